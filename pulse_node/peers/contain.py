"""What a node does when handling one peer's data raises an exception no check anticipated.

Every check of peer data raises a ``PulseError`` the caller expects (a lie, a failure, a busy
peer). Anything else (a ``KeyError`` deep in a decoder, a ``MemoryError`` from a size nobody
bounded) is a bug of ours or a peer exploiting one. The roles take peer data at one boundary,
the peer book (``PeerBook.ask`` for what they fetch, ``PeerBook.contain`` for what was pushed
to them), and there ``Containment.run`` turns such an exception into a value:

- the data is refused and its sender struck (``Unexpected``, judged like a lie);
- it is logged once with the peer named (the traceback with the first of its kind only) and
  counted process-wide in ``INCIDENTS`` (the status reports it; the test suite fails on any it
  did not ask for, so bugs stay loud in tests while production goes on);
- the node goes on; one that keeps failing the same way (``BURST`` times within ``WINDOW_S``)
  backs off: that boundary refuses its next inputs unhandled, and unstruck, for ``BACKOFF_S``,
  doubling with every further burst up to ``MAX_BACKOFF_S``, instead of crash-looping or
  striking the whole swarm for a bug of its own.

``BaseException``s that are not ``Exception``s (``KeyboardInterrupt``, ``SystemExit``) are
never contained.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pulse_node.errors import PulseError
from pulse_node.peers.outcomes import Unexpected

T = TypeVar("T")
log = logging.getLogger("pulse.contain")

#: failures of one kind within ``WINDOW_S`` that make a boundary back off
BURST = 3
WINDOW_S = 60.0
BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
#: kinds of failure remembered per book, at most
MAX_KINDS = 256


@dataclass
class Incidents:
    """Unexpected exceptions contained in this process, all books together (for status and tests)."""

    total: int = 0
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=32))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, line: str) -> None:
        with self.lock:
            self.total += 1
            self.recent.append(line)


INCIDENTS = Incidents()


@dataclass
class _Kind:
    times: deque[float] = field(default_factory=lambda: deque(maxlen=BURST))
    backoff: float = 0.0
    until: float = float("-inf")


def kind_of(exc: BaseException) -> str:
    """Where and what: the exception's type and the innermost frame of this package it came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "pulse_node" in f.filename]
    where = f"{frames[-1].filename.rsplit('pulse_node', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__}@{where}"


class Containment:
    """One book's containment of unexpected exceptions (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.kinds: dict[str, _Kind] = {}
        self.failures = 0  # unexpected exceptions contained by this book
        self.skipped = 0  # inputs refused unhandled while backing off
        self._backing: dict[str, float] = {}  # boundary -> until when it refuses its inputs
        self._lock = threading.Lock()

    def backing_off(self, what: str) -> bool:
        """Whether the boundary ``what`` refuses its inputs now (it kept failing the same way)."""
        with self._lock:
            if self.clock() < self._backing.get(what, float("-inf")):
                self.skipped += 1
                return True
            return False

    def run(self, peer_id: str, call: Callable[[], T], *, what: str) -> T | Unexpected:
        """``call()``, or ``Unexpected`` (the sender's to judge) if it raised an exception that is
        no ``PulseError`` (recorded, ``failed``) or ``what`` is backing off (unstruck); a
        ``PulseError`` propagates to the caller's own handling."""
        if self.backing_off(what):
            return Unexpected(f"{what}: backing off after repeated unexpected failures", struck=False)
        try:
            return call()
        except PulseError:
            raise
        except Exception as exc:  # the boundary: anything no check anticipated
            self.failed(peer_id, exc, what=what)
            return Unexpected(f"{what}: unexpected {type(exc).__name__}: {str(exc)[:200]}")

    def failed(self, peer_id: str, exc: Exception, *, what: str) -> None:
        """Log ``exc`` once with the peer named, count it, and back ``what`` off after a burst."""
        kind = kind_of(exc)
        now = self.clock()
        with self._lock:
            self.failures += 1
            first = kind not in self.kinds
            if first and len(self.kinds) >= MAX_KINDS:
                self.kinds.pop(next(iter(self.kinds)))
            k = self.kinds.setdefault(kind, _Kind())
            k.times.append(now)
            burst = len(k.times) == BURST and now - k.times[0] <= WINDOW_S
            if burst:
                k.times.clear()
                k.backoff = min(MAX_BACKOFF_S, k.backoff * 2 or BACKOFF_S)
                self._backing[what] = now + k.backoff
        line = f"{what} of {peer_id[:16]}: {kind}: {str(exc)[:200]}"
        INCIDENTS.add(line)
        log.warning("unexpected exception handling %s; refused, sender struck", line, exc_info=exc if first else None)
        if burst:
            log.warning("%s keeps failing (%s): refusing its inputs for %.0f s", what, kind, k.backoff)
