"""An anchor pulled from several providers at once (runs inside the wire worker, trio only).

``fetch_anchor`` pulls an anchor in chunks from several providers, retries a failed chunk on
another provider, resumes from ``<dest>.part`` + ``<dest>.part.map`` and, given the signed
``pieces`` (offset, length, BLAKE3 digest), checks every piece as it arrives: a bad piece drops the
provider that sent it (``bad_providers``) and is fetched from another, so one lying provider
neither poisons the file nor gets honest ones blamed. One stream per chunk goes through
``transfer.request`` (the framing and dialing of ``transfer.py``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import blake3
import msgpack
import trio

from pulse_node.errors import IntegrityError, PeerUnavailable, WireError
from pulse_node.fsutil import commit, write_atomic
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.rpc import AnchorResult
from pulse_node.net.wire.transfer import Dialer, Hasher, body_to, request

#: a signed piece of an anchor as the caller names it: (offset, length, BLAKE3 hex)
Piece = Sequence[int | str]


@dataclass(frozen=True)
class PartialMap:
    """``<dest>.part.map``: which chunks of ``<dest>.part`` are already complete (local file)."""

    v: int
    size: int
    chunk: int
    digest: str
    done: bytes  # one byte per chunk, 1 = complete

    def save(self, path: Path) -> None:
        write_atomic(path, msgpack.packb(asdict(self), use_bin_type=True), durable=False)

    @classmethod
    def load(cls, path: Path, *, size: int, chunk: int, digest: str, n: int) -> PartialMap | None:
        """The saved map if it describes the same download (``n`` chunks), else None (start fresh)."""
        try:
            msg = msgpack.unpackb(path.read_bytes(), raw=False)
            pm = cls(**msg)
        except (OSError, ValueError, TypeError, msgpack.UnpackException):
            return None
        if (pm.v, pm.size, pm.chunk, pm.digest, len(pm.done)) != (1, size, chunk, digest, n):
            return None
        return pm


class ChunkPlan:
    """Which chunks are pending, and which providers already failed each one (or sent a bad one)."""

    def __init__(self, n_chunks: int, done: bytearray, providers: list[str]) -> None:
        self.done = done
        self.bad: set[str] = set()
        self.pending = [i for i in range(n_chunks) if not done[i]]
        self.failed_on: dict[int, set[str]] = defaultdict(set)
        self.alive = set(providers)
        self.errors: dict[str, str] = {}
        self.misses: dict[str, int] = defaultdict(int)  # consecutive failures, over all of a peer's streams
        self.in_flight = 0
        self.changed = trio.Event()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def take(self, peer: str) -> int | None:
        """Next chunk for ``peer``, or None when there is nothing left it can do."""
        while peer in self.alive:
            for i in self.pending:
                if peer not in self.failed_on[i]:
                    self.pending.remove(i)
                    self.in_flight += 1
                    return i
            if self.in_flight == 0:
                return None
            await self.changed.wait()
        return None

    def finish(self, i: int, peer: str) -> None:
        self.in_flight -= 1
        self.done[i] = 1
        self.misses[peer] = 0
        self._notify()

    def fail(self, i: int, peer: str, error: str, *, transient: bool) -> None:
        """Give chunk ``i`` back; drop ``peer`` after a hard error or two transient ones in a row."""
        self.in_flight -= 1
        self.failed_on[i].add(peer)
        self.pending.insert(0, i)
        self.errors[peer] = error
        self.misses[peer] += 1
        if not transient or self.misses[peer] >= 2:
            self.alive.discard(peer)
        self._notify()

    def failed(self, peers: list[str]) -> list[str]:
        """Providers dropped, or whose last attempt failed (a peer that died after its last chunk)."""
        return sorted(p for p in set(peers) if p not in self.alive or self.misses[p] > 0)


@dataclass
class MultiJob:
    dialer: Dialer
    version: int
    size: int
    part: Path
    plan: ChunkPlan
    spans: list[tuple[int, int, str | None]]  # per chunk: offset, length, BLAKE3 hex digest (None: unchecked)
    request_bytes: int  # largest single request; a longer chunk takes several, from the same provider
    fetched: int = 0


async def _fetch_range(job: MultiJob, peer: str, off: int, length: int, sink: Callable[[bytes], object],
                       hasher: Hasher | None) -> None:
    req = wp.AnchorRequest(v=wp.WIRE_VERSION, version=job.version, offset=off, length=length)
    async with job.dialer.limiter:
        io, resp = await request(job.dialer, peer, "anchor", req)
        try:
            if resp.total != job.size or resp.size != length:
                raise WireError(f"anchor {job.version} at {io.peer} has {resp.total} bytes, expected {job.size}")
            await body_to(io, length, sink, hasher)
        finally:
            await io.close()


async def _fetch_chunk(job: MultiJob, peer: str, i: int) -> None:
    off, length, digest = job.spans[i]
    hasher = blake3.blake3() if digest is not None else None
    fd = os.open(job.part, os.O_WRONLY)
    try:
        pos = [off]

        def sink(data: bytes) -> None:
            os.pwrite(fd, data, pos[0])
            pos[0] += len(data)

        for start in range(off, off + length, job.request_bytes):
            await _fetch_range(job, peer, start, min(job.request_bytes, off + length - start), sink, hasher)
    finally:
        os.close(fd)
    if hasher is not None and hasher.hexdigest() != digest:
        raise IntegrityError(f"anchor {job.version} bytes {off}+{length} from {peer} do not match their signed digest")
    job.fetched += length


async def _provider_loop(job: MultiJob, peer: str) -> None:
    while (i := await job.plan.take(peer)) is not None:
        try:
            await _fetch_chunk(job, peer, i)
        except IntegrityError as exc:  # a chunk that is not the signed one: this provider lied
            job.plan.bad.add(peer)
            job.plan.fail(i, peer, str(exc), transient=False)
            job.dialer.counters.errors["anchor_bad_chunk"] += 1
            continue
        except WireError as exc:  # transient (PeerUnavailable), or wrong/missing file
            job.plan.fail(i, peer, str(exc), transient=isinstance(exc, PeerUnavailable))
            job.dialer.counters.errors["anchor_chunk"] += 1
            continue
        job.plan.finish(i, peer)


def _assemble(part: Path, dest: Path, want: str | None) -> None:
    """Check the whole file's sha256 (if given), then move ``part`` into place."""
    if want is not None:
        h = hashlib.sha256()
        with open(part, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
        if h.hexdigest() != want:
            part.unlink(missing_ok=True)
            raise IntegrityError(f"{dest.name}: sha256 {h.hexdigest()} != {want}; partial download discarded")
    commit(part, dest)


def _spans(size: int, chunk: int, pieces: Sequence[Piece] | None) -> list[tuple[int, int, str | None]]:
    """The chunks of a download: the caller's signed pieces (which must tile ``size`` exactly), or
    ``chunk``-byte pieces without digests."""
    if pieces is None:
        return [(off, min(chunk, size - off), None) for off in range(0, max(size, 1), chunk)]
    spans: list[tuple[int, int, str | None]] = []
    pos = 0
    for piece in pieces:
        if len(piece) != 3:
            raise WireError("anchor pieces must be (offset, length, BLAKE3 hex) tiling the file from 0")
        off, length, digest = piece
        if off != pos or not isinstance(off, int) or not isinstance(length, int) or length < 0 or not isinstance(digest, str) or len(digest) != 64:
            raise WireError("anchor pieces must be (offset, length, BLAKE3 hex) tiling the file from 0")
        spans.append((off, length, digest.lower()))
        pos += length
    if pos != size:
        raise WireError(f"anchor pieces cover {pos} bytes, the file is {size}")
    return spans


async def fetch_anchor(dialer: Dialer, peers: list[str], *, version: int, size: int, dest: Path,
                      digest: str | None, timeout: float, chunk: int = 4 << 20,
                      per_peer: int = 2, pieces: Sequence[Piece] | None = None) -> AnchorResult:
    """Download anchor ``version`` (``size`` bytes) from ``peers``: in ``chunk``-byte pieces, or in
    the signed ``pieces`` [(offset, length, BLAKE3 hex)], each checked as it arrives.

    Without ``pieces`` an incomplete download raises ``PeerUnavailable``; with them it returns
    ``complete: False`` and the reason, so the caller still learns ``bad_providers``."""
    if not peers:
        raise WireError("fetch_anchor needs at least one provider")
    if not 0 < chunk <= wp.BODY_CAPS["anchor"]:
        raise WireError(f"chunk must be in (0, {wp.BODY_CAPS['anchor']}]")
    want = wp.parse_digest(digest)
    spans = _spans(size, chunk, pieces)
    plan_id = want or ("" if pieces is None else blake3.blake3(repr(spans).encode()).hexdigest())
    part, map_path = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.map")
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = PartialMap.load(map_path, size=size, chunk=chunk, digest=plan_id, n=len(spans)) if part.exists() else None
    done = bytearray(old.done if old else bytes(len(spans)))
    with open(part, "r+b" if old else "wb") as fh:
        fh.truncate(size)
    plan = ChunkPlan(len(spans), done, list(dict.fromkeys(peers)))
    resumed = sum(spans[i][1] for i in range(len(spans)) if done[i])
    job = MultiJob(dialer, version, size, part, plan, spans, chunk)
    t0 = time.monotonic()
    try:
        with trio.move_on_after(timeout) as scope:
            async with trio.open_nursery() as nursery:
                for peer in plan.alive:
                    for _ in range(per_peer):
                        nursery.start_soon(_provider_loop, job, peer)
    finally:
        PartialMap(1, size, chunk, plan_id, bytes(done)).save(map_path)
    result = AnchorResult(bytes=size, seconds=0.0, fetched=job.fetched, resumed=resumed,
                          failed_providers=plan.failed(peers), errors=plan.errors, bad_providers=sorted(plan.bad))
    if scope.cancelled_caught or plan.pending:
        why = "timed out" if scope.cancelled_caught else "no provider could serve all chunks"
        message = (f"anchor {version}: {why} ({sum(done)}/{len(spans)} chunks kept in {part.name}); "
                   f"provider errors: {plan.errors}")
        if pieces is None:
            raise PeerUnavailable(message)
        return replace(result, complete=False, error=message, seconds=time.monotonic() - t0)
    try:
        _assemble(part, dest, want)
    finally:
        map_path.unlink(missing_ok=True)
    return replace(result, seconds=time.monotonic() - t0)
