"""Bounded queue of inbound pushes, the same in both workers (the wire worker on trio, the p2pd push
plane on asyncio; anyio wakes a waiting ``events`` call on either).

Space (one slot and the body's bytes) is reserved before a body is read, so a flood of pushes is
refused with ``busy`` instead of growing memory; ``take`` hands out events up to a byte budget
per call so one RPC answer stays under ``ipc.MAX_FRAME``. A body written to a spool file instead
of memory (the p2pd plane's large pushes, ``net/local/spool.py``) reserves room in a separate disk
budget and costs nothing against the per-call budget: only its path crosses the RPC.

With ``shares`` (``net/peers/budget.py``) a push is admitted against its sender's own share first: a
non-member peer cannot fill the queue for everyone by declaring large sizes it never sends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

import anyio

from pulse_node.net.peers.budget import PushShares
from pulse_node.vocab import BudgetRefusal, Event

#: bytes of in-memory event bodies returned by one ``take`` (stays under ipc.MAX_FRAME)
EVENTS_BYTES_PER_CALL = 48 << 20
#: longest wait of one ``events`` call
MAX_WAIT_S = 60.0


@dataclass(frozen=True)
class Queued:
    """An event waiting for the node (also how the ``events`` RPC of both workers carries it). With
    ``path`` set its body is in that spool file (``size`` bytes) and ``event.data`` is empty;
    whoever takes it owns the file."""

    event: Event
    path: str | None = None
    size: int = 0

    @property
    def nbytes(self) -> int:
        return self.size if self.path is not None else len(self.event.data)


class Inbox:
    """Bounded inbound pushes; space is reserved before a body is read (``busy`` when full)."""

    def __init__(self, *, max_events: int, max_bytes: int, max_disk_bytes: int = 0,
                 shares: PushShares | None = None) -> None:
        self.max_events, self.max_bytes, self.max_disk_bytes = max_events, max_bytes, max_disk_bytes
        self.shares = shares
        self._q: deque[Queued] = deque()
        self._count = self._bytes = self._disk = 0
        self.rejected = 0
        self._waiter: anyio.Event | None = None

    def reserve(self, n: int, *, spooled: bool = False, peer: str = "") -> bool:
        """Claim room for one event of ``n`` bytes (on disk if ``spooled``); False (and counted) when full."""
        return not self.admit(n, spooled=spooled, peer=peer)

    def admit(self, n: int, *, spooled: bool = False, peer: str = "") -> BudgetRefusal | Literal["", "queue_full"]:
        """Like ``reserve``: "" when room for the push of ``peer`` was claimed, else why not
        (``push_share``, ``push_pool``: the sender's budget; ``queue_full``)."""
        used, cap = (self._disk, self.max_disk_bytes) if spooled else (self._bytes, self.max_bytes)
        if self._count + 1 > self.max_events or used + n > cap:
            self.rejected += 1
            return "queue_full"
        if self.shares is not None:
            why = self.shares.admit(peer, n)
            if why:
                self.rejected += 1
                return why
        self._count += 1
        if spooled:
            self._disk += n
        else:
            self._bytes += n
        return ""

    def release(self, n: int, *, spooled: bool = False, peer: str = "") -> None:
        """Give back a reservation (body never arrived, or the event was taken)."""
        if self.shares is not None:
            self.shares.release(peer, n)
        self._count -= 1
        if spooled:
            self._disk -= n
        else:
            self._bytes -= n

    def put(self, event: Event, *, path: str | None = None, size: int = 0) -> None:
        """Queue an event whose space was reserved; wake whoever waits in ``take``."""
        self._q.append(Queued(event, path, size))
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None

    async def take(self, max_n: int, wait_s: float = 0.0) -> list[Queued]:
        """Up to ``max_n`` queued events, waiting up to ``wait_s`` (at most ``MAX_WAIT_S``) for the first."""
        if not self._q and wait_s > 0:
            if self._waiter is None:
                self._waiter = anyio.Event()
            with anyio.move_on_after(min(wait_s, MAX_WAIT_S)):
                await self._waiter.wait()
        return self.take_ready(max_n)

    def take_ready(self, max_n: int) -> list[Queued]:
        """Up to ``max_n`` queued events within ``EVENTS_BYTES_PER_CALL`` of in-memory bodies (at least one)."""
        out: list[Queued] = []
        budget = EVENTS_BYTES_PER_CALL
        while self._q and len(out) < max_n and (not out or self._q[0].path is not None
                                                 or len(self._q[0].event.data) <= budget):
            item = self._q.popleft()
            if item.path is None:
                budget -= len(item.event.data)
            self.release(item.nbytes, spooled=item.path is not None, peer=item.event.sender)
            out.append(item)
        return out

    def __len__(self) -> int:
        return len(self._q)
