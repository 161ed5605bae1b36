"""The defences of a round, as pluggable stages of the Byzantine harness.

Each stage is one decision a swarm makes about its trainers in a round. ``Defences.today()``
is what main does now; the protocol pieces of issue 32's later phase (commit-reveal, decisions
naming every committed payload, spot recomputation of inner steps, evidence scoped to one
chain, one capped weight for new keys) plug in by implementing the same interfaces, and the
bench then reports what they hold. The aggregation rule itself is not a stage: it is
``loco.aggregate`` of the run's ``LocoConfig``, applied by the real ``OuterOptimizer``.

- ``Reveal``: may Byzantine trainers see this round's honest payloads before sending theirs?
  Today yes (payloads are pushed as they are made: rushing); with commit-reveal, no.
- ``Membership``: whose payloads count. Today keyed (only the configured trainer set) or, with
  no key configured, every peer announcing the trainer role (``OpenSwarm``).
- ``DecisionCheck``: does a trainer accept the coordinator's decision? Today any decision of
  the coordinator whose turn it is; later only one naming every payload committed in time.
- ``SpotCheck``: recomputes inner steps, convicts cheaters, judges accusations. Today there
  is none: nobody is checked and an accusation has nowhere to go.
- ``EvidenceJudge``: convicts a key from two conflicting statements it signed. Today the
  checkers a node's evidence book runs (``loco/equivocation.py``), which tie the statements to
  the run id only, not to one chain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pulse_node.errors import PulseError
from pulse_node.loco.equivocation import evidence_checkers
from pulse_node.loco.payload import LocoPayload


class Reveal(Protocol):
    def rushing(self) -> bool:
        """True if Byzantine trainers see this round's honest payloads before making theirs."""


class Membership(Protocol):
    def admits(self, trainer_id: str, *, members: frozenset[str]) -> bool:
        """Does a payload (or accusation) from ``trainer_id`` count? ``members``: the configured set."""


class DecisionCheck(Protocol):
    def accepts(self, decided: set[str], *, committed: set[str]) -> bool:
        """Do trainers accept a decision naming ``decided`` when ``committed`` were committed in time?"""


class SpotCheck(Protocol):
    seconds: float
    """CPU seconds this stage spent (verification overhead)."""

    def check(self, round: int, payloads: Mapping[str, LocoPayload]) -> set[str]:
        """Keys convicted this round by recomputing their inner steps."""

    def judge(self, accuser: str, target: str, round: int) -> bool:
        """Is an accusation of ``target`` by ``accuser`` upheld (the target convicted)?"""


class EvidenceJudge(Protocol):
    def convicts(self, kind: str, first: bytes, second: bytes) -> str | None:
        """The signer key convicted by two conflicting signed statements, or None."""


@dataclass
class Rushing:
    """Today: payloads are pushed as soon as they are made; nothing is committed first."""

    def rushing(self) -> bool:
        return True


@dataclass
class CommitReveal:
    """A model of commit-reveal (not built yet): every payload is committed by its digest before
    any is revealed, so a Byzantine trainer crafts from earlier rounds only."""

    def rushing(self) -> bool:
        return False


@dataclass
class Keyed:
    """Today, with trainer keys configured: only the trainer set's keys count."""

    def admits(self, trainer_id: str, *, members: frozenset[str]) -> bool:
        return trainer_id in members


@dataclass
class OpenSwarm:
    """Today, with no trainer key configured: every peer announcing the trainer role counts."""

    def admits(self, trainer_id: str, *, members: frozenset[str]) -> bool:
        return True


@dataclass
class AnyDecision:
    """Today: the decision of the coordinator whose turn it is, naming any non-empty set."""

    def accepts(self, decided: set[str], *, committed: set[str]) -> bool:
        return bool(decided)


@dataclass
class NamesEveryCommitted:
    """A model of the later rule (not built yet): a decision leaving out a committed payload is
    refused (and the next coordinator decides)."""

    def accepts(self, decided: set[str], *, committed: set[str]) -> bool:
        return bool(decided) and committed <= decided


@dataclass
class NoSpotChecks:
    """Today: no inner step is recomputed, and no accusation is acted on."""

    seconds: float = 0.0

    def check(self, round: int, payloads: Mapping[str, LocoPayload]) -> set[str]:
        return set()

    def judge(self, accuser: str, target: str, round: int) -> bool:
        return False


@dataclass
class RunIdEvidence:
    """Today: the checkers every node runs on received evidence (``loco/equivocation.py``: a
    conviction needs two statements one member key signed for one round of this run)."""

    run_id: str

    def convicts(self, kind: str, first: bytes, second: bytes) -> str | None:
        checker = evidence_checkers().get(kind)
        if checker is None:
            return None
        try:
            return checker(first, second, self.run_id)[0]
        except PulseError:
            return None


@dataclass
class Defences:
    """One choice per stage."""

    reveal: Reveal
    membership: Membership
    decision: DecisionCheck
    spot: SpotCheck
    evidence: EvidenceJudge

    @classmethod
    def today(cls, run_id: str, *, open_swarm: bool = False) -> Defences:
        """What main does now (keyed trainer set unless ``open_swarm``)."""
        return cls(Rushing(), OpenSwarm() if open_swarm else Keyed(), AnyDecision(), NoSpotChecks(),
                   RunIdEvidence(run_id))
