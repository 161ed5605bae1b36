"""A decision may not name a round commitment this member cannot check (issue 32, ``trainer/decisions.py``).

A member that lacks a commitment a decision names fetches it by its digest (``loco_commit``) from
the decision's sender, its coordinator, the trainer, then the other live members, and checks it as
a pushed one is checked before it accepts the decision. A hostile coordinator naming a partner's
commitment honest members never saw (one without inner steps, or on other terms, or forged) is
refused (``bad_commitment``), both signed statements kept, and the next coordinator decides without
the partner's payload; a member that merely missed a good commitment fetches it and accepts the
decision; one it cannot get parks the decision (not held back: a round most members closed with it
re-syncs us). Agreements under real libp2p peer ids on one in-memory hub, stepped by hand, in a
keyed swarm that runs spot checks (``test_node_spot_required.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
from helpers import hub_agreement
from test_node_open_trainers import BASE, EPOCH, ROUND, SHAPES, W, _payload
from test_node_spot_required import SETTINGS, _commit

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.serving import loco_commit_path
from pulse_node.loco.decision import decode_decision, encode_decision, make_decision, payload_digest
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.roundcommit import commit_digest, decode_commit, encode_commit, make_commit
from pulse_node.net.wire.protocol import LocoCommitRequest
from pulse_node.net.wire.serving import resolve, store_resolver
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.decisions import coordinator_order
from pulse_node.vocab import DEFAULT_RUN_ID


@dataclass
class Round:
    """Member ``me`` (an agreement), coordinator ``c`` (first in the round's order; it serves
    commitments from ``store``) and partner ``p``; ``me`` holds its own and ``c``'s commitments and
    payloads, never ``p``'s commitment."""

    ag: RoundAgreement
    c: Identity
    p: Identity
    store: Path

    @property
    def ids(self) -> tuple[str, str, str]:
        return self.ag.me, peer_id(self.c), peer_id(self.p)

    def serve(self, commitment: bytes) -> None:
        """The coordinator serves ``commitment`` by its digest (as an honest trainer holding it does)."""
        path = loco_commit_path(self.store, ROUND, commit_digest(commitment).hex())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(commitment)

    def decide(self, partner_commit: bytes, *, partner_payload: bytes | None = None) -> bytes:
        """The coordinator's signed decision naming every payload, ``p``'s commitment as ``partner_commit``."""
        mid, cid, pid = self.ids
        payload = partner_payload if partner_payload is not None else _payload(pid)
        return encode_decision(make_decision(
            self.c, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=cid,
            contributors={mid: payload_digest(_payload(mid)), cid: payload_digest(_payload(cid)),
                          pid: payload_digest(payload)},
            committed={mid: commit_digest(self.ag.commits.of(ROUND, mid).data), cid: commit_digest(_commit(self.c)),
                       pid: commit_digest(partner_commit)}))

    def refused(self) -> dict[str, int]:
        return dict(self.ag.ctx.status.snapshot().trainer.decisions_refused)


@pytest.fixture
def rnd(tmp_path):
    keys = [Identity.generate() for _ in range(3)]
    by_id = {peer_id(k): k for k in keys}
    c, me, p = (by_id[i] for i in coordinator_order(DEFAULT_RUN_ID, ROUND, by_id))
    hub, store = MemoryHub(), tmp_path / "c-store"
    ag = hub_agreement(tmp_path, hub, me, {"loco": {"inner_steps": 4, "decision_wait_s": 0.4,
                                                    "spot": {"keyed": True, "rate": 0.3}},
                                           "chain": {"trusted_trainers": [k.public_key_hex for k in keys]}},
                       round=ROUND, epoch=EPOCH, base=(BASE, W), shapes=SHAPES, inner_settings=lambda: SETTINGS)
    for ident, resolver in ((c, store_resolver(store)), (p, lambda request: None)):
        hub.join(peer_id(ident), resolver).publish(PeerStatus(role="trainer", version=ROUND,
                                                              node_key=ident.public_key_hex))
    r = Round(ag, c, p, store)
    mid, cid, _ = r.ids
    ag.offer_commit(cid, _commit(c))
    ag.offer_payload(cid, _payload(cid))
    ag.open_round(LocoPayload(round=ROUND, trainer_id=mid, base_hash=BASE), _payload(mid))
    yield r
    ag.ctx.store.close()


def _forged(r: Round) -> bytes:
    """A commitment in the partner's name signed by another key."""
    pid = r.ids[2]
    good = decode_commit(_commit(r.p))
    return encode_commit(make_commit(Identity.generate(), run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND, base=BASE,
                                     trainer=pid, payload=good.payload, spot=good.spot))


