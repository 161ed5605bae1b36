"""The libp2p data-plane worker: serves the node's store to peers and fetches from them.

Run by ``WireClient`` (never import it from the node process)::

    python -m pulse_node.net.wire_worker --ipc SOCK --listen /ip4/127.0.0.1/tcp/0 --store ROOT \
        [--identity KEYFILE] [--announce MADDR ...] [--max-streams N]

One trio program: a py-libp2p host (TCP, Noise only, yamux) serving the ``/pulse/*/1.0.0``
protocols of ``wire_protocol`` read-only from ``--store`` (files there are written atomically
by the node), and the local RPC of ``ipc.py`` on a Unix socket (methods ``rpc_*`` below).
A catch-up patch that is not cached yet is made on demand from the store's verified states
(``chain.catchup_producer``: one at a time, on a thread, a bounded wait, then ``busy``).
Inbound pushes (rollouts, PULSELoCo payloads, head announcements) go to a bounded queue that
the node drains with ``events``. A peer that sends garbage gets an error response and its
stream closed; nothing a peer sends can stop the worker.

Identity: ``--identity`` is an Ed25519 private key file, either the raw 32-byte seed or the
chain layer's PKCS#8 PEM (``pulse_node.chain.identity``); without it an ephemeral key is used.
The worker exits when its parent process goes away.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import multiaddr
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from pulse_node.chain import serving
from pulse_node.chain.catchup_producer import CatchupProducer
from pulse_node.errors import BusyError, ConfigError, PulseError, WireError
from pulse_node.net.inbox import Event, Inbox
from pulse_node.net import ipc
from pulse_node.net import wire_protocol as wp
from pulse_node.net import wire_transfer as wt

log = logging.getLogger("pulse.wire")

Resolver = Callable[[str, dict[str, Any]], "Path | None"]


def resolve(root: Path, kind: str, params: dict[str, Any]) -> Path | None:
    """Where the store keeps a servable file (defined once, in ``pulse_node.chain.serving``)."""
    return serving.resolve(root, kind, params)


def load_key_pair(path: Path | None) -> Any:
    """libp2p Ed25519 key pair from a raw 32-byte seed file or a PKCS#8 PEM file."""
    if path is None:
        return create_new_key_pair()
    try:
        data = path.read_bytes()[:8192]
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read identity key ({exc.strerror})") from None
    if len(data) != 32:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise ConfigError(f"{path}: identity key must be 32 raw bytes or an Ed25519 PEM") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path}: key is {type(key).__name__}, expected Ed25519")
        data = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
    return create_new_key_pair(data)


class EventQueue(Inbox):
    """The wire worker's inbound pushes (see ``net.inbox``), with a trio wake-up for waiters."""

    def __init__(self, *, max_events: int, max_bytes: int) -> None:
        super().__init__(max_events=max_events, max_bytes=max_bytes)
        self._arrived = trio.Event()

    def put(self, event: Event) -> None:
        super().put(event)
        self._arrived.set()

    async def take(self, max_n: int, wait_s: float) -> list[Event]:
        if not len(self) and wait_s > 0:
            with trio.move_on_after(wait_s):
                await self._arrived.wait()
        out = self.take_ready(max_n)
        if not len(self):
            self._arrived = trio.Event()
        return out


