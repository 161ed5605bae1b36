"""The real round's spot-check rules (``trainer/spot_round.py``, ``trainer/agreement.py``,
``trainer/decisions.py``), as the byzantine harness plays them (issue 32):

- an unproven member (one that passed no check yet) is drawn every round, by two verifiers, until it
  passes one; then at ``loco.spot.rate``;
- a failing verdict a round's decision names keeps its target's payload out of that round already:
  the coordinator leaves it out, and a decision naming it as a contributor is refused;
- a target's answer is published (served by digest, its signed receipt relayed to every member),
  past the 48 MiB a push carries, and "no answer" of a target whose receipt a member holds is refused,
  as is a verdict of a check the round's draw did not make; a receipt signing more than the
  target's commitment bounds its answer to is refused, nothing fetched; answers download off the
  trainer loop (a stalled server does not hold it);
- a decision leaving out a failed verdict with evidence that a member held and re-checked before
  its round opened is refused like one leaving out a commitment, both statements kept.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import blake3
import numpy as np
import pytest
from helpers import commit_to, hold_evidence, hub_agreement, inner_commitment, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.serving import loco_payload_path
from pulse_node.errors import IntegrityError, PeerUnavailable
from pulse_node.loco.commit import InnerCommitment, decode_commitment
from pulse_node.loco.commitlist import VERDICTS, make_verdict
from pulse_node.loco.config import SpotConfig
from pulse_node.loco.decision import encode_decision, make_decision, payload_digest
from pulse_node.loco.ledger import Entry, Ledger
from pulse_node.loco.opening import RoundOpening
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.loco.roundcommit import commit_digest, encode_commit, make_commit
from pulse_node.loco.roundrules import unrevealed
from pulse_node.loco.spot_answer import (
    MAX_ANSWER_BYTES,
    RECEIPTS,
    AnswerReceipt,
    SpotAnswer,
    encode_answer,
    make_receipt,
)
from pulse_node.loco.spotdraw import Shape
from pulse_node.net.wire.protocol import PUSH_CAPS
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.commits import HeldCommit
from pulse_node.trainer.spot_answers import Answers
from pulse_node.trainer.spot_evidence import Recheck
from pulse_node.trainer.spot_round import SpotRounds, round_draws
from pulse_node.vocab import DEFAULT_RUN_ID

ROUND = 3
BASE = b"\x01" * 32
EPOCH = b"\x0e" * 32
SHAPE = Shape(steps=4, params=1024, leaf=64)
SHAPES = {"w": (64,)}
W = {"w": (np.random.default_rng(0).standard_normal(64) * 0.02).astype(np.float32)}


def _decided(keys: list[Identity], round: int):
    ids = [peer_id(k) for k in keys]
    return make_decision(keys[0], run_id=DEFAULT_RUN_ID, round=round, base=BASE, epoch=EPOCH, coordinator=ids[0],
                         contributors={t: bytes([i]) * 32 for i, t in enumerate(ids)},
                         committed={t: bytes([i + 8]) * 32 for i, t in enumerate(ids)})


def test_an_unproven_member_is_drawn_every_round_by_two_verifiers_until_it_passes_a_check():
    """Three members, at rate 0: a member that passed no check is drawn every round (two verifiers:
    one colluding verifier cannot pass it); once it passed one, rate 0 draws it no more."""
    keys = [Identity.generate() for _ in range(3)]
    ids = [peer_id(k) for k in keys]
    ledger, spot = Ledger(), SpotConfig(rate=0.0)
    ledger.entries[ids[0]] = Entry(0, 0, member=True, passed=1)  # proven
    for r in range(5):
        d = _decided(keys, r)
        draws = round_draws(d, bytes([r]) * 32, shapes=dict.fromkeys(ids, SHAPE), ledger=ledger,
                            is_member=set(ids).__contains__, spot=spot)
        by = {t: sorted(x.verifier for x in draws if x.target == t) for t in ids}
        assert by[ids[0]] == [], "a proven member is drawn at rate 0"
        for t in ids[1:]:
            assert len(by[t]) == 2 and t not in by[t], f"round {r}: unproven {t[:12]} drawn by {by[t]}"
    ledger.entries[ids[1]] = Entry(0, 4, member=True, passed=1)
    draws = round_draws(_decided(keys, 5), b"\x05" * 32, shapes=dict.fromkeys(ids, SHAPE), ledger=ledger,
                        is_member=set(ids).__contains__, spot=spot)
    assert {x.target for x in draws} == {ids[2]}


def test_a_convicted_key_is_drawn_no_more_though_it_still_commits():
    """An open trainer convicted (and owing) keeps committing; checking it again would cost two
    verifiers every round for nothing: it is out for good. An owing key still is drawn."""
    keys = [Identity.generate() for _ in range(4)]
    ids = [peer_id(k) for k in keys]
    ledger = Ledger()
    for t in ids[:2]:
        ledger.entries[t] = Entry(0, 0, member=True, passed=1)
    ledger.entries[ids[2]] = Entry(0, 0, failed=1, owing=True)
    ledger.entries[ids[3]] = Entry(0, 0, failed=2, owing=True, convicted=True)
    d = _decided(keys[:2], 4)
    committed = dict(d.commitments) | {t: bytes([9]) * 32 for t in ids[2:]}
    d = make_decision(keys[0], run_id=DEFAULT_RUN_ID, round=4, base=BASE, epoch=EPOCH, coordinator=ids[0],
                      contributors=dict(d.contributors), committed=committed)
    draws = round_draws(d, b"\x04" * 32, shapes=dict.fromkeys(ids, SHAPE), ledger=ledger,
                        is_member=set(ids[:2]).__contains__, spot=SpotConfig(rate=0.0))
    assert {x.target for x in draws} == {ids[2]}


def _agreement(tmp_path: Path, hub: MemoryHub, me: Identity, keys: list[str], *, verdicts: list[bytes],
               refutes=None, owed=None) -> RoundAgreement:
    return hub_agreement(tmp_path, hub, me, {"chain": {"trusted_trainers": keys}}, round=ROUND, epoch=EPOCH,
                         base=(BASE, W), shapes=SHAPES, verdicts=lambda r: (verdicts, []), refutes=refutes, owed=owed)


def _payload(trainer: str) -> bytes:
    p = LocoPayload(round=ROUND, trainer_id=trainer, base_hash=BASE, numel={"w": 64},
                    tensors={"w": (np.array([1, 5, 9], np.int64), np.array([1e-4, -1e-4, 1e-4], np.float32))})
    return encode_payload(p, base=W)


def test_a_key_failing_a_check_the_decision_names_enters_no_payload_that_round(tmp_path):
    """Members {me, b, x}; b's signed verdict says x failed its check of the last round. Our decision
    names that verdict and leaves x's revealed payload out (x is not counted unrevealed either);
    b's decision naming the verdict and x's payload both is refused here."""
    hub = MemoryHub()
    me, b, x = (Identity.generate() for _ in range(3))
    bid, xid = peer_id(b), peer_id(x)
    failed = VERDICTS.encode(make_verdict(b, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND - 1, target=xid,
                                          verifier=bid, reason="unanswered"))
    ag = _agreement(tmp_path, hub, me, [k.public_key_hex for k in (me, b, x)], verdicts=[failed])
    for k in (b, x):
        hub.join(peer_id(k), lambda request: None).publish(PeerStatus(role="trainer", version=ROUND,
                                                                      node_key=k.public_key_hex))
        commit_to(ag, k, peer_id(k), _payload(peer_id(k)), round=ROUND, base=BASE)
        ag.offer_payload(peer_id(k), _payload(peer_id(k)))
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(me), base_hash=BASE), _payload(peer_id(me)))
    d = ag._decide(ag._open, ag._live(), pull=False)
    assert d.verdicts == (failed,) and xid in d.commitments
    assert xid not in d.trainer_ids, "a key failing a check the decision names weighs in that round"
    members = set(d.trainer_ids)
    assert unrevealed(d.commitments, contributors=d.trainer_ids, members=members, ledger=ag.intake.ledger(),
                      failed={xid}) == ()
    held = {peer_id(k): commit_digest(ag.commits.of(ROUND, peer_id(k)).data) for k in (me, b, x)}
    theirs = make_decision(b, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=bid,
                           contributors={t: payload_digest(_payload(t)) for t in held}, committed=held,
                           verdicts=[failed])
    with pytest.raises(IntegrityError, match="does not let in"):
        ag.offer_decision(bid, encode_decision(theirs))
    ag.ctx.store.close()


def _hold_inner(ag: RoundAgreement, k: Identity, r: int, *, batches: int = 1) -> InnerCommitment:
    """Hold ``k``'s round ``r`` commitment (as the commit intake keeps one), carrying its signed inner
    commitment of 4 steps of ``batches`` batches each over the 64 weights of ``SHAPES``."""
    tid = peer_id(k)
    inner = inner_commitment(k, tid, run_id=DEFAULT_RUN_ID, round=r, base=BASE, payload=BASE, params=64,
                             settings=BASE, steps=4, batches=batches)
    c = make_commit(k, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=r, base=BASE, trainer=tid, payload=BASE, spot=inner)
    ag.commits.held.setdefault(r, {})[tid] = HeldCommit(encode_commit(c), c, time.monotonic())
    return decode_commitment(inner)


def _drawn(spot: SpotRounds, r: int, pairs: set[tuple[str, str]], inners: dict[str, InnerCommitment]) -> None:
    """What ``decided`` keeps of round ``r``'s draw: the keys whose draw is unknown here (none), the
    (target, verifier) pairs, and each target's answer bound (step 1 drawn)."""
    spot.drawn[r] = (set(), pairs)
    spot.caps |= {(r, t): spot._cap(inners[t], step=1) for t, _ in pairs}


