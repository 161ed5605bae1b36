"""Trainers agree on every round's contributors (``trainer/agreement.py``), so they never fork.

In-process swarms of trainers (no inference nodes: each makes its own rollouts) with one-way
payload loss and a coordinator that crashes mid-round; plus forged and conflicting decisions
handed straight to one trainer's agreement. Trainers are compared per version on the published
state hash and on the hash of the FP32 global weights + outer momentum.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import all_at_version, assert_trainers_identical, read_status, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.store import VersionStore
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus
from pulse_node.errors import PulseError, WireError
from pulse_node.loco.decision import decode_decision, encode_decision, make_decision
from pulse_node.net.wire.protocol import LocoDecisionRequest, LocoPayloadRequest
from pulse_node.net.wire.serving import resolve, store_resolver
from pulse_node.testing.faults import CrashingTransport, FaultRates, FaultyTransport
from pulse_node.testing.inprocess import InProcessSwarm
from pulse_node.testing.memory import MemoryHub, announced
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.decisions import coordinator_order
from pulse_node.vocab import DEFAULT_RUN_ID

EPOCH = b"\x0e" * 32  # the epoch of the chain the agreements under test extend
LOCO = {"inner_steps": 2, "deadline_s": 2.0, "decision_wait_s": 2.0}


def _push_forged_decisions(hub: MemoryHub, trainers) -> None:
    """A peer pushes each trainer a decision signed by its own key in the coordinator's name, and junk."""
    rogue = hub.join("rogue", lambda request: None)
    forged = encode_decision(make_decision(Identity.generate(), run_id=DEFAULT_RUN_ID, round=1, base=b"\0" * 32, epoch=EPOCH,
                                           coordinator="trainer-a", contributors={"trainer-a": b"\0" * 32}))
    for name in trainers:
        for data in (forged, b"\x99junk"):
            rogue.push(announced(name, PeerStatus(role="trainer")), "loco_decision", data, timeout=1.0)


@pytest.mark.slow
def test_one_way_payload_loss_never_forks(node_cfg):
    """a -> b and c -> a payload pushes are always lost: a is never pushed c's payload, b never
    a's. Every version is still bit-identical on all three trainers (whoever coordinates a round;
    a coordinator fetches a committed payload it lacks), and forged decisions pushed meanwhile are
    rejected and counted."""
    faulty: dict[str, FaultyTransport] = {}
    lost = {"trainer-a": ("trainer-b",), "trainer-c": ("trainer-a",)}

    def wrap(name, transport):
        if name not in lost:
            return transport
        faulty[name] = FaultyTransport(transport, FaultRates(drop=1.0, only_kinds=("loco",), only_peers=lost[name]),
                                       seed=1)
        return faulty[name]

    swarm = InProcessSwarm(wrap=wrap)
    try:
        dirs = {n: swarm.start(n, node_cfg(TrainerConfig, n, loco=LOCO)) for n in ("trainer-a", "trainer-b", "trainer-c")}
        wait_for(all_at_version(dirs.values(), 1), timeout=300, what="every trainer at version 1")
        _push_forged_decisions(swarm.hub, dirs)
        wait_for(all_at_version(dirs.values(), 5), timeout=300, what="every trainer at version 5")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    assert_trainers_identical(dirs, range(1, 6))
    st = {n: read_status(d).trainer for n, d in dirs.items()}
    assert sum(f.faults["drop"] for f in faulty.values()) >= 10, "no payload was lost"
    turns = [coordinator_order(DEFAULT_RUN_ID, r, dirs)[0] for r in range(5)]  # rounds 0-4 make versions 1-5
    assert sum(s.decisions_made for s in st.values()) >= 5
    # a coordinator fetches a committed payload whose push it lost: nobody's work is left out
    if "trainer-b" in turns:
        assert st["trainer-b"].loco_fetched >= 1, "b never fetched a's payload, which it was never pushed"
    if "trainer-a" in turns:
        assert st["trainer-a"].loco_fetched >= 1, "a never fetched c's payload, which it was never pushed"
    assert not any(s.rounds_left_out for s in st.values()), st
    if "trainer-a" in turns or "trainer-c" in turns:
        assert st["trainer-b"].loco_fetched >= 1, "b never fetched the payload it missed"
    for name, s in st.items():
        assert s.resyncs <= 1 and not s.forks, f"{name} had to repair a fork"
        assert s.decisions_rejected == 2, f"{name} did not reject the forged decisions"


