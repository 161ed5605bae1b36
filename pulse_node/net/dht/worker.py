"""The DHT worker: one hivemind DHT node in its own process, served over the local RPC.

Run by ``DhtClient.start`` as ``python -m pulse_node.net.dht.worker --ipc SOCK --config FILE
[--error-file FILE]``, FILE being a ``DhtConfig`` as JSON (``rpc_server.run_worker``).

Design: one asyncio loop in this process runs hivemind's ``DHTNode`` directly (not
``hivemind.DHT``, which forks a second process and talks to it over a pipe) next to the RPC
server of ``rpc_server.py``. Stopping is one path: the ``stop`` RPC, SIGTERM, SIGINT or the parent
process going away; the worker then marks its record as leaving (bounded), stops the DHT node and
p2pd, and exits 0. A start failure (``dht.join.JoinError``, a live duplicate of our identity, a
bad spool) is reported as a ``StartFailure`` and the process exits 2.

RPC methods (the ``@rpc`` methods of ``DhtWorker``, named like ``DhtClient``'s): ``info``,
``publish_peer``, ``peers`` (at most ``MAX_PEERS_READ`` valid records, those of the ``prefer`` peer
ids first, then the newest), and the p2pd push plane of ``net/dht/push.py`` (PULSELoCo
payloads between trainers): ``push``, ``push_file`` (a body the node wrote to a spool file),
``events`` (a large received body as a spool ``path`` + ``size`` instead of ``data``),
``push_stats``, ``probe``; inbound pushes are served only with ``accept_pushes``.
The spool directory (``net/local/spool.py``) is created mode 0700 and emptied at start and at stop.
Published records are re-signed and refreshed every ttl/3 until replaced or stopped, so dead
peers disappear within one TTL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.errors import WireError
from pulse_node.net.dht.capped_storage import NewcomerGate, cap_node_storage, refuse_before_signature
from pulse_node.net.dht.config import DhtConfig
from pulse_node.net.dht.push import PushPlane
from pulse_node.net.dht.records import (
    MAX_PEERS_READ,
    MAX_TTL_S,
    MIN_TTL_S,
    DhtInfo,
    address_range,
    dht_key,
    select_entries,
    validate_tree,
)
from pulse_node.net.dht.rpc import PushPlaneStats
from pulse_node.net.local.inbox import Queued
from pulse_node.net.local.rpc_api import Pushed
from pulse_node.net.local.rpc_server import Service, StartFailed, rpc, run_worker
from pulse_node.net.local.spool import Spool
from pulse_node.vocab import BudgetRefusal, PushKind

if TYPE_CHECKING:  # hivemind ships no types: these read as unchecked
    from hivemind.dht.node import DHTNode
    from hivemind.dht.validation import RecordValidatorBase
    from hivemind.p2p import P2P

#: one live DHT entry as read: (subkey, the value a peer stored, its expiration)
Entry = tuple[str, dict[str, object], float]

log = logging.getLogger("pulse_node.dht")

#: how long a start may wait to tell a live duplicate from a dead previous session
MAX_DUPLICATE_WAIT_S = 30.0
LEAVE_TIMEOUT_S = 2.0


def check_ttl(value: float) -> float:
    if not MIN_TTL_S <= value <= MAX_TTL_S:
        raise WireError(f"ttl_s must be a number in [{MIN_TTL_S:g}, {MAX_TTL_S:g}], got {value!r}")
    return float(value)


class RefreshedRecord:
    """One record this node keeps alive: a factory for fresh copies, a TTL and the next refresh."""

    def __init__(self, kind: str, build: Callable[[float], PeerRecord], ttl_s: float) -> None:
        self.kind, self.build, self.ttl_s = kind, build, ttl_s
        self.due = 0.0


class DhtWorker(Service):
    """A joined DHT node plus the records it publishes; its ``@rpc`` methods are the worker's RPC."""

    def __init__(self, config: DhtConfig, node: DHTNode, p2p: P2P, peer_id: str, *,
                 spool: Spool | None = None) -> None:
        self.config, self.node, self.p2p, self.peer_id = config, node, p2p, peer_id
        self.gate = NewcomerGate()  # what this node stores of the peers dictionary (capped_storage.py)
        self.gate.own = frozenset({peer_id})
        self.pushes = PushPlane(p2p, spool=spool, budget=config.budget)
        self.session = secrets.token_hex(16)
        self.salt = secrets.token_bytes(16)  # this worker's draw of which newcomers' records it reads
        self.duplicate: str | None = None
        self._published: dict[str, RefreshedRecord] = {}
        self._last_peer_publish = 0.0
        self._visible: list[str] = []

    # ---- publishing -------------------------------------------------------------------------
    async def _store(self, kind: str, record: PeerRecord, ttl_s: float, *, expiration: float | None = None) -> bool:
        exp = expiration if expiration is not None else record.updated_at + ttl_s
        return bool(await self.node.store(dht_key(self.config.run_id, kind), record.model_dump(),
                                          exp, subkey=self.peer_id))

    async def _refresh(self, item: RefreshedRecord) -> bool:
        now = time.time()
        ok = await self._store(item.kind, item.build(now), item.ttl_s)
        item.due = time.monotonic() + item.ttl_s / 3
        if item.kind == "peers":
            self._last_peer_publish = now
        if not ok:  # hivemind reports the last replica's answer; "already had it" also reads False
            log.debug("dht[%s]: a replica did not accept our %s record", self.peer_id[-8:], item.kind)
        return ok

    async def _refresh_guarded(self, item: RefreshedRecord) -> None:
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

    async def run(self) -> None:
        """Keep alive: refresh every published record at ttl/3; check for a duplicate identity each round."""
        while True:
            now = time.monotonic()
            for item in list(self._published.values()):
                if item.due <= now:
                    await self._refresh_guarded(item)
            wake = min((i.due for i in self._published.values()), default=now + 1.0)
            await asyncio.sleep(max(0.05, min(1.0, wake - now)))

    # ---- reading ----------------------------------------------------------------------------
    async def read(self, kind: str) -> list[Entry]:
        """Live (subkey, value, expiration) entries of one kind, freshest view of the swarm."""
        found = await self.node.get(dht_key(self.config.run_id, kind), latest=True)
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
            self.duplicate = duplicate_message(self.config.identity, self.peer_id, rec)
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
                raise StartFailed("duplicate", duplicate_message(self.config.identity, self.peer_id, again[0]))
            if again is None or again[0].session != rec.session:
                break
        log.info("dht[%s]: found a stale record of a previous session; taking over", self.peer_id[-8:])

    # ---- RPC methods ------------------------------------------------------------------------
    @rpc
    async def info(self) -> DhtInfo:
        self._visible = [str(m) for m in await self.node.get_visible_maddrs(latest=True)]
        return DhtInfo(peer_id=self.peer_id, visible_maddrs=self._visible, session=self.session,
                       run_id=self.config.run_id, client_mode=self.config.client_mode,
                       routing_table_size=len(self.node.protocol.routing_table.uid_to_peer_id),
                       duplicate=self.duplicate)

    @rpc
    async def publish_peer(self, *, status: PeerStatus, ttl_s: float) -> bool:
        item = RefreshedRecord("peers", self._peer_builder(status), check_ttl(ttl_s))
        item.build(time.time())  # a record every peer would refuse fails here, with the reason
        self._published["peers"] = item
        return await self._refresh(item)

    @rpc
    async def peers(self, *, prefer: list[str] | None = None, limit: int | None = None) -> list[PeerRecord]:
        """At most ``limit`` (default ``MAX_PEERS_READ``) live records, ``prefer`` first
        (``records.select_entries``), chosen from the raw entries before any is validated: a flood
        costs a validation per record returned, not per record stored."""
        epoch = int(time.time() // 30).to_bytes(8, "big")  # the draw changes every 30 s: newcomers take turns
        if prefer:
            self.gate.prefer(prefer)  # configured, members, standing: always stored here
        entries = await self.read("peers")
        chosen = select_entries(entries, prefer=prefer or (), limit=max(1, min(limit or MAX_PEERS_READ, MAX_PEERS_READ)),
                                salt=self.salt + epoch, id_of=lambda e: e[0],
                                range_of=lambda e: address_range(e[1].get("wire_maddrs")))
        found = []
        for sub, value, _exp in chosen:
            try:
                rec = validate_tree(PeerRecord, value)
            except WireError:  # the validator admitted it; a schema change since: skip, never fail the read
                continue
            if rec.peer_id == sub and not rec.leaving:
                found.append(rec)
        return found

    @rpc
    async def push(self, *, peer_id: str, maddrs: list[str], kind: PushKind, data: bytes, timeout: float) -> Pushed:
        return await self.pushes.push(peer_id, maddrs, kind, data, timeout=timeout)

    @rpc
    async def push_file(self, *, peer_id: str, maddrs: list[str], kind: PushKind, path: str, size: int,
                        timeout: float) -> Pushed:
        return await self.pushes.push_file(peer_id, maddrs, kind, path, size, timeout=timeout)

    @rpc
    async def events(self, *, max_events: int = 64, wait_s: float = 0.0) -> list[Queued]:
        """Received pushes; a spooled one carries ``path`` and ``size`` (the node reads and deletes it)."""
        return await self.pushes.inbox.take(max_events, wait_s)

    @rpc
    async def set_members(self, *, peer_ids: list[str]) -> int:
        """The trainer-set members' peer ids: the push plane serves them first."""
        if len(peer_ids) > 4096 or not all(isinstance(p, str) and len(p) <= 128 for p in peer_ids):
            raise WireError("set_members takes at most 4096 peer ids")
        self.pushes.members.set(peer_ids)
        self.gate.members = frozenset(peer_ids)
        return len(self.pushes.members.ids)

    @rpc
    async def set_push_cap(self, *, kind: str, cap: int) -> int:
        """Lower the push plane's cap for ``kind`` (a trainer: the largest payload its model's shapes
        allow, ``loco/bound.max_payload_bytes``); a larger push is refused before its body is read."""
        known = next((k for k in self.pushes.caps if k == kind), None)
        if known is None or type(cap) is not int or cap < 1:
            raise WireError(f"set_push_cap: no cap {kind!r} to set to {cap!r}")
        self.pushes.caps[known] = min(self.pushes.caps[known], cap)
        return self.pushes.caps[known]

    @rpc
    async def push_stats(self) -> PushPlaneStats:
        stats = self.pushes.stats()  # + newcomers' records this node declined to store (capped_storage.py)
        return stats.model_copy(update={"refused": {**stats.refused, BudgetRefusal.DHT_NEWCOMERS: self.gate.refused}})

    @rpc
    async def probe(self, *, peer_id: str, raw: bytes, maddrs: list[str], timeout: float) -> bytes:
        return await self.pushes.probe(peer_id, maddrs, raw, timeout=timeout)

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


def duplicate_message(identity: Path | None, peer_id: str, other: PeerRecord) -> str:
    where = f"identity file {identity}" if identity else "this identity"
    addrs = ", ".join(other.dht_maddrs[:2]) or "unknown address"
    return (f"{where} (peer id {peer_id}) is already used by another running node ({other.role}, at {addrs}): "
            "every node needs its own identity; if you copied this directory or config from another "
            "node, delete the copied identity file (a new one is created) or pass a different --identity")


# ---- start ------------------------------------------------------------------------------------
def load_identity(path: Path | None) -> Identity:
    return Identity.load_or_create(path) if path else Identity.generate()


async def start_worker(config: DhtConfig) -> DhtWorker:
    """Identity -> p2pd -> bootstrap dial -> DHT node -> duplicate check; each step bounded."""
    began = time.monotonic()
    from pulse_node.net.dht.join import (  # hivemind (and torch)
        UnreachableError,
        connect_bootstrap,
        create_dht_node,
        start_daemon,
    )
    from pulse_node.net.dht.validator import PulseRecordValidator, libp2p_private_key, peer_id_of

    imported = time.monotonic()
    spool = open_spool(config)
    identity = load_identity(config.identity)
    with tempfile.TemporaryDirectory(prefix="pulse-dht-id-") as tmp:
        key_file = os.path.join(tmp, "p2pd.key")  # p2pd reads it at start; removed right after
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(libp2p_private_key(identity))
        p2p = await start_daemon(config, key_file)
    peer_id = peer_id_of(identity)
    try:
        if p2p.peer_id.to_base58() != peer_id:
            raise StartFailed("internal", f"p2pd runs as {p2p.peer_id} but the identity is {peer_id}")
        if config.initial_peers:
            await connect_bootstrap(p2p, config.initial_peers, timeout=config.bootstrap_timeout_s)
        validator = PulseRecordValidator(config.run_id, identity)
        try:
            node = await create_dht_node(p2p, validator, initial_peers=config.initial_peers,
                                         client_mode=config.client_mode, timeout=config.bootstrap_timeout_s)
        except UnreachableError:
            await refuse_if_identity_taken(config, p2p, validator, peer_id)
            raise
    except BaseException:
        await p2p.shutdown()
        raise
    worker = DhtWorker(config, node, p2p, peer_id, spool=spool)
    cap_node_storage(node, worker.gate)
    validator.precheck = refuse_before_signature(node, worker.gate)
    try:
        if config.accept_pushes:
            await worker.pushes.start()
        worker._visible = [str(m) for m in await node.get_visible_maddrs()]
        await worker.check_identity_free()
    except BaseException:
        await worker.close()
        raise
    log.info("dht[%s]: ready run=%s (hivemind import %.1fs, p2pd+join %.1fs) maddrs=%s", peer_id[-8:],
             config.run_id, imported - began, time.monotonic() - imported, " ".join(worker._visible))
    return worker


async def refuse_if_identity_taken(config: DhtConfig, p2p: P2P, validator: RecordValidatorBase,
                                   peer_id: str) -> None:
    """After "the bootstrap cannot connect back": ``StartFailed("duplicate")`` if a live node publishes under
    our peer id, since the bootstrap's ping back then reaches that node, not us; else return (the cause is
    the network). Looked up through a client-mode DHT node, which needs no ping back."""
    from pulse_node.net.dht.join import create_dht_node

    node = await create_dht_node(p2p, validator, initial_peers=config.initial_peers, client_mode=True,
                                 timeout=config.bootstrap_timeout_s)
    probe = DhtWorker(config, node, p2p, peer_id)
    try:
        await probe.check_identity_free()
    finally:
        probe.pushes.close()
        try:
            await asyncio.wait_for(node.shutdown(), 5.0)
        except (asyncio.TimeoutError, Exception) as exc:
            log.info("dht[%s]: probe node shutdown: %s", peer_id[-8:], exc)


def open_spool(config: DhtConfig) -> Spool | None:
    """The spool directory, created (0700) and emptied of an earlier run's files; None without one."""
    if config.spool_dir is None:
        return None
    try:
        return Spool(config.spool_dir, max_push=config.spool_max_push_bytes,
                     disk_bytes=config.spool_disk_bytes).prepare()
    except OSError as exc:
        raise StartFailed("config", f"cannot use spool directory {config.spool_dir}: {exc.strerror}") from None


@asynccontextmanager
async def open_worker(config: DhtConfig) -> AsyncIterator[DhtWorker]:
    """The joined worker while the process serves; left and shut down (bounded) afterwards."""
    worker = await start_worker(config)
    try:
        yield worker
    finally:
        await worker.close()


def main(argv: list[str] | None = None) -> int:
    return run_worker("dht", DhtConfig, open_worker, backend="asyncio", argv=argv)


if __name__ == "__main__":
    sys.exit(main())