def _publish(theirs: RoundAgreement, spot: SpotRounds, ag: RoundAgreement, tid: str, batches: list[bytes]) -> SpotAnswer:
    """``theirs`` (target ``tid``) publishes a round ``ROUND - 1`` answer of ``batches``; returns it
    once our ``spot`` (of agreement ``ag``) holds its receipt."""
    answer = SpotAnswer(ROUND - 1, tid, 1, RoundOpening(ROUND - 1, tid, (3,), ((b"\x00" * 16, (b"\x01" * 32,)),)),
                        batches, None)
    Answers(theirs.ctx, peers=theirs.peers, current_round=lambda: ROUND, epoch=lambda: EPOCH,
            cap=spot.answer_cap).publish(answer)

    def receipt_here() -> bool:
        ag.ctx.take_events({"spot_answer": spot.offer_answer}, wait_s=0.2)
        return (ROUND - 1, tid) in spot.answers.held

    wait_for(receipt_here, timeout=60, what="t's answer receipt")
    return answer


def test_a_published_answer_past_the_push_cap_is_fetched_and_no_answer_of_it_is_refused(tmp_path):
    """Members {v (us), t, l, n}. t publishes its answer of round 2, 49 MiB (past the 48 MiB a push
    carried; four batches of its step, within its commitment's bound): its signed receipt reaches us, we fetch the answer by digest from t, capped by the
    signed size. l's signed "no answer" of t is then refused here (a strike on l), and a decision
    of l naming it is refused (``refuted``); "no answer" of n, which signed a receipt but serves
    its answer to nobody, is taken."""
    hub, box = MemoryHub(), {}
    v, t, lie, n = (Identity.generate() for _ in range(4))
    keys = [k.public_key_hex for k in (v, t, lie, n)]
    tid, lid, nid = peer_id(t), peer_id(lie), peer_id(n)
    ag = _agreement(tmp_path, hub, v, keys, verdicts=[], refutes=lambda x, before: box["spot"].refutes(x, before=before))
    spot = box["spot"] = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag,
                                    ledger=ag.intake.ledger, states=dict)
    inners = {peer_id(k): _hold_inner(ag, k, ROUND - 1, batches=4) for k in (t, n)}
    _drawn(spot, ROUND - 1, {(tid, lid), (nid, lid)}, inners)  # l verifies t and n
    theirs = _agreement(tmp_path, hub, t, keys, verdicts=[])
    for k in (lie, n):
        hub.join(peer_id(k), lambda request: None).publish(PeerStatus(role="trainer", version=ROUND,
                                                                      node_key=k.public_key_hex))
    big = [bytes([i]) * (49 << 18) for i in range(4)]
    assert sum(map(len, big)) > PUSH_CAPS["loco"]
    answer = _publish(theirs, spot, ag, tid, big)
    forged = make_receipt(lie, run_id=DEFAULT_RUN_ID, epoch=EPOCH, data=b"x",
                          answer=SpotAnswer(ROUND - 1, nid, 1, answer.opening, [], None))
    with pytest.raises(IntegrityError, match="signature|signed"):  # only n's own key says n answered
        spot.offer_answer(lid, RECEIPTS.encode(forged))
    assert spot.answers.answered(ROUND - 1, nid) is None
    withheld = make_receipt(n, run_id=DEFAULT_RUN_ID, epoch=EPOCH, data=b"served to nobody",
                            answer=SpotAnswer(ROUND - 1, nid, 1, answer.opening, [], None))
    spot.offer_answer(nid, RECEIPTS.encode(withheld))  # n's own receipt, for an answer it serves nobody
    assert spot.answers.fetch(ROUND - 1, nid, until=time.monotonic() + 10) is None
    assert spot.answers.answered(ROUND - 1, nid) is None, "a receipt alone counted as an answer"
    spot.answers.pull(wait_s=60)  # every member holds a published answer (and serves it)
    wait_for(lambda: spot.answers.answered(ROUND - 1, tid) is not None, timeout=60, what="t's answer downloaded")
    got = spot.answers.fetch(ROUND - 1, tid, until=time.monotonic() + 60, tries=0)
    assert got is not None and got.batches == big and got.step == 1, "the published answer was not fetched"

    def no_answer(of: str) -> bytes:
        return VERDICTS.encode(make_verdict(lie, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND - 1, target=of,
                                            verifier=lid, reason="unanswered"))

    with pytest.raises(IntegrityError, match="receipt"):
        spot.offer_verdict(lid, no_answer(tid))
    assert ag.ctx.book.strikes.get(lid, 0) >= 1, "a lying verifier's no answer cost it nothing"
    spot.offer_verdict(lid, no_answer(nid))  # n served no answer: its verifier's word is taken
    assert spot.verdicts_for(ROUND)[0] == [no_answer(nid)]

    for k in (t, lie, n):
        commit_to(ag, k, peer_id(k), _payload(peer_id(k)), round=ROUND, base=BASE)
        ag.offer_payload(peer_id(k), _payload(peer_id(k)))
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(v), base_hash=BASE), _payload(peer_id(v)))
    spot.answers.have[ROUND - 1, tid] -= 60  # held long before the decision came
    held = {peer_id(k): commit_digest(ag.commits.of(ROUND, peer_id(k)).data) for k in (v, t, lie, n)}

    def decision(of: str, by: Identity) -> bytes:  # its failed verdict keeps ``of``'s payload out
        return encode_decision(make_decision(by, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH,
                                             coordinator=peer_id(by), contributors={k: payload_digest(_payload(k)) for k in held
                                                                            if k != of},
                                             committed=held, verdicts=[no_answer(of)]))

    ag.offer_decision(lid, decision(tid, lie))
    refused = ag.ctx.status.snapshot().trainer.decisions_refused
    assert ROUND not in ag.decisions and refused.get("refuted", 0) == 1, refused
    ag.offer_decision(nid, decision(nid, n))  # taken or parked by its turn, never refuted
    assert ag.ctx.status.snapshot().trainer.decisions_refused.get("refuted", 0) == 1
    spot.close()
    for a in (ag, theirs):
        a.ctx.store.close()


