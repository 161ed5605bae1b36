"""The node's typed, blocking view of the swarm DHT (a ``dht_worker`` process behind it).

    client = DhtClient.start(DhtConfig(run_id="run1", initial_peers=[...]))
    client.publish_peer(PeerStatus(role="trainer", version=12, ...), ttl_s=30)
    for rec in client.peers(): ...             # validated PeerRecords, expired/leaving ones gone
    client.push(peer_id, dht_maddrs, "loco", payload, timeout=30)   # p2pd push plane (dht_push.py)
    for ev in client.events(): ...             # pushes received (with accept_pushes=True)
    client.stop()

With ``DhtConfig.spool_dir`` set (trainers: ``<data_dir>/spool``), bodies above
``spool.THRESHOLD`` pass between node and worker as spool files (``net/spool.py``), not bytes,
so a push may reach ``spool_max_push_bytes`` (1 GiB) instead of the RPC-bound 48 MiB.

Start failures raise ``DhtStartError`` (``DuplicateIdentityError`` for a copied identity) with
the worker's one-line explanation; every call has a timeout and raises ``RpcError`` on expiry.
Importing this module does not import hivemind.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from pulse_node.configload import StrictModel
from pulse_node.errors import PulseError, WireError
from pulse_node.net.dht_records import (
    MAX_TTL_S, MIN_TTL_S, DhtInfo, PeerRecord, PeerStatus, StartFailure, validate_tree,
)
from pulse_node.net.ipc import RpcClient, RpcError
from pulse_node.net.process import WorkerProcess
from pulse_node.net.spool import DEFAULT_DISK_BYTES, DEFAULT_MAX_PUSH, THRESHOLD, Spool
from pulse_node.net.wire_client import WireEvent

log = logging.getLogger("pulse_node.dht.client")

WORKER_MODULE = "pulse_node.net.dht_worker"
#: a DHT read walks the swarm and may wait out dead peers (hivemind's 3 s RPC timeout)
READ_TIMEOUT_S = 30.0
#: p2pd start + the longest wait to tell a live duplicate identity from a stale record
START_SLACK_S = 60.0
#: the worker bounds each push by its own timeout; the socket waits a little longer
PUSH_SLACK_S = 10.0
_FULL_MADDR = re.compile(r"^/(ip4|ip6|dns|dns4|dns6)/[^/]+/(tcp|udp)/\d{1,5}(/quic-v1|/quic)?(/[^/]+/[^/]+)*"
                         r"/p2p/[1-9A-HJ-NP-Za-km-z]{40,64}$")


class DhtStartError(PulseError):
    """The DHT worker could not start; the message says what to check next."""

    def __init__(self, message: str, kind: str = "internal") -> None:
        super().__init__(message)
        self.kind = kind


class DuplicateIdentityError(DhtStartError):
    """Another live node publishes under this node's peer id (a copied identity file)."""


