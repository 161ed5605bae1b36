"""Who a failed spot check with evidence convicts, in the real round (``trainer/spot_round.py``,
``trainer/decisions.py``; issue 32: a colluding minority gets no honest trainer excluded):

- a verdict names the evidence of its own accusation (round, target, accuser): a member's failed
  verdict on an honest key naming evidence that convicts another key is refused, convicts nobody,
  and is owed by no decision;
- a decision convicts whom this member's own re-check of the evidence convicts: a member's decision
  convicting the target of its own false accusation is refused (``refuted``), one convicting the
  accuser is taken; one convicting by evidence not re-checked here yet waits for the re-check.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import blake3
import numpy as np
import pytest
from helpers import commit_to, hold_evidence, hub_agreement, inner_commitment

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.errors import IntegrityError, PulseError
from pulse_node.loco.commitlist import VERDICTS, make_verdict
from pulse_node.loco.decision import encode_decision, make_decision, payload_digest
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.loco.roundcommit import commit_digest, encode_commit, make_commit
from pulse_node.loco.spot_evidence import Accusation, encode_evidence, make_evidence, sign_accusation
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.commits import HeldCommit
from pulse_node.trainer.decisions import coordinator_order
from pulse_node.trainer.spot_evidence import Recheck
from pulse_node.trainer.spot_round import SpotRounds
from pulse_node.vocab import DEFAULT_RUN_ID

ROUND = 3
BASE = b"\x01" * 32
EPOCH = b"\x0e" * 32
SHAPES = {"w": (64,)}
W = {"w": (np.random.default_rng(0).standard_normal(64) * 0.02).astype(np.float32)}


def _world(tmp_path: Path, keys: list[Identity]) -> tuple[MemoryHub, RoundAgreement, SpotRounds]:
    """Members ``keys`` (the first is us, the others announced as trainers), our agreement and spot
    rounds wired as a trainer wires them."""
    hub, box = MemoryHub(), {}
    ag = hub_agreement(tmp_path, hub, keys[0], {"chain": {"trusted_trainers": [k.public_key_hex for k in keys]}},
                       round=ROUND, epoch=EPOCH, base=(BASE, W), shapes=SHAPES, verdicts=lambda r: ([], []),
                       refutes=lambda v, before: box["spot"].refutes(v, before=before),
                       owed=lambda r, since: box["spot"].owed(r, since=since),
                       culprit=lambda v: box["spot"].culprit(v))  # noqa: PLW0108 (spot: made next)
    spot = box["spot"] = SpotRounds(ag.ctx, engine=SimpleNamespace(shapes=SHAPES), agreement=ag,
                                    ledger=ag.intake.ledger, states=dict)
    for k in keys[1:]:
        hub.join(peer_id(k), lambda request: None).publish(PeerStatus(role="trainer", version=ROUND,
                                                                      node_key=k.public_key_hex))
    return hub, ag, spot


def _evidence(spot: SpotRounds, accuser: Identity, target: str, outcome: Recheck) -> bytes:
    return hold_evidence(spot, accuser, target, outcome, round=ROUND - 2)


def _failed(by: Identity, target: str, evidence: bytes, *, r: int = ROUND - 2) -> bytes:
    return VERDICTS.encode(make_verdict(by, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=r, target=target,
                                        verifier=peer_id(by), reason="gradient", evidence=evidence))


def _payload(trainer: str) -> bytes:
    p = LocoPayload(round=ROUND, trainer_id=trainer, base_hash=BASE, numel={"w": 64},
                    tensors={"w": (np.array([1, 5, 9], np.int64), np.array([1e-4, -1e-4, 1e-4], np.float32))})
    return encode_payload(p, base=W)


def _open(ag: RoundAgreement, me: Identity, others: list[Identity]) -> dict[str, bytes]:
    """Open round ``ROUND`` here with every other member committed and revealed; the commitments held."""
    for k in others:
        commit_to(ag, k, peer_id(k), _payload(peer_id(k)), round=ROUND, base=BASE)
        ag.offer_payload(peer_id(k), _payload(peer_id(k)))
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(me), base_hash=BASE), _payload(peer_id(me)))
    return {peer_id(k): commit_digest(ag.commits.of(ROUND, peer_id(k)).data) for k in (me, *others)}


def _decision(by: Identity, held: dict[str, bytes], verdicts: list[bytes], convicted: tuple[str, ...],
              out: tuple[str, ...] = ()) -> bytes:
    return encode_decision(make_decision(by, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH,
                                         coordinator=peer_id(by), committed=held, verdicts=verdicts, convicted=convicted,
                                         contributors={k: payload_digest(_payload(k)) for k in held if k not in out}))


def _refuted(ag: RoundAgreement) -> int:
    return ag.ctx.status.snapshot().trainer.decisions_refused.get("refuted", 0)


def test_a_verdict_naming_the_evidence_of_another_check_convicts_nobody(tmp_path):
    """Members {v (us), b, m, x, t}. b's check of x's round 1 failed, its evidence re-checked here:
    confirmed. m, drawn to check honest t in that round, signs a failed verdict on t naming b's
    evidence (an accusation of x by b). It is refused here (a strike on m); our decisions name b's
    verdict and convict x only; no decision owes m's; m's decision naming it is refused."""
    v, b, m, x, t = keys = [Identity.generate() for _ in range(5)]
    bid, mid, xid, tid = map(peer_id, (b, m, x, t))
    _, ag, spot = _world(tmp_path, keys)
    spot.drawn[ROUND - 2] = (set(), {(xid, bid), (tid, mid)})
    evidence = _evidence(spot, b, xid, Recheck.CONFIRMED)
    spot.offer_verdict(bid, _failed(b, xid, evidence))
    with pytest.raises(IntegrityError):
        spot.offer_verdict(mid, _failed(m, tid, evidence))
    assert ag.ctx.book.strikes.get(mid, 0) >= 1, "a verdict naming another check's evidence cost its verifier nothing"
    spot.verdicts[(ROUND - 2, tid, mid)] = (VERDICTS.decode(_failed(m, tid, evidence)), _failed(m, tid, evidence))
    spot.arrived[(ROUND - 2, tid, mid)] = time.monotonic() - 60  # as if relayed before the rule: still worth nothing
    named, convicted = spot.verdicts_for(ROUND)
    assert named == [_failed(b, xid, evidence)] and convicted == [xid], "an honest key convicted by another's evidence"
    assert set(spot.owed(ROUND, since=time.monotonic() + 1)) == {(ROUND - 2, xid, bid)}
    held = _open(ag, v, [b, m, x, t])
    ag.offer_decision(mid, _decision(m, held, [_failed(b, xid, evidence), _failed(m, tid, evidence)], (xid, tid),
                                     out=(xid, tid)))
    assert ROUND not in ag.decisions and _refuted(ag) == 1
    ag.ctx.store.close()


def test_a_decision_convicts_whom_our_own_recheck_convicts(tmp_path):
    """Members {v (us), b, m, t, c}. m, drawn to check honest t, files evidence that our re-check finds
    false. m's decision naming its verdict and convicting t is refused (``refuted``); b's convicting
    m (t's payload counting) is not refused for it. c (first in the round's order) convicting t by
    evidence not re-checked here yet is parked until the re-check, not taken."""
    while True:
        v, b, m, t, c = keys = [Identity.generate() for _ in range(5)]
        if coordinator_order(DEFAULT_RUN_ID, ROUND, map(peer_id, keys))[0] == peer_id(c):
            break
    bid, mid, tid, cid = map(peer_id, (b, m, t, c))
    _, ag, spot = _world(tmp_path, keys)
    spot.drawn[ROUND - 2] = (set(), {(tid, mid)})
    evidence = _evidence(spot, m, tid, Recheck.FALSE_ACCUSATION)
    spot.offer_verdict(mid, _failed(m, tid, evidence))
    assert spot.verdicts_for(ROUND)[1] == [mid]
    held = _open(ag, v, [b, m, t, c])
    ag.offer_decision(mid, _decision(m, held, [_failed(m, tid, evidence)], (tid,), out=(tid,)))
    assert ROUND not in ag.decisions and _refuted(ag) == 1, "a member convicted an honest key by its false evidence"
    ag.offer_decision(bid, _decision(b, held, [_failed(m, tid, evidence)], (mid,), out=(mid,)))
    assert _refuted(ag) == 1  # taken or parked by its turn, never refuted
    unseen = _failed(m, tid, b"\x0c" * 32, r=ROUND - 1)  # its evidence never reached us
    spot.drawn[ROUND - 1] = (set(), {(tid, mid)})
    ag.table.decisions.pop(ROUND, None)
    ag.intake.parked.clear()
    ag.offer_decision(cid, _decision(c, held, [_failed(m, tid, evidence), unseen], (mid, tid), out=(mid, tid)))
    assert ROUND not in ag.decisions, "a conviction taken on evidence nobody here re-checked"
    assert cid in ag.intake.parked.get(ROUND, {}) and _refuted(ag) == 1
    ag.ctx.store.close()


def test_evidence_is_held_once_per_drawn_check_of_a_recent_round_and_signed_by_its_accuser(tmp_path):
    """Members {v (us), m, t, x}; round 1's draw had m check t. Evidence costs a re-check (about an
    inner step) and up to 48 MiB held, so a member's pushes are bounded by its drawn checks: m's
    evidence against t is held once (a second, different one of that check is dropped), its
    evidence against x (a check nobody drew) and evidence of a round out of the window are refused, as is
    evidence whose accusation its accuser did not sign; nothing of these is held or relayed, and of
    what is held only the accusation outlives its re-check (not its exhibits)."""
    v, m, t, x = keys = [Identity.generate() for _ in range(4)]
    mid, tid, xid = map(peer_id, (m, t, x))
    _, ag, spot = _world(tmp_path, keys)
    spot.drawn[ROUND - 2] = (set(), {(tid, mid), (xid, peer_id(v))})

    opening = b"o" * (1 << 20)

    def evidence(target: str, *, r: int = ROUND - 2, keep: float = 1.0, signer: Identity = m) -> bytes:
        a = sign_accusation(signer, Accusation(run_id=DEFAULT_RUN_ID, round=r, target=target, accuser=mid, signer="",
                                               step=1, leaves=(0,), reason="gradient", keep=keep, commitment=b"c",
                                               next_commitment=b"", exhibits=(("opening", blake3.blake3(opening).digest()),)))
        return encode_evidence(make_evidence(a, {"opening": opening}))

    spot.offer_evidence(mid, evidence(tid))
    assert len(spot.evidence) == 1 and not next(iter(spot.evidence.values())).exhibits, "exhibits held past the re-check"
    spot.offer_evidence(mid, evidence(tid, keep=0.5))  # the same check accused twice: one re-check
    for bad in (evidence(xid), evidence(tid, r=ROUND + 40), evidence(tid, signer=x)):
        with pytest.raises(PulseError):
            spot.offer_evidence(mid, bad)
    assert len(spot.evidence) == 1, "evidence held (and re-checked) past the checks its accuser was drawn for"
    assert ag.ctx.book.strikes.get(mid, 0) >= 1
    ag.ctx.store.close()


def test_a_verdict_on_a_key_no_check_of_the_round_could_draw_is_refused(tmp_path):
    """Members {v (us), m}; round 1's decision named the commitments of v, m, n (an open newcomer
    the entry draw left out: not a contributor, so no check of it could be drawn; held here) and u
    (not held here). m's signed "no answer" of n, and of z (named by no commitment that round), are
    refused (a strike on m) and never named: one member cannot make an honest key owing, nor fill
    decisions with verdicts, by checks nobody could draw. m's verdict on u is taken (we cannot tell)."""
    v, m, n, u, z = keys = [Identity.generate() for _ in range(5)]
    mid, nid, uid, zid = map(peer_id, (m, n, u, z))
    _, ag, spot = _world(tmp_path, keys[:2])
    r = ROUND - 2
    held = {tid: _hold_inner(ag, k, r) for k, tid in ((m, mid), (n, nid))}
    d = make_decision(v, run_id=DEFAULT_RUN_ID, round=r, base=BASE, epoch=EPOCH, coordinator=peer_id(v),
                      contributors={peer_id(v): b"\x03" * 32, mid: b"\x04" * 32},
                      committed={peer_id(v): b"\x05" * 32, uid: b"\x06" * 32,
                                 **{t: commit_digest(ag.commits.of(r, t).data) for t in held}})
    spot._draw(d, b"\x09" * 32)

    def no_answer(of: str) -> bytes:
        return VERDICTS.encode(make_verdict(m, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=r, target=of, verifier=mid,
                                            reason="unanswered"))

    for of in (nid, zid):
        with pytest.raises(IntegrityError, match="nobody drew"):
            spot.offer_verdict(mid, no_answer(of))
    assert ag.ctx.book.strikes.get(mid, 0) >= 2
    spot.offer_verdict(mid, no_answer(uid))
    assert spot.verdicts_for(ROUND)[0] == [no_answer(uid)]
    ag.ctx.store.close()