def test_a_decision_leaving_out_a_failed_verdict_with_evidence_held_in_time_is_refused(tmp_path):
    """Members {v (us), b, x}. b's check of x's round 1 failed on x's data (its evidence re-checked
    here: confirmed) before our round 3 opened. x, coordinating round 3, leaves that verdict out
    (so its own payload counts): refused (``omits_verdict``), both statements kept; b's decision
    naming it (and so leaving x's payload out) is not refused for it."""
    hub, box = MemoryHub(), {}
    v, b, x = (Identity.generate() for _ in range(3))
    bid, xid = peer_id(b), peer_id(x)
    ag = _agreement(tmp_path, hub, v, [k.public_key_hex for k in (v, b, x)], verdicts=[],
                    owed=lambda r, since: box["spot"].owed(r, since=since))
    spot = box["spot"] = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag,
                                    ledger=ag.intake.ledger, states=dict)
    for k in (b, x):
        hub.join(peer_id(k), lambda request: None).publish(PeerStatus(role="trainer", version=ROUND,
                                                                      node_key=k.public_key_hex))
    evidence = hold_evidence(spot, b, xid, Recheck.CONFIRMED, round=ROUND - 2)
    failed = VERDICTS.encode(make_verdict(b, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND - 2, target=xid,
                                          verifier=bid, reason="gradient", evidence=evidence))
    spot.offer_verdict(bid, failed)
    assert spot.owed(ROUND, since=time.monotonic() + 1) == {(ROUND - 2, xid, bid): failed}
    assert spot.owed(ROUND - 1, since=time.monotonic() + 1) == {}, "a verdict one round old is owed already"
    for k in (b, x):
        commit_to(ag, k, peer_id(k), _payload(peer_id(k)), round=ROUND, base=BASE)
        ag.offer_payload(peer_id(k), _payload(peer_id(k)))
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(v), base_hash=BASE), _payload(peer_id(v)))
    held = {peer_id(k): commit_digest(ag.commits.of(ROUND, peer_id(k)).data) for k in (v, b, x)}

    def decision(by: Identity, verdicts: list[bytes], out: tuple[str, ...] = ()) -> bytes:
        return encode_decision(make_decision(by, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH,
                                             coordinator=peer_id(by), committed=held, verdicts=verdicts, convicted=out,
                                             contributors={k: payload_digest(_payload(k)) for k in held if k not in out}))

    ag.offer_decision(xid, decision(x, []))
    refused = ag.ctx.status.snapshot().trainer.decisions_refused
    assert ROUND not in ag.decisions and refused.get("omits_verdict", 0) == 1, refused
    assert (tmp_path / peer_id(v) / "store" / "loco" / str(ROUND) / "omitted" / f"{xid[:32]}.msgpack").exists()
    ag.offer_decision(bid, decision(b, [failed], out=(xid,)))
    assert ag.ctx.status.snapshot().trainer.decisions_refused.get("omits_verdict", 0) == 1
    ag.ctx.store.close()