class DhtConfig(StrictModel):
    """How this node joins the swarm's DHT (one section of a role config)."""

    run_id: str
    initial_peers: list[str] = Field(default_factory=list)
    host_maddrs: list[str] = Field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    announce_maddrs: list[str] = Field(default_factory=list)
    identity: Path | None = None
    use_relay: bool = False
    use_auto_relay: bool = False
    client_mode: bool = False
    accept_pushes: bool = False  # serve the p2pd push plane (trainers receive PULSELoCo payloads on it)
    spool_dir: Path | None = None  # pass large push bodies as files here (net/spool.py); None: bytes only
    spool_max_push_bytes: int = Field(default=DEFAULT_MAX_PUSH, gt=THRESHOLD)
    spool_disk_bytes: int = Field(default=DEFAULT_DISK_BYTES, gt=THRESHOLD)
    bootstrap_timeout_s: float = Field(default=15.0, gt=0, le=300)
    ttl_s: float = Field(default=30.0, ge=MIN_TTL_S, le=MAX_TTL_S)

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, run_id: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", run_id):
            raise ValueError(f"run id {run_id!r} must be 1-64 characters of [A-Za-z0-9._-]")
        return run_id

    @field_validator("initial_peers")
    @classmethod
    def _full_maddrs(cls, peers: list[str]) -> list[str]:
        for text in peers:
            if not _FULL_MADDR.match(text):
                raise ValueError(f"{text!r} is not a full multiaddr like /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...; "
                                 "copy a line that `pulse-node bootstrap` prints")
        return peers

    @model_validator(mode="after")
    def _spool_budget(self) -> "DhtConfig":
        if self.spool_disk_bytes < self.spool_max_push_bytes:
            raise ValueError(f"spool_disk_bytes ({self.spool_disk_bytes}) must hold one push of "
                             f"spool_max_push_bytes ({self.spool_max_push_bytes})")
        return self

    def worker_args(self) -> list[str]:
        args = ["--run-id", self.run_id, "--bootstrap-timeout", str(self.bootstrap_timeout_s)]
        for flag, values in (("--initial-peers", self.initial_peers), ("--host-maddrs", self.host_maddrs),
                             ("--announce-maddrs", self.announce_maddrs)):
            if values:
                args += [flag, *values]
        if self.identity is not None:
            args += ["--identity", str(self.identity)]
        for flag, on in (("--use-relay", self.use_relay), ("--use-auto-relay", self.use_auto_relay),
                         ("--client-mode", self.client_mode), ("--accept-pushes", self.accept_pushes)):
            if on:
                args.append(flag)
        if self.spool_dir is not None:
            args += ["--spool", str(self.spool_dir), "--spool-max-push", str(self.spool_max_push_bytes),
                     "--spool-disk-bytes", str(self.spool_disk_bytes)]
        return args


