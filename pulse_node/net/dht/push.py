"""Pushes over hivemind's p2pd streams: the plane that carries PULSELoCo payloads between trainers.

Runs inside the DHT worker (asyncio, on the same p2pd as hivemind's DHT node) and is reached
through its RPC (``push``, ``push_file``, ``events``, ``push_stats``, ``probe``). Why this plane and not the
py-libp2p wire: ``bench/dataplane.py`` (bench/RESULTS.md, "Data plane"). One p2pd stream per
push, protocol ``PROTOCOL``::

    request   = frame(PushHeader{v, kind, size}) + size body bytes
    response  = frame(wire_protocol.Response)   status: ok | too_large | busy | bad_request | unsupported
    frame(s)  = 4-byte big-endian length + msgpack map with exactly the struct's fields

Limits, all checked before anything is allocated: the header frame is capped at
``wire.protocol.REQUEST_CAP``, the declared size at the kind's cap (``CAPS``). Streams are admitted
by the data plane's one mechanism, ``StreamPools`` (``net/peers/budget.py``, as the wire worker's):
at most ``MAX_INBOUND`` read at once, trainer-set members may use all of them, all non-members
together at most ``OTHER_INBOUND``, one each (``set_members``), each peer's request bucket, the
slowest non-member evicted for a new one; each stream's ``Flow`` gives the header
``HEADER_TIMEOUT_S`` and then wants ``MIN_RATE`` bytes/s. A non-member's queued pushes stay within
its own share. Received pushes wait in a bounded queue (count and bytes); a push that does not fit
is refused with ``busy`` and counted.
The sender of an event is the peer id p2pd authenticated for the stream (libp2p security
handshake), never anything the peer wrote: with one Ed25519 identity per node it equals the
sender's wire peer id, which is what the trainer checks a payload's trainer id against.

With a spool (``net/local/spool.py``, a trainer's ``<data_dir>/spool``) payloads above
``spool.THRESHOLD`` never cross the local RPC as bytes: outbound the worker streams a file the
node wrote (``push_file``), inbound a body is written to a spool file while it is read (chunk by
chunk, off the event loop, under the same deadlines; removed on any failure) and the event
carries its path. The ``loco`` cap is then the spool's (default 1 GiB), spooled events count
against a disk budget instead of the memory one, and a failed disk write answers ``busy``.
Without a spool the cap stays ``CAPS`` (48 MiB, bounded by the RPC frame).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import anyio

from pulse_node.errors import PeerUnavailable, UnsupportedVersion, WireError
from pulse_node.net.dht.rpc import PushPlaneStats
from pulse_node.net.local.inbox import Inbox
from pulse_node.net.local.rpc_api import Pushed
from pulse_node.net.local.spool import THRESHOLD, AsyncFile, Spool
from pulse_node.net.peers.budget import (
    BudgetConfig,
    Flow,
    Members,
    PushShares,
    Refusals,
    Refused,
    SlowPeer,
    StreamPools,
)
from pulse_node.net.wire import protocol as wp
from pulse_node.vocab import Event, PushKind

if TYPE_CHECKING:  # hivemind ships no types: these read as unchecked
    from hivemind.p2p import P2P
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
    from hivemind.utils.multiaddr import Multiaddr

log = logging.getLogger("pulse_node.dht.push")

PROTOCOL = wp.protocol_id("p2pd-push")
#: kinds this plane accepts and their caps without a spool (bounded by the local RPC frame, like the wire's)
CAPS: dict[PushKind, int] = {"loco": wp.PUSH_CAPS["loco"]}
WRITE_CHUNK = 1 << 20  # 1 MiB writes were the fastest on p2pd streams (bench/dataplane.py)
HEADER_TIMEOUT_S = 10.0
MIN_RATE = 1e6  # bytes/s a stream must sustain, or it is cut
MAX_INBOUND = 8
OTHER_INBOUND = 2  # of MAX_INBOUND, what all non-members together may hold (one stream each)
MAX_EVENTS = 256
MAX_EVENT_BYTES = 256 << 20


@dataclass(frozen=True)
class PushHeader(wp.WireStruct):
    """``size`` bytes of a push of ``kind`` follow; ``size`` is unbounded here so the receiver,
    not the decoder, refuses an oversized push with an explicit ``too_large``."""

    v: int
    kind: str
    size: int
    SPEC: ClassVar = {"v": ("int", 255), "kind": ("str", 16), "size": ("int", wp.MAX_U64)}


async def read_frame(reader: asyncio.StreamReader, cap: int) -> bytes:
    """One length-prefixed frame body; the declared length is checked before it is read."""
    return await reader.readexactly(wp.frame_length(await reader.readexactly(4), cap))


def stream_budget(budget: BudgetConfig, *, longest_push: int) -> BudgetConfig:
    """The node's budget with this plane's stream numbers: ``MAX_INBOUND`` streams, of which
    non-members hold ``OTHER_INBOUND`` (one each); ``HEADER_TIMEOUT_S`` of grace, then ``MIN_RATE``;
    no stream outlives the slowest allowed ``longest_push``."""
    return budget.model_copy(update={
        "member_streams": MAX_INBOUND - OTHER_INBOUND, "other_streams": OTHER_INBOUND, "streams_per_peer": 1,
        "min_rate": MIN_RATE, "grace_s": HEADER_TIMEOUT_S,
        "stream_deadline_s": 2 * HEADER_TIMEOUT_S + longest_push / MIN_RATE})


def _reply(status: str, message: str = "") -> bytes:
    return wp.Response(v=wp.WIRE_VERSION, status=status, size=0, total=0, message=message[:512]).encode()


class PushPlane:
    """Serves ``PROTOCOL`` on a hivemind ``P2P`` and sends pushes over it; counts bytes and errors."""

    def __init__(self, p2p: P2P, *, spool: Spool | None = None, inbox: Inbox | None = None,
                 budget: BudgetConfig | None = None) -> None:
        self.p2p = p2p
        self.spool = spool
        self.caps = dict.fromkeys(CAPS, spool.max_push) if spool else dict(CAPS)
        budget = budget or BudgetConfig()
        self.members = Members()
        self.refusals = Refusals(interval=budget.log_interval_s)
        self.pools = StreamPools(stream_budget(budget, longest_push=max(self.caps.values())), self.members,
                                 self.refusals)
        shares = PushShares(budget, self.members, max_events=MAX_EVENTS, max_bytes=MAX_EVENT_BYTES)
        self.inbox = inbox or Inbox(max_events=MAX_EVENTS, max_bytes=MAX_EVENT_BYTES,
                                    max_disk_bytes=spool.disk_bytes if spool else 0, shares=shares)
        self._io = ThreadPoolExecutor(MAX_INBOUND, thread_name_prefix="pulse-spool") if spool else None
        self.bytes_in: dict[str, int] = defaultdict(int)
        self.bytes_out: dict[str, int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)

    async def start(self) -> None:
        await self.p2p.add_binary_stream_handler(PROTOCOL, self.handle)

    # ---- inbound ------------------------------------------------------------------------
    async def handle(self, info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One inbound stream: admission -> header -> checks -> body -> queued event -> response."""
        sender = info.peer_id.to_base58()  # authenticated by p2pd, not claimed by the peer
        try:
            flow = self.pools.open(sender)  # counted and logged by the pools when refused
        except Refused as exc:
            self.errors["busy"] += 1
            await self._answer(writer, "busy", f"{exc.reason}: too many inbound pushes")
            return
        try:
            with anyio.CancelScope() as scope:
                flow.on_cut = scope.cancel  # evicted for another stream
                status, message = await self._serve(flow, reader)
            if scope.cancelled_caught:
                self.errors["inbound_evicted"] += 1
                writer.close()
                return
        except UnsupportedVersion as exc:
            status, message = "unsupported", str(exc)
        except SlowPeer as exc:
            self.refusals.add(sender, flow.why(), str(exc))
            self.errors["inbound_timeout"] += 1
            writer.close()
            return
        except WireError as exc:
            status, message = "bad_request", str(exc)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            self.errors["inbound_" + ("timeout" if isinstance(exc, TimeoutError) else "cut")] += 1
            writer.close()
            return
        finally:
            self.pools.close(flow)
        if status != "ok":
            self.errors[f"refused_{status}"] += 1
            log.info("push from %s refused: %s: %s", sender[-8:], status, message)
        await self._answer(writer, status, message)

    async def _serve(self, flow: Flow, reader: asyncio.StreamReader) -> tuple[str, str]:
        with anyio.fail_after(flow.limit(HEADER_TIMEOUT_S, flow.peer)):
            head = PushHeader.decode(await read_frame(reader, wp.REQUEST_CAP))
        return await self._receive(flow, head, reader)

    async def _receive(self, flow: Flow, head: PushHeader, reader: asyncio.StreamReader) -> tuple[str, str]:
        kind, sender = next((k for k in self.caps if k == head.kind), None), flow.peer
        if kind is None:
            return "unsupported", f"push kind {head.kind!r} is not carried on this plane ({sorted(CAPS)})"
        cap = self.caps[kind]
        if head.size > cap:
            return "too_large", f"{head.kind} push of {head.size} bytes exceeds {cap}"
        spooled = self.spool is not None and head.size > THRESHOLD
        why = self.inbox.admit(head.size, spooled=spooled, peer=sender)
        if why:
            if why != "queue_full":
                self.refusals.add(sender, why, f"{head.kind} push of {head.size} bytes")
            return "busy", f"{why}: " + ("spool is full" if spooled else "event queue is full")
        done, message = False, ""
        try:
            if spooled:
                path, message = await self._read_to_spool(flow, head, reader)
                if path is not None:
                    self.inbox.put(Event(kind, sender, b"", time.time()), path=str(path), size=head.size)
                    done = True
            else:
                self.inbox.put(Event(kind, sender, b"".join([c async for c in _chunks(flow, reader, head.size)]),
                                     time.time()))
                done = True
        finally:
            if not done:
                self.inbox.release(head.size, spooled=spooled, peer=sender)
        if not done:
            return "busy", message
        self.bytes_in[head.kind] += head.size
        return "ok", ""

    async def _read_to_spool(self, flow: Flow, head: PushHeader, reader: asyncio.StreamReader
                             ) -> tuple[Path | None, str]:
        """The body into a new spool file, chunk by chunk; (None, why) if the disk failed.

        The file is removed on any failure (disk, deadline, a cut stream): only a complete body
        is left in the spool, and only with its event queued."""
        assert self.spool is not None and self._io is not None
        try:
            fd, path = self.spool.create("in")
        except OSError as exc:
            self.errors["spool_write"] += 1
            return None, f"spool: {exc.strerror}"
        out = AsyncFile(fd, self._io)
        complete = False
        try:
            async for chunk in _chunks(flow, reader, head.size):
                t0 = time.monotonic()
                try:
                    await out.write(chunk)
                except OSError as exc:  # disk full, I/O error: refuse, keep serving
                    self.errors["spool_write"] += 1
                    return None, f"spool write failed: {exc.strerror}"
                flow.own_s += time.monotonic() - t0  # our disk's time, not the peer's
            complete = True
        finally:
            out.close()
            if not complete:
                path.unlink(missing_ok=True)
        return path, ""

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: str, message: str) -> None:
        try:
            writer.write(_reply(status, message))
            await asyncio.wait_for(writer.drain(), HEADER_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    # ---- outbound -----------------------------------------------------------------------
    async def push(self, peer_id: str, maddrs: list[str], kind: str, data: bytes, *, timeout: float) -> Pushed:
        """Send one push; returns once the peer has queued it. ``PeerUnavailable``/``WireError``."""
        self._check_size(kind, len(data))

        async def body(writer: asyncio.StreamWriter) -> None:
            view = memoryview(data)
            for i in range(0, len(data), WRITE_CHUNK):
                writer.write(view[i:i + WRITE_CHUNK])
                await writer.drain()

        return await self._send(peer_id, maddrs, kind, len(data), body, timeout=timeout)

    async def push_file(self, peer_id: str, maddrs: list[str], kind: str, path: object, size: object, *,
                        timeout: float) -> Pushed:
        """``push`` of a body the node wrote to spool file ``path`` (checked: in the spool, ``size`` bytes)."""
        if self.spool is None or self._io is None:
            raise WireError("push_file: this DHT worker has no spool (DhtConfig.spool_dir)")
        if not isinstance(size, int) or isinstance(size, bool):
            raise WireError(f"push_file: size must be an int, got {size!r}")
        self._check_size(kind, size)
        src = AsyncFile(self.spool.open_checked(path, size), self._io)

        async def body(writer: asyncio.StreamWriter) -> None:
            for offset in range(0, size, WRITE_CHUNK):
                chunk = await src.pread(min(WRITE_CHUNK, size - offset), offset)
                if not chunk:
                    raise WireError(f"push_file: spool file shrank below {size} bytes")
                writer.write(chunk)
                await writer.drain()

        try:
            return await self._send(peer_id, maddrs, kind, size, body, timeout=timeout)
        finally:
            src.close()

    def _check_size(self, kind: str, size: int) -> None:
        if kind not in self.caps:
            raise WireError(f"push kind {kind!r} is not carried on this plane ({sorted(self.caps)})")
        if size > self.caps[kind]:
            raise WireError(f"{kind} push of {size} bytes exceeds cap {self.caps[kind]}")

    async def _send(self, peer_id: str, maddrs: list[str], kind: str, size: int,
                    body: Callable[[asyncio.StreamWriter], Awaitable[None]], *, timeout: float) -> Pushed:
        """Header, ``body(writer)``, the peer's answer; every failure mapped to a typed error and counted."""
        t0 = time.monotonic()
        try:
            with anyio.fail_after(timeout):
                reader, writer = await self._open(peer_id, maddrs)
                try:
                    writer.write(PushHeader(v=wp.WIRE_VERSION, kind=kind, size=size).encode())
                    await body(writer)
                    resp = wp.Response.decode(await read_frame(reader, wp.RESPONSE_CAP))
                finally:
                    writer.close()
        except TimeoutError:
            self.errors["timeout"] += 1
            raise PeerUnavailable(f"push {kind} to {peer_id}: not acknowledged within {timeout:.1f}s") from None
        except WireError:
            self.errors["protocol"] += 1
            raise
        except Exception as exc:  # p2pd control failures, resets: the peer is not reachable this way
            self.errors["unreachable"] += 1
            raise PeerUnavailable(f"push {kind} to {peer_id}: {type(exc).__name__}: {exc}") from None
        if resp.status != "ok":
            self.errors[f"remote_{resp.status}"] += 1
            raise (PeerUnavailable if resp.status == "busy" else WireError)(
                f"push {kind} to {peer_id}: {resp.status}: {resp.message}")
        self.bytes_out[kind] += size
        return Pushed(bytes=size, seconds=time.monotonic() - t0)

    async def _open(self, peer_id: str, maddrs: list[str]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A stream to ``peer_id``, dialing its advertised DHT addresses first if given."""
        from hivemind.p2p import PeerID

        try:
            peer = PeerID.from_base58(peer_id)
        except Exception:
            raise WireError(f"{peer_id!r} is not a peer id") from None
        addrs = _transport_addrs(peer_id, maddrs)
        if addrs:
            try:  # a no-op when already connected (the DHT usually is)
                await self.p2p._client.connect(peer, addrs)
            except Exception as exc:
                log.debug("dial %s: %s (trying the stream anyway)", peer_id[-8:], exc)
        info, reader, writer = await self.p2p.call_binary_stream_handler(peer, PROTOCOL)
        if info.peer_id != peer:
            writer.close()
            raise WireError(f"p2pd opened a stream to {info.peer_id} instead of {peer_id}")
        return reader, writer

    async def probe(self, peer_id: str, maddrs: list[str], raw: bytes, *, timeout: float) -> bytes:
        """Diagnostics and tests: send raw bytes on a push stream, return what the peer answers."""
        reply = bytearray()
        try:
            with anyio.fail_after(timeout):
                reader, writer = await self._open(peer_id, maddrs)
                try:
                    writer.write(raw)
                    await writer.drain()
                    while len(reply) < wp.RESPONSE_CAP + 4:
                        chunk = await reader.read(wp.RESPONSE_CAP)
                        if not chunk:
                            break
                        reply += chunk
                finally:
                    writer.close()
        except (TimeoutError, ConnectionError):
            pass
        return bytes(reply)

    def stats(self) -> PushPlaneStats:
        return PushPlaneStats(bytes_in=dict(self.bytes_in), bytes_out=dict(self.bytes_out), errors=dict(self.errors),
                              events_queued=len(self.inbox), events_rejected=self.inbox.rejected,
                              refused=dict(self.refusals.by_reason), caps=dict(self.caps),
                              spool=str(self.spool.directory) if self.spool else None)

    def close(self) -> None:
        """After p2pd stopped: finish spool I/O, remove every file nobody collected."""
        if self._io is not None:
            self._io.shutdown(wait=True, cancel_futures=True)
        if self.spool is not None:
            removed = self.spool.clear()
            if removed:
                log.info("removed %d uncollected spool file(s)", removed)


async def _chunks(flow: Flow, reader: asyncio.StreamReader, size: int) -> AsyncIterator[bytes]:
    """``size`` body bytes in chunks, each read within the stream's budget (``SlowPeer`` past it)."""
    left = size
    while left:
        with anyio.fail_after(flow.limit(HEADER_TIMEOUT_S, flow.peer)):
            chunk = await reader.readexactly(min(WRITE_CHUNK, left))
        flow.add(len(chunk))
        left -= len(chunk)
        yield chunk


def _transport_addrs(peer_id: str, maddrs: list[str]) -> list[Multiaddr]:
    """Advertised multiaddrs of ``peer_id`` without their ``/p2p/`` part; others' addresses dropped."""
    from hivemind.utils.multiaddr import Multiaddr

    out = []
    for text in maddrs[:8]:
        try:
            m = Multiaddr(text)
        except Exception:
            continue
        owner = next((value for proto, value in m.items() if proto.name == "p2p"), None)
        if owner is None:
            out.append(m)
        elif owner == peer_id:
            out.append(m.decapsulate(Multiaddr(f"/p2p/{owner}")))
    return out