def test_a_verdict_of_a_check_nobody_drew_is_refused(tmp_path):
    """Members {v (us), b, c, x}; round 2's draw (as computed here) had b check x. c's signed failing
    verdict on x is refused here (a strike on c) and a decision of c naming it is refused
    (``refuted``): a member cannot keep a key out of a round by a check it was not drawn for; b's
    verdict is taken."""
    hub, box = MemoryHub(), {}
    v, b, c, x = (Identity.generate() for _ in range(4))
    bid, cid, xid = peer_id(b), peer_id(c), peer_id(x)
    ag = _agreement(tmp_path, hub, v, [k.public_key_hex for k in (v, b, c, x)], verdicts=[],
                    refutes=lambda w, before: box["spot"].refutes(w, before=before))
    spot = box["spot"] = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag,
                                    ledger=ag.intake.ledger, states=dict)
    for k in (b, c, x):
        hub.join(peer_id(k), lambda request: None).publish(PeerStatus(role="trainer", version=ROUND,
                                                                      node_key=k.public_key_hex))
    spot.drawn[ROUND - 1] = (set(), {(xid, bid)})  # what ``decided`` keeps of round 2's draw

    def failed(by: Identity) -> bytes:
        return VERDICTS.encode(make_verdict(by, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND - 1, target=xid,
                                            verifier=peer_id(by), reason="unanswered"))

    with pytest.raises(IntegrityError, match="nobody drew"):
        spot.offer_verdict(cid, failed(c))
    assert ag.ctx.book.strikes.get(cid, 0) >= 1
    spot.offer_verdict(bid, failed(b))
    assert spot.verdicts_for(ROUND)[0] == [failed(b)]
    for k in (b, c, x):
        commit_to(ag, k, peer_id(k), _payload(peer_id(k)), round=ROUND, base=BASE)
        ag.offer_payload(peer_id(k), _payload(peer_id(k)))
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(v), base_hash=BASE), _payload(peer_id(v)))
    held = {peer_id(k): commit_digest(ag.commits.of(ROUND, peer_id(k)).data) for k in (v, b, c, x)}
    d = make_decision(c, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=cid, committed=held,
                      contributors={k: payload_digest(_payload(k)) for k in held if k != xid}, verdicts=[failed(c)])
    ag.offer_decision(cid, encode_decision(d))
    refused = ag.ctx.status.snapshot().trainer.decisions_refused
    assert ROUND not in ag.decisions and refused.get("refuted", 0) == 1, refused
    ag.ctx.store.close()