@pytest.mark.slow
def test_coordinator_lost_mid_round_others_finish_in_bounded_time(node_cfg):
    """a dies with every payload of the first round from 2 on that it coordinates in hand, just
    before sending its decision."""
    crash: dict[str, CrashingTransport] = {}
    names = ("trainer-a", "trainer-b", "trainer-c")
    lost = next(r for r in range(2, 64) if coordinator_order(DEFAULT_RUN_ID, r, names)[0] == "trainer-a")

    def wrap(name, transport):
        if name != "trainer-a":
            return transport
        crash[name] = CrashingTransport(
            transport, lambda kind, data: kind == "loco_decision" and _own_decision(data, "trainer-a", lost))
        return crash[name]

    swarm = InProcessSwarm(wrap=wrap)
    try:
        dirs = {n: swarm.start(n, node_cfg(TrainerConfig, n, loco=LOCO)) for n in names}
        crashed = lambda: "trainer-a" in crash and crash["trainer-a"].crashed_at is not None  # noqa: E731
        wait_for(lambda: crashed() or bool(swarm.errors), timeout=300, what=f"the coordinator to crash in round {lost}")
        swarm.stop(dirs["trainer-a"])
        rest = {n: d for n, d in dirs.items() if n != "trainer-a"}
        wait_for(all_at_version(rest.values(), lost + 3), timeout=120, what=f"b and c at version {lost + 3}")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    assert_trainers_identical(rest, range(1, lost + 4))
    assert_trainers_identical(dirs, range(1, lost + 1))  # a agreed with them up to its crash
    bound = LOCO["deadline_s"] + 3 * LOCO["decision_wait_s"]  # deadline + n * decision_wait
    for name, d in rest.items():
        closed_at = next(h.at for h in read_status(d).history if h.version == lost + 1)
        assert closed_at - crash["trainer-a"].crashed_at < bound + 10, f"{name} took too long to close round {lost}"
    assert sum(read_status(d).trainer.decisions_made for d in rest.values()) >= 1, "nobody took over"


def _own_decision(data: bytes, name: str, first_round: int) -> bool:
    """Whether ``data`` is a decision ``name`` coordinated, of ``first_round`` or later (not a relay)."""
    d = decode_decision(data)
    return d.coordinator == name and d.round >= first_round


def _agreement(tmp_path, hub: MemoryHub, **cfg_extra) -> RoundAgreement:
    cfg = TrainerConfig.model_validate({"data_dir": str(tmp_path / "b"), **cfg_extra})
    store = VersionStore(tmp_path / "b" / "store")
    ctx = RoleContext(cfg=cfg, identity=Identity.generate(), store=store,
                      transport=hub.join("trainer-b", store_resolver(store.root)),
                      status=NodeStatus(role="trainer", peer_id="trainer-b", run_id=cfg.run_id))
    return RoundAgreement(ctx, shapes={"w": (4,)}, current_round=lambda: 3, epoch=lambda: EPOCH)


def _trainer_agreement(tmp_path, hub: MemoryHub, name: str, **loco) -> RoundAgreement:
    """A trainer's agreement on ``hub`` for round 3, announced in discovery with its node key."""
    cfg = TrainerConfig.model_validate({"data_dir": str(tmp_path / name), "loco": loco})
    store, ident = VersionStore(tmp_path / name / "store"), Identity.generate()
    transport = hub.join(name, store_resolver(store.root))
    transport.publish(PeerStatus(role="trainer", version=3, node_key=ident.public_key_hex))
    ctx = RoleContext(cfg=cfg, identity=ident, store=store, transport=transport,
                      status=NodeStatus(role="trainer", peer_id=name, run_id=cfg.run_id))
    return RoundAgreement(ctx, shapes={"w": (4,)}, current_round=lambda: 3, epoch=lambda: EPOCH)


