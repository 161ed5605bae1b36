"""What a peer did, as a value: the one thing the peer book (``peers/book.py``) is told.

Roles never count strikes or standing: each thing a peer did that matters is handed to
``PeerBook.judge(peer_id, outcome)``, once. A call that can fail because of a peer (a fetch, a
check of what it sent) is made through ``PeerBook.ask``, which turns its fault into a value here
(``outcome_of``), judges it and returns it, in the manner of torchft's ``report_error``: nothing
is caught and translated into a strike at the call site.

- ``Delivered``: it served something that verified (a patch, a catch-up patch, an anchor).
- ``Accepted``: a rollout batch of its was verified and used.
- ``Relayed``: it pushed a head record a trainer-set member signed.
- ``Failed``: a request to it failed (no answer, refused, not found, a record no member signs
  any more): no lie, but a streak of them cools it down.
- ``Unreached``: a push to it failed: it moves down the order, never cools down.
- ``Lied``: it sent something false or damaged: a strike (``max_strikes`` of them ban it).
- ``Reported``: it handed us equivocation evidence (``chain/evidence.py``): checked by the book;
  true convicts the signer for good, false is the reporter's lie.
- ``Unexpected``: handling what it sent raised an exception no check anticipated
  (``peers/contain.py``): refused, and a strike like a lie.
- ``Busy``: it is working on the request (a catch-up patch being made): nothing to judge.

``Failed``, ``Lied``, ``Reported``, ``Unexpected`` and ``Busy`` are ``Fault``s: what ``ask`` returns instead of
a result.
"""

from __future__ import annotations

from dataclasses import dataclass

from pulse_node.chain.gate import Equivocation, SignedWrong
from pulse_node.errors import BusyError, IntegrityError, PulseError


@dataclass(frozen=True)
class Outcome:
    """Something a peer did, as this node saw it."""


@dataclass(frozen=True)
class Delivered(Outcome):
    """It served something that verified: standing earned, its failure streak ends."""


@dataclass(frozen=True)
class Accepted(Outcome):
    """A rollout batch of its was verified and accepted."""

    rollouts: int = 0


@dataclass(frozen=True)
class Relayed(Outcome):
    """It pushed a head record a trainer-set member signed (a little standing, capped)."""


@dataclass(frozen=True)
class Unreached(Outcome):
    """A push to it failed: it moves down the order."""

    why: str = ""


@dataclass(frozen=True)
class Fault(Outcome):
    """What a call to a peer gave instead of a result."""

    why: str = ""


@dataclass(frozen=True)
class Failed(Fault):
    """A request to it failed; ``max_failures`` in a row cool it down for a while."""


@dataclass(frozen=True)
class Lied(Fault):
    """It sent something false or damaged."""


@dataclass(frozen=True)
class Unexpected(Fault):
    """Handling what it sent raised an exception no check anticipated (``peers/contain.py``):
    refused and struck like a lie; ``struck`` False while a failing boundary backs off."""

    struck: bool = True


@dataclass(frozen=True)
class Busy(Fault):
    """It is working on what we asked for; ask again shortly."""


@dataclass(frozen=True)
class Reported(Fault):
    """Equivocation evidence it handed us (the encoded ``chain/evidence.Evidence``)."""

    evidence: bytes = b""


def outcome_of(exc: PulseError, *, lies: tuple[type[PulseError], ...] = ()) -> Fault:
    """The fault ``exc`` stands for: a record conflicting with one seen before is evidence
    (``Reported``); a statement its signer got wrong (or a convicted signer's) is no lie of who
    relayed it (``Failed``);
    any other ``IntegrityError`` (or one of ``lies``) is a lie; a busy peer is ``Busy``; the rest
    failed."""
    if isinstance(exc, Equivocation):
        return Reported(str(exc), evidence=exc.evidence)
    if isinstance(exc, SignedWrong):
        return Failed(str(exc))
    if isinstance(exc, (IntegrityError, lies)):
        return Lied(str(exc))
    if isinstance(exc, BusyError):
        return Busy(str(exc))
    return Failed(str(exc))