def test_receipts_of_keys_no_draw_picked_are_neither_held_nor_fetched(tmp_path):
    """A receipt costs its signature check and nothing more unless its answer can matter: of a
    round drawn here, only the draw's targets' are held (and relayed, and downloaded); of a round
    not drawn yet, only those of keys whose commitment of that round is held here."""
    hub = MemoryHub()
    v, t, x = (Identity.generate() for _ in range(3))
    keys = [k.public_key_hex for k in (v, t, x)]
    tid, xid = peer_id(t), peer_id(x)
    ag = _agreement(tmp_path, hub, v, keys, verdicts=[])
    spot = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag, ledger=ag.intake.ledger, states=dict)
    _drawn(spot, ROUND - 1, {(tid, peer_id(v))}, {tid: _hold_inner(ag, t, ROUND - 1)})

    def receipt(k: Identity, r: int) -> bytes:
        a = SpotAnswer(r, peer_id(k), 1, RoundOpening(r, peer_id(k), (3,), ((b"\x00" * 16, (b"\x01" * 32,)),)), [], None)
        return RECEIPTS.encode(make_receipt(k, run_id=DEFAULT_RUN_ID, epoch=EPOCH, data=b"1 GiB, say", answer=a))

    spot.offer_answer(xid, receipt(x, ROUND - 1))  # drawn round, x not a target
    spot.offer_answer(tid, receipt(t, ROUND - 1))
    assert set(spot.answers.held) == {(ROUND - 1, tid)}
    spot.offer_answer(xid, receipt(x, ROUND))  # not drawn yet, no commitment of x held
    assert (ROUND, xid) not in spot.answers.held
    _hold_inner(ag, x, ROUND)
    spot.offer_answer(xid, receipt(x, ROUND))  # committed: its answer may be drawn
    assert (ROUND, xid) in spot.answers.held
    spot.drawn[ROUND] = (set(), set())  # drawn without x: no download, dropped at the next receipt
    spot.answers.pull(wait_s=60)
    assert (ROUND, xid) not in spot.answers.tried
    ag.ctx.store.close()


