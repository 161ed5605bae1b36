"""Inference side of PULSESync: keep a local state equal to the newest trusted version.

One ``step()``: learn the head, fetch the missing versions' records and patches from any peers
that hold them (bounded concurrency, per-peer timeouts, failover, inference peers preferred so
trainers upload each patch about once), pass each record and patch through the trust gate
(``VersionGate.admit``: run, signature, trainer-set signer, patch digest, header; the
``VerifiedVersion`` it returns is all the apply and the store take), hand them to the reorder
buffer, and apply exactly the next version (``chain.verified.apply_version``: base hash against
the signed parent, one state hash of the result). Every call to a peer goes through the peer
book (``PeerBook.ask``): what the peer did, delivered, failed or lied, is judged there, once.

Nothing a peer merely claims sets a number this node acts on. A version becomes the target only
once its signed record is in hand and verified: a pushed head record, or the record of a version
a trainer-set member announces in its DHT record, fetched and checked (``_probe_announced``).
That verified record is kept and used for its version's fetch from the peers that sent it (not
fetched from them again), as long as it carries a quorum of signers on its own.
Every download is capped by something signed or recomputed before a byte is read: a record by
``MAX_RECORD_BYTES``, a patch by its record's ``patch_bytes``, a catch-up patch by twice the dense
size of our own state, an anchor by its record's manifest (``anchor_load.py``).

Applied versions are written to the store, so this node re-serves them. A node that is
``catchup_min_gap`` or more versions behind asks peers for one catch-up patch ``base -> their
head`` instead of the patches (peers make it on demand, ``chain/catchup_producer.py``; a peer
still making it answers "busy" and is asked again for up to ``catchup_wait_s``); if nobody can
make it, the patches are fetched as usual. A node with no state starts from the newest anchor;
one whose missing patches nobody holds any more tries a catch-up patch, then an anchor (both in
``inference/recovery.py``, a ``Recovery`` of its own on the version held, ``inference/held.py``).
Downloads go through ``PeerFetch`` (``inference/fetcher.py``).
"""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import VersionRecord, decode_record, encode_record
from pulse_node.chain.reorder import ReorderBuffer
from pulse_node.chain.store import VersionStore
from pulse_node.chain.verified import VerifiedVersion
from pulse_node.codec.failpoints import NEVER, Failpoints
from pulse_node.codec.inplace import Move
from pulse_node.codec.limits import check_patch_size
from pulse_node.codec.patch import ParsedPatch
from pulse_node.codec.state import State
from pulse_node.config import NetConfig
from pulse_node.daemon.status_model import InferenceCounters
from pulse_node.daemon.transport import Event, Transport
from pulse_node.errors import ConfigError, PulseError, WireError
from pulse_node.inference.fetcher import PeerFetch, scratch_file
from pulse_node.inference.held import Held
from pulse_node.inference.recovery import CatchupApplied, Recovery, catchup_cap  # noqa: F401 (re-exported)
from pulse_node.inference.streaming import Pipeline, Streamed, apply_next, stream_next
from pulse_node.net.wire.protocol import PatchRequest
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Delivered, Fault, Relayed

log = logging.getLogger("pulse.sync")

#: pushed head records kept until the next pass, and verified hints kept, at most
MAX_PENDING_HEADS = 256
MAX_HINTS = 1024
#: peers asked for the record of an announced version, at most, per pass
MAX_PROBES = 3
#: verified records kept for the versions ahead of us (not fetched again), at most
MAX_KEPT_RECORDS = 64


@dataclass
class Fetched:
    """A verified version waiting in the reorder buffer, and what was applied while it arrived."""

    verified: VerifiedVersion
    streamed: Streamed | None = None  # applied while it arrived (``inference/streaming.py``)

    @property
    def record(self) -> VersionRecord:
        return self.verified.record