def _hold_inner(ag: RoundAgreement, k: Identity, r: int) -> None:
    """Hold ``k``'s round ``r`` commitment carrying a signed inner commitment (4 steps of one batch)."""
    tid = peer_id(k)
    inner = inner_commitment(k, tid, run_id=DEFAULT_RUN_ID, round=r, base=BASE, payload=BASE, params=64,
                             settings=BASE, steps=4)
    c = make_commit(k, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=r, base=BASE, trainer=tid, payload=BASE, spot=inner)
    ag.commits.held.setdefault(r, {})[tid] = HeldCommit(encode_commit(c), c, time.monotonic())


def test_evidence_the_recheck_queue_cannot_take_is_inconclusive_and_never_waited_for(tmp_path):
    """A decision convicting by evidence we have not re-checked waits for our re-check; evidence our
    re-check queue is too full to take is judged inconclusive at once (the coordinator's word is
    taken, as for a round we do not hold), so no decision waits on a re-check that never comes."""
    _, m, t = keys = [Identity.generate() for _ in range(3)]
    mid, tid = peer_id(m), peer_id(t)
    _, ag, spot = _world(tmp_path, keys)
    spot.drawn[ROUND - 2] = (set(), {(tid, mid)})
    spot.bases[ROUND - 2] = (SimpleNamespace(version=0, bf16=None), {})  # we hold the round
    spot.worker = SimpleNamespace(recheck=lambda *args, **kw: False, close=lambda: None)  # its queue is full
    a = sign_accusation(m, Accusation(run_id=DEFAULT_RUN_ID, round=ROUND - 2, target=tid, accuser=mid, signer="",
                                      step=1, leaves=(0,), reason="gradient", keep=1.0, commitment=b"c",
                                      next_commitment=b"", exhibits=()))
    data = encode_evidence(make_evidence(a, {}))
    spot.offer_evidence(mid, data)
    assert spot.culprit(VERDICTS.decode(_failed(m, tid, blake3.blake3(data).digest()))) == "", "waits for a re-check never queued"
    ag.ctx.store.close()


