"""A trainer-set member is held to one member's share (``trainer/decisions.py``, ``chain/evidence.py``,
``chain/gate.py``, ``peers/book.py``): decisions only from the round's designated coordinator in
its turn, on our base, never ahead of time; two conflicting signed statements of one key convict
it everywhere; versions move forward by a bounded step from what the other members signed.

Agreements of trainers under real libp2p peer ids on one in-memory hub, stepped by hand, and
peer books fed signed records directly.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_node_round_trust import BASE, EPOCH, ROUND, _agreement, _payload

from pulse_node.chain.anchor import anchor_manifest
from pulse_node.chain.evidence import decode_evidence, encode_evidence, heads_conflict
from pulse_node.chain.gate import FarVersion
from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.record import encode_record, make_record
from pulse_node.codec.state import TensorBits
from pulse_node.errors import IntegrityError, PulseError
from pulse_node.loco.decision import encode_decision, make_decision
from pulse_node.loco.equivocation import evidence_checkers
from pulse_node.net.wire.protocol import kind_of
from pulse_node.peers.book import PeerBook
from pulse_node.peers.evidence import EvidenceBook
from pulse_node.peers.outcomes import Fault, Reported
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub, announced
from pulse_node.trainer.decisions import coordinator_order, turn_at
from pulse_node.vocab import DEFAULT_RUN_ID

RUN = DEFAULT_RUN_ID
CODEC = "pulsesync/compact/1"
MANIFEST = anchor_manifest({"w": TensorBits("BF16", (3,), np.arange(3, dtype=np.uint16))})


def test_the_coordinator_order_rotates_and_does_not_depend_on_who_is_seen():
    ids = [f"peer-{i}" for i in range(6)]
    firsts = {coordinator_order(RUN, r, ids)[0] for r in range(60)}
    assert len(firsts) >= 5, "one member coordinates (nearly) every round"
    for r in range(20):
        full = coordinator_order(RUN, r, ids)
        partial = coordinator_order(RUN, r, [i for i in ids if i != full[3]])
        assert partial == [i for i in full if i != full[3]], "a view missing a member reorders the others"
    order = ["a", "b", "c"]
    assert turn_at(order, "a", {}, me="x", deadline=10.0, wait=2.0) == float("-inf")
    assert turn_at(order, "c", {"a": 1, "b": 1}, me="x", deadline=10.0, wait=2.0) == 14.0
    assert turn_at(order, "c", {"a": 1}, me="x", deadline=10.0, wait=2.0) == 12.0  # b gone: skipped
    assert turn_at(order, "c", {}, me="x", deadline=10.0, wait=2.0) == 10.0


@pytest.fixture
def pair(tmp_path):
    """Our agreement (round ``ROUND`` open on ``BASE``) and a member who is second in the order."""
    hub, me = MemoryHub(), Identity.generate()
    while True:  # a member that comes after us in round ROUND's order
        member = Identity.generate()
        if coordinator_order(RUN, ROUND, [peer_id(me), peer_id(member)])[0] == peer_id(me):
            break
    ag = _agreement(tmp_path, hub, me, [me.public_key_hex, member.public_key_hex])
    hub.join(peer_id(member), lambda request: None).publish(
        PeerStatus(role="trainer", version=ROUND, node_key=member.public_key_hex))
    yield ag, member
    ag.ctx.store.close()


def _decision(ident: Identity, *, rnd: int = ROUND, base: bytes = BASE, digest: bytes = b"\2" * 32) -> bytes:
    pid = peer_id(ident)
    return encode_decision(make_decision(ident, run_id=RUN, round=rnd, base=base, epoch=EPOCH, coordinator=pid,
                                         contributors={pid: digest}))


def test_a_decision_before_its_coordinators_turn_is_parked_then_taken_in_turn(pair):
    ag, member = pair
    mine, data = _payload(peer_id(ag.ctx.identity))
    ag.open_round(mine, data)
    early = _decision(member)
    ag.offer_decision(peer_id(member), early)
    assert ROUND not in ag.decisions, "a member decided a round it is not first for, before its turn"
    ag._open.t0 -= ag.cfg.deadline_s + ag.cfg.decision_wait_s  # its turn has come
    ag.intake.replay_parked(ROUND)
    assert ag.decisions[ROUND].coordinator == peer_id(member)


def test_decisions_signed_ahead_of_time_or_on_another_base_are_never_taken(pair):
    ag, member = pair
    at = [ROUND]
    ag.current_round = lambda: at[0]
    for r in range(ROUND + 1, ROUND + 4):  # pre-signed for the coming rounds, on a guessed base
        ag.offer_decision(peer_id(member), _decision(member, rnd=r, base=b"\7" * 32))
    assert set(ag.decisions) == set(), "a decision of a round not open here was accepted"
    at[0] = ROUND + 1
    mine, data = _payload(peer_id(ag.ctx.identity), rnd=ROUND + 1)
    ag.open_round(mine, data)
    ag._open.t0 -= 100.0
    ag.intake.replay_parked(ROUND + 1)
    ag.offer_decision(peer_id(member), _decision(member, rnd=ROUND + 1, base=b"\7" * 32))
    assert ROUND + 1 not in ag.decisions
    assert ag.ctx.status.snapshot().trainer.decisions_refused.get("other_base", 0) >= 1


def test_two_decisions_of_one_key_for_one_round_convict_it(pair, tmp_path):
    ag, member = pair
    mine, data = _payload(peer_id(ag.ctx.identity))
    ag.open_round(mine, data)
    ag._open.t0 -= 100.0
    first, second = _decision(member), _decision(member, digest=b"\3" * 32)
    ag.offer_decision(peer_id(member), first)
    assert ag.decisions[ROUND].coordinator == peer_id(member)
    ag.offer_decision(peer_id(member), _decision(member, base=b"\7" * 32, digest=b"\4" * 32))  # re-synced: no conflict
    assert not ag.ctx.book.convicted(member.public_key_hex) and not ag.ctx.book.strikes[peer_id(member)]
    with pytest.raises(IntegrityError, match="convicted"):
        ag.offer_decision(peer_id(member), second)
    assert ROUND not in ag.decisions, "the equivocator's decision was kept"
    assert member.public_key_hex in ag.ctx.book.evidence and peer_id(member) not in ag._live()
    with pytest.raises(PulseError):  # refused from now on, even a decision that would have been fine
        ag.offer_decision(peer_id(member), _decision(member, rnd=ROUND + 1))
    # the evidence convinces a node that never saw either decision, and survives its restart
    ev = ag.ctx.book.evidence.convicted[member.public_key_hex]
    other = EvidenceBook(run_id=RUN, directory=tmp_path / "ev", checkers=evidence_checkers())
    assert other.mark_evidence(ev.encode()).key == member.public_key_hex
    assert member.public_key_hex in EvidenceBook(run_id=RUN, directory=tmp_path / "ev", checkers=evidence_checkers())


def _records(ident: Identity, versions, *, salt: str = "a", epoch: bytes = b""):
    """Records of ``ident``'s own chain (one anchor, version 0; one epoch per ``epoch`` nonce);
    ``salt`` forks the last version off the same parent."""
    nonce = (epoch or bytes.fromhex(ident.public_key_hex))[:16].ljust(16, b"\0")
    first = make_record(ident, run_id=RUN, version=0, parent=None, state_hash="00" * 32, patch=None,
                        anchor_version=0, is_anchor=True, codec=CODEC, anchor_manifest=MANIFEST, nonce=nonce)
    out, top = {0: first}, max(versions)
    for v in range(1, top + 1):
        out[v] = make_record(ident, run_id=RUN, version=v, parent=out[v - 1],
                             state_hash=f"{salt if v == top else 'a'}{v:063x}", patch=b"p%d" % v, anchor_version=0,
                             is_anchor=False, codec=CODEC)
    return {v: out[v] for v in versions}


def _book(*idents: Identity, step: int = 8) -> PeerBook:
    return PeerBook(TrainerSet(run_id=RUN, keys=[i.public_key_hex for i in idents]), max_version_step=step)


def _check(book: PeerBook, rec, *, sender: str) -> None:
    """``rec`` through the book's gate as ``sender`` sent it; ``IntegrityError`` with the fault."""
    got = book.ask(sender, lambda: book.gate.verify(rec))
    if isinstance(got, Fault):
        raise IntegrityError(got.why)


