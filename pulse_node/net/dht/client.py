"""The node's typed, blocking view of the swarm DHT (a ``net/dht/worker.py`` process behind it).

    client = DhtClient.start(DhtConfig(run_id="run1", initial_peers=[...]))
    client.publish_peer(PeerStatus(role="trainer", version=12, ...), ttl_s=30)
    for rec in client.peers(): ...             # validated PeerRecords, expired/leaving ones gone
    client.push(peer_id, dht_maddrs, "loco", payload, timeout=30)   # p2pd push plane (dht_push.py)
    for ev in client.events(): ...             # pushes received (with accept_pushes=True)
    client.stop()

With ``DhtConfig.spool_dir`` set (trainers: ``<data_dir>/spool``), bodies above
``spool.THRESHOLD`` pass between node and worker as spool files (``net/local/spool.py``), not bytes,
so a push may reach ``spool_max_push_bytes`` (1 GiB) instead of the RPC-bound 48 MiB.

Start failures raise ``DhtStartError`` (``DuplicateIdentityError`` for a copied identity) with
the worker's one-line explanation; calls raise the worker's typed errors (``WireError``,
``PeerUnavailable``) and ``RpcError`` when the worker does not answer within the call's timeout.
Importing this module does not import hivemind.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.errors import WireError
from pulse_node.net.dht import rpc as dht_rpc
from pulse_node.net.dht.config import DhtConfig
from pulse_node.net.dht.records import DhtInfo
from pulse_node.net.local.ipc import StartFailure
from pulse_node.net.local.process import WorkerClient, WorkerProcess, WorkerStartError
from pulse_node.net.local.spool import THRESHOLD, Spool
from pulse_node.vocab import Event, PushKind

__all__ = ["DhtClient", "DhtConfig", "DhtStartError", "DuplicateIdentityError"]

log = logging.getLogger("pulse_node.dht.client")

#: a DHT read walks the swarm and may wait out dead peers (hivemind's 3 s RPC timeout)
READ_TIMEOUT_S = 30.0
#: p2pd start + the longest wait to tell a live duplicate identity from a stale record
START_SLACK_S = 60.0
#: the worker bounds each push by its own timeout; the socket waits a little longer
PUSH_SLACK_S = 10.0


class DhtStartError(WorkerStartError):
    """The DHT worker could not start; the message says what to check next."""


class DuplicateIdentityError(DhtStartError):
    """Another live node publishes under this node's peer id (a copied identity file)."""


