"""When a round's phases close at one trainer: the commit phase, and the wait for payloads.

Live members are waited for (``trainer/agreement.py``: up to ``loco.deadline_s``). Open trainers
(``chain.open_trainers``) cannot be: any key may announce the role. They get two short windows
instead, each ``loco.open_wait_s`` at most, so that one running a little behind the members
(it learned the last decision late, its steps are slower) still enters rounds, and a silent one
costs a round ``open_wait_s``, never ``deadline_s``:

- **commit** (``commit_phase_over``): once every live member's commitment is held here, the
  commit phase stays open for the open trainers in discovery that hold the round's base and have
  not committed yet, ``open_wait_s`` at most; it closes ``deadline_s / 2`` after the round opened
  here in any case. Nobody reveals a payload before its commit phase closed, and a commitment
  arriving later counts for nothing this round, so no one commits after seeing a revealed payload.
  Members close the phase within a push of each other (the last member's commitment and the
  window start it), which is what the decisions' omission check (``trainer/decisions.py``) needs.
- **reveal** (``payloads_in``): once every live member's payload is here, the coordinator waits
  ``open_wait_s`` at most for the payloads of the open trainers that entered the round with a
  commitment; one never revealed is named in the decision among the commitments but not the
  contributors, and the ledger counts it unrevealed (``loco/ledger.py``: it costs standing).

An open trainer makes its own rollouts (inference nodes serve members only), so its inner steps
may take longer than the members' whole round; it would then commit after every window and
never enter a round. ``OpenPace`` sets how many inner steps it makes: half as many after a round
its commitment missed, one more after one it made (between 1 and ``inner_steps``), so it
settles at what it can make within the members' time; and it stops stepping once most members
closed the round (``RoundAgreement.closed_elsewhere``) to catch up at once. Members always make
``inner_steps``. A payload of fewer steps is a valid one (its commitment names the steps made).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from pulse_node.trainer.rounds import OpenRound


def commit_phase_over(o: OpenRound, *, now: float, members: Iterable[str], open_live: Iterable[str],
                      held: Collection[str], wait_s: float) -> bool:
    """Whether the commit phase of ``o`` is over here (module docstring): ``members``, the live
    members (not us); ``open_live``, the open trainers in discovery holding the round's base;
    ``held``, the trainers whose commitments we hold. Records when it closed (``o.closed``)."""
    if o.closed is not None:
        return True
    if now < o.commit_deadline:
        if not all(pid in held for pid in members):
            return False
        if o.members_committed is None:
            o.members_committed = now
        if now < o.members_committed + wait_s and not all(pid in held for pid in open_live):
            return False
    o.closed = now
    return True


def payloads_in(o: OpenRound | None, *, now: float, members_in: bool, open_entered: Iterable[str],
                held: Collection[str], wait_s: float) -> bool:
    """Whether a coordinator may decide now (module docstring): ``members_in``, whether every
    live member's payload is here (or cannot count); ``open_entered``, the open trainers that
    entered the round with a commitment in time; ``held``, the trainers whose payloads are here
    (or cannot count)."""
    if not members_in:
        return False
    if o is None:
        return all(t in held for t in open_entered)
    if o.members_in is None:
        o.members_in = now
    return now >= o.members_in + wait_s or all(t in held for t in open_entered)


class OpenPace:
    """How many inner steps an open trainer makes in its next round (module docstring)."""

    def __init__(self, inner_steps: int) -> None:
        self.most = inner_steps
        self.steps = inner_steps

    def saw(self, *, in_time: bool) -> None:
        """After a round: its commitment came ``in_time`` (its payload applied, or the decision
        names its commitment: the entry draw or a check left it out, not its pace), or too late."""
        self.steps = min(self.most, self.steps + 1) if in_time else max(1, self.steps // 2)
