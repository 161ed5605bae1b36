"""The node's typed, blocking view of the swarm DHT (a ``dht_worker`` process behind it).

    client = DhtClient.start(DhtConfig(run_id="run1", initial_peers=[...]))
    client.publish_peer(PeerStatus(role="trainer", version=12, ...), ttl_s=30)
    for rec in client.peers(): ...             # validated PeerRecords, expired/leaving ones gone
    client.publish_head(signed_version_record, version=12, ttl_s=30)
    newest = max(client.heads(), key=lambda h: h.version)
    client.stop()

Start failures raise ``DhtStartError`` (``DuplicateIdentityError`` for a copied identity) with
the worker's one-line explanation; every call has a timeout and raises ``RpcError`` on expiry.
Importing this module does not import hivemind.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from pydantic import Field, field_validator

from pulse_node.configload import StrictModel
from pulse_node.errors import PulseError
from pulse_node.net.dht_records import (
    MAX_TTL_S, MIN_TTL_S, DhtInfo, HeadEntry, PeerRecord, PeerStatus, StartFailure, validate_tree,
)
from pulse_node.net.ipc import RpcError
from pulse_node.net.process import WorkerProcess

WORKER_MODULE = "pulse_node.net.dht_worker"
#: a DHT read walks the swarm and may wait out dead peers (hivemind's 3 s RPC timeout)
READ_TIMEOUT_S = 30.0
#: p2pd start + the longest wait to tell a live duplicate identity from a stale record
START_SLACK_S = 60.0
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

    def worker_args(self) -> list[str]:
        args = ["--run-id", self.run_id, "--bootstrap-timeout", str(self.bootstrap_timeout_s)]
        for flag, values in (("--initial-peers", self.initial_peers), ("--host-maddrs", self.host_maddrs),
                             ("--announce-maddrs", self.announce_maddrs)):
            if values:
                args += [flag, *values]
        if self.identity is not None:
            args += ["--identity", str(self.identity)]
        for flag, on in (("--use-relay", self.use_relay), ("--use-auto-relay", self.use_auto_relay),
                         ("--client-mode", self.client_mode)):
            if on:
                args.append(flag)
        return args


class DhtClient:
    """Typed methods over the worker's RPC; one instance per node, safe to share between threads."""

    def __init__(self, worker: WorkerProcess, config: DhtConfig) -> None:
        self._worker = worker
        self.config = config

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

    def peers(self) -> list[PeerRecord]:
        return [validate_tree(PeerRecord, r) for r in self._worker.call("peers", timeout=READ_TIMEOUT_S)]

    def publish_head(self, record: bytes, *, version: int, ttl_s: float | None = None) -> bool:
        """Announce the newest version this node holds with its signed version record."""
        params = {"record": record, "version": version, "ttl_s": ttl_s or self.config.ttl_s}
        return bool(self._worker.call("publish_head", params, timeout=READ_TIMEOUT_S))

    def heads(self) -> list[HeadEntry]:
        return [validate_tree(HeadEntry, h) for h in self._worker.call("heads", timeout=READ_TIMEOUT_S)]

    def get(self, kind: str) -> list[dict]:
        """Raw live entries of ``peers`` or ``heads`` (subkey, value, expires_at) for dashboards."""
        return list(self._worker.call("get", {"kind": kind}, timeout=READ_TIMEOUT_S))

    def alive(self) -> bool:
        return self._worker.alive()

    def stop(self, timeout: float = 8.0) -> None:
        """Mark this peer as leaving, stop the DHT; bounded by ~``timeout`` seconds."""
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
