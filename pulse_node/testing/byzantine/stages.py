"""The defences of a round, as pluggable stages of the Byzantine harness: today's, and the protocol's.

Each stage is one decision a swarm makes about its trainers in a round. ``Defences.today()`` is
what main did before the open-trainer protocol (the bench's "before" column, with the plain
mean); ``Defences.protocol()`` plugs in the real pieces of issue 32's protocol. The aggregation
rule itself is not a stage: it is ``loco.aggregate`` of the run's ``LocoConfig``, applied by the
real ``OuterOptimizer`` with the trust ledger's weights.

- ``Reveal``: may Byzantine trainers see this round's honest payloads before sending theirs?
  Today yes (payloads are pushed as they are made: rushing). With commit-reveal
  (``CommitReveal``) every payload is committed by a signed ``RoundCommit``
  (``loco/roundcommit.py``, checked by ``check_commit``, with its inner-step commitment) before
  any is revealed, so an attacker crafts from earlier rounds only.
- ``Membership``: whose payloads count. Keyed (only the configured trainer set), the open
  swarm of today (every peer announcing the trainer role is a member), or open trainers
  (``chain.open_trainers``: any key may contribute; the trust ledger's class, newcomer cap and
  entry draw decide its weight, ``loco/ledger.py``).
- ``DecisionCheck``: does a trainer accept a coordinator's commit list (``loco/commitlist.py``)?
  Today any non-empty one of the coordinator in turn; with ``EveryCommitment``, only one
  ``loco/roundrules.list_problems`` finds nothing wrong with: it names every commitment and
  verdict held in time (else the next coordinator decides).
- ``spot``: whether spot checks run in the rounds (``testing/byzantine/spotcheck.py``, the real
  draw, checker, evidence and re-check).
- ``EvidenceJudge``: convicts a key from two conflicting statements it signed: the checkers a
  node's evidence book runs (``loco/equivocation.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pulse_node.errors import PulseError
from pulse_node.loco.commitlist import CommitList
from pulse_node.loco.equivocation import evidence_checkers
from pulse_node.loco.roundrules import Held, list_problems


class Reveal(Protocol):
    def rushing(self) -> bool:
        """True if Byzantine trainers see this round's honest payloads before making theirs."""


class Membership(Protocol):
    def admits(self, trainer_id: str, *, members: frozenset[str]) -> bool:
        """Does a payload (or accusation) from ``trainer_id`` count? ``members``: the configured set."""

    def open_trainers(self) -> bool:
        """Whether keys outside the trainer set contribute as open trainers (weighed by the ledger)."""


class DecisionCheck(Protocol):
    def accepts(self, lst: CommitList, *, commits: Mapping[str, Held], verdicts: Mapping[tuple[int, str, str], Held],
                is_member: Callable[[str], bool], convicted: Callable[[str], bool]) -> bool:
        """Do trainers holding ``commits`` and ``verdicts`` (arrived at t = 0) accept ``lst`` (arriving at t = 1)?"""


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
    """Commit-reveal: signed round commitments, checked, before any payload is revealed."""

    def rushing(self) -> bool:
        return False


@dataclass
class Keyed:
    """Only the trainer set's keys count."""

    def admits(self, trainer_id: str, *, members: frozenset[str]) -> bool:
        return trainer_id in members

    def open_trainers(self) -> bool:
        return False


@dataclass
class OpenSwarm:
    """Today, with no trainer key configured: every peer announcing the trainer role is a member."""

    def admits(self, trainer_id: str, *, members: frozenset[str]) -> bool:
        return True

    def open_trainers(self) -> bool:
        return False


@dataclass
class OpenTrainers:
    """``chain.open_trainers``: any key contributes, weighed by the trust ledger (newcomers share one weight)."""

    def admits(self, trainer_id: str, *, members: frozenset[str]) -> bool:
        return True

    def open_trainers(self) -> bool:
        return True


@dataclass
class AnyDecision:
    """Today: the list of the coordinator whose turn it is, naming any non-empty set."""

    def accepts(self, lst: CommitList, *, commits: Mapping[str, Held], verdicts: Mapping[tuple[int, str, str], Held],
                is_member: Callable[[str], bool], convicted: Callable[[str], bool]) -> bool:
        return bool(lst.commits)


@dataclass
class EveryCommitment:
    """The protocol's rule (``loco/roundrules.list_problems``): a list leaving out a commitment or
    a verdict held in time is refused, and the next coordinator decides."""

    skew: float = 0.5

    def accepts(self, lst: CommitList, *, commits: Mapping[str, Held], verdicts: Mapping[tuple[int, str, str], Held],
                is_member: Callable[[str], bool], convicted: Callable[[str], bool]) -> bool:
        problems = list_problems(lst, commits=commits, verdicts=verdicts, is_member=is_member, convicted=convicted,
                                 arrived=1.0, skew=self.skew)
        return bool(lst.commits) and not problems


@dataclass
class RunIdEvidence:
    """The checkers every node runs on received evidence (``loco/equivocation.py``)."""

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
    spot: bool
    evidence: EvidenceJudge

    @classmethod
    def today(cls, run_id: str, *, open_swarm: bool = False) -> Defences:
        """Main before the open-trainer protocol (keyed trainer set unless ``open_swarm``)."""
        return cls(Rushing(), OpenSwarm() if open_swarm else Keyed(), AnyDecision(), False, RunIdEvidence(run_id))

    @classmethod
    def protocol(cls, run_id: str, *, open_trainers: bool = False) -> Defences:
        """Issue 32's protocol: commit-reveal, lists naming every commitment, spot checks in the rounds,
        and (``open_trainers``) keys outside the trainer set weighed by the ledger."""
        return cls(CommitReveal(), OpenTrainers() if open_trainers else Keyed(), EveryCommitment(), True,
                   RunIdEvidence(run_id))
