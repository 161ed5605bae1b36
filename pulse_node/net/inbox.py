"""Bounded queue of inbound pushes, shared by the wire worker (trio) and the p2pd push plane (asyncio).

Space (one slot and the body's bytes) is reserved before a body is read, so a flood of
pushes is refused with ``busy`` instead of growing memory; ``take`` hands out events up to a
byte budget per call so one RPC answer stays under ``ipc.MAX_FRAME``. A body written to a spool
file instead of memory (the p2pd plane's large pushes, ``net/spool.py``) reserves room in a
separate disk budget and costs nothing against the per-call budget: only its path crosses the
RPC. No I/O, no event loop: the workers add their own wake-up signal.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: bytes of in-memory event bodies returned by one ``take`` (stays under ipc.MAX_FRAME)
EVENTS_BYTES_PER_CALL = 48 << 20


@dataclass(frozen=True)
class Event:
    """One inbound push: its kind, the authenticated sender, the body and the arrival time.

    A spooled event has ``path`` set (the spool file holding the body, ``size`` bytes) and an
    empty ``data``; whoever takes it owns the file."""

    kind: str
    from_peer: str
    data: bytes
    received_at: float
    path: str | None = None
    size: int = 0

    @property
    def spooled(self) -> bool:
        return self.path is not None


class Inbox:
    """Bounded inbound pushes; space is reserved before a body is read (``busy`` when full)."""

    def __init__(self, *, max_events: int, max_bytes: int, max_disk_bytes: int = 0) -> None:
        self.max_events, self.max_bytes, self.max_disk_bytes = max_events, max_bytes, max_disk_bytes
        self._q: deque[Event] = deque()
        self._count = self._bytes = self._disk = 0
        self.rejected = 0

    def reserve(self, n: int, *, spooled: bool = False) -> bool:
        """Claim room for one event of ``n`` bytes (on disk if ``spooled``); False (and counted) when full."""
        used, cap = (self._disk, self.max_disk_bytes) if spooled else (self._bytes, self.max_bytes)
        if self._count + 1 > self.max_events or used + n > cap:
            self.rejected += 1
            return False
        self._count += 1
        if spooled:
            self._disk += n
        else:
            self._bytes += n
        return True

    def release(self, n: int, *, spooled: bool = False) -> None:
        """Give back a reservation (body never arrived, or the event was taken)."""
        self._count -= 1
        if spooled:
            self._disk -= n
        else:
            self._bytes -= n

    def put(self, event: Event) -> None:
        """Queue an event whose space was reserved."""
        self._q.append(event)

    def take_ready(self, max_n: int) -> list[Event]:
        """Up to ``max_n`` queued events within ``EVENTS_BYTES_PER_CALL`` of in-memory bodies (at least one)."""
        out: list[Event] = []
        budget = EVENTS_BYTES_PER_CALL
        while self._q and len(out) < max_n and (not out or len(self._q[0].data) <= budget):
            ev = self._q.popleft()
            budget -= len(ev.data)
            self.release(ev.size if ev.spooled else len(ev.data), spooled=ev.spooled)
            out.append(ev)
        return out

    def __len__(self) -> int:
        return len(self._q)