class Server:
    """Inbound ``/pulse/*`` streams: serves store files and the head record, queues pushes."""

    def __init__(self, resolver: Resolver, *, counters: wt.Counters, events: EventQueue,
                 max_streams: int, idle: float, upload_rate: float = 0.0,
                 producer: CatchupProducer | None = None) -> None:
        self.resolver, self.counters, self.events, self.idle = resolver, counters, events, idle
        self.producer = producer
        self.limiter = trio.CapacityLimiter(max_streams)
        self.upload_rate = upload_rate
        self.head: bytes | None = None
        self._next_send = 0.0

    def register(self, host: Any) -> None:
        for kind, proto in wp.PROTOCOLS.items():
            host.set_stream_handler(TProtocol(proto), partial(self.handle, kind))

    async def handle(self, kind: str, stream: Any) -> None:
        peer = _peer_of(stream)
        io = wt.StreamIO(stream, idle=self.idle, counters=self.counters, kind=kind, peer=peer)
        self.counters.requests[kind] += 1
        try:
            self.limiter.acquire_nowait()
        except trio.WouldBlock:
            await self._reply_error(io, "busy", f"serving {self.limiter.total_tokens} streams already")
            return
        try:
            await self._handle(kind, io)
        finally:
            self.limiter.release()

    async def _handle(self, kind: str, io: wt.StreamIO) -> None:
        reset = False
        try:
            req = await io.read_struct(wp.REQUESTS[kind])
            if kind == "push":
                await self._serve_push(io, req)
            else:
                await self._serve_file(io, kind, req)
        except wp.UnsupportedVersion as exc:
            await self._reply_error(io, "unsupported", str(exc))
        except wt.PeerUnavailable as exc:
            self.counters.errors[f"serve_{kind}_stream"] += 1
            log.debug("serving %s to %s: %s", kind, io.peer, exc)
            reset = True
        except WireError as exc:
            await self._reply_error(io, "bad_request", str(exc))
        except Exception as exc:  # never let a request take the worker down
            log.exception("serving %s to %s failed", kind, io.peer)
            self.counters.errors["serve_internal"] += 1
            await self._reply_error(io, "internal", type(exc).__name__)
        finally:
            await io.close(reset=reset)

    async def _reply_error(self, io: wt.StreamIO, status: str, message: str) -> None:
        self.counters.errors[f"sent_{status}"] += 1
        try:
            await io.write(wp.error_response(status, message).encode())
        except wt.PeerUnavailable:
            pass

    async def _serve_file(self, io: wt.StreamIO, kind: str, req: Any) -> None:
        params = {k: getattr(req, k) for k in req.SPEC if k != "v"}
        if kind == "record" and req.version is None:
            if self.head is None:
                await self._reply_error(io, "not_found", "no head record set")
            else:
                await self._send_ok(io, self.head, len(self.head))
            return
        path = self.resolver(kind, params)
        if kind == "catchup" and path is not None and self.producer is not None and not path.exists():
            path = await self._make_catchup(io, req.base, req.target)
            if path is None:
                return
        try:
            fh = open(path, "rb") if path is not None else None
        except OSError:
            fh = None
        if fh is None:
            await self._reply_error(io, "not_found", f"no {kind} {params}")
            return
        with fh:
            total = os.fstat(fh.fileno()).st_size
            off, length = self._range(kind, req, total)
            await io.write(wp.Response(v=wp.WIRE_VERSION, status="ok", size=length, total=total,
                                       message="").encode())
            await self._send_range(io, fh.fileno(), off, length)

    async def _make_catchup(self, io: wt.StreamIO, base: int, target: int) -> Path | None:
        """Have the producer make ``base -> target`` on a thread (it waits a bounded time)."""
        assert self.producer is not None
        try:
            return await trio.to_thread.run_sync(self.producer.request, base, target)
        except BusyError as exc:
            await self._reply_error(io, "busy", str(exc))
        except PulseError as exc:
            await self._reply_error(io, "not_found", f"no catchup v{base} -> v{target}: {exc}")
        return None

    @staticmethod
    def _range(kind: str, req: Any, total: int) -> tuple[int, int]:
        if kind == "anchor":
            if req.offset > total:
                raise WireError(f"offset {req.offset} is past the end ({total} bytes)")
            return req.offset, min(req.length, total - req.offset)
        if total > wp.BODY_CAPS[kind]:
            raise WireError(f"{kind} of {total} bytes exceeds cap {wp.BODY_CAPS[kind]}")
        return 0, total

    async def _send_ok(self, io: wt.StreamIO, body: bytes, total: int) -> None:
        await io.write(wp.Response(v=wp.WIRE_VERSION, status="ok", size=len(body), total=total,
                                   message="").encode())
        await io.write(body)

    async def _send_range(self, io: wt.StreamIO, fd: int, off: int, length: int) -> None:
        pos, end = off, off + length
        while pos < end:
            block = os.pread(fd, min(1 << 20, end - pos), pos)
            if not block:
                raise wt.PeerUnavailable("file shrank while serving")  # resets the stream
            for i in range(0, len(block), wp.CHUNK):
                piece = block[i:i + wp.CHUNK]
                await self._throttle(len(piece))
                await io.write(piece)
            pos += len(block)

    async def _throttle(self, n: int) -> None:
        """Optional upload cap shared by all streams (``--max-upload-rate``)."""
        if self.upload_rate <= 0:
            return
        now = trio.current_time()
        start = max(now, self._next_send)
        self._next_send = start + n / self.upload_rate
        await trio.sleep_until(start)

    async def _serve_push(self, io: wt.StreamIO, req: Any) -> None:
        cap = wp.PUSH_CAPS.get(req.kind)
        if cap is None:
            raise WireError(f"unknown push kind {req.kind!r}")
        if req.size > cap:
            await self._reply_error(io, "too_large", f"{req.kind} push of {req.size} bytes exceeds {cap}")
            return
        if not self.events.reserve(req.size):
            await self._reply_error(io, "busy", "event queue is full")
            return
        try:
            data = await io.read_exact(req.size)
        except BaseException:
            self.events.release(req.size)
            raise
        self.events.put(Event(req.kind, io.peer, data, time.time()))
        await io.write(wp.Response(v=wp.WIRE_VERSION, status="ok", size=0, total=0, message="").encode())


