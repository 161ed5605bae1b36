"""The checks' overhead split into the rounds that prove the members and the steady rounds after.

``bench/byzantine.py`` reports the protocol's overhead (the rule's weighing, recording inner
steps, answering checks, the checks and re-checks) as a share of one honest trainer's CPU in a
swarm round (its inner steps and gate plus verifying its batches). A member that passed no check
yet is checked every round by two verifiers (``Ledger.unproven``): a one-off cost per key, which
a short run weighs as if it were paid every round. The harness records each round's costs
(``RoundCost``) with the round's phase as the ledger stood when it began:

- ``proving``: some honest member had passed no check yet;
- ``steady``: every live member (neither excluded nor owing a check) had passed one;
- ``other``: only a live Byzantine member was unproven (in neither figure).

``split`` gives each phase's overhead as the headline's (a ratio of CPU sums over the phase's
rounds), its parts and its checks per trainer and round; ``wide`` is the same over a wider basis
that also counts the trainer's part of the round's payload exchange (``exchange_s``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from pulse_node.loco.ledger import Ledger

PROVING, STEADY, OTHER = "proving", "steady", "other"
PARTS = ("weigh_s", "record_s", "answer_s", "check_s")


@dataclass(frozen=True)
class RoundCost:
    """CPU seconds of one round (or a run's totals so far), as ``harness.Outcome`` counts them."""

    phase: str
    trainer_s: float
    """One honest trainer's inner steps and gate (mean over the honest trainers)."""
    batches_s: float
    """The first honest trainer verifying the batches it trains on."""
    weigh_s: float
    """The rule weighing the round's payloads."""
    record_s: float
    """One honest trainer recording its inner steps (mean over the honest trainers)."""
    answer_s: float
    """The targets answering checks, per trainer."""
    check_s: float
    """The draws, checks and re-checks, per trainer."""
    checks: float
    """Checks recomputed by honest verifiers, per trainer."""
    exchange_s: float = 0.0
    """The first honest trainer's part of the payload exchange: encoding its payload, decoding
    and checking the others', the outer step (the wider basis only)."""

    def since(self, earlier: RoundCost) -> RoundCost:
        """This total minus an earlier one: one round's costs, with this one's phase."""
        return RoundCost(self.phase, *(getattr(self, f.name) - getattr(earlier, f.name)
                                       for f in fields(self) if f.name != "phase"))


@dataclass(frozen=True)
class Split:
    """One phase's rounds: its overhead over a trainer's swarm round, the overhead's parts, checks."""

    rounds: int
    overhead: float
    parts: dict[str, float]
    checks: float
    """Checks recomputed per trainer and round."""
    wide: float = 0.0
    """The overhead over the wider basis: the swarm round plus the trainer's payload exchange."""


def phase(ledger: Ledger, *, honest: Iterable[str], live: Iterable[str]) -> str:
    """The phase of the round about to run (module docstring): ``honest`` the honest members not
    excluded, ``live`` every member not excluded."""
    if any(ledger.unproven(t, member=True) for t in honest):
        return PROVING
    if any(ledger.unproven(t, member=True) for t in live if not ledger.owing(t)):
        return OTHER
    return STEADY


def split(costs: Sequence[RoundCost]) -> dict[str, Split]:
    """Per phase present in ``costs``: its overhead as ``bench/byzantine.py``'s headline measures a
    whole run (the parts' CPU over the trainer's swarm round, each summed over the phase's rounds)."""
    out = {}
    for ph in sorted({c.phase for c in costs}):
        rows = [c for c in costs if c.phase == ph]
        round_s = max(sum(c.trainer_s + c.batches_s for c in rows), 1e-9)
        parts = {p: sum(getattr(c, p) for c in rows) / round_s for p in PARTS}
        wide = round_s / (round_s + sum(c.exchange_s for c in rows))
        out[ph] = Split(len(rows), sum(parts.values()), parts, sum(c.checks for c in rows) / len(rows),
                        sum(parts.values()) * wide)
    return out
