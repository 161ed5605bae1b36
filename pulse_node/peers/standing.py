"""A peer's standing: what this node saw it do, never what its record claims.

Keys, records and streams are free, so nothing a peer says about itself (its record's
``updated_at``, the version it announces, its role) may order it before another peer. Standing
is earned from observations of this node only:

- patches (and catch-up patches, anchors) it delivered that verified (``Delivered``),
- rollout batches of its that a trainer accepted (``Accepted``),
- head records it pushed that a trainer-set member signed (``Relayed``, small and capped:
  relaying a head is cheap),
- time since this node first saw it (capped, and counted only once it earned something),

minus failed requests and pushes (a streak, ended by a delivery) and strikes (lies, never
forgotten while the peer is remembered). Trainer-set members always come first. The peer book
(``peers/book.py``) records these outcomes here; nothing else does.

``Standing.order`` is the one ordering every fan-out uses (views, push targets, fetch
providers): members, then peers with standing by score, then at most ``quota`` peers without
standing, chosen in an order this node draws at random and redraws every ``rotate_s`` (so a
key ground to sort first does not, and every newcomer gets its turn). However many fresh keys
exist, 1 or 1,000, the honest peers' position and the number of unknown peers tried are the same.
Pure bookkeeping: no I/O, a ``clock`` injected.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast, overload

T = TypeVar("T")


class HasPeerId(Protocol):
    """Anything that names a peer (a DHT record, a transport's peer)."""

    @property
    def peer_id(self) -> str: ...


P = TypeVar("P", bound=HasPeerId)


def _peer_id(p: object) -> str:
    """The peer id of an item the overloads below admit without a ``key`` (a ``HasPeerId``)."""
    return cast(HasPeerId, p).peer_id

#: per-peer observations kept, at most (the least valuable are forgotten first)
MAX_PEERS = 8192
#: time seen counts up to this long
SEEN_CAP_S = 600.0
#: unknown peers a view keeps, push fan-out reaches and a fetch tries, at most (each together)
VIEW_UNKNOWN = 16
PUSH_UNKNOWN = 4
FETCH_UNKNOWN = 2


@dataclass
class PeerMarks:
    """What one peer did, as this node saw it."""

    first_seen: float
    delivered: int = 0
    accepted: int = 0
    heads: int = 0
    fail_streak: int = 0
    strikes: int = 0

    @property
    def earned(self) -> bool:
        return self.delivered > 0 or self.accepted > 0


class Standing:
    """Per-peer standing from this node's own observations, and the one ordering built on it."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, rotate_s: float = 30.0,
                 salt: bytes | None = None, max_peers: int = MAX_PEERS) -> None:
        self.clock, self.rotate_s, self.max_peers = clock, rotate_s, max_peers
        self.salt = salt if salt is not None else os.urandom(16)
        self.members: frozenset[str] = frozenset()
        self.marks: dict[str, PeerMarks] = {}
        self._lock = threading.RLock()  # the push fan-out thread reports failures too
        self.changes = 0  # bumped by every observation that can move a peer in the order

    # ---- observations ---------------------------------------------------------------
    def mark_members(self, peer_ids: Iterable[str]) -> None:
        self.members = frozenset(peer_ids)
        self.changes += 1

    def _of(self, peer_id: str) -> PeerMarks:
        with self._lock:
            m = self.marks.get(peer_id)
            if m is None:
                if len(self.marks) >= self.max_peers:
                    self._forget()
                m = self.marks[peer_id] = PeerMarks(first_seen=self.clock())
            return m

    def mark_seen(self, peer_ids: Iterable[str]) -> None:
        """Peers in a view now (starts their time seen)."""
        for pid in peer_ids:
            self._of(pid)

    def mark_delivered(self, peer_id: str, n: int = 1) -> None:
        """It served something that verified; its failure streak ends."""
        m = self._of(peer_id)
        m.delivered += n
        m.fail_streak = 0
        self.changes += 1

    def mark_accepted(self, peer_id: str, n: int = 1) -> None:
        """A rollout batch of its was verified and accepted."""
        self._of(peer_id).accepted += n
        self.changes += 1

    def mark_relayed(self, peer_id: str) -> None:
        """It pushed a head record a trainer-set member signed."""
        self._of(peer_id).heads += 1
        self.changes += 1

    def mark_failure(self, peer_id: str) -> None:
        """A request to it timed out or failed."""
        self._of(peer_id).fail_streak += 1
        self.changes += 1

    def mark_strike(self, peer_id: str) -> None:
        """It sent something false or damaged."""
        self._of(peer_id).strikes += 1
        self.changes += 1

    # ---- judgement ------------------------------------------------------------------
    def score(self, peer_id: str) -> float:
        m = self.marks.get(peer_id)
        if m is None:
            return 0.0
        s = 3 * math.log2(1 + m.delivered) + 3 * math.log2(1 + m.accepted) + 0.25 * min(m.heads, 4)
        if m.earned:
            s += min(self.clock() - m.first_seen, SEEN_CAP_S) / SEEN_CAP_S
        return s - 2.0 * m.fail_streak - 4.0 * m.strikes

    def known(self, peer_id: str) -> bool:
        """A member, or a peer that earned standing (work that verified) and lost none of it."""
        if peer_id in self.members:
            return True
        m = self.marks.get(peer_id)
        return m is not None and m.earned and self.score(peer_id) > 0

    def delivered_before(self, peer_id: str) -> bool:
        m = self.marks.get(peer_id)
        return m is not None and m.delivered > 0 and self.score(peer_id) > 0

    def known_ids(self, limit: int = 256) -> list[str]:
        """Non-member peers with standing, best first."""
        with self._lock:
            ids = [p for p, m in self.marks.items() if m.earned and p not in self.members and self.score(p) > 0]
        return sorted(ids, key=lambda p: (-self.score(p), p))[:limit]

    def epoch(self) -> int:
        """Which draw of newcomers is current (it changes every ``rotate_s``)."""
        return int(self.clock() // self.rotate_s) if self.rotate_s > 0 else 0

    def _draw(self, peer_id: str) -> bytes:
        """This node's random order of unknown peers, redrawn every ``rotate_s``."""
        return hashlib.blake2b(peer_id.encode(), key=self.salt, digest_size=8,
                               person=self.epoch().to_bytes(8, "big")).digest()

    @overload
    def order(self, items: Iterable[P], *, quota: int, members_first: bool = True) -> list[P]: ...
    @overload
    def order(self, items: Iterable[T], *, quota: int, key: Callable[[T], str],
              members_first: bool = True) -> list[T]: ...
    def order(self, items: Iterable[T], *, quota: int, key: Callable[[T], str] = _peer_id,
              members_first: bool = True) -> list[T]:
        """Members (if ``members_first``), then peers with standing by score, then at most
        ``quota`` others: those not yet demoted by a failure first, each group in this node's draw."""
        items = list(items)
        members = [x for x in items if key(x) in self.members] if members_first else []
        rest = [x for x in items if not members_first or key(x) not in self.members]
        known = sorted([x for x in rest if self.known(key(x))], key=lambda x: -self.score(key(x)))
        unknown = [x for x in rest if not self.known(key(x))]
        unknown.sort(key=lambda x: (self.score(key(x)) < 0, self._draw(key(x))))
        return members + known + unknown[:max(0, quota)]

    @overload
    def providers(self, items: Iterable[P], *, quota: int = FETCH_UNKNOWN) -> list[P]: ...
    @overload
    def providers(self, items: Iterable[T], *, quota: int = FETCH_UNKNOWN, key: Callable[[T], str]) -> list[T]: ...
    def providers(self, items: Iterable[T], *, quota: int = FETCH_UNKNOWN,
                  key: Callable[[T], str] = _peer_id) -> list[T]:
        """Who to fetch from: peers that delivered before (so members upload each version about
        once), then members, then at most ``quota`` peers without standing."""
        items = list(items)
        proven = sorted([x for x in items if key(x) not in self.members and self.delivered_before(key(x))],
                        key=lambda x: -self.score(key(x)))
        chosen = {key(x) for x in proven}
        return proven + self.order([x for x in items if key(x) not in chosen], quota=quota, key=key)

    def summary(self) -> dict[str, int]:
        """Counts for the status page."""
        with self._lock:
            known = sum(1 for p in self.marks if self.known(p) and p not in self.members)
            demoted = sum(1 for p in self.marks if self.score(p) < 0)
            return {"remembered": len(self.marks), "with_standing": known, "demoted": demoted}

    def _forget(self) -> None:
        """Drop an eighth of what is remembered (never members): peers seen but never observed
        doing anything first, oldest first; strikes and earnings are kept longest."""
        def value(p: str) -> tuple[bool, float, float]:
            m = self.marks[p]
            marked = m.earned or m.heads or m.fail_streak or m.strikes
            return (bool(marked), abs(self.score(p)), m.first_seen)
        ranked = sorted((p for p in self.marks if p not in self.members), key=value)
        for p in ranked[:max(1, len(ranked) // 8)]:
            del self.marks[p]