def test_a_receipt_signing_more_than_the_commitment_bounds_is_refused_and_nothing_is_fetched(tmp_path):
    """t, drawn at step 1, signs a receipt of 512 MiB (under the 1 GiB a receipt may sign): its
    commitment (4 steps of one batch, 64 weights) bounds its answer to one rollout batch, the
    opening and a patch, ~18 MiB. Refused (a strike on t: both are its signed word), nothing
    fetched; its receipt within the bound is then taken. Before the round is drawn here, the
    bound is over any step; without a commitment held, nothing is held."""
    hub, asked = MemoryHub(), []
    v, t, x = (Identity.generate() for _ in range(3))
    tid, xid = peer_id(t), peer_id(x)
    ag = _agreement(tmp_path, hub, v, [k.public_key_hex for k in (v, t, x)], verdicts=[])
    hub.join(tid, asked.append).publish(PeerStatus(role="trainer", version=ROUND, node_key=t.public_key_hex))
    spot = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag, ledger=ag.intake.ledger, states=dict)
    inner = _hold_inner(ag, t, ROUND - 1)
    _drawn(spot, ROUND - 1, {(tid, peer_id(v))}, {tid: inner})
    cap = spot.answer_cap(ROUND - 1, tid)
    assert cap is not None and 16 << 20 < cap < 20 << 20, cap

    def receipt(k: Identity, r: int, size: int) -> bytes:
        return RECEIPTS.encode(RECEIPTS.seal(k, AnswerReceipt(DEFAULT_RUN_ID, EPOCH, r, peer_id(k), b"\x05" * 32,
                                                               size, k.public_key_hex, b"")))

    with pytest.raises(IntegrityError, match="bounds the answer"):
        spot.offer_answer(tid, receipt(t, ROUND - 1, 512 << 20))
    assert (ROUND - 1, tid) not in spot.answers.held and ag.ctx.book.strikes.get(tid, 0) >= 1
    spot.answers.pull(wait_s=60)
    assert spot.answers.fetch(ROUND - 1, tid, until=time.monotonic() + 5) is None and asked == [], "fetched"
    spot.offer_answer(tid, receipt(t, ROUND - 1, cap))
    assert (ROUND - 1, tid) in spot.answers.held
    spot.answers.fetch(ROUND - 1, tid, until=time.monotonic() + 5, tries=1)
    wait_for(lambda: len(asked) == 1, timeout=30, what="the probe of what is fetched to see a fetch")
    assert spot.answer_cap(ROUND, xid) is None  # no commitment of x held: its receipt cannot matter here
    spot.offer_answer(xid, receipt(x, ROUND, 1 << 20))
    assert (ROUND, xid) not in spot.answers.held
    x_inner = _hold_inner(ag, x, ROUND)
    assert spot.answer_cap(ROUND, xid) == spot._cap(x_inner) > cap - 8  # not drawn yet: bounded at any step
    with pytest.raises(IntegrityError, match="bounds the answer"):
        spot.offer_answer(xid, receipt(x, ROUND, MAX_ANSWER_BYTES))
    spot.close()
    ag.ctx.store.close()