def _live(book: PeerBook, *idents: Identity, head: int = 0) -> None:
    """Discovery shows ``idents`` as live trainers announcing ``head`` (the rest as gone)."""
    book.observe([announced(peer_id(i), PeerStatus(role="trainer", version=head, node_key=i.public_key_hex))
                  for i in idents])


def test_a_record_far_past_what_the_other_members_signed_is_refused():
    a, b = Identity.generate(), Identity.generate()
    book = _book(a, b)
    _live(book, a, b)
    for rec in _records(a, [5, 6]).values():
        _check(book, rec, sender="a")
    with pytest.raises(FarVersion, match="past what the live trainer set signed"):
        book.gate.verify(_records(b, [40])[40])
    assert book.gate.far_refused == 1
    _check(book, _records(b, [12])[12], sender="b")  # within the step
    with pytest.raises(IntegrityError):  # b alone cannot lift its own ceiling
        _check(book, _records(b, [50])[50], sender="b")
    assert not book.strikes["b"], "a far record a member signed is no lie of who relayed it"
    # a partition left both far ahead: once both are seen there, they vouch for each other
    _check(book, _records(a, [41])[41], sender="a")  # b was seen signing 50
    _check(book, _records(b, [45])[45], sender="b")  # a was seen at 41


def test_two_records_of_one_key_for_one_version_convict_it_and_the_evidence_travels():
    a, b = Identity.generate(), Identity.generate()
    book = _book(a, b)
    one, two = _records(a, [3], salt="a")[3], _records(a, [3], salt="b")[3]
    _check(book, one, sender="x")
    with pytest.raises(IntegrityError, match="signed two records"):
        _check(book, two, sender="x")
    assert book.convicted(a.public_key_hex) and not book.is_member(a.public_key_hex) and not book.strikes["x"]
    with pytest.raises(IntegrityError, match="convicted"):
        _check(book, _records(a, [4])[4], sender="x")
    (ev,) = book.convictions()
    assert decode_evidence(ev.encode())[0] == "head" and ev.at == 3
    other = _book(a, b)
    other.judge("reporter", Reported(evidence=ev.encode()))
    assert other.convicted(a.public_key_hex) and not other.strikes["reporter"]
    with pytest.raises(IntegrityError):  # agreeing or foreign records are no evidence
        heads_conflict(encode_record(one), encode_record(one), RUN)
    with pytest.raises(IntegrityError):
        heads_conflict(encode_record(one), encode_record(_records(b, [3], salt="b")[3]), RUN)
    fresh = Identity.generate()  # a non-member equivocating against itself convicts nobody: the reporter lied
    forged = encode_evidence("head", encode_record(_records(fresh, [2])[2]), encode_record(_records(fresh, [2], salt="c")[2]))
    other.judge("reporter", Reported(evidence=forged))
    assert not other.convicted(fresh.public_key_hex) and other.strikes["reporter"] == 1


