"""The DHT worker: one hivemind DHT node in its own process, served over the local RPC of ipc.py.

Run: ``python -m pulse_node.net.dht_worker --ipc SOCK --run-id RUN [--initial-peers MADDR ...]
[--host-maddrs /ip4/0.0.0.0/tcp/0 ...] [--announce-maddrs ...] [--identity PATH] [--use-relay]
[--use-auto-relay] [--client-mode] [--accept-pushes] [--spool DIR [--spool-max-push BYTES]
[--spool-disk-bytes BYTES]] [--bootstrap-timeout S] [--error-file PATH]``.

Design: one asyncio loop in this process runs hivemind's ``DHTNode`` directly (not
``hivemind.DHT``, which forks a second process and talks to it over a pipe) next to an asyncio
Unix-socket server for the node's RPC. Stopping is one path: the ``shutdown`` RPC, SIGTERM,
SIGINT or the parent process going away all set one event; the worker then marks its record
as leaving (bounded), stops the DHT node and p2pd, and exits 0. A start failure writes a
``StartFailure`` to ``--error-file``, prints it to stderr, and exits 2.

RPC methods: ping, shutdown, info, publish_peer(record, ttl_s), peers(prefer) (at most
``MAX_PEERS_READ`` valid records, those of the ``prefer`` peer ids first, then the newest),
get(kind), and the p2pd push plane of ``dht_push.py`` (PULSELoCo
payloads between trainers): push(peer, maddrs, kind, data, timeout), push_file(peer, maddrs, kind,
path, size, timeout) (with ``--spool``: a body the node wrote to a spool file), events(max)
(a large received body as a spool ``path`` + ``size`` instead of ``data``), push_stats(),
probe(peer, maddrs, raw, timeout); inbound pushes are served only with ``--accept-pushes``.
The spool directory (``net/spool.py``) is created mode 0700 and emptied at start and at stop.
Published records are re-signed and refreshed every ttl/3 until replaced or shutdown, so dead
peers disappear within one TTL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from pulse_node.errors import PulseError, WireError
from pulse_node.net import ipc
from pulse_node.net.dht_push import PushPlane
from pulse_node.net.dht_records import (
    KEY_KINDS, MAX_TTL_S, MIN_TTL_S, DhtInfo, PeerRecord, PeerStatus, StartFailure, dht_key,
    select_peer_records, validate_tree,
)
from pulse_node.net.spool import DEFAULT_DISK_BYTES, DEFAULT_MAX_PUSH, Spool

log = logging.getLogger("pulse_node.dht")

#: how long a start may wait to tell a live duplicate from a dead previous session
MAX_DUPLICATE_WAIT_S = 30.0
LEAVE_TIMEOUT_S = 2.0
PARENT_POLL_S = 1.0
EXIT_START_FAILED = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pulse_node.net.dht_worker", description=__doc__.split("\n")[0])
    p.add_argument("--ipc", required=True, help="Unix socket path to serve the RPC on")
    p.add_argument("--run-id", required=True)
    p.add_argument("--initial-peers", nargs="*", default=[], metavar="MADDR")
    p.add_argument("--host-maddrs", nargs="*", default=["/ip4/0.0.0.0/tcp/0"], metavar="MADDR")
    p.add_argument("--announce-maddrs", nargs="*", default=[], metavar="MADDR")
    p.add_argument("--identity", type=Path, help="Ed25519 key file (PEM); created if missing")
    p.add_argument("--use-relay", action="store_true")
    p.add_argument("--use-auto-relay", action="store_true")
    p.add_argument("--client-mode", action="store_true")
    p.add_argument("--accept-pushes", action="store_true", help="serve the p2pd push plane (dht_push.py)")
    p.add_argument("--spool", type=Path, help="directory for push bodies passed as files (net/spool.py)")
    p.add_argument("--spool-max-push", type=int, default=DEFAULT_MAX_PUSH, metavar="BYTES",
                   help="largest push carried through the spool")
    p.add_argument("--spool-disk-bytes", type=int, default=DEFAULT_DISK_BYTES, metavar="BYTES",
                   help="received spool files waiting for the node, at most")
    p.add_argument("--bootstrap-timeout", type=float, default=15.0)
    p.add_argument("--error-file", type=Path)
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def check_ttl(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not MIN_TTL_S <= value <= MAX_TTL_S:
        raise WireError(f"ttl_s must be a number in [{MIN_TTL_S:g}, {MAX_TTL_S:g}], got {value!r}")
    return float(value)


class Published:
    """One record this node keeps alive: a factory for fresh copies, a TTL and the next refresh."""

    def __init__(self, kind: str, build: Callable[[float], Any], ttl_s: float) -> None:
        self.kind, self.build, self.ttl_s = kind, build, ttl_s
        self.due = 0.0


class DhtWorker:
    """A joined DHT node plus the records it publishes; RPC handlers are the ``rpc_*`` methods."""

    def __init__(self, args: argparse.Namespace, node: Any, p2p: Any, peer_id: str, *,
                 spool: Spool | None = None) -> None:
        self.args, self.node, self.p2p, self.peer_id = args, node, p2p, peer_id
        self.pushes = PushPlane(p2p, spool=spool)
        self.session = secrets.token_hex(16)
        self.stop_event = asyncio.Event()
        self.duplicate: str | None = None
        self._published: dict[str, Published] = {}
        self._last_peer_publish = 0.0
        self._visible: list[str] = []

    # ---- publishing -------------------------------------------------------------------------
    async def _store(self, kind: str, record: Any, ttl_s: float, *, expiration: float | None = None) -> bool:
        exp = expiration if expiration is not None else record.updated_at + ttl_s
        return bool(await self.node.store(dht_key(self.args.run_id, kind), record.model_dump(),
                                          exp, subkey=self.peer_id))

    async def _refresh(self, item: Published) -> bool:
        now = time.time()
        ok = await self._store(item.kind, item.build(now), item.ttl_s)
        item.due = time.monotonic() + item.ttl_s / 3
        if item.kind == "peers":
            self._last_peer_publish = now
        if not ok:  # hivemind reports the last replica's answer; "already had it" also reads False
            log.debug("dht[%s]: a replica did not accept our %s record", self.peer_id[-8:], item.kind)
        return ok

    async def _refresh_guarded(self, item: Published) -> None:
        """A failed refresh is logged and retried soon; it never ends the keep-alive loop."""
        try:
            if item.kind == "peers":
                await self._check_duplicate_running()
            await self._refresh(item)
        except Exception as exc:
            item.due = time.monotonic() + min(1.0, item.ttl_s / 6)
            log.warning("dht[%s]: refreshing our %s record failed (%s); retrying", self.peer_id[-8:], item.kind, exc)

    def _peer_builder(self, status: PeerStatus) -> Callable[[float], PeerRecord]:
        def build(now: float) -> PeerRecord:  # validated: addresses must end in /p2p/<our id>
            return validate_tree(PeerRecord, {**status.model_dump(), "peer_id": self.peer_id,
                                              "dht_maddrs": self._visible[:8], "session": self.session,
                                              "updated_at": now})
        return build

    async def keep_alive(self) -> None:
        """Refresh every published record at ttl/3; check for a duplicate identity each round."""
        while not self.stop_event.is_set():
            now = time.monotonic()
            for item in list(self._published.values()):
                if item.due <= now:
                    await self._refresh_guarded(item)
            wake = min((i.due for i in self._published.values()), default=now + 1.0)
            try:
                await asyncio.wait_for(self.stop_event.wait(), timeout=max(0.05, min(1.0, wake - now)))
            except asyncio.TimeoutError:
                pass

    # ---- reading ----------------------------------------------------------------------------
    async def read(self, kind: str) -> list[tuple[str, dict, float]]:
        """Live (subkey, value, expiration) entries of one kind, freshest view of the swarm."""
        found = await self.node.get(dht_key(self.args.run_id, kind), latest=True)
        if found is None or not isinstance(found.value, dict):
            return []
        now = time.time()
        return [(sub, item.value, item.expiration_time) for sub, item in found.value.items()
                if item.expiration_time > now and isinstance(item.value, dict)]

    async def own_foreign_record(self) -> tuple[PeerRecord, float] | None:
        """A live record under our peer id written by another session, if any."""
        for sub, value, exp in await self.read("peers"):
            if sub == self.peer_id:
                rec = validate_tree(PeerRecord, value)
                if rec.session != self.session and not rec.leaving:
                    return rec, exp
        return None

    async def _check_duplicate_running(self) -> None:
        found = await self.own_foreign_record()
        if found and found[0].updated_at > self._last_peer_publish:
            rec = found[0]
            self.duplicate = duplicate_message(self.args.identity, self.peer_id, rec)
            log.error("dht[%s]: %s", self.peer_id[-8:], self.duplicate)

    async def check_identity_free(self) -> None:
        """Refuse to start if another live process publishes under our peer id."""
        found = await self.own_foreign_record()
        if found is None:
            return
        rec, exp = found
        refresh = max(0.1, (exp - rec.updated_at) / 3)
        deadline = rec.updated_at + 1.5 * refresh + 1.0
        wait_until = time.monotonic() + min(MAX_DUPLICATE_WAIT_S, deadline - time.time())
        while time.monotonic() < wait_until:
            await asyncio.sleep(min(0.25, refresh / 4))
            again = await self.own_foreign_record()
            if again and again[0].session == rec.session and again[0].updated_at > rec.updated_at:
                raise StartError("duplicate", duplicate_message(self.args.identity, self.peer_id, again[0]))
            if again is None or again[0].session != rec.session:
                break
        log.info("dht[%s]: found a stale record of a previous session; taking over", self.peer_id[-8:])

    # ---- RPC handlers -----------------------------------------------------------------------
    async def rpc_ping(self, params: dict) -> str:
        return "pong"

    async def rpc_shutdown(self, params: dict) -> bool:
        self.stop_event.set()
        return True

    async def rpc_info(self, params: dict) -> dict:
        self._visible = [str(m) for m in await self.node.get_visible_maddrs(latest=True)]
        return DhtInfo(peer_id=self.peer_id, visible_maddrs=self._visible, session=self.session,
                       run_id=self.args.run_id, client_mode=self.args.client_mode,
                       routing_table_size=len(self.node.protocol.routing_table.uid_to_peer_id),
                       duplicate=self.duplicate).model_dump()

    async def rpc_publish_peer(self, params: dict) -> bool:
        status = validate_tree(PeerStatus, params.get("record"))
        item = Published("peers", self._peer_builder(status), check_ttl(params.get("ttl_s")))
        item.build(time.time())  # a record every peer would refuse fails here, with the reason
        self._published["peers"] = item
        return await self._refresh(item)

    async def rpc_peers(self, params: dict) -> list[dict]:
        prefer = params.get("prefer") or []
        if not isinstance(prefer, list) or not all(isinstance(p, str) for p in prefer):
            raise WireError("peers: prefer must be a list of peer ids")
        found = []
        for sub, value, _exp in await self.read("peers"):
            try:
                rec = validate_tree(PeerRecord, value)
            except WireError:  # the validator admitted it; a schema change since: skip, never fail the read
                continue
            if rec.peer_id == sub and not rec.leaving:
                found.append(rec)
        return [rec.model_dump() for rec in select_peer_records(found, prefer=prefer)]

    async def rpc_get(self, params: dict) -> list[dict]:
        kind = params.get("kind")
        if kind not in KEY_KINDS:
            raise WireError(f"get: unknown record kind {kind!r} ({', '.join(KEY_KINDS)})")
        return [{"subkey": sub, "value": value, "expires_at": exp} for sub, value, exp in await self.read(kind)]

    async def rpc_push(self, params: dict) -> dict:
        maddrs, data = params.get("maddrs") or [], params.get("data")
        if not isinstance(data, bytes) or not isinstance(maddrs, list):
            raise WireError("push: data must be bytes and maddrs a list")
        return await self.pushes.push(str(params.get("peer")), [str(m) for m in maddrs], str(params.get("kind")),
                                      data, timeout=float(params.get("timeout", 30.0)))

    async def rpc_push_file(self, params: dict) -> dict:
        maddrs = params.get("maddrs") or []
        if not isinstance(maddrs, list):
            raise WireError("push_file: maddrs must be a list")
        return await self.pushes.push_file(str(params.get("peer")), [str(m) for m in maddrs],
                                           str(params.get("kind")), params.get("path"), params.get("size"),
                                           timeout=float(params.get("timeout", 30.0)))

    async def rpc_events(self, params: dict) -> list[dict]:
        """Received pushes; a spooled one carries ``path`` and ``size`` (the node reads and deletes it)."""
        out = []
        for e in self.pushes.inbox.take(int(params.get("max", 64))):
            item = {"kind": e.kind, "from_peer": e.from_peer, "data": e.data, "received_at": e.received_at}
            if e.spooled:
                item.update(path=e.path, size=e.size)
            out.append(item)
        return out

    async def rpc_push_stats(self, params: dict) -> dict:
        return self.pushes.stats()

    async def rpc_probe(self, params: dict) -> bytes:
        raw = params.get("raw")
        if not isinstance(raw, bytes):
            raise WireError("probe: raw must be bytes")
        return await self.pushes.probe(str(params.get("peer")), list(params.get("maddrs") or []), raw,
                                       timeout=float(params.get("timeout", 5.0)))

    # ---- stop -------------------------------------------------------------------------------
    async def leave(self) -> None:
        """Mark our peer record as leaving so others drop us now, not one TTL later (bounded)."""
        item = self._published.get("peers")
        if item is None:
            return
        now = time.time()
        rec = item.build(now).model_copy(update={"leaving": True})
        try:
            # a record only replaces ours if it expires later: outlive the live one by a hair
            await asyncio.wait_for(self._store("peers", rec, item.ttl_s, expiration=now + item.ttl_s + 1.0),
                                   LEAVE_TIMEOUT_S)
        except (asyncio.TimeoutError, Exception) as exc:  # best effort: the record expires anyway
            log.info("dht[%s]: could not mark record as leaving (%s)", self.peer_id[-8:], exc)

    async def close(self) -> None:
        await self.leave()
        try:
            await asyncio.wait_for(self.node.shutdown(), 5.0)
        except (asyncio.TimeoutError, Exception) as exc:
            log.info("dht[%s]: DHT node shutdown: %s", self.peer_id[-8:], exc)
        try:
            await asyncio.wait_for(self.p2p.shutdown(), 5.0)
        finally:
            self.pushes.close()


class StartError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def duplicate_message(identity: Path | None, peer_id: str, other: PeerRecord) -> str:
    where = f"identity file {identity}" if identity else "this identity"
    addrs = ", ".join(other.dht_maddrs[:2]) or "unknown address"
    return (f"{where} (peer id {peer_id}) is already used by another running node ({other.role}, at {addrs}): "
            "every node needs its own identity; if you copied this directory or config from another "
            "node, delete the copied identity file (a new one is created) or pass a different --identity")


# ---- RPC server -----------------------------------------------------------------------------
Handler = Callable[[dict], Awaitable[Any]]


async def dispatch(handlers: dict[str, Handler], msg: dict) -> dict:
    """One request map -> one response map (errors are answers, never a dropped connection)."""
    call_id, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
    handler = handlers.get(method) if isinstance(method, str) else None
    if handler is None:
        return {"id": call_id, "ok": False, "error": f"unknown method {method!r}"}
    if not isinstance(params, dict):
        return {"id": call_id, "ok": False, "error": "params must be a map"}
    try:
        return {"id": call_id, "ok": True, "result": await handler(params)}
    except PulseError as exc:
        return {"id": call_id, "ok": False, "error": str(exc)}
    except Exception as exc:  # a bug here must not take the worker down: report it to the caller
        log.exception("rpc %s failed", method)
        return {"id": call_id, "ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}


async def serve_rpc(worker: DhtWorker, path: str) -> asyncio.AbstractServer:
    handlers = {name[len("rpc_"):]: getattr(worker, name) for name in dir(worker) if name.startswith("rpc_")}

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readexactly(4)
                msg = ipc.decode_body(await reader.readexactly(ipc.frame_length(header)))
                writer.write(ipc.encode_frame(await dispatch(handlers, msg)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # client went away, or the worker is stopping
        except WireError as exc:
            log.warning("rpc client sent a bad frame (%s); closing it", exc)
        finally:
            writer.close()

    return await asyncio.start_unix_server(on_client, path=path)


# ---- start and run --------------------------------------------------------------------------
def load_identity(path: Path | None) -> Any:
    from pulse_node.chain.identity import Identity

    return Identity.load_or_create(path) if path else Identity.generate()


async def start_worker(args: argparse.Namespace) -> DhtWorker:
    """Identity -> p2pd -> bootstrap dial -> DHT node -> duplicate check; each step bounded."""
    from pulse_node.net.dht_join import NetOptions, connect_bootstrap, create_dht_node, start_daemon
    from pulse_node.net.dht_records import check_run_id
    from pulse_node.net.dht_validator import PulseRecordValidator, libp2p_private_key, peer_id_of

    check_run_id(args.run_id)
    spool = open_spool(args)
    identity = load_identity(args.identity)
    opts = NetOptions(host_maddrs=args.host_maddrs, announce_maddrs=args.announce_maddrs,
                      use_relay=args.use_relay, use_auto_relay=args.use_auto_relay, client_mode=args.client_mode)
    with tempfile.TemporaryDirectory(prefix="pulse-dht-id-") as tmp:
        key_file = os.path.join(tmp, "p2pd.key")  # p2pd reads it at start; removed right after
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(libp2p_private_key(identity))
        p2p = await start_daemon(opts, key_file)
    peer_id = peer_id_of(identity)
    try:
        if p2p.peer_id.to_base58() != peer_id:
            raise StartError("internal", f"p2pd runs as {p2p.peer_id} but the identity is {peer_id}")
        if args.initial_peers:
            await connect_bootstrap(p2p, args.initial_peers, timeout=args.bootstrap_timeout)
        node = await create_dht_node(p2p, PulseRecordValidator(args.run_id, identity),
                                     initial_peers=args.initial_peers, client_mode=args.client_mode,
                                     timeout=args.bootstrap_timeout)
    except BaseException:
        await p2p.shutdown()
        raise
    worker = DhtWorker(args, node, p2p, peer_id, spool=spool)
    try:
        if args.accept_pushes:
            await worker.pushes.start()
        worker._visible = [str(m) for m in await node.get_visible_maddrs()]
        await worker.check_identity_free()
    except BaseException:
        await worker.close()
        raise
    return worker


def open_spool(args: argparse.Namespace) -> Spool | None:
    """The ``--spool`` directory, created (0700) and emptied of an earlier run's files; None without it."""
    if args.spool is None:
        return None
    if not 0 < args.spool_max_push <= args.spool_disk_bytes:
        raise StartError("config", f"--spool-max-push ({args.spool_max_push}) must be positive and at most "
                                   f"--spool-disk-bytes ({args.spool_disk_bytes})")
    try:
        return Spool(args.spool, max_push=args.spool_max_push, disk_bytes=args.spool_disk_bytes).prepare()
    except OSError as exc:
        raise StartError("config", f"cannot use spool directory {args.spool}: {exc.strerror}") from None