def _drive(agreements: dict[str, RoundAgreement], *, lost: tuple[str, str] | None = None) -> dict:
    """Step every open round, handing each agreement its pushed inputs, until all have closed.

    ``lost``: (sender, receiver) whose payload push never arrives."""
    results: dict = {}

    def one_pass() -> bool:
        for name, ag in agreements.items():
            if name in results:
                continue
            for ev in ag.ctx.transport.events(wait_s=ag.idle_s / len(agreements)):
                if ev.kind == "loco" and (ev.sender, name) != lost:
                    ag.offer_payload(ev.sender, ev.data)
                elif ev.kind == "loco_commit":
                    ag.offer_commit(ev.sender, ev.data)
                elif ev.kind == "loco_decision":
                    ag.offer_decision(ev.sender, ev.data)
            if (result := ag.step()) is not None:
                results[name] = result
        return len(results) == len(agreements)

    wait_for(one_pass, timeout=60, interval=0.0, what="every agreement to close the round")
    return results


@pytest.mark.parametrize("lose", [False, True])
def test_agreements_driven_step_by_step_close_on_the_same_payloads(tmp_path, lose):
    """Three agreements over one hub, no trainer: each is opened with its payload and stepped;
    all close on one decision of the round's designated coordinator, with the same payloads in
    trainer-id order (a trainer fetches the payload whose push to it was lost)."""
    from pulse_node.loco.payload import LocoPayload, encode_payload

    hub = MemoryHub()
    names = ("trainer-a", "trainer-b", "trainer-c")
    others = coordinator_order(DEFAULT_RUN_ID, 3, names)[1:]
    lost = (others[1], others[0]) if lose else None
    agreements = {n: _trainer_agreement(tmp_path, hub, n, deadline_s=20.0, decision_wait_s=5.0) for n in names}
    for i, (name, ag) in enumerate(agreements.items()):
        mine = LocoPayload(round=3, trainer_id=name, base_hash=b"\x01" * 32, numel={"w": 4},
                           tensors={"w": (np.array([i], np.int64), np.array([0.5 + i], np.float32))})
        ag.open_round(mine, encode_payload(mine))
    results = _drive(agreements, lost=lost)
    decisions = {r.decision.coordinator for r in results.values()}
    assert decisions == {coordinator_order(DEFAULT_RUN_ID, 3, names)[0]}, decisions  # the round's designated one
    for name, r in results.items():
        assert [p.trainer_id for p in r.payloads] == list(names) and r.mine_included, name
        assert [float(p.tensors["w"][1][0]) for p in r.payloads] == [0.5, 1.5, 2.5]
    assert agreements[others[0]].ctx.status.snapshot().trainer.loco_fetched == (1 if lost else 0)
    for ag in agreements.values():
        ag.ctx.store.close()


def test_forged_and_conflicting_decisions_are_rejected_and_counted(tmp_path):
    from pulse_node.loco.payload import LocoPayload, encode_payload

    hub, coord, rogue = MemoryHub(), Identity.generate(), Identity.generate()
    hub.join("trainer-a", lambda request: None).publish(
        PeerStatus(role="trainer", node_key=coord.public_key_hex))
    agreement = _agreement(tmp_path, hub, loco={"deadline_s": 1e-3, "decision_wait_s": 1e-3})  # a's turn comes at once
    mine = LocoPayload(round=3, trainer_id="trainer-b", base_hash=b"\x01" * 32, numel={"w": 4},
                       tensors={"w": (np.array([0], np.int64), np.array([0.5], np.float32))})
    agreement.open_round(mine, encode_payload(mine))
    agreement._open.t0 -= 10.0  # the round opened long ago: a's turn has come whatever its place

    def signed(ident: Identity = coord, **changes) -> bytes:
        args = dict(run_id=DEFAULT_RUN_ID, round=3, base=b"\x01" * 32, epoch=EPOCH, coordinator="trainer-a",
                    contributors={"trainer-a": b"\x02" * 32})
        return encode_decision(make_decision(ident, **{**args, **changes}))

    good = signed()
    tampered = bytearray(good)
    tampered[good.index(b"\x02" * 32)] ^= 1  # a contributor's digest: still decodes, signature fails
    forged = [signed(rogue), signed(rogue, coordinator="trainer-x"), signed(run_id="other-run"), signed(epoch=b"\x0f" * 32),
              bytes(tampered), b"\x93garbage"]
    for data in forged:  # pushed by the member itself: every check after membership runs
        with pytest.raises(PulseError):
            agreement.offer_decision("trainer-a", data)
    with pytest.raises(PulseError, match="not a trusted trainer-set member"):
        agreement.offer_decision("rogue", good)  # a valid decision relayed by a non-member
    status = agreement.ctx.status.snapshot()
    assert status.trainer.decisions_rejected == len(forged) + 1 and 3 not in agreement.decisions

    agreement.offer_decision("trainer-a", good)
    agreement.offer_decision("trainer-a", signed(round=99))  # outside the window: ignored
    assert agreement.decisions[3] == decode_decision(good) and set(agreement.decisions) == {3}
    assert resolve(agreement.root, LocoDecisionRequest(round=3)).read_bytes() == good  # served to peers
    with pytest.raises(PulseError, match="convicted"):  # a second, different one of the same key
        agreement.offer_decision("trainer-a", signed(contributors={"trainer-a": b"\x03" * 32}))
    assert coord.public_key_hex in agreement.ctx.book.evidence and 3 not in agreement.decisions
    agreement.ctx.store.close()