class DhtClient:
    """Typed methods over the worker's RPC; one instance per node, safe to share between threads."""

    def __init__(self, worker: WorkerProcess, config: DhtConfig) -> None:
        self._worker = worker
        self.config = config
        self._local = threading.local()  # pushes get one socket per thread: a long push blocks no lookup
        self._data_clients: list[RpcClient] = []
        self._lock = threading.Lock()
        self.spool = (Spool(config.spool_dir, max_push=config.spool_max_push_bytes,
                            disk_bytes=config.spool_disk_bytes) if config.spool_dir is not None else None)

    @classmethod
    def start(cls, config: DhtConfig, *, log_path: Path | None = None) -> "DhtClient":
        """Start the worker and wait until it has joined; ``DhtStartError`` explains a failure."""
        err_dir = tempfile.mkdtemp(prefix="pulse-dht-start-")
        err_file = Path(err_dir) / "error.json"
        try:
            worker = WorkerProcess(WORKER_MODULE, [*config.worker_args(), "--error-file", str(err_file)],
                                   name="dht", start_timeout=config.bootstrap_timeout_s + START_SLACK_S,
                                   log_path=log_path)
        except RpcError as exc:
            raise _start_error(err_file, exc) from None
        finally:
            err_file.unlink(missing_ok=True)
            os.rmdir(err_dir)
        return cls(worker, config)

    def info(self) -> DhtInfo:
        return validate_tree(DhtInfo, self._worker.call("info", timeout=10.0))

    def publish_peer(self, status: PeerStatus, *, ttl_s: float | None = None) -> bool:
        """Publish (and keep refreshing every ttl/3) this node's peer record; True if stored."""
        params = {"record": status.model_dump(), "ttl_s": ttl_s or self.config.ttl_s}
        return bool(self._worker.call("publish_peer", params, timeout=READ_TIMEOUT_S))

    def peers(self, *, prefer: list[str] | tuple[str, ...] = ()) -> list[PeerRecord]:
        """Live peer records (at most ``dht_records.MAX_PEERS_READ``: those of ``prefer``, peer
        ids, first, then the newest), each checked again here."""
        out = []
        for r in self._worker.call("peers", {"prefer": list(prefer)}, timeout=READ_TIMEOUT_S):
            try:
                out.append(validate_tree(PeerRecord, r))
            except WireError as exc:
                log.warning("dropped a peer record the DHT worker returned: %s", exc)
        return out

    def get(self, kind: str) -> list[dict]:
        """Raw live entries of ``peers`` (subkey, value, expires_at) for dashboards."""
        return list(self._worker.call("get", {"kind": kind}, timeout=READ_TIMEOUT_S))

    # ---- p2pd push plane (dht_push.py) -------------------------------------------------------
    def push(self, peer_id: str, maddrs: list[str], kind: str, data: bytes, *, timeout: float = 30.0) -> None:
        """Deliver ``data`` into ``peer_id``'s push queue over p2pd (dialing ``maddrs``, its DHT addresses).

        With a spool, a body above ``spool.THRESHOLD`` goes to the worker as a file (removed when
        the call returns, whatever happened); otherwise as bytes in the RPC frame."""
        if self.spool is None or len(data) <= THRESHOLD:
            self._data_call("push", {"peer": peer_id, "maddrs": list(maddrs), "kind": kind, "data": data,
                                     "timeout": timeout}, timeout=timeout + PUSH_SLACK_S)
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

    def push_file(self, peer_id: str, maddrs: list[str], kind: str, path: Path, size: int, *,
                  timeout: float = 30.0) -> None:
        """Push the ``size`` bytes of ``path``, a file in this node's spool (the worker checks both)."""
        self._data_call("push_file", {"peer": peer_id, "maddrs": list(maddrs), "kind": kind, "path": str(path),
                                      "size": size, "timeout": timeout}, timeout=timeout + PUSH_SLACK_S)

    def events(self, *, max_events: int = 64) -> list[WireEvent]:
        """Drain pushes received over p2pd; ``from_peer`` is the p2p-authenticated sender.

        A body the worker spooled is read here (its path checked: in our spool, of the announced
        size, at most our cap) and its file deleted; an event that fails the checks is dropped."""
        out = []
        for e in self._data_call("events", {"max": max_events}, timeout=10.0):
            data = e.get("data", b"")
            if e.get("path") is not None:
                data = self._take_spooled(e.get("path"), e.get("size"))
                if data is None:
                    continue
            out.append(WireEvent(kind=e["kind"], from_peer=e["from_peer"], data=data, received_at=e["received_at"]))
        return out

    def _take_spooled(self, path: object, size: object) -> bytes | None:
        try:
            if self.spool is None:
                raise WireError("the worker sent a spool path but this client has no spool")
            if not isinstance(size, int) or size > self.spool.max_push:
                raise WireError(f"spooled push of {size!r} bytes exceeds cap {self.spool.max_push}")
            return self.spool.take(path, size)
        except (WireError, OSError) as exc:
            log.warning("dropped a spooled push event: %s", exc)
            return None

    def push_stats(self) -> dict:
        """Push-plane counters: bytes in/out per kind, errors, queued and rejected events."""
        return dict(self._data_call("push_stats", timeout=10.0))

    def probe(self, peer_id: str, raw: bytes, *, maddrs: tuple[str, ...] = (), timeout: float = 5.0) -> bytes:
        """Diagnostics: raw bytes on a push stream to ``peer_id``; returns the raw answer."""
        return self._data_call("probe", {"peer": peer_id, "maddrs": list(maddrs), "raw": raw, "timeout": timeout},
                               timeout=timeout + PUSH_SLACK_S)

    def _data_call(self, method: str, params: dict | None = None, *, timeout: float) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = RpcClient(self._worker.socket_path, connect_timeout=5.0)
            self._local.client = client
            with self._lock:
                self._data_clients.append(client)
        return client.call(method, params, timeout=timeout)

    def alive(self) -> bool:
        return self._worker.alive()

    def stop(self, timeout: float = 8.0) -> None:
        """Mark this peer as leaving, stop the DHT; bounded by ~``timeout`` seconds."""
        with self._lock:
            for c in self._data_clients:
                c.close()
            self._data_clients.clear()
        self._worker.stop(timeout=timeout)

    def __enter__(self) -> "DhtClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start_error(err_file: Path, exc: RpcError) -> DhtStartError:
    try:
        failure = StartFailure.model_validate_json(err_file.read_text())
    except (OSError, ValueError):
        return DhtStartError(f"DHT worker failed to start: {exc}")
    cls = DuplicateIdentityError if failure.kind == "duplicate" else DhtStartError
    return cls(failure.message, failure.kind)