def report_start_failure(args: argparse.Namespace, kind: str, message: str) -> None:
    print(f"pulse-node dht: error: {message}", file=sys.stderr, flush=True)
    if args.error_file:
        args.error_file.write_text(StartFailure(kind=kind, message=message).model_dump_json())


async def watch_parent(worker: DhtWorker, parent: int) -> None:
    """An orphaned worker would keep a dead node's record alive: stop when the parent is gone."""
    while not worker.stop_event.is_set():
        if os.getppid() != parent:
            log.warning("dht[%s]: parent process %d is gone; stopping", worker.peer_id[-8:], parent)
            worker.stop_event.set()
        await asyncio.sleep(PARENT_POLL_S)


async def amain(args: argparse.Namespace) -> int:
    parent = os.getppid()
    began = time.monotonic()
    from pulse_node.net.dht_join import JoinError  # imports hivemind (and torch): most of a start

    imported = time.monotonic()
    try:
        worker = await start_worker(args)
    except (StartError, JoinError) as exc:
        report_start_failure(args, exc.kind, str(exc))
        return EXIT_START_FAILED
    except PulseError as exc:
        report_start_failure(args, "config", str(exc))
        return EXIT_START_FAILED
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop_event.set)
    server = await serve_rpc(worker, args.ipc)
    tasks = [asyncio.create_task(worker.keep_alive()), asyncio.create_task(watch_parent(worker, parent))]
    log.info("dht[%s]: ready run=%s (hivemind import %.1fs, p2pd+join %.1fs) maddrs=%s", worker.peer_id[-8:],
             args.run_id, imported - began, time.monotonic() - imported, " ".join(worker._visible))
    await worker.stop_event.wait()
    server.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await worker.close()
    Path(args.ipc).unlink(missing_ok=True)
    log.info("dht[%s]: stopped", worker.peer_id[-8:])
    return 0


def setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(logging.WARNING if level.upper() != "DEBUG" else logging.DEBUG)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
