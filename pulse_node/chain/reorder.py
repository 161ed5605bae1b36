"""Reorder buffer: turns versions arriving in any order into an in-order stream.

Gossip delivers patches out of order, twice, or not at all. Patches in compact mode (ulp
deltas) are only correct on their exact base, so they must be applied strictly in sequence.
The buffer holds verified items for versions ``next_version .. next_version + max_pending - 1``
(bounded memory), hands out exactly the consecutive run starting at ``next_version``, and
reports the hole that later versions are waiting on so the node can fetch it (or a catch-up
patch / anchor, then ``reset``).
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class ReorderBuffer(Generic[T]):
    """In-order release of items keyed by version, with a bounded look-ahead window."""

    def __init__(self, *, next_version: int, max_pending: int = 64) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        if next_version < 0:
            raise ValueError("next_version must be >= 0")
        self.max_pending = max_pending
        self._next = next_version
        self._pending: dict[int, T] = {}

    @property
    def next_version(self) -> int:
        """The version the consumer needs next."""
        return self._next

    @property
    def window_end(self) -> int:
        """First version that ``offer`` refuses because it lies beyond the window."""
        return self._next + self.max_pending

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, version: object) -> bool:
        """True if ``version`` is buffered (waiting for its predecessors)."""
        return version in self._pending

    def offer(self, version: int, item: T) -> bool:
        """Buffer ``item``; False if it is stale, a duplicate, or beyond the window."""
        if version < self._next or version >= self.window_end or version in self._pending:
            return False
        self._pending[version] = item
        return True

    def pop_ready(self) -> list[tuple[int, T]]:
        """Remove and return the consecutive run starting at ``next_version`` (maybe empty)."""
        ready: list[tuple[int, T]] = []
        while self._next in self._pending:
            ready.append((self._next, self._pending.pop(self._next)))
            self._next += 1
        return ready

    def gap(self) -> tuple[int, int] | None:
        """``(missing_from, have_up_to)`` if some buffered version waits on a missing one."""
        if not self._pending:
            return None
        missing = self._next
        while missing in self._pending:
            missing += 1
        newest = max(self._pending)
        return (missing, newest) if newest > missing else None

    def reset(self, next_version: int) -> None:
        """Restart at ``next_version`` (after loading an anchor or a catch-up patch).

        Buffered items at or beyond the new position are kept if they still fit the window.
        """
        if next_version < 0:
            raise ValueError("next_version must be >= 0")
        self._next = next_version
        end = self.window_end
        self._pending = {v: x for v, x in self._pending.items() if next_version <= v < end}