def test_a_stalled_answer_server_never_holds_the_trainer_loop_back(tmp_path):
    """t, drawn, published its answer; its server stalls every request until released (at most 5 s).
    What the loop calls (``pull`` for a member, ``fetch`` for t's verifier) only starts the download
    and returns at once; the answer is held once t serves it."""
    hub, release = MemoryHub(), threading.Event()
    v, t = Identity.generate(), Identity.generate()
    tid, keys = peer_id(t), [k.public_key_hex for k in (v, t)]
    ag = _agreement(tmp_path, hub, v, keys, verdicts=[])
    spot = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag, ledger=ag.intake.ledger, states=dict)
    _drawn(spot, ROUND - 1, {(tid, peer_id(v))}, {tid: _hold_inner(ag, t, ROUND - 1)})
    theirs = _agreement(tmp_path, hub, t, keys, verdicts=[])
    serve = hub.resolvers[tid]
    hub.resolvers[tid] = lambda request: (release.wait(5.0), serve(request))[1]
    _publish(theirs, spot, ag, tid, [b"batch"])
    t0 = time.monotonic()
    spot.answers.pull(wait_s=60)
    early = spot.answers.fetch(ROUND - 1, tid, until=time.monotonic() + 60)
    assert time.monotonic() - t0 < 1.0, f"the loop waited {time.monotonic() - t0:.1f} s on a stalled server"
    assert early is None
    release.set()
    wait_for(lambda: spot.answers.answered(ROUND - 1, tid) is not None, timeout=60, what="t's answer downloaded")
    got = spot.answers.fetch(ROUND - 1, tid, until=time.monotonic() + 60)
    assert got is not None and got.batches == [b"batch"]
    spot.close()
    for a in (ag, theirs):
        a.ctx.store.close()


