"""Outbound side of the libp2p data plane (runs inside ``net/wire/worker.py``, trio only).

``StreamIO`` frames one libp2p stream with a timeout on every read and write and 64 KiB body
writes. ``Dialer`` reuses connections and bounds concurrent outbound streams. ``fetch_to_file``
pulls one file (record, patch, catch-up patch) from one peer into a temp file and renames it
into place, refusing a body larger than the caller's ``max_bytes`` (what the signed record
says) before reading it. An anchor from several providers at once: ``anchor_fetch.py``.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr

from pulse_node.errors import IntegrityError, NotFound, PeerBusy, PeerUnavailable, WireError
from pulse_node.fsutil import atomic_writer
from pulse_node.net.local.rpc_api import Pushed
from pulse_node.net.peers.budget import Flow
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.config import DIAL_TIMEOUT_S
from pulse_node.net.wire.rpc import FetchResult
from pulse_node.vocab import check_push_kind

W = TypeVar("W", bound=wp.WireStruct)


class Hasher(Protocol):
    """What a body's bytes are hashed with as they arrive (hashlib, blake3)."""

    def update(self, data: bytes, /) -> object: ...


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

    def peers(self) -> dict[str, dict[str, int]]:
        """Bytes in and out per peer."""
        return {p: {"in": self.peer_in.get(p, 0), "out": self.peer_out.get(p, 0)}
                for p in sorted(set(self.peer_in) | set(self.peer_out))}


class StreamIO:
    """One libp2p stream: buffered reads and chunked writes, each bounded by ``idle`` seconds."""

    def __init__(self, stream: INetStream, *, idle: float, counters: Traffic, kind: str, peer: str,
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

    async def read_frame(self, cap: int) -> bytes:
        """One length-prefixed frame body; its declared length is checked against ``cap`` first."""
        return await self.read_exact(wp.frame_length(await self.read_exact(4), cap))

    async def read_struct(self, cls: type[W]) -> W:
        return cls.decode(await self.read_frame(cls.CAP))

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

    def __init__(self, host: IHost, *, counters: Traffic, max_streams: int, idle: float,
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


async def body_to(io: StreamIO, size: int, sink: Callable[[bytes], object], hasher: Hasher | None) -> None:
    left = size
    while left:
        data = await io.read_some(min(left, 1 << 20))
        sink(data)
        if hasher is not None:
            hasher.update(data)
        left -= len(data)


async def fetch_to_file(dialer: Dialer, peer: str, req: wp.FetchRequest, dest: Path, *,
                        timeout: float, digest: str | None = None, max_bytes: int | None = None) -> FetchResult:
    """Fetch the file ``req`` asks ``peer`` for into ``dest`` atomically.

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
                        await body_to(io, resp.size, fh.write, hasher)
                        if hasher is not None and hasher.hexdigest() != want:
                            raise IntegrityError(f"{kind} {params} from {io.peer}: sha256 "
                                                 f"{hasher.hexdigest()} != {want}")
                finally:
                    await io.close()
    except trio.TooSlowError:
        dialer.counters.errors["timeout"] += 1
        raise PeerUnavailable(f"{kind} {params} from {peer}: no complete answer within {timeout:.1f}s") from None
    return FetchResult(bytes=resp.size, seconds=time.monotonic() - t0, peer=io.peer, total=resp.total)


async def push(dialer: Dialer, peer: str, kind: str, data: bytes, *, timeout: float) -> Pushed:
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
    return Pushed(bytes=len(data), seconds=time.monotonic() - t0)


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