@pytest.mark.parametrize(("bad", "struck"), [
    (lambda r: _commit(r.p, inner=False), False),  # no inner commitment: no check could ever be drawn on p
    (lambda r: _commit(r.p, steps=5), False),  # more steps than a round has
    (_forged, True),  # no commitment of p at all: no honest coordinator holds it
])
def test_a_decision_naming_a_commitment_that_fails_our_checks_is_refused(rnd, bad, struck):
    """The hole of issue 32: the hostile coordinator names the partner's commitment that honest
    members refused (or never saw), so its payload would be averaged with no check drawable on it."""
    r, (mid, cid, pid) = rnd, rnd.ids
    commitment = bad(r)
    r.serve(commitment)
    data = r.decide(commitment)
    r.ag.offer_decision(cid, data)
    assert ROUND not in r.ag.decisions, "a decision naming a commitment that fails our checks was accepted"
    assert r.refused() == {"bad_commitment": 1} and r.ag.commits.of(ROUND, pid) is None
    assert r.ag.ctx.book.strikes[cid] == (1 if struck else 0)
    kept = r.ag.root / "loco" / str(ROUND) / "omitted" / f"{cid[:32]}.msgpack"
    decision, named = msgpack.unpackb(kept.read_bytes())
    assert decision == data and named == commitment
    assert r.ag._held_back(ROUND), "a peer applying the refused decision would make us re-sync onto it"
    r.ag.intake.replay_parked(ROUND)
    assert ROUND not in r.ag.decisions and r.refused() == {"bad_commitment": 1}  # counted once
    d = r.ag._decide(r.ag._open, r.ag._live(), pull=False)  # the next coordinator in turn: here, us
    assert d is not None and pid not in d.trainer_ids and d.trainer_ids == sorted([mid, cid])


def test_a_decision_naming_a_payload_its_fetched_commitment_is_not_to_is_refused(rnd):
    r, (_, cid, pid) = rnd, rnd.ids
    good = _commit(r.p)
    r.serve(good)
    r.ag.offer_decision(cid, r.decide(good, partner_payload=_payload(pid, value=2e-4)))
    assert ROUND not in r.ag.decisions and r.refused() == {"bad_commitment": 1}
    assert r.ag.ctx.book.strikes[cid] == 1


def test_a_member_that_missed_a_good_commitment_fetches_it_and_accepts_the_decision(rnd):
    """Partitions stay tolerated: the commitment is fetched, checked, held (never in time, so no
    later decision must name it) and served by us too; the decision is accepted."""
    r, (_, cid, pid) = rnd, rnd.ids
    good = _commit(r.p)
    r.serve(good)
    r.ag.offer_decision(cid, r.decide(good))
    assert ROUND in r.ag.decisions and r.refused() == {}
    held = r.ag.commits.of(ROUND, pid)
    assert held is not None and held.data == good and held.at == math.inf
    assert r.ag.ctx.status.snapshot().trainer.commits_fetched == 1
    served = resolve(r.ag.root, LocoCommitRequest(round=ROUND, digest=commit_digest(good).hex()))
    assert served is not None and served.read_bytes() == good
    assert r.ag.intake._omission(r.ag.decisions[ROUND], r.ag._open, elsewhere=False) is None


def test_a_commitment_nobody_serves_parks_the_decision_until_it_can_be_fetched(rnd):
    """Not obtainable: not accepted (the hole stays closed), not refused (it may be a partition), not
    held back (once most live members closed the round with it, we re-sync rather than decide it
    again); fetched again at most every ``decision_wait_s / 2``, and taken once it is served."""
    r, (_, cid, pid) = rnd, rnd.ids
    good = _commit(r.p)
    data = r.decide(good)
    r.ag.offer_decision(cid, data)
    assert ROUND not in r.ag.decisions and r.refused() == {}
    assert cid in r.ag.intake.parked[ROUND] and not r.ag._held_back(ROUND)
    r.serve(good)
    r.ag.intake.replay_parked(ROUND)
    assert ROUND not in r.ag.decisions, "fetched again at once (a stalling coordinator would hold the loop)"
    r.ag.intake.fetch.tried.clear()  # as decision_wait_s / 2 later
    r.ag.intake.replay_parked(ROUND)
    assert ROUND in r.ag.decisions and decode_decision(data) == r.ag.decisions[ROUND]
    assert r.ag.commits.of(ROUND, pid).data == good and not r.ag._held_back(ROUND)
