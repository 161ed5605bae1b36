"""Inference side of PULSESync: keep a local state equal to the newest trusted version.

One ``step()``: learn the head, fetch the missing versions' records and patches from any peers
that hold them (bounded concurrency, per-peer timeouts, failover, inference peers preferred so
trainers upload each patch about once), verify each record (run, signature, trainer-set signer,
parent link) and patch digest, hand them to the reorder buffer, and apply exactly the next
version, checking base and result state hashes.

Nothing a peer merely claims sets a number this node acts on. A version becomes the target only
once its signed record is in hand and verified: a pushed head record, or the record of a version
a trainer-set member announces in its DHT record, fetched and checked (``_probe_announced``).
Every download is capped by something signed or recomputed before a byte is read: a record by
``MAX_RECORD_BYTES``, a patch by its record's ``patch_bytes``, a catch-up patch by twice the dense
size of our own state, an anchor by its record's manifest (``anchor_load.py``).

Applied versions are written to the store, so this node re-serves them. A node that is
``catchup_min_gap`` or more versions behind asks peers for one catch-up patch ``base -> their
head`` instead of the patches (peers make it on demand, ``chain/catchup_producer.py``; a peer
still making it answers "busy" and is asked again for up to ``catchup_wait_s``); if nobody can
make it, the patches are fetched as usual. A node with no state starts from the newest anchor;
one whose missing patches nobody holds any more tries a catch-up patch, then an anchor.
"""

from __future__ import annotations

import logging
import random
import shutil
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pulse_node.chain.catchup import check_catchup
from pulse_node.chain.identity import peer_id_of_key
from pulse_node.chain.patchinfo import patch_hashes
from pulse_node.chain.record import MAX_RECORD_BYTES, VersionRecord, check_patch, decode_record, encode_record
from pulse_node.chain.reorder import ReorderBuffer
from pulse_node.chain.store import VersionStore
from pulse_node.chain.trust import TrustPolicy
from pulse_node.codec.patch import apply_patch, read_header
from pulse_node.codec.state import State, state_nbytes
from pulse_node.config import NetConfig
from pulse_node.daemon.transport import Event, PeerInfo, Transport
from pulse_node.errors import BusyError, ConfigError, GapError, IntegrityError, PatchError, PulseError
from pulse_node.inference.anchor_load import load_anchor
from pulse_node.net.standing import FETCH_UNKNOWN, Standing

log = logging.getLogger("pulse.sync")

Offer = tuple[PeerInfo, int]  # a peer to ask for a catch-up patch, and the target version to ask for
#: pushed head records kept until the next pass, and verified hints kept, at most
MAX_PENDING_HEADS = 256
MAX_HINTS = 1024
#: anchors offered by peers tried per recovery, at most (each costs a record fetch)
MAX_ANCHOR_TRIES = 8
#: peers asked for the record of an announced version, at most, per pass
MAX_PROBES = 3
#: seconds a peer without standing gets to send a record, when tried before the trainers
FIRST_TRY_S = 3.0


def catchup_cap(state: State) -> int:
    """Largest catch-up patch accepted: twice the dense size of the state it applies to (a
    fully changed state codes to ~1.04x dense), recomputed here, never what a peer says."""
    return 2 * state_nbytes(state) + (1 << 20)


@dataclass
class Fetched:
    record: VersionRecord
    patch: bytes


@dataclass(frozen=True)
class CatchupApplied:
    """One catch-up patch applied: from ``base`` to ``target`` in ``patch_bytes``."""

    base: int
    target: int
    patch_bytes: int