def test_verdicts_on_a_round_not_drawn_yet_are_bounded_and_dropped_by_its_draw(tmp_path):
    """Members {v (us), m}; m signs "no answer" verdicts of round 1 before we drew it, on made-up
    keys: we hold no more of them than one verifier can be drawn for in a round, and once we draw
    the round, those its draw did not make are dropped (none is ever named)."""
    v, m = keys = [Identity.generate() for _ in range(2)]
    mid = peer_id(m)
    _, ag, spot = _world(tmp_path, keys)
    r = ROUND - 2

    def no_answer(of: str) -> bytes:
        return VERDICTS.encode(make_verdict(m, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=r, target=of, verifier=mid,
                                            reason="unanswered"))

    cap = spot._checks_per_verifier()
    for i in range(cap):
        spot.offer_verdict(mid, no_answer(f"made-up-{i:04d}"))
    with pytest.raises(PulseError, match="more than one verifier"):
        spot.offer_verdict(mid, no_answer("one-too-many"))
    assert len(spot.verdicts) == cap
    d = make_decision(v, run_id=DEFAULT_RUN_ID, round=r, base=BASE, epoch=EPOCH, coordinator=peer_id(v),
                      contributors={peer_id(v): b"\x03" * 32, mid: b"\x04" * 32},
                      committed={peer_id(v): b"\x05" * 32, mid: b"\x06" * 32})
    spot._draw(d, b"\x09" * 32)
    assert spot.verdicts == {} and spot.verdicts_for(ROUND)[0] == []
    ag.ctx.store.close()
