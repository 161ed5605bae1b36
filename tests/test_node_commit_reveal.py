"""Commit-reveal in the real round (``trainer/commits.py``, ``trainer/agreement.py``, ``trainer/decisions.py``).

Agreements over one in-memory hub, stepped by hand: a payload is revealed (pushed, served) only
once the commit phase closed; a payload that is not the one its sender committed to is refused;
a coordinator whose decision leaves out a commitment held in time is refused by every other
trainer, which keeps both signed statements, and the next coordinator's decision names it.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from helpers import gather
from test_node_agreement import _drive, _trainer_agreement

from pulse_node.chain.peer import PeerStatus
from pulse_node.errors import IntegrityError
from pulse_node.loco.decision import decode_decision, payload_digest
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.loco.roundcommit import commit_digest, decode_commit
from pulse_node.net.wire.protocol import LocoPayloadRequest
from pulse_node.net.wire.serving import resolve
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.decisions import coordinator_order
from pulse_node.vocab import DEFAULT_RUN_ID

NAMES = ("trainer-a", "trainer-b", "trainer-c")


def _payload(name: str, i: int, value: float | None = None) -> tuple[LocoPayload, bytes]:
    p = LocoPayload(round=3, trainer_id=name, base_hash=b"\x01" * 32, numel={"w": 4},
                    tensors={"w": (np.array([i], np.int64), np.array([0.5 + i if value is None else value], np.float32))})
    return p, encode_payload(p)


class _Dropping(RoundAgreement):
    """A coordinator that leaves ``victim``'s commitment and payload out of its decisions (tests only)."""

    victim = ""

    def _decide(self, o, live, *, pull):
        self.inbox.get(o.round, {}).pop(self.victim, None)
        self.commits.held.get(o.round, {}).pop(self.victim, None)
        return super()._decide(o, live, pull=pull)


def _events(ag: RoundAgreement, count: int) -> list:
    """The next ``count`` pushes to ``ag`` (pushes go out in the background)."""
    return gather(lambda: ag.ctx.transport.events(wait_s=0.05), count=count, timeout=30, what="pushes")


def test_a_payload_is_revealed_only_after_the_commit_phase_and_must_match_its_commitment(tmp_path):
    hub = MemoryHub()
    a, b = (_trainer_agreement(tmp_path, hub, n, deadline_s=60.0, decision_wait_s=5.0) for n in NAMES[:2])
    mine_a, data_a = _payload(NAMES[0], 0)
    a.open_round(mine_a, data_a)
    assert a.step() is None  # b has not committed: a waits, revealing nothing
    digest = payload_digest(data_a)
    served = resolve(a.root, LocoPayloadRequest(round=3, digest=digest.hex()))
    assert served is not None and not served.exists()  # not served before it is revealed
    got = _events(b, 1)
    assert [ev.kind for ev in got] == ["loco_commit"]
    assert decode_commit(got[0].data).payload == digest
    b.offer_commit(NAMES[0], got[0].data)
    mine_b, data_b = _payload(NAMES[1], 1)
    b.open_round(mine_b, data_b)
    for ev in _events(a, 1):
        a.offer_commit(ev.sender, ev.data)
    assert a.step() is None and a._open.revealed  # every live member committed: revealed
    assert resolve(a.root, LocoPayloadRequest(round=3, digest=digest.hex())).read_bytes() == data_a
    assert [ev.kind for ev in _events(b, 1)] == ["loco"]
    _, other = _payload(NAMES[0], 0, value=9.0)  # not what a committed to
    with pytest.raises(IntegrityError, match="not the one it committed to"):
        b.offer_payload(NAMES[0], other)
    assert NAMES[0] not in b.inbox.get(3, {}) and b.refused[3][NAMES[0]] == payload_digest(other)
    assert b.ctx.status.snapshot().trainer.loco_refused == {"uncommitted": 1}
    for ag in (a, b):
        ag.ctx.store.close()


def test_a_decision_leaving_out_a_commitment_is_refused_and_the_next_coordinator_decides(tmp_path):
    hub = MemoryHub()
    order = coordinator_order(DEFAULT_RUN_ID, 3, NAMES)
    dropper, second, victim = order
    agreements = {n: _trainer_agreement(tmp_path, hub, n, deadline_s=1.0, decision_wait_s=0.5) for n in NAMES}
    agreements[dropper].__class__ = _Dropping
    agreements[dropper].victim = victim  # type: ignore[attr-defined]
    for i, (name, ag) in enumerate(agreements.items()):
        ag.open_round(*_payload(name, i))
    results = _drive(agreements)
    assert results[dropper].decision.coordinator == dropper and victim not in results[dropper].decision.trainer_ids
    for name in (second, victim):
        r = results[name]
        assert r.decision.coordinator == second, "the dropping coordinator's decision was accepted"
        assert r.decision.trainer_ids == sorted(NAMES) and len(r.payloads) == 3
        held = agreements[name].commits.of(3, victim)
        assert r.decision.commitments[victim] == commit_digest(held.data)
        st = agreements[name].ctx.status.snapshot().trainer
        assert st.decisions_refused == {"omits_commitment": 1}, st.decisions_refused
        kept = agreements[name].root / "loco" / "3" / "omitted" / f"{dropper[:32]}.msgpack"
        decision, commitment = msgpack.unpackb(kept.read_bytes())
        assert decode_decision(decision).coordinator == dropper and decode_commit(commitment).trainer == victim
    for ag in agreements.values():
        ag.ctx.store.close()


def test_a_trainer_joining_a_round_decided_before_it_came_takes_the_decision(tmp_path):
    """A trainer that (re)joins while a round is being decided without it commits too late: the
    decision it pulls (nobody pushed it one: it was not live to the coordinator) leaves its
    commitment out, and it takes that decision instead of refusing it and deciding the round again
    alone (a second version of the round: a fork; seen in the memory swarm's returning trainer)."""
    hub = MemoryHub()
    a = _trainer_agreement(tmp_path, hub, NAMES[0], deadline_s=2.0, decision_wait_s=0.5)
    a.open_round(*_payload(NAMES[0], 0))
    done = gather(lambda: [r] if (r := a.step()) is not None else [], count=1, timeout=30, what="a deciding alone")
    assert done[0].decision.trainer_ids == [NAMES[0]]
    a.ctx.transport.publish(PeerStatus(role="trainer", version=4, node_key=a.ctx.identity.public_key_hex))
    b = _trainer_agreement(tmp_path, hub, NAMES[1], deadline_s=2.0, decision_wait_s=0.5)
    b.open_round(*_payload(NAMES[1], 1))
    result = gather(lambda: [r] if (r := b.step()) is not None else [], count=1, timeout=30, what="b closing the round")[0]
    assert result.decision is not None and result.decision.coordinator == NAMES[0], "b decided the round again"
    assert [p.trainer_id for p in result.payloads] == [NAMES[0]]
    st = b.ctx.status.snapshot().trainer
    assert st.decisions_refused == {} and st.decisions_made == 0 and st.decisions_pulled == 1, st
    for ag in (a, b):
        ag.ctx.store.close()