def test_pulse_node_status_names_banned_members_and_open_trust_mode():
    from test_ops_snapshot import NOW, _swarm

    from pulse_node.daemon.status_model import EvidenceEntry
    from pulse_node.ops.render import render_text
    from pulse_node.ops.snapshot import NodeInput, build_snapshot

    nodes = _swarm(i1_version=5)
    entry = EvidenceEntry(key="ab" * 32, kind="decision", at=12, found_at=NOW - 5)
    nodes = [NodeInput(n.name, n.status.model_copy(update={"evidence": [entry] if i < 3 else [],
                                                          "trust_mode": "open" if i == 0 else "keys"}))
             for i, n in enumerate(nodes)]
    msgs = [a.message for a in build_snapshot(nodes, now=NOW).alerts]
    assert any("banned for equivocation (two signed decisions for 12) by 3/4 nodes" in m for m in msgs), msgs
    assert any(m.startswith("OPEN trust mode on trainer-0") for m in msgs), msgs
    assert "abababababababab... banned" in render_text(build_snapshot(nodes, now=NOW), width=200)


def test_a_member_serving_another_record_for_an_anchor_gets_no_honest_provider_struck(tmp_path):
    """A member signs its own record for anchor 20 (other chunk digests, same layout) and serves
    it: the honest provider of the real anchor serves another record of 20, so it is not asked
    for pieces and never struck; the download fails on the liar alone."""
    import dataclasses

    from test_chain_catchup_producer import CHAIN, fill
    from test_chain_synth import TRAINER

    from pulse_node.chain.anchor import AnchorManifest
    from pulse_node.chain.record import signing_bytes
    from pulse_node.inference.anchor_load import load_anchor
    from pulse_node.net.wire.serving import store_resolver
    from pulse_node.testing.adversaries import announce

    served = fill(tmp_path / "served" / "store", 24)
    served.close()
    member = Identity.generate()
    real = CHAIN[20][0]
    m = AnchorManifest.decode(real.anchor_manifest)
    swapped = dataclasses.replace(m, chunks=bytes(b ^ 1 for b in m.chunks)).encode()
    unsigned = dataclasses.replace(real, anchor_manifest=swapped, signer=member.public_key_hex)
    forged = dataclasses.replace(unsigned, signature=member.sign(signing_bytes(unsigned)))
    hub = MemoryHub()
    forged_file = tmp_path / "forged.record"
    forged_file.write_bytes(encode_record(forged))
    honest_store = store_resolver(served.root)
    liar = announce(hub, member, lambda r: forged_file if kind_of(r) == "record" else honest_store(r),
                    role="trainer", version=24, anchors=(20,))
    honest = announce(hub, TRAINER, honest_store, role="trainer", version=24, anchors=(20,))
    me = hub.join("me", lambda request: None)
    book = PeerBook(TrainerSet(run_id=real.run_id, keys=[TRAINER.public_key_hex, member.public_key_hex]))
    book.gate.verify(forged)
    with pytest.raises(PulseError):
        load_anchor(me, book, forged, liar, [liar, honest], tmp_path, timeout=10)
    assert honest.peer_id not in book.strikes, "the provider of the real anchor was struck"


