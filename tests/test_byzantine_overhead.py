"""The Byzantine bench's overhead split (pulse_node/testing/byzantine/overhead.py): a round's phase
read off the ledger, and each phase's overhead measured as the bench's headline measures a run."""

from __future__ import annotations

import pytest

from pulse_node.loco.ledger import Ledger, RoundFacts, Verdict
from pulse_node.testing.byzantine.overhead import OTHER, PROVING, STEADY, RoundCost, phase, split


def _cost(ph: str, *, trainer_s: float = 1.0, check_s: float = 0.0, checks: float = 0.0) -> RoundCost:
    return RoundCost(ph, trainer_s=trainer_s, batches_s=0.5, weigh_s=0.01, record_s=0.04, answer_s=0.0,
                     check_s=check_s, checks=checks)


def test_each_phase_is_a_ratio_of_its_rounds_sums_and_all_rounds_give_the_headline() -> None:
    costs = [_cost(PROVING), _cost(PROVING, check_s=0.3, checks=2.0), *(_cost(STEADY, check_s=0.03, checks=0.25)
                                                                       for _ in range(4))]
    got = split(costs)
    assert got[PROVING].rounds == 2 and got[STEADY].rounds == 4
    assert got[PROVING].overhead == pytest.approx((2 * 0.05 + 0.3) / 3.0)
    assert got[STEADY].overhead == pytest.approx((0.05 + 0.03) / 1.5)
    assert got[PROVING].checks == pytest.approx(1.0) and got[STEADY].checks == pytest.approx(0.25)
    assert got[STEADY].parts == pytest.approx({"weigh_s": 0.01 / 1.5, "record_s": 0.04 / 1.5, "answer_s": 0.0,
                                               "check_s": 0.03 / 1.5})
    # one phase over every round is the headline's measure: the parts' sums over the swarm rounds' sum
    whole = split([RoundCost("all", *(getattr(c, f) for f in ("trainer_s", "batches_s", "weigh_s", "record_s",
                                                                "answer_s", "check_s", "checks"))) for c in costs])
    assert whole["all"].overhead == pytest.approx((6 * 0.05 + 0.3 + 4 * 0.03) / 9.0)
    # the wider basis adds the trainer's payload exchange to the denominator only
    wide = split([RoundCost(STEADY, 1.0, 0.5, 0.01, 0.04, 0.0, 0.03, 0.25, exchange_s=0.5)])[STEADY]
    assert wide.overhead == pytest.approx(0.08 / 1.5) and wide.wide == pytest.approx(0.08 / 2.0)


def test_a_round_cost_is_the_difference_of_two_totals_with_the_later_phase() -> None:
    before, after = _cost(""), _cost(STEADY, trainer_s=3.0, check_s=0.2, checks=0.5)
    one = after.since(before)
    assert (one.phase, one.trainer_s, one.check_s, one.checks, one.record_s) == (STEADY, 2.0, 0.2, 0.5, 0.0)


def test_the_phase_follows_the_ledger_honest_members_first() -> None:
    ledger = Ledger()
    assert phase(ledger, honest=["h0", "h1"], live=["h0", "h1", "b0"]) == PROVING  # nobody checked yet
    members = frozenset({"h0", "h1", "b0"})
    ledger.record(RoundFacts(0, contributors=("h0", "h1", "b0"), members=members))
    ledger.record(RoundFacts(1, members=members, verdicts=(Verdict(0, "h0", "h1", True), Verdict(0, "h1", "h0", True))))
    assert phase(ledger, honest=["h0", "h1"], live=["h0", "h1", "b0"]) == OTHER  # only b0 unproven
    assert phase(ledger, honest=["h0", "h1"], live=["h0", "h1"]) == STEADY  # b0 excluded
    ledger.record(RoundFacts(2, members=members, verdicts=(Verdict(1, "b0", "h0", False),)))
    assert phase(ledger, honest=["h0", "h1"], live=["h0", "h1", "b0"]) == STEADY  # b0 owes a check: out