class VersionSync:
    """Pull, verify, reorder and apply versions; serve them afterwards through the store."""

    def __init__(self, store: VersionStore, transport: Transport, book: PeerBook, *,
                 net: NetConfig, seeds: int = 1, window: int = 16, seed_wait_s: float = 2.0,
                 catchup_min_gap: int = 4, catchup_wait_s: float = 30.0) -> None:
        self.store, self.transport, self.book, self.net = store, transport, book, net
        self.gate = book.gate
        self.seeds, self.window, self.seed_wait_s = seeds, window, seed_wait_s
        record, state = store.load_head() or (None, None)  # our own arrays: patched in place
        if record is not None and record.run_id != self.gate.run_id:
            raise ConfigError(f"{store.root} holds versions of run {record.run_id!r}, not {self.gate.run_id!r}; "
                              "use another data_dir for another run")
        self.held: Held[Fetched] = Held(record, state)
        self.pipeline: Pipeline | None = None  # set by the role: the next version applied while it arrives
        self.failpoints: Failpoints = NEVER  # tests: failures injected into the apply (codec/failpoints.py)
        self.counters = InferenceCounters()  # the status model's own counters, by the same names
        self.fetch = PeerFetch(transport, book, net=net, scratch=store.root.parent / "fetch-tmp")
        self.recovery: Recovery[Fetched] = Recovery(
            self.held, store=store, fetch=self.fetch, book=book, counters=self.counters,
            catchup_min_gap=catchup_min_gap, catchup_wait_s=catchup_wait_s, anchor_timeout=net.fetch_timeout_s * 4)
        self.last_error = ""
        self.stall_passes = 10  # passes without progress before trying a catch-up or an anchor
        self._stalled = 0
        self.hints: dict[str, int] = {}  # peer -> highest version it told us it holds (verified)
        self._heads: dict[str, VersionRecord] = {}  # pushed head records, until verified
        self.head: VersionRecord | None = None  # newest verified record ahead of us: the target
        self._records: dict[int, tuple[VersionRecord, set[str]]] = {}  # version ahead -> verified record, who sent it
        self._probed: dict[str, int] = {}  # peer -> the announced version we asked it about
        self.first_seen: dict[int, float] = {}
        self._pool = ThreadPoolExecutor(max_workers=net.max_parallel_fetches, thread_name_prefix="fetch")

    # ---- the version held (``inference/held.py``) --------------------------------------
    @property
    def record(self) -> VersionRecord | None:
        return self.held.record

    @property
    def state(self) -> State | None:
        return self.held.state

    @property
    def reorder(self) -> ReorderBuffer[Fetched]:
        return self.held.reorder

    @property
    def last_catchup(self) -> CatchupApplied | None:
        return self.recovery.last_catchup

    def take_changes(self) -> list[Move]:
        """The (from, to, changes) steps applied since the last call; the live model follows them
        sparsely. Empty after an anchor or a state loaded whole (reload the live model)."""
        return self.held.take_changes()

    # ---- head discovery -------------------------------------------------------------
    def take_events(self, events: list[Event]) -> None:
        """Head announcements pushed by peers (``take_head``)."""
        for ev in events:
            if ev.kind == "head":
                self.take_head(ev.sender, ev.data)

    def take_head(self, sender: str, data: bytes) -> None:
        """A head record ``sender`` pushed: kept until ``step`` verifies it (``_take_hints``)."""
        if self.book.ignored(sender):
            return
        rec = self.book.ask(sender, partial(decode_record, data), lies=(WireError,))
        if isinstance(rec, Fault):
            return
        have = self._heads.get(sender)
        if (have is None and len(self._heads) < MAX_PENDING_HEADS) or (have and rec.version > have.version):
            self._heads[sender] = rec

    def _take_hints(self) -> None:
        """A pushed head record becomes a target and a hint about who holds what only if a member
        of the trainer set signed it for this run; a forged one is its sender's lie (else it could
        make us chase versions that do not exist). Kept while no member is known yet."""
        if not self.book.signers():
            return
        for sender, rec in self._heads.items():
            got = self.book.ask(sender, partial(self.gate.verify, rec), then=Relayed())
            if isinstance(got, Fault):
                log.info("head announcement from %s rejected: %s", sender[:12], got.why)
                continue
            self._verified(got, holder=sender)
        self._heads.clear()

    def _verified(self, rec: VersionRecord, *, holder: str) -> None:
        """``rec`` (verified) exists and ``holder`` says it holds it: a hint, maybe the new target,
        and the record its version's fetch uses."""
        self.hints[holder] = max(self.hints.get(holder, -1), rec.version)
        if len(self.hints) > MAX_HINTS:  # keep the peers holding the newest versions
            self.hints = dict(sorted(self.hints.items(), key=lambda kv: -kv[1])[:MAX_HINTS // 2])
        kept = self._records.get(rec.version)
        if kept is None and rec.version > self.held.version and len(self._records) < MAX_KEPT_RECORDS:
            self._records[rec.version] = kept = (rec, set())
        if kept is not None and kept[0] == rec and len(kept[1]) < MAX_PENDING_HEADS:
            kept[1].add(holder)
        if rec.version > self.target():
            self.head = rec

    def _probe_announced(self, peers: list[PeerRecord]) -> None:
        """A member trainer announces a version beyond the one we hold in its DHT record: fetch that
        version's record (from it, then from peers announcing it while the gate lacks a quorum for
        it) and verify it before it counts. Each (peer, announced version) is asked about once, so
        every live member's head gets its vote, the laggard's too."""
        claims = [p for p in peers if p.role == "trainer" and p.head > self.held.version
                  and self._probed.get(p.peer_id) != p.head and self.book.vouches_for(p)]
        if not claims:
            return
        claim = max(claims, key=lambda p: p.head)
        self._probed = {p.peer_id: v for p in peers if (v := self._probed.get(p.peer_id)) is not None}
        self._probed[claim.peer_id] = claim.head
        others = self.book.providers([p for p in peers if p.head >= claim.head and p.peer_id != claim.peer_id],
                                     key=_peer_id)
        for peer in [claim, *others][:MAX_PROBES]:
            rec = self.book.ask(peer.peer_id, partial(self._verified_record, peer, claim.head))
            if isinstance(rec, Fault):
                log.info("announced version %d of %s not confirmed by %s: %s", claim.head, claim.peer_id[:12],
                         peer.peer_id[:12], rec.why)
                continue
            self._verified(rec, holder=peer.peer_id)
            if self.gate.check(rec):  # else another holder's record of it may be the second vote
                return

    def _verified_record(self, peer: PeerRecord, version: int) -> VersionRecord:
        """``peer``'s record of ``version``, verified by the gate."""
        return self.gate.verify(self.fetch.record(peer, version))

    def target(self) -> int:
        """The newest version whose signed record we verified (or hold); -1 if none."""
        return max(self.held.version, self.head.version if self.head is not None else -1)

    def providers(self, version: int, peers: list[PeerRecord], *, rank: int) -> list[PeerRecord]:
        """Peers that hold ``version``, in the book's order (``PeerBook.fetch_order``): peers that
        delivered to us before, then trainer-set members, then at most ``FETCH_UNKNOWN`` others.
        What a peer announces (role, version) orders nothing.

        Only the first ``seeds`` inference nodes (by rank) fetch a fresh version straight from a
        trainer; the rest, while no peer that delivered before holds it, try one peer without
        standing that pushed us the verified head of it (briefly: ``FIRST_TRY_S``) or wait up to
        ``seed_wait_s`` for one, so a trainer's upload does not grow with the inference nodes.
        """
        holders = [p for p in peers if p.peer_id != self.transport.peer_id
                   and max(p.head, self.hints.get(p.peer_id, -1)) >= version and p.lowest <= version]
        random.shuffle(holders)
        young = time.monotonic() - self.first_seen.get(version, 0.0) < self.seed_wait_s
        return self.book.fetch_order(holders, copies={pid for pid, v in self.hints.items() if v >= version},
                                     first_hand=rank < self.seeds, wait=young)

    # ---- one pass -------------------------------------------------------------------
    def step(self, peers: list[PeerRecord], *, rank: int = 0) -> list[VersionRecord]:
        """Fetch and apply what is missing; returns the records applied in this pass."""
        # banned, cooling down or convicted peers, and we, are not asked this pass
        peers = [p for p in self.book.heed(peers) if p.peer_id != self.transport.peer_id]
        self._take_hints()
        self._probe_announced(peers)
        head = self.target()
        if head < 0 or (self.record is not None and head <= self.record.version):
            return []
        self._note_wanted(head)
        if self.state is None:
            self.recovery.recover_from_anchor(peers, head)
            if self.state is None:
                return []
        caught = self.recovery.catch_up_if_behind(peers, head)
        if caught is None:
            return []  # a peer is still making our catch-up patch: ask it again next pass
        applied = caught + self._fetch_and_apply(peers, head, rank=rank)
        self._stalled = 0 if applied or self.reorder.next_version > head else self._stalled + 1
        stuck = self._stalled >= self.stall_passes
        if self._stalled and (stuck or self._nobody_has(self.reorder.next_version, peers)):
            self._stalled = 0
            self.recovery.recover_gap(peers, head, older_anchors=stuck)
        self.gate.forget_below(self.held.version)  # votes of versions we hold are done with
        return applied

    def _note_wanted(self, head: int) -> None:
        """When each version of the window was first wanted; records kept only for those ahead."""
        nxt = self.reorder.next_version
        for v in range(nxt, min(head, nxt + self.window - 1) + 1):
            self.first_seen.setdefault(v, time.monotonic())
        self.first_seen = {v: t for v, t in self.first_seen.items() if v >= nxt}
        self._records = {v: r for v, r in self._records.items() if v > self.held.version}

    def _fetch_and_apply(self, peers: list[PeerRecord], head: int, *, rank: int) -> list[VersionRecord]:
        """Fetch the window's missing versions at once, then apply those ready, in order."""
        nxt = self.reorder.next_version
        wanted = [v for v in range(nxt, min(head, nxt + self.window - 1) + 1) if v not in self.reorder]
        jobs = {v: self._pool.submit(self._fetch_version, v, self.providers(v, peers, rank=rank)) for v in wanted}
        fetched = {v: job.result() for v, job in jobs.items()}
        for v, got in fetched.items():
            if got is not None:
                self.reorder.offer(v, got)
        applied = self._apply_ready()
        for got in fetched.values():
            if got is not None and got.streamed is not None and not got.streamed.settled:
                got.streamed.rollback()  # not applied after all: the state back at our version
                self.reorder.reset(got.record.version)
        return applied

    def _nobody_has(self, version: int, peers: list[PeerRecord]) -> bool:
        return not any(p.lowest <= version <= p.head for p in peers)

    def _fetch_version(self, version: int, providers: list[PeerRecord]) -> Fetched | None:
        for peer in providers:
            got = self.book.ask(peer.peer_id, partial(self._version_from, peer, version), then=Delivered())
            if isinstance(got, Fault):
                self.counters.fetch_errors += 1
                log.info("fetch of version %d from %s failed: %s", version, peer.peer_id[:12], got.why)
            elif got is not None:
                return got
        return None

    def _version_from(self, peer: PeerRecord, version: int) -> Fetched | None:
        """``version`` from ``peer``, through the gate (None while it lacks a quorum of signers).
        The verified record ``peer`` sent us of the version (a pushed head) is used when it has a
        quorum on its own; else ``peer``'s record is fetched."""
        sent, by = self._records.get(version, (None, set()))
        kept = sent if sent is not None and peer.peer_id in by and self.gate.check(sent) else None
        rec = kept if kept is not None else self.fetch.record(peer, version)
        if kept is None and not self.gate.check(rec):
            return None
        assert self.state is not None
        check_patch_size(rec.patch_bytes, self.state)  # signed, yet past any patch of our model: no lie of the peer
        streamed: Streamed | None = None
        patch: bytes | ParsedPatch
        if self.pipeline is not None and stream_next(self.record, rec):
            patch, streamed = self._fetch_streamed(peer, rec)
        else:
            patch = self.fetch.file(peer, PatchRequest(version=version), max_bytes=rec.patch_bytes)
            self.failpoints.reached("reported")
            self.failpoints.reached("received")
        try:  # a streamed patch's digest was compared as it came
            got = self.gate.admit(rec, patch=patch, digest_seen=streamed is not None)
        except BaseException:
            if streamed is not None:
                streamed.rollback()
            raise
        self.counters.patch_bytes_total += len(patch)
        return Fetched(got, streamed)

    def _fetch_streamed(self, peer: PeerRecord, rec: VersionRecord) -> tuple[bytes | ParsedPatch, Streamed | None]:
        """The next version's patch, applied while it arrives (``inference/streaming.py``)."""
        assert self.pipeline is not None and self.state is not None and self.record is not None
        dest = self.fetch.path("patch")
        limit = self.net.fetch_timeout_s

        def fetch(path: Path) -> None:
            self.transport.fetch(peer, PatchRequest(version=rec.version), path, timeout=limit,
                                 max_bytes=rec.patch_bytes)

        with scratch_file(dest):
            return self.pipeline.fetch_apply(fetch, dest, state=self.state, base=self.record.version,
                                             target=rec.version, expected=self.pipeline.expect(self.record, rec),
                                             size=rec.patch_bytes, timeout=limit)

    def _apply_ready(self) -> list[VersionRecord]:
        applied: list[VersionRecord] = []
        for version, got in self.reorder.pop_ready():
            try:
                self._apply(got)
            except PulseError as exc:  # ours to retry: the version was verified, no peer lied
                self.counters.apply_errors += 1
                self.last_error = f"version {version} rejected: {exc}"
                log.warning("%s", self.last_error)
                self.reorder.reset(version)  # refetch it (from another provider) next pass
                break
            except BaseException:
                self.reorder.reset(version)  # not applied (``_apply`` is all or nothing): asked for again
                raise
            applied.append(got.record)
        return applied

    def _apply(self, got: Fetched) -> None:
        """Apply the next version in place (a failure leaves our version intact) and store it."""
        try:
            self._apply_fetched(got)
        finally:
            if got.streamed is not None and not got.streamed.settled:
                got.streamed.rollback()  # refused here: the state and live model back at our version

    def _apply_fetched(self, got: Fetched) -> None:
        assert self.state is not None and self.record is not None
        rec = got.record
        changes = apply_next(got.verified, got.streamed, state=self.state, base=self.record, store=self.store,
                             failpoints=self.failpoints)  # all or nothing (inference/streaming.py)
        if got.streamed is not None and got.streamed.live_written:
            self.held.changes = []  # the live model holds this version already: later steps start here
        else:
            self.held.moved(self.record.version, rec.version, changes)
        self.held.record = rec
        self.counters.patches_applied += 1

    def head_announcement(self) -> bytes | None:
        return encode_record(self.record) if self.record else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.fetch.close()


def _peer_id(p: PeerRecord) -> str:
    return p.peer_id
