"""Strikes, bans and failure cool-downs per peer id: whom this node stops listening to, for how long.

A peer that sent something false or damaged gets a strike; every ``max_strikes`` of them ban it for
``ban_s``, doubling with every further ban up to ``max_ban_s``. Bans are bounded because damaged
bytes from an honest peer (a flaky link, a bad disk) look exactly like a lie: a liar keeps
re-earning longer bans, an honest peer that had a bad minute comes back. A peer whose requests
failed ``max_failures`` times in a row is left alone for ``cooldown_s`` after each further
failure; one delivery ends the streak. At most ``MAX_TRACKED`` peers are remembered (those with
no ban running are forgotten first). Pure bookkeeping: a ``clock`` injected, no I/O.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

#: peers whose strikes and failures are remembered, at most
MAX_TRACKED = 8192


class Strikes:
    """Per-peer strikes, bans and failure streaks (the peer book's; see the module docstring)."""

    def __init__(self, *, max_strikes: int = 3, ban_s: float = 60.0, max_ban_s: float = 3600.0,
                 max_failures: int = 20, cooldown_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_strikes, self.ban_s, self.max_ban_s = max_strikes, ban_s, max_ban_s
        self.max_failures, self.cooldown_s, self.clock = max_failures, cooldown_s, clock
        self.strikes: Counter[str] = Counter()  # all strikes per peer (reported)
        self.bans: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  # consecutive failed requests per peer
        self.rejected = 0  # strikes of all peers together
        self._since_ban: Counter[str] = Counter()
        self._banned_until: dict[str, float] = {}
        self._last_failure: dict[str, float] = {}

    def ignored(self, peer_id: str) -> bool:
        """Banned, or failing and cooling down."""
        now = self.clock()
        if now < self._banned_until.get(peer_id, float("-inf")):
            return True
        cooling = now - self._last_failure.get(peer_id, float("-inf")) < self.cooldown_s
        return self.failures[peer_id] >= self.max_failures and cooling

    def mark_strike(self, peer_id: str) -> None:
        self._room(peer_id)
        self.rejected += 1
        self.strikes[peer_id] += 1
        self._since_ban[peer_id] += 1
        if self._since_ban[peer_id] >= self.max_strikes:
            self._since_ban[peer_id] = 0
            self.bans[peer_id] += 1
            ban = min(self.max_ban_s, self.ban_s * 2 ** (self.bans[peer_id] - 1))
            self._banned_until[peer_id] = self.clock() + ban

    def mark_failure(self, peer_id: str) -> None:
        self._room(peer_id)
        self.failures[peer_id] += 1
        self._last_failure[peer_id] = self.clock()

    def mark_served(self, peer_id: str) -> None:
        self.failures.pop(peer_id, None)
        self._last_failure.pop(peer_id, None)

    def _room(self, peer_id: str) -> None:
        """Forget the peers without a running ban first when ``MAX_TRACKED`` are remembered."""
        if peer_id in self.strikes or peer_id in self.failures or len(self.strikes) + len(self.failures) < MAX_TRACKED:
            return
        now, tracked = self.clock(), self.strikes.keys() | self.failures.keys()
        idle = [p for p in tracked if self._banned_until.get(p, float("-inf")) <= now]
        for p in idle[:max(1, len(idle) // 8)]:
            for table in (self.strikes, self.bans, self.failures, self._since_ban, self._banned_until,
                          self._last_failure):
                table.pop(p, None)
