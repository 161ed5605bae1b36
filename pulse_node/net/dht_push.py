"""Pushes over hivemind's p2pd streams: the plane that carries PULSELoCo payloads between trainers.

Runs inside the DHT worker (asyncio, on the same p2pd as hivemind's DHT node) and is reached
through its RPC (``push``, ``events``, ``push_stats``, ``probe``). Why this plane and not the
py-libp2p wire: ``bench/dataplane.py`` (bench/RESULTS.md, "Data plane"). One p2pd stream per
push, protocol ``PROTOCOL``::

    request   = frame(PushHeader{v, kind, size}) + size body bytes
    response  = frame(wire_protocol.Response)   status: ok | too_large | busy | bad_request | unsupported
    frame(s)  = 4-byte big-endian length + msgpack map with exactly the struct's fields

Limits, all checked before anything is allocated: the header frame is capped at
``wire_protocol.REQUEST_CAP``, the declared size at the kind's cap (``CAPS``), at most
``MAX_INBOUND`` streams are read at once, and every stream has a deadline (``HEADER_TIMEOUT_S``
for the header, then at least ``MIN_RATE`` bytes/s for the body). Received pushes wait in a
bounded queue (count and bytes); a push that does not fit is refused with ``busy`` and counted.
The sender of an event is the peer id p2pd authenticated for the stream (libp2p security
handshake), never anything the peer wrote: with one Ed25519 identity per node it equals the
sender's wire peer id, which is what the trainer checks a payload's trainer id against.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, ClassVar

from pulse_node.errors import WireError
from pulse_node.net import wire_protocol as wp
from pulse_node.net.inbox import Event
from pulse_node.net.inbox import Inbox as _Inbox

log = logging.getLogger("pulse_node.dht.push")

PROTOCOL = "/pulse/p2pd-push/1.0.0"
#: kinds this plane accepts and their caps (bounded by the local RPC frame, like the wire's pushes)
CAPS: dict[str, int] = {"loco": wp.PUSH_CAPS["loco"]}
WRITE_CHUNK = 1 << 20  # 1 MiB writes were the fastest on p2pd streams (bench/dataplane.py)
HEADER_TIMEOUT_S = 10.0
MIN_RATE = 1e6  # bytes/s a stream must sustain, or it is cut
MAX_INBOUND = 8
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


class Inbox(_Inbox):
    """Bounded inbound pushes of the p2pd plane (see ``net.inbox``)."""

    def __init__(self, *, max_events: int = MAX_EVENTS, max_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_events=max_events, max_bytes=max_bytes)

    def take(self, max_n: int) -> list[Event]:
        return self.take_ready(max_n)


async def read_frame(reader: asyncio.StreamReader, cap: int) -> bytes:
    """One length-prefixed frame body; the declared length is checked before it is read."""
    return await reader.readexactly(wp.frame_length(await reader.readexactly(4), cap))


def _reply(status: str, message: str = "") -> bytes:
    return wp.Response(v=wp.WIRE_VERSION, status=status, size=0, total=0, message=message[:512]).encode()


class PushPlane:
    """Serves ``PROTOCOL`` on a hivemind ``P2P`` and sends pushes over it; counts bytes and errors."""

    def __init__(self, p2p: Any, *, inbox: Inbox | None = None) -> None:
        self.p2p = p2p
        self.inbox = inbox or Inbox()
        self.bytes_in: dict[str, int] = defaultdict(int)
        self.bytes_out: dict[str, int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)
        self._active = 0

    async def start(self) -> None:
        await self.p2p.add_binary_stream_handler(PROTOCOL, self.handle)

    # ---- inbound ------------------------------------------------------------------------
    async def handle(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One inbound stream: header -> checks -> body -> queued event -> response."""
        sender = info.peer_id.to_base58()  # authenticated by p2pd, not claimed by the peer
        if self._active >= MAX_INBOUND:
            self.errors["busy"] += 1
            await self._answer(writer, "busy", "too many inbound pushes")
            return
        self._active += 1
        try:
            async with asyncio.timeout(HEADER_TIMEOUT_S):
                head = PushHeader.decode(await read_frame(reader, wp.REQUEST_CAP))
            status, message = await self._receive(sender, head, reader)
        except wp.UnsupportedVersion as exc:
            status, message = "unsupported", str(exc)
        except WireError as exc:
            status, message = "bad_request", str(exc)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            self.errors["inbound_" + ("timeout" if isinstance(exc, TimeoutError) else "cut")] += 1
            writer.close()
            return
        finally:
            self._active -= 1
        if status != "ok":
            self.errors[f"refused_{status}"] += 1
            log.info("push from %s refused: %s: %s", sender[-8:], status, message)
        await self._answer(writer, status, message)

    async def _receive(self, sender: str, head: PushHeader, reader: asyncio.StreamReader) -> tuple[str, str]:
        cap = CAPS.get(head.kind)
        if cap is None:
            return "unsupported", f"push kind {head.kind!r} is not carried on this plane ({sorted(CAPS)})"
        if head.size > cap:
            return "too_large", f"{head.kind} push of {head.size} bytes exceeds {cap}"
        if not self.inbox.reserve(head.size):
            return "busy", "event queue is full"
        try:
            async with asyncio.timeout(HEADER_TIMEOUT_S + head.size / MIN_RATE):
                data = await reader.readexactly(head.size)
        except BaseException:
            self.inbox.release(head.size)
            raise
        self.inbox.put(Event(head.kind, sender, data, time.time()))
        self.bytes_in[head.kind] += head.size
        return "ok", ""

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
    async def push(self, peer_id: str, maddrs: list[str], kind: str, data: bytes, *, timeout: float) -> dict:
        """Send one push; returns once the peer has queued it. ``PeerUnavailable``/``WireError``."""
        if kind not in CAPS:
            raise WireError(f"push kind {kind!r} is not carried on this plane ({sorted(CAPS)})")
        if len(data) > CAPS[kind]:
            raise WireError(f"{kind} push of {len(data)} bytes exceeds cap {CAPS[kind]}")
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await self._open(peer_id, maddrs)
                try:
                    writer.write(PushHeader(v=wp.WIRE_VERSION, kind=kind, size=len(data)).encode())
                    view = memoryview(data)
                    for i in range(0, len(data), WRITE_CHUNK):
                        writer.write(view[i:i + WRITE_CHUNK])
                        await writer.drain()
                    resp = wp.Response.decode(await read_frame(reader, wp.RESPONSE_CAP))
                finally:
                    writer.close()
        except TimeoutError:
            self.errors["timeout"] += 1
            raise wp.PeerUnavailable(f"push {kind} to {peer_id}: not acknowledged within {timeout:.1f}s") from None
        except WireError:
            self.errors["protocol"] += 1
            raise
        except Exception as exc:  # p2pd control failures, resets: the peer is not reachable this way
            self.errors["unreachable"] += 1
            raise wp.PeerUnavailable(f"push {kind} to {peer_id}: {type(exc).__name__}: {exc}") from None
        if resp.status != "ok":
            self.errors[f"remote_{resp.status}"] += 1
            raise (wp.PeerUnavailable if resp.status == "busy" else WireError)(
                f"push {kind} to {peer_id}: {resp.status}: {resp.message}")
        self.bytes_out[kind] += len(data)
        return {"bytes": len(data), "seconds": time.monotonic() - t0}

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
                await self.p2p._client.connect(peer, addrs)  # noqa: SLF001 (hivemind has no public dial)
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
            async with asyncio.timeout(timeout):
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

    def stats(self) -> dict[str, Any]:
        return {"bytes_in": dict(self.bytes_in), "bytes_out": dict(self.bytes_out), "errors": dict(self.errors),
                "events_queued": len(self.inbox), "events_rejected": self.inbox.rejected}


def _transport_addrs(peer_id: str, maddrs: list[str]) -> list[Any]:
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
