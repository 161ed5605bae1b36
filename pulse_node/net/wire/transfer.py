"""Outbound side of the libp2p data plane (runs inside ``wire_worker``, trio only).

``StreamIO`` frames one libp2p stream with a timeout on every read and write and 64 KiB body
writes. ``Dialer`` reuses connections and bounds concurrent outbound streams. ``fetch_to_file``
pulls one file (record, patch, catch-up patch) from one peer into a temp file and renames it
into place, refusing a body larger than the caller's ``max_bytes`` (what the signed record
says) before reading it; ``fetch_anchor`` pulls an anchor in chunks from several providers at
once, retries a failed chunk on another provider, resumes from ``<dest>.part`` +
``<dest>.part.map`` and, given the signed ``pieces`` (offset, length, BLAKE3 digest), checks every
piece as it arrives: a bad piece drops the provider that sent it (``bad_providers``) and is
fetched from another, so one lying provider neither poisons the file nor gets honest ones blamed.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import blake3
import msgpack
import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr

from pulse_node.errors import IntegrityError, NotFound, PeerBusy, PeerUnavailable, WireError
from pulse_node.fsutil import atomic_writer, commit, write_atomic
from pulse_node.net.peers.budget import Flow
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.config import DIAL_TIMEOUT_S
from pulse_node.vocab import check_push_kind


class Traffic:
    """Byte, request and error counters per stream kind and per peer (the ``stats`` RPC)."""

    def __init__(self) -> None:
        self.bytes_in: dict[str, int] = defaultdict(int)
        self.bytes_out: dict[str, int] = defaultdict(int)
        self.peer_in: dict[str, int] = defaultdict(int)
        self.peer_out: dict[str, int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)
        self.requests: dict[str, int] = defaultdict(int)

    def add_in(self, kind: str, peer: str, n: int) -> None:
        self.bytes_in[kind] += n
        self.peer_in[peer] += n

    def add_out(self, kind: str, peer: str, n: int) -> None:
        self.bytes_out[kind] += n
        self.peer_out[peer] += n

    def snapshot(self) -> dict[str, Any]:
        return {"bytes_in": dict(self.bytes_in), "bytes_out": dict(self.bytes_out),
                "peers": {p: {"in": self.peer_in.get(p, 0), "out": self.peer_out.get(p, 0)}
                          for p in sorted(set(self.peer_in) | set(self.peer_out))},
                "errors": dict(self.errors), "requests": dict(self.requests)}


class StreamIO:
    """One libp2p stream: buffered reads and chunked writes, each bounded by ``idle`` seconds."""

    def __init__(self, stream: Any, *, idle: float, counters: Traffic, kind: str, peer: str,
                 flow: Flow | None = None) -> None:
        self.stream, self.idle, self.counters = stream, idle, counters
        self.kind, self.peer = kind, peer
        self.flow = flow  # an inbound stream's budget (deadline, minimum rate): ``net/peers/budget.py``
        self._buf = bytearray()

    def _limit(self) -> float:
        """How long the next read or write may take: ``idle``, or less if the flow's budget says so."""
        return self.idle if self.flow is None else self.flow.limit(self.idle, self.peer)

    def _timed_out(self, what: str) -> None:
        if self.flow is not None:
            self.flow.limit(self.idle, self.peer, slack=0.01)  # raises SlowPeer if the budget ran out
        raise PeerUnavailable(f"peer {self.peer} {what} for {self.idle:.0f}s")

    async def read_some(self, n: int) -> bytes:
        if not self._buf:
            try:
                with trio.fail_after(self._limit()):
                    data: bytes = await self.stream.read(max(n, wp.CHUNK))
            except trio.TooSlowError:
                self._timed_out("sent nothing")
            except Exception as exc:
                raise PeerUnavailable(f"stream from {self.peer} ended ({type(exc).__name__})") from None
            if not data:
                raise PeerUnavailable(f"stream from {self.peer} ended")
            self.counters.add_in(self.kind, self.peer, len(data))
            if self.flow is not None:
                self.flow.add(len(data))
            if len(data) <= n:
                return data  # the common case for bodies: no copy through the buffer
            self._buf += data
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def read_exact(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            part = await self.read_some(n - got)
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    async def read_struct(self, cls: type[wp.WireStruct]) -> Any:
        n = wp.frame_length(await self.read_exact(4), cls.CAP)
        return cls.decode(await self.read_exact(n))

    async def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for i in range(0, len(view), wp.CHUNK):
            piece = bytes(view[i:i + wp.CHUNK])
            try:
                with trio.fail_after(self._limit()):
                    await self.stream.write(piece)
            except trio.TooSlowError:
                self._timed_out("stopped reading")
            except Exception as exc:
                raise PeerUnavailable(f"stream to {self.peer} failed ({type(exc).__name__})") from None
            self.counters.add_out(self.kind, self.peer, len(piece))
            if self.flow is not None:
                self.flow.add(len(piece))

    async def close(self, *, reset: bool = False) -> None:
        """Close (or reset) the stream; shielded so a cancelled transfer still frees the peer's side."""
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            try:
                await (self.stream.reset() if reset else self.stream.close())
            except Exception:
                pass


class Dialer:
    """Opens streams to peers named by ``/ip4/../tcp/../p2p/<id>`` multiaddrs, reusing connections."""

    def __init__(self, host: Any, *, counters: Traffic, max_streams: int, idle: float,
                 dial_timeout: float = DIAL_TIMEOUT_S) -> None:
        self.host, self.counters, self.idle, self.dial_timeout = host, counters, idle, dial_timeout
        self.limiter = trio.CapacityLimiter(max_streams)

    async def open(self, peer: str, kind: str) -> StreamIO:
        """Connect if needed (within ``dial_timeout``) and open a stream for ``kind``; bounded by
        the caller's deadline. A connection the peer opened to us is reused: that is how peers
        reach a node behind a NAT."""
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(peer))
        except Exception as exc:
            raise WireError(f"peer address {peer!r} is not a /p2p/ multiaddr ({exc})") from None
        pid = info.peer_id.to_string()
        try:
            with trio.move_on_after(self.dial_timeout) as dial:
                await self.host.connect(info)
            if dial.cancelled_caught:
                self.counters.errors["dial_timeout"] += 1
                raise TimeoutError(f"no connection within {self.dial_timeout:g} s (nothing answers at {peer}: "
                                   "a peer behind a NAT or a firewall, or gone)")
            stream = await self.host.new_stream(info.peer_id, [TProtocol(wp.PROTOCOLS[kind])])
        except trio.Cancelled:
            raise
        except Exception as exc:
            self.counters.errors["dial"] += 1
            raise PeerUnavailable(f"cannot open {kind} stream to {pid}: {type(exc).__name__}: {exc}") from None
        return StreamIO(stream, idle=self.idle, counters=self.counters, kind=kind, peer=pid)