def test_decisions_from_untrusted_trainer_keys_are_rejected(tmp_path):
    hub, coord = MemoryHub(), Identity.generate()
    hub.join("trainer-a", lambda request: None).publish(
        PeerStatus(role="trainer", node_key=coord.public_key_hex))
    agreement = _agreement(tmp_path, hub, chain={"trusted_trainers": ["ab" * 32]})
    data = encode_decision(make_decision(coord, run_id=DEFAULT_RUN_ID, round=3, base=b"\x01" * 32, epoch=EPOCH,
                                         coordinator="trainer-a", contributors={"trainer-a": b"\x02" * 32}))
    with pytest.raises(PulseError, match="trusted"):
        agreement.offer_decision("trainer-a", data)
    assert agreement.ctx.status.snapshot().trainer.decisions_rejected == 1
    agreement.ctx.store.close()


def test_round_files_are_served_only_for_well_formed_requests(tmp_path):
    digest = "ab" * 32
    assert resolve(tmp_path, LocoPayloadRequest(round=5, digest=digest)) == tmp_path / "loco" / "5" / f"{digest}.payload"
    assert resolve(tmp_path, LocoDecisionRequest(round=5)) == tmp_path / "loco" / "5" / "decision"
    for bad in ("../" + digest[3:], digest.upper(), digest[:-1]):
        assert resolve(tmp_path, LocoPayloadRequest(round=5, digest=bad)) is None, bad
    for fields in ({"round": -1, "digest": digest}, {"round": True, "digest": digest}, {"round": "5", "digest": digest}):
        with pytest.raises(WireError):  # a peer's request of these never reaches the resolver
            LocoPayloadRequest(**fields)


def test_a_payload_revealed_to_some_trainers_only_is_fetched_from_them_by_the_coordinator(tmp_path, monkeypatch):
    """A trainer pushes its payload to one member but not to the coordinator, and does not serve it
    to the coordinator either: the coordinator fetches it from the member that holds it, so its
    decision names it and nobody refuses the decision (before: decided without it, refused by the
    member holding it as an omission)."""
    from pulse_node.loco.payload import LocoPayload, encode_payload

    hub = MemoryHub()
    names = ("trainer-a", "trainer-b", "trainer-c")
    coordinator, holder, hider = coordinator_order(DEFAULT_RUN_ID, 3, names)
    agreements = {n: _trainer_agreement(tmp_path, hub, n, deadline_s=3.0, decision_wait_s=1.0) for n in names}
    real = agreements[coordinator]._fetch_payload

    def not_from_the_hider(peer, *args, **kw):
        return None if peer.peer_id == hider else real(peer, *args, **kw)

    monkeypatch.setattr(agreements[coordinator], "_fetch_payload", not_from_the_hider)
    for i, (name, ag) in enumerate(agreements.items()):
        mine = LocoPayload(round=3, trainer_id=name, base_hash=b"\x01" * 32, numel={"w": 4},
                           tensors={"w": (np.array([i], np.int64), np.array([0.5 + i], np.float32))})
        ag.open_round(mine, encode_payload(mine))
    results = _drive(agreements, lost=(hider, coordinator))
    for name, r in results.items():
        assert r.decision.coordinator == coordinator and r.decision.trainer_ids == sorted(names), name
        assert len(r.payloads) == 3, name
    assert agreements[holder].ctx.status.snapshot().trainer.decisions_refused == {}
    assert agreements[coordinator].ctx.status.snapshot().trainer.loco_fetched == 1
    for ag in agreements.values():
        ag.ctx.store.close()