class VersionSync:
    """Pull, verify, reorder and apply versions; serve them afterwards through the store."""

    def __init__(self, store: VersionStore, transport: Transport, trust: TrustPolicy, *,
                 net: NetConfig, seeds: int = 1, window: int = 16, seed_wait_s: float = 2.0,
                 catchup_min_gap: int = 4, catchup_wait_s: float = 30.0, standing: Standing | None = None) -> None:
        self.store, self.transport, self.trust, self.net = store, transport, trust, net
        self.standing = standing if standing is not None else Standing()
        self._members_told: frozenset[str] | None = None
        self.seeds, self.window, self.seed_wait_s = seeds, window, seed_wait_s
        self.catchup_min_gap, self.catchup_wait_s = catchup_min_gap, catchup_wait_s  # 0 = never ask
        self._pending: tuple[int, str, int, float] | None = None  # (base, peer, target, give up at)
        self._no_catchup_base = -1  # base nobody could make a catch-up from: fetch patches instead
        self.record: VersionRecord | None = None
        self.state: State | None = None
        self.record, self.state = store.load_head() or (None, None)
        if self.record is not None and self.record.run_id != trust.trainers.run_id:
            raise ConfigError(f"{store.root} holds versions of run {self.record.run_id!r}, not "
                              f"{trust.trainers.run_id!r}; use another data_dir for another run")
        self.reorder = ReorderBuffer(next_version=self.record.version + 1 if self.record else 0)
        self.counters: Counter[str] = Counter()
        self.last_catchup: CatchupApplied | None = None
        self.last_error = ""
        self.stall_passes = 10  # passes without progress before trying a catch-up or an anchor
        self._stalled = 0
        self.hints: dict[str, int] = {}  # peer -> highest version it told us it holds (verified)
        self._heads: dict[str, VersionRecord] = {}  # pushed head records, until verified
        self.head: VersionRecord | None = None  # newest verified record ahead of us: the target
        self._probed: dict[str, int] = {}  # peer -> the announced version we asked it about
        self.first_seen: dict[int, float] = {}
        self._pool = ThreadPoolExecutor(max_workers=net.max_parallel_fetches, thread_name_prefix="fetch")
        self._tmp = _fresh_dir(store.root.parent / "fetch-tmp")
        self._lock = threading.Lock()

    # ---- head discovery -------------------------------------------------------------
    def take_events(self, events: list[Event]) -> None:
        """Head announcements pushed by peers: kept until ``step`` verifies them (``_take_hints``)."""
        for ev in events:
            if ev.kind != "head" or self.trust.ignored(ev.sender):
                continue
            try:
                rec = decode_record(ev.data)
            except PulseError:
                self.trust.strike(ev.sender)
                continue
            have = self._heads.get(ev.sender)
            if (have is None and len(self._heads) < MAX_PENDING_HEADS) or (have and rec.version > have.version):
                self._heads[ev.sender] = rec

    def _take_hints(self) -> None:
        """A pushed head record becomes a target and a hint about who holds what only if a member
        of the trainer set signed it for this run; a forged one strikes its sender (else it could
        make us chase versions that do not exist). Kept while no member is known yet."""
        if not self.trust.trainers.members:
            return
        for sender, rec in self._heads.items():
            try:
                self.trust.verify(rec, sender=sender)
            except IntegrityError as exc:
                self.standing.struck(sender)
                log.info("head announcement from %s rejected: %s", sender[:12], exc)
                continue
            self.standing.head_matched(sender)
            self._verified(rec, holder=sender)
        self._heads.clear()

    def _verified(self, rec: VersionRecord, *, holder: str) -> None:
        """``rec`` (verified) exists and ``holder`` says it holds it: a hint, and maybe the new target."""
        self.hints[holder] = max(self.hints.get(holder, -1), rec.version)
        if len(self.hints) > MAX_HINTS:  # keep the peers holding the newest versions
            self.hints = dict(sorted(self.hints.items(), key=lambda kv: -kv[1])[:MAX_HINTS // 2])
        if rec.version > self.target():
            self.head = rec

    def _probe_announced(self, peers: list[PeerInfo]) -> None:
        """A member trainer announces a version beyond our target in its DHT record: fetch that
        version's record (from it, else from peers announcing it) and verify it before it counts.
        Each (peer, announced version) is asked about once."""
        claims = [p for p in peers if p.role == "trainer" and p.version > self.target()
                  and self._probed.get(p.peer_id) != p.version and not self.trust.ignored(p.peer_id)
                  and self.trust.vouches_for(p)]
        if not claims:
            return
        claim = max(claims, key=lambda p: p.version)
        self._probed = {p.peer_id: v for p in peers if (v := self._probed.get(p.peer_id)) is not None}
        self._probed[claim.peer_id] = claim.version
        others = self.standing.providers([p for p in peers if p.version >= claim.version and not self.trust.ignored(
            p.peer_id) and p.peer_id not in (claim.peer_id, self.transport.peer_id)])
        for peer in [claim, *others][:MAX_PROBES]:
            try:
                rec = self._fetch_record(peer, claim.version, timeout=self._first_try(peer.peer_id))
                self.trust.verify(rec, sender=peer.peer_id)
            except PulseError as exc:
                log.info("announced version %d of %s not confirmed by %s: %s", claim.version, claim.peer_id[:12],
                         peer.peer_id[:12], exc)
                continue
            self._verified(rec, holder=peer.peer_id)
            return

    def target(self) -> int:
        """The newest version whose signed record we verified (or hold); -1 if none."""
        ours = self.record.version if self.record is not None else -1
        return max(ours, self.head.version if self.head is not None else -1)

    def providers(self, version: int, peers: list[PeerInfo], *, rank: int) -> list[PeerInfo]:
        """Peers that hold ``version``, in standing order (``net/standing.py``): peers that
        delivered to us before, then trainer-set members, then at most ``FETCH_UNKNOWN`` others.
        What a peer announces (role, version) orders nothing.

        Only the first ``seeds`` inference nodes (by rank) fetch a fresh version straight from a
        trainer; the rest, while no peer that delivered before holds it, try one peer without
        standing that pushed us the verified head of it (briefly: ``FIRST_TRY_S``) or wait up to
        ``seed_wait_s`` for one, so a trainer's upload does not grow with the inference nodes.
        """
        holders = [p for p in peers if p.peer_id != self.transport.peer_id and not self.trust.ignored(p.peer_id)
                   and max(p.version, self.hints.get(p.peer_id, -1)) >= version and p.lowest <= version]
        random.shuffle(holders)
        ordered = self.standing.providers(holders, quota=FETCH_UNKNOWN)
        if rank < self.seeds or (ordered and self.standing.delivered_before(ordered[0].peer_id)):
            return ordered
        copies = [p for p in holders if p.peer_id not in self.standing.members
                  and self.hints.get(p.peer_id, -1) >= version and self.standing.score(p.peer_id) >= 0]
        young = time.monotonic() - self.first_seen.get(version, 0.0) < self.seed_wait_s
        if not copies:
            return [] if young else ordered
        first = self.standing.order(copies, quota=1)[0]
        return [first] + [p for p in ordered if p.peer_id != first.peer_id]

    # ---- one pass -------------------------------------------------------------------
    def step(self, peers: list[PeerInfo], *, rank: int = 0) -> list[VersionRecord]:
        """Fetch and apply what is missing; returns the records applied in this pass."""
        self.trust.observe(peers)
        self._tell_standing_members()
        self._take_hints()
        self._probe_announced(peers)
        head = self.target()
        if head < 0 or (self.record is not None and head <= self.record.version):
            return []
        nxt = self.reorder.next_version
        for v in range(nxt, min(head, nxt + self.window - 1) + 1):
            self.first_seen.setdefault(v, time.monotonic())
        self.first_seen = {v: t for v, t in self.first_seen.items() if v >= nxt}
        if self.state is None:
            self._recover_from_anchor(peers, head)
            if self.state is None:
                return []
        caught = self._catch_up_if_behind(peers, head)
        if caught is None:
            return []  # a peer is still making our catch-up patch: ask it again next pass
        wanted = [v for v in range(self.reorder.next_version, min(head, self.reorder.next_version + self.window - 1) + 1)
                  if v not in self.reorder]
        jobs = {v: self._pool.submit(self._fetch_version, v, self.providers(v, peers, rank=rank)) for v in wanted}
        for v, job in jobs.items():
            got = job.result()
            if got is not None:
                self.reorder.offer(v, got)
        applied = caught + self._apply_ready()
        self._stalled = 0 if applied or self.reorder.next_version > head else self._stalled + 1
        stuck = self._stalled >= self.stall_passes
        if self._stalled and (stuck or self._nobody_has(self.reorder.next_version, peers)):
            self._stalled = 0
            self._recover_gap(peers, head, older_anchors=stuck)
        return applied

    def _tell_standing_members(self) -> None:
        """The trainer set's members come first in every order (``net/standing.py``)."""
        keys = self.trust.trainers.members
        if keys != self._members_told:
            self._members_told = keys
            self.standing.set_members(self.standing.members | {peer_id_of_key(k) for k in keys})

    def _nobody_has(self, version: int, peers: list[PeerInfo]) -> bool:
        return not any(p.lowest <= version <= p.version for p in peers
                       if p.peer_id != self.transport.peer_id and not self.trust.ignored(p.peer_id))

    def _fetch_version(self, version: int, providers: list[PeerInfo]) -> Fetched | None:
        for peer in providers:
            try:
                rec = self._fetch_record(peer, version, timeout=self._first_try(peer.peer_id))
                if not self.trust.check(rec, sender=peer.peer_id):
                    continue
                patch = self._fetch(peer, "patch", {"version": version}, max_bytes=rec.patch_bytes)
                try:
                    check_patch(rec, patch)
                except IntegrityError:
                    self.trust.strike(peer.peer_id)
                    raise
                self.counters["patch_bytes_in"] += len(patch)
                self.trust.served(peer.peer_id)
                self.standing.delivered(peer.peer_id)
                return Fetched(rec, patch)
            except PulseError as exc:
                self.counters["fetch_errors"] += 1
                self.trust.failed(peer.peer_id)
                self.standing.failed(peer.peer_id)
                log.info("fetch of version %d from %s failed: %s", version, peer.peer_id[:12], exc)
        return None

    def _first_try(self, peer_id: str) -> float | None:
        """The record timeout for ``peer_id``: short for a peer without standing (a silent
        newcomer costs ``FIRST_TRY_S``, once), the configured one otherwise."""
        return None if self.standing.known(peer_id) else FIRST_TRY_S

    def _fetch_record(self, peer: PeerInfo, version: int, *, timeout: float | None = None) -> VersionRecord:
        """The record of ``version`` from ``peer``, decoded (not verified); a wrong one strikes it."""
        rec = decode_record(self._fetch(peer, "record", {"version": version}, max_bytes=MAX_RECORD_BYTES,
                                        timeout=timeout))
        if rec.version != version:
            self.trust.strike(peer.peer_id)
            self.standing.struck(peer.peer_id)
            raise IntegrityError(f"asked for version {version}, got record of {rec.version}")
        return rec

    def _fetch(self, peer: PeerInfo, kind: str, params: dict, *, max_bytes: int, timeout: float | None = None) -> bytes:
        """One file, refused (and the peer struck) if it declares more than ``max_bytes``."""
        dest = self._tmp / f"{kind}-{threading.get_ident()}-{random.getrandbits(32):08x}"
        limit = self.net.fetch_timeout_s if timeout is None else min(timeout, self.net.fetch_timeout_s)
        try:
            self.transport.fetch(peer, kind, params, dest, timeout=limit, max_bytes=max_bytes)
            return dest.read_bytes()
        except IntegrityError:
            self.trust.strike(peer.peer_id)
            self.standing.struck(peer.peer_id)
            raise
        finally:
            dest.unlink(missing_ok=True)

    def _apply_ready(self) -> list[VersionRecord]:
        applied: list[VersionRecord] = []
        for version, got in self.reorder.pop_ready():
            try:
                self._apply(got)
            except PulseError as exc:
                self.counters["apply_errors"] += 1
                self.last_error = f"version {version} rejected: {exc}"
                log.warning("%s", self.last_error)
                self.reorder.reset(version)  # refetch it (from another provider) next pass
                break
            applied.append(got.record)
        return applied

    def _apply(self, got: Fetched) -> None:
        assert self.state is not None and self.record is not None
        rec = got.record
        if rec.parent_chain_hash != self.record.chain_hash:
            raise IntegrityError(f"version {rec.version} does not extend our chain at {self.record.version}")
        header = read_header(got.patch)
        if header.result_state_hash != rec.state_hash:
            raise IntegrityError(f"patch {rec.version} result hash differs from its signed record")
        new_state = apply_patch(self.state, got.patch, verify=True, base_hash=self.record.state_hash)
        self.store.put_patch(rec, got.patch)
        if rec.is_anchor:
            self.store.put_anchor(rec, new_state)
        self.state, self.record = new_state, rec
        self.counters["applied"] += 1

    # ---- recovery -------------------------------------------------------------------
    def _recover_gap(self, peers: list[PeerInfo], head: int, *, older_anchors: bool) -> None:
        """Nobody serves the next patch any more: try a catch-up patch, else an anchor.

        Only ``older_anchors`` (after ``stall_passes`` passes without progress: the way off a
        fork) may that anchor be one we are already past; sooner, the next version may just not
        be in the DHT yet, and an older anchor would cost a full download to end where we are.
        """
        assert self.record is not None
        self.counters["gaps"] += 1
        if self.state is not None and self._catch_up(self._catchup_offers(peers, head, min_gap=1))[0]:
            return
        self._recover_from_anchor(peers, head, above=-1 if older_anchors else self.record.version)

    def _catch_up_if_behind(self, peers: list[PeerInfo], head: int) -> list[VersionRecord] | None:
        """``catchup_min_gap`` or more versions behind: one catch-up patch instead of the patches.

        Returns ``[record caught up to]`` or ``[]`` (fetch patches), or None while the peer that
        answered "busy" may still be making ours (until ``catchup_wait_s``, then patches).
        """
        assert self.record is not None
        base, pending = self.record.version, self._pending
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

    def _catchup_offers(self, peers: list[PeerInfo], head: int, *, min_gap: int) -> list[Offer]:
        """(peer, target = its version) pairs at least ``min_gap`` ahead of us, in standing order:
        peers that delivered before, members, at most ``FETCH_UNKNOWN`` others (a flood of fresh
        keys announcing versions costs a few tries, not one per key); nearest the head first
        within each."""
        assert self.record is not None
        offers = [(p, min(p.version, head)) for p in peers if p.peer_id != self.transport.peer_id
                  and not self.trust.ignored(p.peer_id) and min(p.version, head) - self.record.version >= min_gap]
        random.shuffle(offers)
        offers.sort(key=lambda o: -o[1])
        return self.standing.providers(offers, quota=FETCH_UNKNOWN, key=lambda o: o[0].peer_id)

    def _catch_up(self, offers: list[Offer]) -> tuple[VersionRecord | None, Offer | None]:
        """Ask each (peer, target) for a catch-up patch from our version; returns (the record we
        caught up to, None) or (None, the first offer that answered busy, if any)."""
        assert self.record is not None and self.state is not None
        busy = None
        for peer, target in offers:
            try:
                rec = self._fetch_record(peer, target, timeout=self._first_try(peer.peer_id))
                if not self.trust.check(rec, sender=peer.peer_id):
                    continue
                patch = self._fetch(peer, "catchup", {"base": self.record.version, "target": target},
                                    max_bytes=catchup_cap(self.state))
                self._apply_catchup(peer, rec, patch)
                self.standing.delivered(peer.peer_id)
                return rec, None
            except BusyError as exc:
                busy = busy or (peer, target)
                log.info("catch-up from %s: %s", peer.peer_id[:12], exc)
            except PulseError as exc:
                self.counters["catchup_misses"] += 1
                self.standing.failed(peer.peer_id)
                log.info("catch-up from %s failed: %s", peer.peer_id[:12], exc)
        return None, busy

    def _apply_catchup(self, peer: PeerInfo, rec: VersionRecord, patch: bytes) -> None:
        assert self.record is not None and self.state is not None
        try:
            if patch_hashes(patch)[0] != self.record.state_hash:  # the peer's history differs: no lie
                raise GapError(f"catch-up starts from another state of version {self.record.version}")
            check_catchup(patch, from_record=self.record, to_record=rec)  # header names both signed hashes
            # apply checks the result against that hash, so it is not computed twice
            new_state = apply_patch(self.state, patch, verify=True, base_hash=self.record.state_hash)
        except (IntegrityError, PatchError):
            self.trust.strike(peer.peer_id)
            self.standing.struck(peer.peer_id)
            raise
        self.store.put_current(rec, new_state)  # a restart resumes from here
        self.last_catchup = CatchupApplied(self.record.version, rec.version, len(patch))
        self._adopt(rec, new_state)
        self.counters["catchups"] += 1
        self.counters["catchup_bytes_in"] += len(patch)
        log.info("caught up to version %d with one %d-byte patch from %s", rec.version, len(patch), peer.peer_id[:12])

    def _recover_from_anchor(self, peers: list[PeerInfo], head: int, *, above: int = -1) -> None:
        """Load the newest anchor above ``above`` that peers serve, bounded and checked by its signed
        record (``anchor_load.py``); at most ``MAX_ANCHOR_TRIES`` offers per call."""
        live = [p for p in peers if not self.trust.ignored(p.peer_id) and p.peer_id != self.transport.peer_id]
        by_id = {p.peer_id: p for p in live}
        # only anchors at or below the verified head count (an announced one above it is no
        # version a member signed); the offers in standing order (members' and peers' that
        # delivered before, then at most FETCH_UNKNOWN offers of peers without standing), newest
        # first within each: fresh keys announcing anchors cannot use up the tries
        offers = [(a, p.peer_id) for p in live for a in set(p.anchors) if above < a <= head]
        random.shuffle(offers)
        offers.sort(key=lambda o: -o[0])
        offers = self.standing.providers(offers, quota=FETCH_UNKNOWN, key=lambda o: o[1])
        for anchor, pid in offers[:MAX_ANCHOR_TRIES]:
            try:
                rec = self._fetch_record(by_id[pid], anchor, timeout=self._first_try(pid))
                if not rec.is_anchor:
                    self.trust.strike(pid)  # it announced an anchor it does not hold
                    continue
                if not self.trust.check(rec, sender=pid):
                    continue
                holders = self.standing.providers([p for p in live if anchor in p.anchors], quota=FETCH_UNKNOWN)
                state = load_anchor(self.transport, self.trust, rec, by_id[pid], holders, self._tmp,
                                    timeout=self.net.fetch_timeout_s * 4)
                self.store.put_anchor(rec, state)
                self._adopt(rec, state)
                self.standing.delivered(pid)
                self.counters["anchor_loads"] += 1
                return
            except PulseError as exc:
                self.standing.failed(pid)
                log.info("anchor %d from %s failed: %s", anchor, pid[:12], exc)

    def _adopt(self, record: VersionRecord, state: State) -> None:
        self.state, self.record = state, record
        self.reorder.reset(record.version + 1)
        self.trust.forget_below(record.version)

    def head_announcement(self) -> bytes | None:
        return encode_record(self.record) if self.record else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self._tmp, ignore_errors=True)


def _fresh_dir(path: Path) -> Path:
    """An empty scratch directory (leftovers of a crashed fetch are removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