async def request(dialer: Dialer, peer: str, kind: str, req: wp.WireStruct) -> tuple[StreamIO, wp.Response]:
    """Open a stream, send ``req``, read the response header; raises on a non-ok status."""
    io = await dialer.open(peer, kind)
    try:
        await io.write(req.encode())
        resp = await io.read_struct(wp.Response)
    except BaseException:
        await io.close(reset=True)
        raise
    if resp.status != "ok":
        await io.close()
        dialer.counters.errors[f"remote_{resp.status}"] += 1
        err = {"busy": PeerBusy, "not_found": NotFound}.get(resp.status, WireError)
        raise err(f"{kind} from {io.peer}: {resp.status}: {resp.message}")
    return io, resp


async def _body_to(io: StreamIO, size: int, sink: Any, hasher: Any) -> None:
    left = size
    while left:
        data = await io.read_some(min(left, 1 << 20))
        sink(data)
        if hasher is not None:
            hasher.update(data)
        left -= len(data)


async def fetch_to_file(dialer: Dialer, peer: str, req: wp.FetchRequest, dest: Path, *,
                        timeout: float, digest: str | None = None, max_bytes: int | None = None) -> dict[str, Any]:
    """Fetch the file ``req`` asks ``peer`` for into ``dest`` atomically; returns {bytes, seconds}.

    ``max_bytes`` (what a signed record allows): a body declared larger is a lie, refused with
    ``IntegrityError`` before a byte of it is read."""
    kind, params = wp.kind_of(req), wp.params_of(req)
    want = wp.parse_digest(digest)
    t0 = time.monotonic()
    try:
        with trio.fail_after(timeout):
            async with dialer.limiter:
                io, resp = await request(dialer, peer, kind, req)
                try:
                    if max_bytes is not None and resp.size > max_bytes:
                        raise IntegrityError(f"{kind} {params} from {io.peer} is {resp.size} bytes, more than "
                                             f"the {max_bytes} its signed record allows")
                    if resp.size > wp.BODY_CAPS[kind]:
                        raise WireError(f"{kind} of {resp.size} bytes exceeds cap {wp.BODY_CAPS[kind]}")
                    hasher = hashlib.sha256() if want else None
                    with atomic_writer(dest) as fh:  # replaces dest only once complete and checked
                        await _body_to(io, resp.size, fh.write, hasher)
                        if hasher is not None and hasher.hexdigest() != want:
                            raise IntegrityError(f"{kind} {params} from {io.peer}: sha256 "
                                                 f"{hasher.hexdigest()} != {want}")
                finally:
                    await io.close()
    except trio.TooSlowError:
        dialer.counters.errors["timeout"] += 1
        raise PeerUnavailable(f"{kind} {params} from {peer}: no complete answer within {timeout:.1f}s") from None
    return {"bytes": resp.size, "total": resp.total, "seconds": time.monotonic() - t0, "peer": io.peer}