def test_a_target_stalling_its_verifier_leaves_it_time_to_fetch_the_answer_from_a_member(tmp_path):
    """Members {v (us), t, m}; v verifies t, whose answer m holds. t stalls v's download for the
    whole time it is given (and would serve the others, who then refute v's "no answer": a strike
    on an honest verifier). A try gets at most half the wait left, so v asks m in time."""
    hub = MemoryHub()
    v, t, m = (Identity.generate() for _ in range(3))
    tid, keys = peer_id(t), [k.public_key_hex for k in (v, t, m)]
    ag = _agreement(tmp_path, hub, v, keys, verdicts=[])
    spot = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag, ledger=ag.intake.ledger, states=dict)
    _drawn(spot, ROUND - 1, {(tid, peer_id(v))}, {tid: _hold_inner(ag, t, ROUND - 1)})
    theirs, member = (_agreement(tmp_path, hub, k, keys, verdicts=[]) for k in (t, m))
    answer = SpotAnswer(ROUND - 1, tid, 1, RoundOpening(ROUND - 1, tid, (3,), ((b"\x00" * 16, (b"\x01" * 32,)),)),
                        [b"batch"], None)
    Answers(theirs.ctx, peers=theirs.peers, current_round=lambda: ROUND, epoch=lambda: EPOCH,
            cap=spot.answer_cap).publish(answer)
    digest = blake3.blake3(encode_answer(answer)).hexdigest()
    held = loco_payload_path(member.ctx.store.root, ROUND - 1, digest)
    held.parent.mkdir(parents=True, exist_ok=True)
    held.write_bytes(encode_answer(answer))  # m pulled it

    def receipt_here() -> bool:
        ag.ctx.take_events({"spot_answer": spot.offer_answer}, wait_s=0.2)
        return (ROUND - 1, tid) in spot.answers.held

    wait_for(receipt_here, timeout=60, what="t's answer receipt")
    fetch, stalled = ag.ctx.transport.fetch, []

    def stalling(peer, request, dest, *, timeout, max_bytes=None):
        if peer.peer_id != tid:
            return fetch(peer, request, dest, timeout=timeout, max_bytes=max_bytes)
        stalled.append(timeout)
        time.sleep(timeout)
        raise PeerUnavailable("t stalled the download until its timeout")

    ag.ctx.transport.fetch = stalling
    until = time.monotonic() + 3.0
    assert spot.answers.fetch(ROUND - 1, tid, until=until) is None
    wait_for(lambda: spot.answers.answered(ROUND - 1, tid) is not None or time.monotonic() > until + 1, timeout=30,
             what="v's download to end")
    assert stalled and (spot.answers.answered(ROUND - 1, tid) or float("inf")) < until, \
        f"v did not get t's answer from m within its wait (t stalled it {stalled} s)"
    spot.close()
    for a in (ag, theirs, member):
        a.ctx.store.close()