def _peer_of(stream: Any) -> str:
    try:
        return stream.muxed_conn.peer_id.to_string()
    except Exception:
        return "unknown"


class Rpc:
    """Local RPC methods called by the node through ``WireClient`` (``rpc_<method>``)."""

    def __init__(self, host: Any, server: Server, dialer: wt.Dialer, events: EventQueue) -> None:
        self.host, self.server, self.dialer, self.events = host, server, dialer, events
        self.stopping = trio.Event()

    async def rpc_ping(self) -> str:
        return "pong"

    async def rpc_shutdown(self) -> bool:
        return True  # the connection handler sets ``stopping`` after replying

    async def rpc_info(self) -> dict[str, Any]:
        return {"peer_id": self.host.get_id().to_string(),
                "listen_maddrs": [str(a) for a in self.host.get_addrs()]}

    async def rpc_set_head(self, *, record: bytes) -> bool:
        if not isinstance(record, bytes) or len(record) > wp.BODY_CAPS["record"]:
            raise WireError(f"head record must be bytes of at most {wp.BODY_CAPS['record']}")
        self.server.head = record
        return True

    async def rpc_fetch(self, *, peer: str, kind: str, params: dict[str, Any], dest: str,
                        timeout: float = 30.0, expected_digest: str | None = None,
                        max_bytes: int | None = None) -> dict[str, Any]:
        return await wt.fetch_to_file(self.dialer, peer, kind, params, Path(dest), timeout=float(timeout),
                                      digest=expected_digest, max_bytes=max_bytes)

    async def rpc_fetch_multi(self, *, peers: list[str], version: int, size: int, dest: str,
                              kind: str = "anchor", digest: str | None = None, timeout: float = 600.0,
                              chunk: int = 4 << 20, per_peer: int = 2,
                              pieces: list[Any] | None = None) -> dict[str, Any]:
        if kind != "anchor":
            raise WireError("fetch_multi serves kind 'anchor' only")
        return await wt.fetch_multi(self.dialer, list(peers), version=version, size=size, dest=Path(dest),
                                    digest=digest, timeout=float(timeout), chunk=chunk, per_peer=per_peer,
                                    pieces=pieces)

    async def rpc_push(self, *, peer: str, kind: str, data: bytes, timeout: float = 30.0) -> dict[str, Any]:
        return await wt.push(self.dialer, peer, kind, data, timeout=float(timeout))

    async def rpc_events(self, *, max: int = 64, wait_s: float = 0.0) -> list[dict[str, Any]]:
        evs = await self.events.take(max_n=int(max), wait_s=min(float(wait_s), 60.0))
        return [{"kind": e.kind, "from_peer": e.from_peer, "data": e.data, "received_at": e.received_at}
                for e in evs]

    async def rpc_stats(self) -> dict[str, Any]:
        snap = self.dialer.counters.snapshot()
        snap["events_queued"] = len(self.events)
        snap["events_rejected"] = self.events.rejected
        snap["connected_peers"] = [p.to_string() for p in self.host.get_connected_peers()]
        return snap

    async def rpc_probe(self, *, peer: str, kind: str, raw: bytes, timeout: float = 5.0) -> dict[str, Any]:
        """Diagnostics: raw bytes on a ``kind`` stream, returns the raw reply."""
        if kind not in wp.PROTOCOLS:
            raise WireError(f"unknown protocol kind {kind!r}")
        return await wt.probe(self.dialer, peer, kind, raw, timeout=float(timeout))

    async def dispatch(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run one request map; every failure becomes ``{"ok": false, "error": "Type: message"}``."""
        call_id, method, params = msg.get("id"), msg.get("method"), msg.get("params", {})
        fn = getattr(self, f"rpc_{method}", None) if isinstance(method, str) else None
        try:
            if fn is None:
                raise WireError(f"unknown method {method!r}")
            if not isinstance(params, dict):
                raise WireError("params must be a map")
            try:
                inspect.signature(fn).bind(**params)
            except TypeError as exc:
                raise WireError(f"{method}: bad params ({exc})") from None
            return {"id": call_id, "ok": True, "result": await fn(**params)}
        except PulseError as exc:
            return {"id": call_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:
            log.exception("rpc %s failed", method)
            return {"id": call_id, "ok": False, "error": f"InternalError: {type(exc).__name__}: {exc}"}


async def _recv_exact(stream: trio.SocketStream, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def _serve_rpc_conn(rpc: Rpc, stream: trio.SocketStream) -> None:
    """One local RPC connection; a broken or hostile connection is closed, never fatal."""
    try:
        async with stream:
            await _rpc_loop(rpc, stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    except Exception:
        log.exception("local rpc connection failed")


async def _rpc_loop(rpc: Rpc, stream: trio.SocketStream) -> None:
    """Frames in, frames out, one call at a time; a bad frame gets an error reply and a close."""
    while True:
        try:
            header = await _recv_exact(stream, 4)
            body = await _recv_exact(stream, ipc.frame_length(header)) if header is not None else None
            if body is None:
                return
            msg = ipc.decode_body(body)
        except WireError as exc:
            await stream.send_all(ipc.encode_frame({"id": None, "ok": False, "error": f"WireError: {exc}"}))
            return
        reply = await rpc.dispatch(msg)
        try:
            frame = ipc.encode_frame(reply)
        except (WireError, TypeError, ValueError) as exc:  # result too large or not encodable
            frame = ipc.encode_frame({"id": reply["id"], "ok": False, "error": f"WireError: {exc}"})
        await stream.send_all(frame)
        if msg.get("method") == "shutdown":
            rpc.stopping.set()


async def serve_rpc(path: str, rpc: Rpc, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    if os.path.exists(path):
        os.unlink(path)
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(16)
    task_status.started()
    await trio.serve_listeners(partial(_serve_rpc_conn, rpc), [trio.SocketListener(sock)])


async def _watch_parent(rpc: Rpc) -> None:
    """Stop when the process that started us is gone (we were re-parented)."""
    parent = os.getppid()
    while os.getppid() == parent:
        await trio.sleep(1.0)
    log.warning("parent process %d is gone; shutting down", parent)
    rpc.stopping.set()


def make_host(key_pair: Any, listen: list[multiaddr.Multiaddr], announce: list[multiaddr.Multiaddr]) -> Any:
    """py-libp2p host: TCP, Noise only (no plaintext/secio fallbacks), yamux."""
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    return new_host(key_pair=key_pair, sec_opt={TProtocol(NOISE_PROTOCOL_ID): noise},
                    muxer_preference="YAMUX", listen_addrs=listen, announce_addrs=announce or None)


async def amain(args: argparse.Namespace) -> None:
    listen = [multiaddr.Multiaddr(a) for a in args.listen]
    announce = [multiaddr.Multiaddr(a) for a in args.announce]
    host = make_host(load_key_pair(args.identity), listen, announce)
    counters = wt.Counters()
    events = EventQueue(max_events=args.max_events, max_bytes=args.max_event_bytes)
    root = Path(args.store)
    server = Server(partial(resolve, root), counters=counters, events=events, max_streams=args.max_streams,
                    idle=args.idle_timeout, upload_rate=args.max_upload_rate, producer=CatchupProducer(root))
    server.register(host)
    dialer = wt.Dialer(host, counters=counters, max_streams=args.max_streams, idle=args.idle_timeout,
                       dial_timeout=args.dial_timeout)
    rpc = Rpc(host, server, dialer, events)
    async with host.run(listen):
        log.info("peer %s listening on %s", host.get_id().to_string(), [str(a) for a in host.get_addrs()])
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_rpc, args.ipc, rpc)
            nursery.start_soon(_watch_parent, rpc)
            await rpc.stopping.wait()
            nursery.cancel_scope.cancel()
        with trio.move_on_after(3.0):
            await host.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pulse_node.net.wire_worker", description=__doc__.splitlines()[0])
    p.add_argument("--ipc", required=True, help="Unix socket path for the local RPC")
    p.add_argument("--listen", action="append", default=[], help="multiaddr to listen on (repeatable)")
    p.add_argument("--store", required=True, help="root of the node's store (served read-only)")
    p.add_argument("--identity", type=Path, help="Ed25519 key: raw 32-byte seed or PKCS#8 PEM")
    p.add_argument("--announce", action="append", default=[], help="multiaddr to advertise instead")
    p.add_argument("--max-streams", type=int, default=32, help="concurrent streams each way")
    p.add_argument("--idle-timeout", type=float, default=10.0, help="seconds any stream read/write may stall")
    p.add_argument("--dial-timeout", type=float, default=wt.DIAL_TIMEOUT_S, help="seconds a new connection may take")
    p.add_argument("--max-upload-rate", type=float, default=0.0, help="bytes/s served to peers (0 = no cap)")
    p.add_argument("--max-events", type=int, default=1024, help="queued inbound pushes")
    p.add_argument("--max-event-bytes", type=int, default=256 << 20, help="bytes of queued inbound pushes")
    p.add_argument("--log-level", default="WARNING", help="worker log level (logs go to stderr)")
    args = p.parse_args(argv)
    args.listen = args.listen or ["/ip4/127.0.0.1/tcp/0"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s wire[%(process)d] %(levelname)s %(name)s: %(message)s")
    try:
        trio.run(amain, args)
    except ConfigError as exc:
        print(f"wire_worker: {exc}", flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
