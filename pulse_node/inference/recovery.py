"""Recovery of an inference node that cannot take the next patch: catch-up patches and anchors.

``VersionSync`` (``inference/syncer.py``) holds one ``Recovery`` and falls back to it when it is ``catchup_min_gap`` or more
versions behind (one catch-up patch ``base -> head`` instead of the patches, made on demand by a
peer, ``chain/catchup_producer.py``), when nobody serves the next patch any more (a catch-up
patch, else an anchor), and when it holds no state yet (the newest anchor, ``anchor_load.py``).
Offers are tried in the peer book's order (``peers/standing.py``): peers that delivered before, members,
then at most ``FETCH_UNKNOWN`` peers without standing, so fresh keys announcing versions or
anchors cost a few tries, not one per key. Every download is capped before a byte is read: a
catch-up patch by twice the dense size of our own state, an anchor by its signed manifest.
Recovery works on the version the syncer holds (``inference/held.py``: record, state, the live
model's pending steps), fetches through the syncer's ``PeerFetch`` and hands what each peer did to
the peer book (``PeerBook.ask``); it shares nothing else with the syncer.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import VersionRecord
from pulse_node.chain.store import VersionStore
from pulse_node.chain.verified import apply_catchup_version
from pulse_node.codec.limits import patch_cap
from pulse_node.codec.state import State, state_nbytes
from pulse_node.daemon.status_model import InferenceCounters
from pulse_node.errors import IntegrityError, PatchError
from pulse_node.inference.anchor_load import load_anchor
from pulse_node.inference.fetcher import PeerFetch
from pulse_node.inference.held import Held
from pulse_node.net.wire.protocol import CatchupRequest
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Busy, Delivered, Fault

log = logging.getLogger("pulse.sync")
T = TypeVar("T")

Offer = tuple[PeerRecord, int]  # a peer to ask for a catch-up patch, and the target version to ask for
#: anchors offered by peers tried per recovery, at most (each costs a record fetch)
MAX_ANCHOR_TRIES = 8
#: other holders asked for their record of a version the gate does not believe yet, at most
MAX_VOUCHERS = 3


def catchup_cap(state: State) -> int:
    """Largest catch-up patch accepted: ``codec/limits.py``'s bound for any patch of the state it
    applies to (twice its dense size), recomputed here, never what a peer says."""
    return patch_cap(state)


@dataclass(frozen=True)
class CatchupApplied:
    """One catch-up patch applied: from ``base`` to ``target`` in ``patch_bytes``."""

    base: int
    target: int
    patch_bytes: int


class Recovery(Generic[T]):
    """The catch-up and anchor paths of ``VersionSync``, on the version it holds (``held``)."""

    def __init__(self, held: Held[T], *, store: VersionStore, fetch: PeerFetch, book: PeerBook,
                 counters: InferenceCounters, catchup_min_gap: int = 4, catchup_wait_s: float = 30.0,
                 anchor_timeout: float = 120.0) -> None:
        self.held, self.store, self.fetch, self.book, self.counters = held, store, fetch, book, counters
        self.gate = book.gate
        self.catchup_min_gap, self.catchup_wait_s = catchup_min_gap, catchup_wait_s  # 0 = never ask
        self.anchor_timeout = anchor_timeout
        self.last_catchup: CatchupApplied | None = None
        self._pending: tuple[int, str, int, float] | None = None  # (base, peer, target, give up at)
        self._no_catchup_base = -1  # base nobody could make a catch-up from: fetch patches instead

    def recover_gap(self, peers: list[PeerRecord], head: int, *, older_anchors: bool) -> None:
        """Nobody serves the next patch any more: try a catch-up patch, else an anchor.

        Only ``older_anchors`` (after ``stall_passes`` passes without progress: the way off a
        fork) may that anchor be one we are already past; sooner, the next version may just not
        be in the DHT yet, and an older anchor would cost a full download to end where we are.
        """
        assert self.held.record is not None
        self.counters.gaps += 1
        if self.held.state is not None and self._catch_up(self._catchup_offers(peers, head, min_gap=1))[0]:
            return
        self.recover_from_anchor(peers, head, above=-1 if older_anchors else self.held.record.version)

    def catch_up_if_behind(self, peers: list[PeerRecord], head: int) -> list[VersionRecord] | None:
        """``catchup_min_gap`` or more versions behind: one catch-up patch instead of the patches.

        Returns ``[record caught up to]`` or ``[]`` (fetch patches), or None while the peer that
        answered "busy" may still be making ours (until ``catchup_wait_s``, then patches).
        """
        assert self.held.record is not None
        base, pending = self.held.record.version, self._pending
        if pending is not None and (pending[0] != base or time.monotonic() > pending[3]):
            if pending[0] == base:
                self._no_catchup_base = base  # waited long enough
            self._pending = pending = None
        if not self.catchup_min_gap or head - base < self.catchup_min_gap or base == self._no_catchup_base:
            return []
        offers = ([(p, pending[2]) for p in peers if p.peer_id == pending[1]] if pending
                  else self._catchup_offers(peers, head, min_gap=self.catchup_min_gap))
        rec, busy = self._catch_up(offers)
        if rec is not None or busy is None:
            self._pending = None
            self._no_catchup_base = -1 if rec is not None else base
            return [rec] if rec is not None else []
        if pending is None:
            self._pending = (base, busy[0].peer_id, busy[1], time.monotonic() + self.catchup_wait_s)
        return None

    def _catchup_offers(self, peers: list[PeerRecord], head: int, *, min_gap: int) -> list[Offer]:
        """(peer, target = its version) pairs at least ``min_gap`` ahead of us, in standing order:
        peers that delivered before, members, at most ``FETCH_UNKNOWN`` others (a flood of fresh
        keys announcing versions costs a few tries, not one per key); nearest the head first
        within each."""
        assert self.held.record is not None
        offers = [(p, min(p.head, head)) for p in peers if min(p.head, head) - self.held.record.version >= min_gap]
        random.shuffle(offers)
        offers.sort(key=lambda o: -o[1])
        return self.book.providers(offers, key=lambda o: o[0].peer_id)

    def _catch_up(self, offers: list[Offer]) -> tuple[VersionRecord | None, Offer | None]:
        """Ask each (peer, target) for a catch-up patch from our version; returns (the record we
        caught up to, None) or (None, the first offer that answered busy, if any)."""
        busy = None
        for peer, target in offers:
            holders = [p for p, _ in offers if p.lowest <= target <= p.head]
            got = self.book.ask(peer.peer_id, partial(self._caught_up_from, peer, target, holders), then=Delivered())
            if isinstance(got, Busy):
                busy = busy or (peer, target)
                log.info("catch-up from %s: %s", peer.peer_id[:12], got.why)
            elif isinstance(got, Fault):
                self.counters.catchup_misses += 1
                log.info("catch-up from %s failed: %s", peer.peer_id[:12], got.why)
            elif got is not None:
                return got, None
        return None, busy

    def _caught_up_from(self, peer: PeerRecord, target: int, holders: list[PeerRecord]) -> VersionRecord | None:
        """Our state caught up to ``target`` with one patch from ``peer`` (None: no quorum yet, after
        asking ``holders`` of ``target`` for their records of it)."""
        assert self.held.record is not None and self.held.state is not None
        rec = self.fetch.record(peer, target)
        if not self._believed(rec, holders, asked=peer.peer_id):
            return None
        patch = self.fetch.file(peer, CatchupRequest(base=self.held.record.version, target=target),
                            max_bytes=catchup_cap(self.held.state))
        self._apply_catchup(peer, rec, patch)
        return rec

    def _apply_catchup(self, peer: PeerRecord, rec: VersionRecord, patch: bytes) -> None:
        """Apply a catch-up patch to ``rec`` (checked by ``gate.check``): its header, parsed once,
        names our state (else ``GapError``: another history, no lie) and ``rec``'s; the result is
        hashed once; in place, and a failure leaves our version intact. A patch that does not make
        ``rec``'s state is the peer's lie (``IntegrityError``)."""
        assert self.held.record is not None and self.held.state is not None
        target = self.gate.admit(rec)  # verified by check: no signature again
        try:
            changes, reached = apply_catchup_version(self.held.state, patch, base=self.held.record, target=target)
        except PatchError as exc:  # nothing signed this patch: a malformed one is its maker's
            raise IntegrityError(f"catch-up patch from {peer.peer_id[:12]}: {exc}") from None
        try:
            self.store.put_current(reached)  # a restart resumes from here
        except BaseException:
            changes.undo(self.held.state)  # refused by the store: we stay at our version
            raise
        self.last_catchup = CatchupApplied(self.held.record.version, rec.version, len(patch))
        base = self.held.record.version
        self.held.adopt(rec, self.held.state)
        self.held.moved(base, rec.version, changes)
        self.counters.catchups += 1
        self.counters.catchup_bytes_total += len(patch)
        log.info("caught up to version %d with one %d-byte patch from %s", rec.version, len(patch), peer.peer_id[:12])

    def recover_from_anchor(self, peers: list[PeerRecord], head: int, *, above: int = -1) -> None:
        """Load the newest anchor above ``above`` that peers serve, bounded and checked by its signed
        record (``anchor_load.py``); at most ``MAX_ANCHOR_TRIES`` offers per call."""
        live = peers
        by_id = {p.peer_id: p for p in live}
        # only anchors at or below the verified head count (an announced one above it is no
        # version a member signed); the offers in standing order (members' and peers' that
        # delivered before, then at most FETCH_UNKNOWN offers of peers without standing), newest
        # first within each: fresh keys announcing anchors cannot use up the tries
        offers = [(a, p.peer_id) for p in live for a in set(p.anchors) if above < a <= head]
        random.shuffle(offers)
        offers.sort(key=lambda o: -o[0])
        offers = self.book.providers(offers, key=lambda o: o[1])
        for anchor, pid in offers[:MAX_ANCHOR_TRIES]:
            holders = [p for p in live if anchor in p.anchors]
            got = self.book.ask(pid, partial(self._anchor_from, by_id[pid], anchor, holders), then=Delivered())
            if isinstance(got, Fault):
                log.info("anchor %d from %s failed: %s", anchor, pid[:12], got.why)
            elif got is not None:
                self.counters.anchor_loads += 1
                return

    def _anchor_from(self, peer: PeerRecord, anchor: int, holders: list[PeerRecord]) -> VersionRecord | None:
        """Anchor ``anchor`` loaded from ``peer`` (and ``holders``), bounded and checked by its
        signed record; None while the record lacks a quorum of signers."""
        rec = self.fetch.record(peer, anchor)
        if not rec.is_anchor:
            raise IntegrityError(f"{peer.peer_id[:12]} announced anchor {anchor} but holds none")
        if not self._believed(rec, holders, asked=peer.peer_id):
            return None
        anchor_version = load_anchor(self.fetch.transport, self.book, rec, peer, self.book.providers(holders, key=_peer_id),
                                     self.fetch.scratch, timeout=self.anchor_timeout,
                                     dense_bytes=None if self.held.state is None else state_nbytes(self.held.state))
        self.store.put_anchor(anchor_version)
        assert anchor_version.state is not None
        self.held.adopt(rec, anchor_version.state)
        return rec

    def _believed(self, rec: VersionRecord, holders: list[PeerRecord], *, asked: str) -> bool:
        """Whether the gate believes ``rec`` (a quorum of members vote for its chain hash), after
        asking up to ``MAX_VOUCHERS`` other ``holders`` of its version for their record of it: each
        is its signer's vote. A node that joins long after a version (an old anchor, a catch-up
        target) has seen one record of it, and one member alone moves nobody (``min_signers``)."""
        if self.gate.check(rec):
            return True
        others = [p for p in holders if p.peer_id != asked]
        for peer in self.book.providers(others, key=_peer_id)[:MAX_VOUCHERS]:
            voted = self.book.ask(peer.peer_id, partial(self._vote_of, peer, rec.version))
            if not isinstance(voted, Fault) and self.gate.check(rec):
                return True
        return False

    def _vote_of(self, peer: PeerRecord, version: int) -> bool:
        """``peer``'s record of ``version`` through the gate (a vote for its chain hash)."""
        return self.gate.check(self.fetch.record(peer, version))


def _peer_id(p: PeerRecord) -> str:
    return p.peer_id