class DhtClient(WorkerClient[DhtConfig]):
    """Typed methods over the DHT worker's RPC; one instance per node, safe to share between threads."""

    module = "pulse_node.net.dht.worker"
    name = "dht"
    api = dht_rpc.DhtRequest  # dht_rpc.py: one typed request per worker handler

    def __init__(self, process: WorkerProcess, config: DhtConfig) -> None:
        super().__init__(process, config)
        self.spool = (Spool(config.spool_dir, max_push=config.spool_max_push_bytes,
                            disk_bytes=config.spool_disk_bytes) if config.spool_dir is not None else None)

    @classmethod
    def start(cls, config: DhtConfig, *, log_path: Path | None = None,
              start_timeout: float | None = None) -> DhtClient:
        """Start the worker and wait until it has joined; ``DhtStartError`` explains a failure."""
        return super().start(config, log_path=log_path, start_timeout=cls.start_timeout(config) if start_timeout is None else start_timeout)

    @staticmethod
    def start_timeout(config: DhtConfig) -> float:
        """How long a start may take: joining through the bootstrap peers, and slack."""
        return config.bootstrap_timeout_s + START_SLACK_S

    @classmethod
    def start_error(cls, failure: StartFailure) -> DhtStartError:
        return (DuplicateIdentityError if failure.kind == "duplicate" else DhtStartError)(failure.message, failure.kind)

    def info(self) -> DhtInfo:
        return self.request(dht_rpc.Info(), timeout=10.0)

    def publish_peer(self, status: PeerStatus, *, ttl_s: float | None = None) -> bool:
        """Publish (and keep refreshing every ttl/3) this node's peer record; True if stored."""
        req = dht_rpc.PublishPeer(status=status, ttl_s=ttl_s or self.config.ttl_s)
        return self.request(req, timeout=READ_TIMEOUT_S)

    def peers(self, *, prefer: list[str] | tuple[str, ...] = (), limit: int | None = None) -> list[PeerRecord]:
        """Live peer records (at most ``limit``, by default ``dht.records.MAX_PEERS_READ``: those of
        ``prefer``, peer ids, first, then others in the worker's draw), each checked again here."""
        return self.request(dht_rpc.Peers(prefer=list(prefer), limit=limit), timeout=READ_TIMEOUT_S)

    # ---- p2pd push plane (dht_push.py) -------------------------------------------------------
    def push(self, peer_id: str, maddrs: list[str], kind: PushKind, data: bytes, *, timeout: float = 30.0) -> None:
        """Deliver ``data`` into ``peer_id``'s push queue over p2pd (dialing ``maddrs``, its DHT addresses).

        With a spool, a body above ``spool.THRESHOLD`` goes to the worker as a file (removed when
        the call returns, whatever happened); otherwise as bytes in the RPC frame."""
        if self.spool is None or len(data) <= THRESHOLD:
            self.request(dht_rpc.Push(peer_id=peer_id, maddrs=list(maddrs), kind=kind, data=data, timeout=timeout),
                         timeout=timeout + PUSH_SLACK_S)
            return
        if len(data) > self.spool.max_push:  # refuse before writing a file the worker would refuse
            raise WireError(f"{kind} push of {len(data)} bytes exceeds cap {self.spool.max_push}")
        try:
            path = self.spool.write_file(data)
        except OSError as exc:
            raise WireError(f"{kind} push: cannot write spool file in {self.spool.directory}: {exc}") from None
        try:
            self.push_file(peer_id, maddrs, kind, path, len(data), timeout=timeout)
        finally:
            path.unlink(missing_ok=True)

    def push_file(self, peer_id: str, maddrs: list[str], kind: PushKind, path: Path, size: int, *,
                  timeout: float = 30.0) -> None:
        """Push the ``size`` bytes of ``path``, a file in this node's spool (the worker checks both)."""
        self.request(dht_rpc.PushFile(peer_id=peer_id, maddrs=list(maddrs), kind=kind, path=str(path), size=size,
                                  timeout=timeout), timeout=timeout + PUSH_SLACK_S)

    def events(self, *, max_events: int = 64, wait_s: float = 0.0) -> list[Event]:
        """Pushes received over p2pd, waiting up to ``wait_s`` for the first; ``sender`` is the
        p2p-authenticated peer id.

        A body the worker spooled is read here (its path checked: in our spool, of the announced
        size, at most our cap) and its file deleted; an event that fails the checks is dropped."""
        out = []
        for e in self.request(dht_rpc.Events(max_events=max_events, wait_s=wait_s), timeout=wait_s + 10.0):
            if e.path is None:
                out.append(e.event)
                continue
            spooled = self._take_spooled(e.path, e.size)
            if spooled is not None:
                out.append(dataclasses.replace(e.event, data=spooled))
        return out

    def _take_spooled(self, path: str, size: int) -> bytes | None:
        try:
            if self.spool is None:
                raise WireError("the worker sent a spool path but this client has no spool")
            if size > self.spool.max_push:
                self.spool.check(path).unlink(missing_ok=True)  # never read into memory
                raise WireError(f"spooled push of {size!r} bytes exceeds cap {self.spool.max_push}")
            return self.spool.take(path, size)
        except (WireError, OSError) as exc:
            log.warning("dropped a spooled push event: %s", exc)
            return None

    def set_members(self, peer_ids: list[str]) -> None:
        """Tell the push plane which peers are trainer-set members (served first)."""
        self.request(dht_rpc.SetMembers(peer_ids=sorted(peer_ids)), timeout=10.0)

    def set_push_cap(self, kind: str, cap: int) -> int:
        """Lower the cap of ``kind`` pushes on this plane, in the worker (refused before the body is
        read) and here (a spooled body above it is deleted unread); returns the cap now in force."""
        now = int(self.request(dht_rpc.SetPushCap(kind=kind, cap=int(cap)), timeout=10.0))
        if self.spool is not None and now < self.spool.max_push:
            self.spool = dataclasses.replace(self.spool, max_push=now)
        return now

    def push_stats(self) -> dht_rpc.PushPlaneStats:
        """Push-plane counters: bytes in/out per kind, errors, queued and rejected events."""
        return self.request(dht_rpc.PushStats(), timeout=10.0)

    def probe(self, peer_id: str, raw: bytes, *, maddrs: tuple[str, ...] = (), timeout: float = 5.0) -> bytes:
        """Diagnostics: raw bytes on a push stream to ``peer_id``; returns the raw answer."""
        return self.request(dht_rpc.Probe(peer_id=peer_id, raw=raw, maddrs=list(maddrs), timeout=timeout),
                            timeout=timeout + PUSH_SLACK_S)

    def stop(self, timeout: float = 8.0) -> None:
        """Mark this peer as leaving, stop the DHT; bounded by ~``timeout`` seconds."""
        super().stop(timeout)
