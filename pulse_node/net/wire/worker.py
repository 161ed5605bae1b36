"""The libp2p data-plane worker: serves the node's store to peers and fetches from them.

Run by ``WireClient.start`` (never import it from the node process) as ``python -m
pulse_node.net.wire.worker --ipc SOCK --config FILE [--error-file FILE]``, FILE being a
``WireConfig`` as JSON (``rpc_server.run_worker``).

One trio program: a py-libp2p host (TCP, Noise only, yamux) serving the ``/pulse/<kind>/2.0.0``
protocols of ``net/wire/protocol.py`` read-only from the store (files there are written atomically by
the node), and the local RPC of ``rpc_server.py`` (the ``@rpc`` methods of ``WireService``,
named like ``WireClient``'s). A catch-up patch that is not cached yet is made on demand from the
store's verified states (``chain.catchup_producer``: one at a time, on a thread, a bounded wait,
then ``busy``). Inbound pushes (``vocab.PushKind``: rollouts, PULSELoCo payloads, head
announcements, round decisions) go to a bounded queue (``net/local/inbox.py``) that the node drains
with ``events``. A peer that sends garbage gets an error response and its stream closed; nothing
a peer sends can stop the worker.

Per-peer budgets (``net/peers/budget.py``, ``WireConfig.budget``): inbound streams come from two
pools (members' and everyone's, a non-member holding at most a few), each with a request
token bucket, an overall deadline and a minimum rate (a slower stream is cut, ``SlowPeer``; when
the shared pool is full the slowest non-member stream is evicted); a push is queued only
against its sender's share; catch-up production is charged to the requesting peer. The member
peer ids come from the node (``set_members``); refusals are counted by reason (``stats``).

Identity: ``WireConfig.identity`` is an Ed25519 private key file, either the raw 32-byte seed or
the chain layer's PKCS#8 PEM (``pulse_node.chain.identity``); without it an ephemeral key is used.
The worker stops when its parent process goes away.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import multiaddr
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p import new_host
from libp2p.abc import IHost, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from pulse_node.chain.catchup_producer import CatchupProducer
from pulse_node.errors import BusyError, ConfigError, PeerUnavailable, PulseError, UnsupportedVersion, WireError
from pulse_node.net.local.inbox import Inbox, Queued
from pulse_node.net.local.rpc_api import Pushed
from pulse_node.net.local.rpc_server import Service, rpc, run_worker
from pulse_node.net.peers.budget import (
    BULK_KINDS,
    BulkBudget,
    CatchupBudget,
    Members,
    Muzzle,
    PushShares,
    Refusals,
    Refused,
    SlowPeer,
    StreamPools,
)
from pulse_node.net.wire import anchor_fetch
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire import transfer as wt
from pulse_node.net.wire.config import WireConfig
from pulse_node.net.wire.gate import HeldAccepts, StreamGate
from pulse_node.net.wire.rpc import AnchorResult, FetchResult, WireInfo, WireStats
from pulse_node.net.wire.serving import Resolver, resolve
from pulse_node.vocab import BudgetRefusal, Event, FetchKind, PushKind, check_push_kind

log = logging.getLogger("pulse.wire")


def load_key_pair(path: Path | None) -> KeyPair:
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


class Server:
    """Inbound ``/pulse/*`` streams: serves store files and the head record, queues pushes."""

    def __init__(self, resolver: Resolver, *, counters: wt.Traffic, events: Inbox, pools: StreamPools,
                 idle: float, upload_rate: float = 0.0, producer: CatchupProducer | None = None,
                 catchups: CatchupBudget | None = None, bulk: BulkBudget | None = None) -> None:
        self.resolver, self.counters, self.events, self.idle = resolver, counters, events, idle
        self.producer, self.catchups, self.bulk = producer, catchups, bulk
        self.pools = pools
        self.refusals = pools.refusals
        self.upload_rate = upload_rate
        self.head: bytes | None = None
        self._next_send = 0.0

    def register(self, host: IHost) -> None:
        for kind, proto in wp.PROTOCOLS.items():
            host.set_stream_handler(TProtocol(proto), partial(self.handle, kind))

    async def handle(self, kind: str, stream: INetStream) -> None:
        peer = _peer_of(stream)
        io = wt.StreamIO(stream, idle=self.idle, counters=self.counters, kind=kind, peer=peer)
        self.counters.requests[kind] += 1
        try:
            flow = self.pools.open(peer)
        except Refused as exc:
            await self._reply_error(io, "busy", f"{exc.reason}: {exc}", limit=1.0)
            await io.close()  # not a reset: the peer still reads why
            return
        io.flow = flow
        try:
            with trio.CancelScope() as scope:
                flow.on_cut = scope.cancel  # evicted for a faster stream
                await self._handle(kind, io)
            if scope.cancelled_caught:
                await io.close(reset=True)
        finally:
            self.pools.close(flow)

    async def _handle(self, kind: str, io: wt.StreamIO) -> None:
        reset = False
        try:
            if kind == "push":
                await self._serve_push(io, await io.read_struct(wp.PushRequest))
            else:
                await self._serve_file(io, wp.decode_fetch(kind, await io.read_frame(wp.REQUEST_CAP)))
        except UnsupportedVersion as exc:
            await self._reply_error(io, "unsupported", str(exc))
        except SlowPeer as exc:
            self.refusals.add(io.peer, io.flow.why() if io.flow else BudgetRefusal.SLOW, str(exc))
            reset = True
        except PeerUnavailable as exc:
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

    async def _reply_error(self, io: wt.StreamIO, status: str, message: str, *, limit: float | None = None) -> None:
        self.counters.errors[f"sent_{status}"] += 1
        with trio.move_on_after(self.idle if limit is None else limit):
            try:
                await io.write(wp.error_response(status, message).encode())
            except PeerUnavailable:
                pass

    async def _serve_file(self, io: wt.StreamIO, req: wp.FetchRequest) -> None:
        kind = wp.kind_of(req)
        if isinstance(req, wp.RecordRequest) and req.version is None:
            if self.head is None:
                await self._reply_error(io, "not_found", "no head record set")
            else:
                await self._send_ok(io, self.head, len(self.head))
            return
        path = self.resolver(req)
        if isinstance(req, wp.CatchupRequest) and path is not None and self.producer is not None and not path.exists():
            if not self._catchup_allowed(io.peer, req.base, req.target):
                # not "busy": asked again, it would still be refused; the requester moves on to patches
                await self._reply_error(io, "not_found", "catchup_budget: this peer asked for too many catch-up "
                                                         "patches; fetch the patches instead")
                return
            path = await self._make_catchup(io, req.base, req.target)
            if path is None:
                return
        try:
            fh = open(path, "rb") if path is not None else None
        except OSError:
            fh = None
        if fh is None:
            await self._reply_error(io, "not_found", f"no {kind} {wp.params_of(req)}")
            return
        with fh:
            total = os.fstat(fh.fileno()).st_size
            off, length = self._range(req, total)
            if kind in BULK_KINDS and self.bulk is not None and not self.bulk.allow(io.peer, length):
                self.refusals.add(io.peer, BudgetRefusal.BULK_BUDGET, f"{kind} {length} bytes")
                await self._reply_error(io, "busy", f"bulk_budget: {kind} bytes served to this peer are over "
                                                    "its budget; ask a member or later")
                return
            await io.write(wp.Response(v=wp.WIRE_VERSION, status="ok", size=length, total=total,
                                       message="").encode())
            await self._send_range(io, fh.fileno(), off, length)

    def _catchup_allowed(self, peer: str, base: int, target: int) -> bool:
        """A pair being made already is shared for free; a new production is charged to ``peer``."""
        assert self.producer is not None
        if self.catchups is None or self.producer.making(base, target) or self.catchups.allow(peer):
            return True
        self.refusals.add(peer, BudgetRefusal.CATCHUP_BUDGET, f"v{base} -> v{target}")
        return False

    async def _make_catchup(self, io: wt.StreamIO, base: int, target: int) -> Path | None:
        """Have the producer make ``base -> target`` on a thread (it waits a bounded time, which
        does not count against the peer's minimum rate)."""
        assert self.producer is not None
        t0 = trio.current_time()
        try:
            return await trio.to_thread.run_sync(self.producer.request, base, target)
        except BusyError as exc:
            await self._reply_error(io, "busy", str(exc))
        except PulseError as exc:
            await self._reply_error(io, "not_found", f"no catchup v{base} -> v{target}: {exc}")
        finally:
            if io.flow is not None:
                io.flow.own_s += trio.current_time() - t0
        return None

    @staticmethod
    def _range(req: wp.FetchRequest, total: int) -> tuple[int, int]:
        kind = wp.kind_of(req)
        if isinstance(req, wp.AnchorRequest):
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
                raise PeerUnavailable("file shrank while serving")  # resets the stream
            for i in range(0, len(block), wp.CHUNK):
                piece = block[i:i + wp.CHUNK]
                await self._throttle(io, len(piece))
                await io.write(piece)
            pos += len(block)

    async def _throttle(self, io: wt.StreamIO, n: int) -> None:
        """Optional upload cap shared by all streams (``--max-upload-rate``); the wait is ours, so it
        does not count against the peer's minimum rate."""
        if self.upload_rate <= 0:
            return
        now = trio.current_time()
        start = max(now, self._next_send)
        self._next_send = start + n / self.upload_rate
        if io.flow is not None:
            io.flow.own_s += start - now
        await trio.sleep_until(start)

    async def _serve_push(self, io: wt.StreamIO, req: wp.PushRequest) -> None:
        kind = check_push_kind(req.kind)
        cap = wp.PUSH_CAPS[kind]
        if req.size > cap:
            await self._reply_error(io, "too_large", f"{req.kind} push of {req.size} bytes exceeds {cap}")
            return
        why = self.events.admit(req.size, peer=io.peer)
        if why:
            if why != "queue_full":
                self.refusals.add(io.peer, why, f"{req.kind} push of {req.size} bytes")
            await self._reply_error(io, "busy", f"{why}: event queue has no room for this push")
            return
        try:
            data = await io.read_exact(req.size)
        except BaseException:
            self.events.release(req.size, peer=io.peer)
            raise
        self.events.put(Event(kind, io.peer, data, time.time()))
        await io.write(wp.Response(v=wp.WIRE_VERSION, status="ok", size=0, total=0, message="").encode())


def _peer_of(stream: INetStream) -> str:
    try:
        return stream.muxed_conn.peer_id.to_string()
    except Exception:
        return "unknown"


class WireService(Service):
    """The wire worker's RPC methods, called by the node through ``WireClient`` (same names)."""

    def __init__(self, host: IHost, server: Server, dialer: wt.Dialer, inbox: Inbox, members: Members) -> None:
        self.host, self.server, self.dialer, self.inbox, self.members = host, server, dialer, inbox, members

    @rpc
    async def info(self) -> WireInfo:
        return WireInfo(peer_id=self.host.get_id().to_string(), listen_maddrs=[str(a) for a in self.host.get_addrs()])

    @rpc
    async def set_head(self, *, record: bytes) -> bool:
        if len(record) > wp.BODY_CAPS["record"]:
            raise WireError(f"head record must be at most {wp.BODY_CAPS['record']} bytes")
        self.server.head = record
        return True

    @rpc
    async def set_members(self, *, peer_ids: list[str]) -> int:
        """The trainer-set members' peer ids (they get their own stream pool and larger shares)."""
        if len(peer_ids) > 4096 or not all(isinstance(p, str) and len(p) <= 128 for p in peer_ids):
            raise WireError("set_members takes at most 4096 peer ids")
        self.members.set(peer_ids)
        return len(self.members.ids)

    @rpc
    async def set_standing(self, *, peer_ids: list[str]) -> int:
        """Peers with standing (``peers/standing.py``): their own shares; everyone else who is no
        member shares the newcomers' allotments together (``net/peers/budget.py``)."""
        if len(peer_ids) > 4096 or not all(isinstance(p, str) and len(p) <= 128 for p in peer_ids):
            raise WireError("set_standing takes at most 4096 peer ids")
        self.members.set_standing(peer_ids)
        return len(peer_ids)

    @rpc
    async def fetch(self, *, peer: str, kind: FetchKind, request: bytes, dest: str,
                    timeout: float, expected_digest: str | None = None,
                    max_bytes: int | None = None) -> FetchResult:
        return await wt.fetch_to_file(self.dialer, peer, wp.decode_fetch(kind, request), Path(dest), timeout=timeout,
                                      digest=expected_digest, max_bytes=max_bytes)

    @rpc
    async def fetch_anchor(self, *, peers: list[str], version: int, size: int, dest: str, timeout: float,
                           digest: str | None = None, chunk: int = 4 << 20, per_peer: int = 2,
                           pieces: list[list[int | str]] | None = None) -> AnchorResult:  # (offset, length, hex)
        return await anchor_fetch.fetch_anchor(self.dialer, peers, version=version, size=size, dest=Path(dest),
                                     digest=digest, timeout=timeout, chunk=chunk, per_peer=per_peer,
                                     pieces=pieces)

    @rpc
    async def push(self, *, peer: str, kind: PushKind, data: bytes, timeout: float) -> Pushed:
        return await wt.push(self.dialer, peer, kind, data, timeout=timeout)

    @rpc
    async def events(self, *, max_events: int = 64, wait_s: float = 0.0) -> list[Queued]:
        return await self.inbox.take(max_events, wait_s)

    @rpc
    async def stats(self) -> WireStats:
        c = self.dialer.counters
        return WireStats(bytes_in=dict(c.bytes_in), bytes_out=dict(c.bytes_out), peers=c.peers(),
                         errors=dict(c.errors), requests=dict(c.requests), events_queued=len(self.inbox),
                         events_rejected=self.inbox.rejected, refused=dict(self.server.refusals.by_reason),
                         streams_open=self.server.pools.open_count(), members=len(self.members.ids),
                         connected_peers=[p.to_string() for p in self.host.get_connected_peers()])

    @rpc
    async def probe(self, *, peer: str, kind: wp.StreamKind, raw: bytes, timeout: float) -> bytes:
        """Diagnostics: raw bytes on a ``kind`` stream, returns the raw reply."""
        return await wt.probe(self.dialer, peer, kind, raw, timeout=timeout)


def make_host(key_pair: KeyPair, listen: list[multiaddr.Multiaddr], announce: list[multiaddr.Multiaddr], *,
              gate: StreamGate | None = None) -> IHost:
    """py-libp2p host: TCP, Noise only (no plaintext/secio fallbacks), yamux; ``gate``: its
    resource manager (None: py-libp2p's default)."""
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    return new_host(key_pair=key_pair, sec_opt={TProtocol(NOISE_PROTOCOL_ID): noise},
                    muxer_preference="YAMUX", listen_addrs=listen, announce_addrs=announce or None,
                    resource_manager=gate)


@asynccontextmanager
async def open_service(config: WireConfig) -> AsyncIterator[WireService]:
    """The host listening and serving the store while the process serves the RPC; closed (bounded) after."""
    listen = [multiaddr.Multiaddr(a) for a in config.listen]
    announce = [multiaddr.Multiaddr(a) for a in config.announce]
    counters = wt.Traffic()
    budget, members = config.budget, Members()
    muzzle = Muzzle(budget, members)
    refusals = Refusals(interval=budget.log_interval_s, muzzle=muzzle)
    pools = StreamPools(budget, members, refusals)
    host = make_host(load_key_pair(config.identity), listen, announce, gate=StreamGate(pools))
    host.get_network().register_notifee(HeldAccepts(muzzle))
    shares = PushShares(budget, members, max_events=config.max_events, max_bytes=config.max_event_bytes)
    events = Inbox(max_events=config.max_events, max_bytes=config.max_event_bytes, shares=shares)
    root = Path(config.store)
    server = Server(partial(resolve, root), counters=counters, events=events, pools=pools,
                    idle=config.idle_timeout_s, upload_rate=config.max_upload_rate, producer=CatchupProducer(root),
                    catchups=CatchupBudget(budget, members), bulk=BulkBudget(budget, members))
    server.register(host)
    dialer = wt.Dialer(host, counters=counters, max_streams=config.max_streams, idle=config.idle_timeout_s,
                       dial_timeout=config.dial_timeout_s)
    async with host.run(listen):
        log.info("peer %s listening on %s", host.get_id().to_string(), [str(a) for a in host.get_addrs()])
        try:
            yield WireService(host, server, dialer, events, members)
        finally:
            with trio.move_on_after(3.0):
                await host.close()


def main(argv: list[str] | None = None) -> int:
    return run_worker("wire", WireConfig, open_service, backend="trio", argv=argv)


if __name__ == "__main__":
    sys.exit(main())