def test_the_evidence_plane_verifies_reports_spreads_and_keeps_evidence(tmp_path):
    """A received evidence is verified here (garbage strikes its sender), the key is named in the
    status, the evidence is pushed on to every peer, and a node built on the same data dir keeps it."""
    from helpers import wait_for

    from pulse_node.chain.store import VersionStore
    from pulse_node.config import InferenceConfig
    from pulse_node.daemon.context import RoleContext
    from pulse_node.daemon.evidence_plane import EvidencePlane
    from pulse_node.daemon.status import NodeStatus
    from pulse_node.net.wire.serving import store_resolver

    bad = Identity.generate()
    cfg = InferenceConfig.model_validate({"data_dir": str(tmp_path / "me"), "chain": {"trusted_trainers": [bad.public_key_hex]}})
    hub = MemoryHub()
    store = VersionStore(tmp_path / "me" / "store")
    ctx = RoleContext(cfg=cfg, identity=Identity.generate(), store=store, transport=hub.join("me", store_resolver(store.root)),
                      status=NodeStatus(role="inference", peer_id="me", run_id=cfg.run_id))
    peer = hub.join("peer", lambda request: None)
    peer.publish(PeerStatus(role="inference"))
    book = ctx.book
    plane = EvidencePlane(ctx)
    plane.take("liar", b"\x93junk")
    assert book.strikes["liar"] == 1 and not ctx.status.snapshot().evidence
    one, two = (encode_record(_records(bad, [3], salt=s)[3]) for s in ("a", "b"))
    plane.take("reporter", encode_evidence("head", one, two))
    (entry,) = ctx.status.snapshot().evidence
    assert (entry.key, entry.kind, entry.at) == (bad.public_key_hex, "head", 3)
    assert not book.is_member(bad.public_key_hex) and book.strikes["reporter"] == 0
    got = wait_for(lambda: [e for e in peer.events(wait_s=0.1) if e.kind == "evidence"], timeout=10, what="the gossip")
    assert decode_evidence(got[0].data)[1:] == (one, two)
    assert PeerBook.for_node(cfg).convicted(bad.public_key_hex), "a restart forgot the evidence"
    late = hub.join("late", lambda request: None)  # joined after the gossip
    late.publish(PeerStatus(role="inference"))
    plane._told_at = float("-inf")  # the next tell is due
    plane.tick()
    got = wait_for(lambda: [e for e in late.events(wait_s=0.1) if e.kind == "evidence"], timeout=10, what="the late peer told")
    assert decode_evidence(got[0].data)[1:] == (one, two)
    store.close()


def test_a_member_announcing_a_far_version_does_not_close_our_round(tmp_path):
    hub, me, member = MemoryHub(), Identity.generate(), Identity.generate()
    ag = _agreement(tmp_path, hub, me, [me.public_key_hex, member.public_key_hex])
    t = hub.join(peer_id(member), lambda request: None)
    try:
        for version, closed in ((10**12 - 1, False), (ROUND + 1, True)):
            t.publish(PeerStatus(role="trainer", version=version, node_key=member.public_key_hex))
            assert ag._closed_elsewhere(ROUND, ag._live()) is closed, version
    finally:
        ag.ctx.store.close()


def test_a_trainer_restarting_within_a_round_it_decided_never_signs_a_second_decision(tmp_path):
    """Our decision of a round is kept on disk: after a restart the same round gets the same bytes
    (never a second, conflicting decision that would convict us), or none if our state changed."""
    hub, me, member = MemoryHub(), Identity.generate(), Identity.generate()
    keys = [me.public_key_hex, member.public_key_hex]
    first = _agreement(tmp_path, hub, me, keys)
    mine, data = _payload(peer_id(me))
    first.open_round(mine, data)
    d1 = first._decide(first._open, first._live(), pull=False)
    first.ctx.store.close()
    again = _agreement(tmp_path, MemoryHub(), me, keys)  # restarted: nothing in memory, other payloads
    other, data2 = _payload(peer_id(me), value=2e-4)
    again.open_round(other, data2)
    d2 = again._decide(again._open, again._live(), pull=False)
    assert d2 == d1, "a second, different decision of one round was signed"
    again._open.base = b"\x09" * 32  # another state now
    assert again._decide(again._open, again._live(), pull=False) is None
    again.ctx.store.close()
