"""The spot-check verdicts a decision names (``loco/verdicts.py``) and a target's answer on the wire
(``loco/spot_answer.py``): only members' signed verdicts of the last rounds count, a conviction
needs a failed verdict with evidence, hostile answers are refused (torch-free)."""

from __future__ import annotations

import dataclasses

import pytest

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.errors import WireError
from pulse_node.loco.commitlist import VERDICTS, make_verdict
from pulse_node.loco.decision import make_decision
from pulse_node.loco.ledger import Ledger, RoundFacts, Verdict
from pulse_node.loco.opening import RoundOpening
from pulse_node.loco.spot_answer import SpotAnswer, decode_answer, encode_answer
from pulse_node.loco.verdicts import failing, ledger_facts, named_verdicts, verdict_problems

RUN, EPOCH, BASE = "run-a", b"\x01" * 32, b"\x02" * 32
KEYS = [Identity.generate() for _ in range(3)]
IDS = [peer_id_of_key(k.public_key_hex) for k in KEYS]
MEMBERS = {IDS[0], IDS[1]}  # IDS[2]: an open trainer
KEY_OF = {i: k.public_key_hex for i, k in zip(IDS, KEYS)}


def verdict(verifier: int, *, round: int = 4, reason: str = "", evidence: bytes = b"", target: int = 2) -> bytes:
    return VERDICTS.encode(make_verdict(KEYS[verifier], run_id=RUN, epoch=EPOCH, round=round, target=IDS[target],
                                        verifier=IDS[verifier], reason=reason, evidence=evidence))


def problems(verdicts: list[bytes], convicted: tuple[str, ...] = (), *, round: int = 5) -> str | None:
    d = make_decision(KEYS[0], run_id=RUN, round=round, base=BASE, epoch=EPOCH, coordinator=IDS[0],
                      contributors={IDS[0]: b"\x03" * 32}, verdicts=verdicts, convicted=convicted)
    return verdict_problems(d, key_of=KEY_OF.__getitem__, is_member=MEMBERS.__contains__)


def test_members_verdicts_of_the_last_rounds_are_taken_and_reach_the_ledger() -> None:
    failed = verdict(1, reason="gradient", evidence=b"\x09" * 32)
    assert problems([verdict(0), failed], (IDS[2],)) is None
    d = make_decision(KEYS[0], run_id=RUN, round=5, base=BASE, epoch=EPOCH, coordinator=IDS[0],
                      contributors={IDS[0]: b"\x03" * 32}, verdicts=[verdict(0), failed], convicted=(IDS[2],))
    verdicts, convicted = ledger_facts(d)
    assert set(verdicts) == {Verdict(4, IDS[2], IDS[0], True), Verdict(4, IDS[2], IDS[1], False)}
    ledger = Ledger()
    ledger.record(RoundFacts(5, verdicts=verdicts, convicted=convicted))
    assert ledger.convicted(IDS[2]) and ledger.owing(IDS[2]) and ledger.entries[IDS[2]].passed == 1


def test_invented_stale_or_unbacked_verdicts_refuse_the_decision() -> None:
    assert "no member" in (problems([verdict(2, target=0)]) or "")  # an open trainer verifies nobody
    forged = dataclasses.replace(VERDICTS.decode(verdict(1)), passed=False, reason="unanswered")
    assert "signature" in (problems([VERDICTS.encode(forged)]) or "")  # the coordinator cannot turn a pass
    assert "window" in (problems([verdict(0, round=5)]) or "")  # a check of its own round: not done yet
    assert "window" in (problems([verdict(0, round=0)]) or "")  # too old to count
    assert "convicts" in (problems([verdict(1, reason="unanswered")], (IDS[2],)) or "")  # no evidence, no conviction
    assert "convicts" in (problems([], (IDS[1],)) or "")


def test_a_failed_verdict_whose_evidence_convicts_its_accuser_costs_its_target_nothing() -> None:
    """A member's failed verdict with evidence that a re-check found false: the decision convicts the
    accuser, and the target (an honest open trainer) is neither kept out of the round nor made owing,
    nor does its failure count. Only a failure whose evidence convicts its target acts on it."""
    false = verdict(1, reason="gradient", evidence=b"\x09" * 32)
    for convicted, hits in (((IDS[1],), False), ((), False), ((IDS[2],), True)):
        d = make_decision(KEYS[0], run_id=RUN, round=5, base=BASE, epoch=EPOCH, coordinator=IDS[0],
                          contributors={IDS[0]: b"\x03" * 32}, verdicts=[false], convicted=convicted)
        assert problems([false], convicted) is None
        ledger = Ledger()
        assert (IDS[2] in failing(named_verdicts(d), ledger, convicted=d.convicted)) is hits
        verdicts, convicts = ledger_facts(d)
        ledger.record(RoundFacts(5, verdicts=verdicts, convicted=convicts))
        assert ledger.owing(IDS[2]) is hits and ledger.convicted(IDS[1]) is (IDS[1] in convicted)
        assert ledger.entries.get(IDS[2]) is None or ledger.entries[IDS[2]].failed == int(hits)
    unanswered = verdict(1, reason="unanswered")  # no evidence: acts on its own (a member holding the answer refutes it)
    assert failing(map(VERDICTS.decode, [unanswered]), Ledger(), convicted=()) == {IDS[2]}


def test_an_answer_round_trips_and_hostile_bytes_are_refused() -> None:
    a = SpotAnswer(4, IDS[2], 1, RoundOpening(4, IDS[2], (3,), ((b"\x00" * 16, (b"\x01" * 32,)),)), [b"batch"], b"patch")
    back = decode_answer(encode_answer(a))
    assert (back.round, back.target, back.step, back.batches, back.patch) == (4, IDS[2], 1, [b"batch"], b"patch")
    assert back.opening == a.opening
    for bad in (b"", b"\x93\x01\x02\x03", encode_answer(a)[:-3], encode_answer(dataclasses.replace(a, target=""))):
        with pytest.raises(WireError):
            decode_answer(bad)