async def push(dialer: Dialer, peer: str, kind: str, data: bytes, *, timeout: float) -> dict[str, Any]:
    """Send a push of ``kind`` to ``peer``; returns once the peer has queued it."""
    check_push_kind(kind)
    if len(data) > wp.PUSH_CAPS[kind]:
        raise WireError(f"{kind} push of {len(data)} bytes exceeds cap {wp.PUSH_CAPS[kind]}")
    t0 = time.monotonic()
    try:
        with trio.fail_after(timeout):
            async with dialer.limiter:
                io = await dialer.open(peer, "push")
                try:
                    await io.write(wp.PushRequest(v=wp.WIRE_VERSION, kind=kind, size=len(data)).encode())
                    await io.write(data)
                    resp = await io.read_struct(wp.Response)
                finally:
                    await io.close()
    except trio.TooSlowError:
        dialer.counters.errors["timeout"] += 1
        raise PeerUnavailable(f"push {kind} to {peer}: not acknowledged within {timeout:.1f}s") from None
    if resp.status != "ok":
        dialer.counters.errors[f"remote_{resp.status}"] += 1
        raise (PeerUnavailable if resp.status == "busy" else WireError)(
            f"push {kind} to {io.peer}: {resp.status}: {resp.message}")
    return {"bytes": len(data), "seconds": time.monotonic() - t0}


async def probe(dialer: Dialer, peer: str, kind: str, raw: bytes, *, timeout: float) -> bytes:
    """Diagnostics: send ``raw`` bytes on a ``kind`` stream, return what the peer answers."""
    reply = bytearray()
    with trio.move_on_after(timeout):
        io = await dialer.open(peer, kind)
        try:
            await io.write(raw)
            while len(reply) < wp.RESPONSE_CAP + 4:
                reply += await io.read_some(wp.RESPONSE_CAP)
        except PeerUnavailable:
            pass
        finally:
            await io.close()
    return bytes(reply)


# ---------------------------------------------------------------- multi-provider anchors

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
        self.strikes: dict[str, int] = defaultdict(int)  # consecutive failures, over all of a peer's streams
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
        self.strikes[peer] = 0
        self._notify()

    def fail(self, i: int, peer: str, error: str, *, transient: bool) -> None:
        """Give chunk ``i`` back; drop ``peer`` after a hard error or two transient ones in a row."""
        self.in_flight -= 1
        self.failed_on[i].add(peer)
        self.pending.insert(0, i)
        self.errors[peer] = error
        self.strikes[peer] += 1
        if not transient or self.strikes[peer] >= 2:
            self.alive.discard(peer)
        self._notify()

    def failed(self, peers: list[str]) -> list[str]:
        """Providers dropped, or whose last attempt failed (a peer that died after its last chunk)."""
        return sorted(p for p in set(peers) if p not in self.alive or self.strikes[p] > 0)


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


async def _fetch_range(job: MultiJob, peer: str, off: int, length: int, sink: Any, hasher: Any) -> None:
    req = wp.AnchorRequest(v=wp.WIRE_VERSION, version=job.version, offset=off, length=length)
    async with job.dialer.limiter:
        io, resp = await request(job.dialer, peer, "anchor", req)
        try:
            if resp.total != job.size or resp.size != length:
                raise WireError(f"anchor {job.version} at {io.peer} has {resp.total} bytes, expected {job.size}")
            await _body_to(io, length, sink, hasher)
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


def _spans(size: int, chunk: int, pieces: list[Any] | None) -> list[tuple[int, int, str | None]]:
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
        if off != pos or not isinstance(length, int) or length < 0 or not isinstance(digest, str) or len(digest) != 64:
            raise WireError("anchor pieces must be (offset, length, BLAKE3 hex) tiling the file from 0")
        spans.append((off, length, digest.lower()))
        pos += length
    if pos != size:
        raise WireError(f"anchor pieces cover {pos} bytes, the file is {size}")
    return spans


async def fetch_anchor(dialer: Dialer, peers: list[str], *, version: int, size: int, dest: Path,
                      digest: str | None, timeout: float, chunk: int = 4 << 20,
                      per_peer: int = 2, pieces: list[Any] | None = None) -> dict[str, Any]:
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
    result = {"bytes": size, "fetched": job.fetched, "resumed": resumed, "failed_providers": plan.failed(peers),
              "bad_providers": sorted(plan.bad), "errors": plan.errors, "complete": True, "error": ""}
    if scope.cancelled_caught or plan.pending:
        why = "timed out" if scope.cancelled_caught else "no provider could serve all chunks"
        message = (f"anchor {version}: {why} ({sum(done)}/{len(spans)} chunks kept in {part.name}); "
                   f"provider errors: {plan.errors}")
        if pieces is None:
            raise PeerUnavailable(message)
        return {**result, "complete": False, "error": message, "seconds": time.monotonic() - t0}
    try:
        _assemble(part, dest, want)
    finally:
        map_path.unlink(missing_ok=True)
    return {**result, "seconds": time.monotonic() - t0}
