"""Only trainer-set members take part in a PULSELoCo round, and no payload beyond the value bound
is kept, signed or applied (``trainer/round_peers.py``, ``trainer/agreement.py``, ``loco/bound.py``).

Agreements of trainers under real libp2p peer ids on one in-memory hub, stepped by hand: a peer
with a fresh key announcing the trainer role cannot get a payload into a round, park payloads,
push or be named in a decision, nor hold a round up; an admitted trainer is a contributor; a
member's payload scaled beyond the bound is refused, counts as heard from, and a decision naming
it is rejected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import commit_to

from pulse_node.chain.admission import Admission
from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.store import VersionStore
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus
from pulse_node.errors import IntegrityError, PulseError
from pulse_node.loco.bound import PayloadBoundError, max_payload_bytes
from pulse_node.loco.decision import encode_decision, make_decision, payload_digest
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.net.wire.serving import store_resolver
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.vocab import DEFAULT_RUN_ID

SHAPES = {"w": (64,)}
BASE = b"\x01" * 32
ROUND = 3
EPOCH = b"\x0e" * 32  # the epoch of the chain the agreement under test extends
W = {"w": (np.random.default_rng(0).standard_normal(64) * 0.02).astype(np.float32)}


def _announce(hub: MemoryHub, ident: Identity, *, admission: bytes | None = None) -> str:
    pid = peer_id(ident)
    hub.join(pid, lambda request: None).publish(
        PeerStatus(role="trainer", version=ROUND, node_key=ident.public_key_hex, admission=admission))
    return pid


def _agreement(tmp_path: Path, hub: MemoryHub, me: Identity, keys: list[str], rnd: list[int] | None = None):
    cfg = TrainerConfig.model_validate({"data_dir": str(tmp_path / "me"), "chain": {"trusted_trainers": keys}})
    store = VersionStore(tmp_path / "me" / "store")
    transport = hub.join(peer_id(me), store_resolver(store.root))
    transport.publish(PeerStatus(role="trainer", version=ROUND, node_key=me.public_key_hex))
    ctx = RoleContext(cfg=cfg, identity=me, store=store, transport=transport,
                      status=NodeStatus(role="trainer", peer_id=peer_id(me), run_id=cfg.run_id))
    at = rnd if rnd is not None else [ROUND]
    return RoundAgreement(ctx, shapes=SHAPES, current_round=lambda: at[0], epoch=lambda: EPOCH, base=lambda: (BASE, W))


def _payload(trainer: str, *, rnd: int = ROUND, value: float = 1e-4) -> tuple[LocoPayload, bytes]:
    p = LocoPayload(round=rnd, trainer_id=trainer, base_hash=BASE, numel={"w": 64},
                    tensors={"w": (np.array([1, 5, 9], np.int64), np.array([value, -value, value], np.float32))})
    return p, encode_payload(p, base=W)


def _status(ag: RoundAgreement):
    return ag.ctx.status.snapshot().trainer


@pytest.fixture
def keyed(tmp_path):
    """(our agreement, a member's id and identity, a non-member's id): a keyed trainer set {me, member}."""
    hub, me, member, fake = MemoryHub(), Identity.generate(), Identity.generate(), Identity.generate()
    ag = _agreement(tmp_path, hub, me, [me.public_key_hex, member.public_key_hex])
    yield ag, _announce(hub, member), member, _announce(hub, fake)
    ag.ctx.store.close()


def test_a_non_member_cannot_contribute_park_decide_nor_be_waited_for(keyed):
    ag, member, member_ident, fake = keyed
    for rnd in (ROUND, ROUND + 1):  # this round's payload and a parked one
        with pytest.raises(IntegrityError, match="not a trusted trainer-set member"):
            ag.offer_payload(fake, _payload(fake, rnd=rnd)[1])
    assert fake not in ag.inbox.get(ROUND, {}) and not ag.pending
    assert set(ag._live()) == {member}, "a non-member is in the round's order"
    mine, data = _payload(peer_id(ag.ctx.identity))
    ag.open_round(mine, data)
    assert sorted(ag._open.order) == sorted([peer_id(ag.ctx.identity), member])
    commit_to(ag, member_ident, member, _payload(member)[1], round=ROUND, base=BASE)
    ag.offer_payload(member, _payload(member)[1])
    assert ag._all_in(ROUND, ag._open.order, ag._live()), "the round waits for a non-member"
    # its decisions, and a member's decision naming it, are refused
    own = make_decision(Identity.generate(), run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=fake,
                        contributors={fake: b"\0" * 32})
    with pytest.raises(IntegrityError):
        ag.offer_decision(fake, encode_decision(own))
    naming = make_decision(member_ident, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=member,
                           contributors={member: b"\0" * 32, fake: b"\0" * 32})
    with pytest.raises(IntegrityError, match="outside the trainer set"):
        ag.offer_decision(member, encode_decision(naming))
    st = _status(ag)
    assert st.loco_refused == {"not_member": 2}
    assert st.decisions_refused == {"not_member": 1, "bad_decision": 1} and st.decisions_rejected == 2
    assert ag.ctx.book.strikes[fake] == 3 and ag.peers.banned(fake), "the non-member was not struck"
    assert ROUND not in ag.decisions
    ag.offer_payload(fake, _payload(fake)[1])  # banned now: dropped unread, counted, no error
    assert _status(ag).loco_refused == {"not_member": 2, "banned": 1} and fake not in ag.inbox[ROUND]


def test_an_open_swarm_keeps_trusting_announced_trainers(tmp_path):
    """No key configured: any peer announcing the trainer role is a member (the open swarm)."""
    hub, me, anyone = MemoryHub(), Identity.generate(), Identity.generate()
    ag = _agreement(tmp_path, hub, me, [])
    pid = _announce(hub, anyone)
    commit_to(ag, anyone, pid, _payload(pid)[1], round=ROUND, base=BASE)
    ag.offer_payload(pid, _payload(pid)[1])
    assert pid in ag.inbox[ROUND] and pid in ag._live()
    ag.ctx.store.close()


def test_an_admitted_trainer_is_a_contributor(tmp_path):
    hub, me, other, new = MemoryHub(), Identity.generate(), Identity.generate(), Identity.generate()
    ag = _agreement(tmp_path, hub, me, [me.public_key_hex, other.public_key_hex])
    _announce(hub, other)
    half = Admission(DEFAULT_RUN_ID, new.public_key_hex).endorse(me)  # quorum is 2 of 2
    pid = _announce(hub, new, admission=half.encode())
    with pytest.raises(IntegrityError):
        ag.offer_payload(pid, _payload(pid)[1])
    hub.join(pid, lambda request: None).publish(PeerStatus(
        role="trainer", version=ROUND, node_key=new.public_key_hex, admission=half.endorse(other).encode()))
    commit_to(ag, new, pid, _payload(pid)[1], round=ROUND, base=BASE)
    ag.offer_payload(pid, _payload(pid)[1])
    assert pid in ag.inbox[ROUND] and pid in ag._live()
    ag.open_round(*_payload(peer_id(me)))
    d = ag._decide(ag._open, ag._live(), pull=False)
    assert pid in d.trainer_ids
    ag.ctx.store.close()


def test_a_payload_beyond_the_bound_is_refused_heard_from_and_never_decided(keyed):
    ag, member, member_ident, _ = keyed
    limit = ag.bound.limit(W["w"][[1, 5, 9]]).min()
    _bad_p, bad = _payload(member, value=float(limit) * 1.5)
    with pytest.raises(PayloadBoundError):
        ag.offer_payload(member, bad)
    assert member not in ag.inbox.get(ROUND, {}) and ag.refused[ROUND][member] == payload_digest(bad)
    mine, data = _payload(peer_id(ag.ctx.identity))
    ag.open_round(mine, data)
    assert ag._all_in(ROUND, ag._open.order, ag._live()), "a refused member is still waited for"
    decision = make_decision(member_ident, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=member,
                             contributors={member: payload_digest(bad)})
    with pytest.raises(PayloadBoundError):
        ag.offer_decision(member, encode_decision(decision))
    ours = ag._decide(ag._open, ag._live(), pull=False)
    assert ours.trainer_ids == [peer_id(ag.ctx.identity)], "an out-of-bound payload was signed"
    st = _status(ag)
    assert st.loco_refused == {"out_of_bound": 1} and st.decisions_refused == {"out_of_bound": 1}
    _ok_p, ok = _payload(member, value=float(limit) * 0.9)  # a member's payload within the bound is kept
    ag.refused.clear()
    ag.offer_payload(member, ok)
    assert member not in ag.inbox[ROUND]  # no commitment to it
    commit_to(ag, member_ident, member, ok, round=ROUND, base=BASE)
    assert member in ag.inbox[ROUND]


def test_parking_holds_two_coming_rounds_one_payload_per_member(keyed):
    ag, member, _, _ = keyed
    for rnd in (ROUND + 1, ROUND + 2, ROUND + 2, ROUND + 3, ROUND + 40):
        ag.offer_payload(member, _payload(member, rnd=rnd)[1])
    assert {r: list(v) for r, v in ag.pending.items()} == {ROUND + 1: [member], ROUND + 2: [member]}
    assert _status(ag).loco_refused == {"too_far_ahead": 2}


def test_payload_size_is_capped_by_the_model_before_parsing(keyed):
    ag, member, _, _ = keyed
    cap = max_payload_bytes(SHAPES, cap=1 << 30)
    assert ag.cap == cap < 128 << 10
    with pytest.raises(PulseError, match="cap"):
        ag.offer_payload(member, b"\x80" * (cap + 1))
    assert _status(ag).loco_refused == {"too_large": 1}
