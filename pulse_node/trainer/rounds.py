"""The rounds one trainer's contributor agreement holds: a typed table its parts share.

``RoundAgreement`` (``trainer/agreement.py``: payloads, the decision, the gathering) and its
``DecisionIntake`` (``trainer/decisions.py``: which decisions are accepted) are separate
classes; both read and write this table, never each other's attributes: the round open here
(``OpenRound``), the decision accepted per round, and per round the digests of members'
payloads refused as beyond the value bound (a decision naming one is refused).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from pulse_node.loco.decision import RoundDecision
from pulse_node.loco.payload import LocoPayload

WINDOW = 4  # decisions are taken for the current round and the next WINDOW - 1


class Wait(enum.Enum):
    WAIT = "wait"  # a step can go no further until new inputs arrive


WAIT = Wait.WAIT


@dataclass
class OpenRound:
    """The round being agreed on, as far as ``RoundAgreement.step`` got."""

    round: int
    base: bytes
    order: list[str]  # trainers seen when pushing, by id: who decides, and in which turn
    t0: float  # when the round opened here (monotonic)
    commit_s: float = 0.0  # the commit phase lasts this long at most (commitments later are late here)
    mine: bytes = b""  # our payload's bytes, revealed once the commit phase closes
    revealed: bool = False
    closed: float | None = None  # when the commit phase closed here (monotonic; ``trainer/pace.py``)
    members_committed: float | None = None  # when every live member's commitment was first held here
    members_in: float | None = None  # when every live member's payload was first held here
    pulled_at: float = float("-inf")
    decision: RoundDecision | None = None
    gather_until: float = 0.0
    payloads: list[LocoPayload] = field(default_factory=list)  # decided payloads obtained so far

    @property
    def commit_close(self) -> float:
        """When the commit phase closed here, or closes at the latest (monotonic): commitments
        arriving later count for nothing this round."""
        return self.closed if self.closed is not None else self.commit_deadline

    @property
    def commit_deadline(self) -> float:
        """When the commit phase closes here at the latest (monotonic)."""
        return self.t0 + self.commit_s


@dataclass
class RoundTable:
    """What the agreement and its decision intake share (module docstring)."""

    current_round: Callable[[], int]
    epoch: Callable[[], bytes]  # of the chain we extend (``chain/record.py``): decisions of another are refused
    open: OpenRound | None = None
    decisions: dict[int, RoundDecision] = field(default_factory=dict)
    refused: dict[int, dict[str, bytes]] = field(default_factory=dict)  # round -> member -> digest out of bound
    omitted: dict[int, set[str]] = field(default_factory=dict)  # round -> coordinators refused for an omission

    def in_window(self, r: int) -> bool:
        return 0 <= r - self.current_round() < WINDOW

    def drop_decision(self, d: RoundDecision) -> None:
        """Forget ``d`` if it was accepted (its signer was convicted): the next coordinator decides."""
        if self.decisions.get(d.round) is not d:
            return
        del self.decisions[d.round]
        o = self.open
        if o is not None and o.round == d.round and o.decision is d:
            o.decision, o.payloads = None, []

    def prune(self, r: int) -> None:
        for table in (self.decisions, self.refused, self.omitted):
            for old in [k for k in table if k < r]:
                del table[old]
