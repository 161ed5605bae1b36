"""Typed blocking API of the libp2p data plane, used by the node process.

``WireClient.start(store=...)`` launches ``python -m pulse_node.net.wire_worker`` (its own
interpreter: py-libp2p and hivemind cannot share a process) and talks to it over the Unix
socket RPC of ``ipc.py``. Bulk data moves as files: ``fetch`` and ``fetch_anchor`` write the
destination atomically and return byte counts; only pushes and events carry bytes. Calls are
thread-safe and concurrent (one socket per calling thread), so a long ``events`` poll does not
hold up a ``fetch``. Failures raise typed errors: ``PeerUnavailable`` (dead, busy, slow peer;
``PeerBusy`` when it asked us to come back),
``NotFound`` (the peer lacks the file), ``WireError`` (protocol), ``IntegrityError`` (digest mismatch), ``RpcError``
(the worker itself failed).

    with WireClient.start(store=Path("store")) as wire:
        me = wire.info()
        wire.fetch(peer_maddr, "patch", {"version": 7}, dest=Path("in/7.patch"), timeout=30)
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulse_node import errors
from pulse_node.net.ipc import RpcClient, RpcError
from pulse_node.net.process import WorkerProcess
from pulse_node.net.wire_protocol import NotFound, PeerBusy, PeerUnavailable, UnsupportedVersion

_RPC_SLACK = 10.0  # the worker enforces each operation's timeout; the socket waits a little longer
_ERROR_TYPES: dict[str, type[errors.PulseError]] = {
    "PeerUnavailable": PeerUnavailable, "PeerBusy": PeerBusy, "UnsupportedVersion": UnsupportedVersion,
    "NotFound": NotFound,
    "WireError": errors.WireError, "IntegrityError": errors.IntegrityError,
    "ConfigError": errors.ConfigError, "StoreError": errors.StoreError,
}
_ERROR_RE = re.compile(r"^\w+: (\w+): (.*)$", re.S)


@dataclass(frozen=True)
class WireInfo:
    peer_id: str
    listen_maddrs: list[str]


@dataclass(frozen=True)
class FetchResult:
    bytes: int
    seconds: float
    peer: str
    total: int = 0  # size of the whole file (for an anchor chunk: the anchor's size)


@dataclass(frozen=True)
class AnchorResult:
    bytes: int
    seconds: float
    fetched: int  # bytes moved in this call (the rest was resumed from a partial download)
    resumed: int
    failed_providers: list[str]
    errors: dict[str, str]
    bad_providers: list[str] = field(default_factory=list)  # sent a piece failing its signed digest: a lie
    complete: bool = True  # False (with ``error``) only for a download of signed pieces that did not finish
    error: str = ""


@dataclass(frozen=True)
class WireEvent:
    kind: str  # "rollout" | "loco" | "head"
    from_peer: str
    data: bytes
    received_at: float


class WireClient:
    """One running wire worker and typed calls into it."""

    def __init__(self, proc: WorkerProcess) -> None:
        self._proc = proc
        self._local = threading.local()
        self._clients: list[RpcClient] = []
        self._lock = threading.Lock()

    @classmethod
    def start(cls, *, store: Path, listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",),
              identity: Path | None = None, announce: tuple[str, ...] = (), max_streams: int = 32,
              idle_timeout: float = 10.0, max_upload_rate: float = 0.0, log_path: Path | None = None,
              start_timeout: float = 60.0, dial_timeout: float | None = None) -> "WireClient":
        args = ["--store", str(store), "--max-streams", str(max_streams),
                "--idle-timeout", str(idle_timeout), "--max-upload-rate", str(max_upload_rate)]
        if dial_timeout is not None:  # else the worker's default (wire_transfer.DIAL_TIMEOUT_S)
            args += ["--dial-timeout", str(dial_timeout)]
        for a in listen:
            args += ["--listen", a]
        for a in announce:
            args += ["--announce", a]
        if identity is not None:
            args += ["--identity", str(identity)]
        proc = WorkerProcess("pulse_node.net.wire_worker", args, name="wire",
                             start_timeout=start_timeout, log_path=log_path)
        return cls(proc)

    def __enter__(self) -> "WireClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def process(self) -> WorkerProcess:
        return self._proc

    def _call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 10.0) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = RpcClient(self._proc.socket_path, connect_timeout=5.0)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        try:
            return client.call(method, params, timeout=timeout)
        except RpcError as exc:
            raise _typed(exc) from None

    def info(self) -> WireInfo:
        r = self._call("info")
        return WireInfo(peer_id=r["peer_id"], listen_maddrs=list(r["listen_maddrs"]))

    def fetch(self, peer: str, kind: str, params: dict[str, int | None], dest: Path, *,
              timeout: float = 30.0, expected_digest: str | None = None,
              max_bytes: int | None = None) -> FetchResult:
        """Fetch a record/patch/catchup file from ``peer`` into ``dest`` (atomic); a body declared
        larger than ``max_bytes`` is refused before it is read."""
        r = self._call("fetch", {"peer": peer, "kind": kind, "params": params, "dest": str(dest),
                                 "timeout": timeout, "expected_digest": expected_digest, "max_bytes": max_bytes},
                       timeout=timeout + _RPC_SLACK)
        return FetchResult(bytes=r["bytes"], seconds=r["seconds"], peer=r["peer"], total=r.get("total", 0))

    def fetch_anchor(self, peers: list[str], *, version: int, size: int, dest: Path,
                     digest: str | None = None, timeout: float = 600.0, chunk: int = 4 << 20,
                     per_peer: int = 2, pieces: list[tuple[int, int, str]] | None = None) -> AnchorResult:
        """Download anchor ``version`` from several providers at once; resumable, verified (each
        of the signed ``pieces`` (offset, length, BLAKE3 hex) as it arrives, when given)."""
        r = self._call("fetch_multi", {"peers": list(peers), "version": version, "size": size,
                                       "dest": str(dest), "digest": digest, "timeout": timeout,
                                       "chunk": chunk, "per_peer": per_peer,
                                       "pieces": None if pieces is None else [list(p) for p in pieces]},
                       timeout=timeout + _RPC_SLACK)
        return AnchorResult(**r)

    def push(self, peer: str, kind: str, data: bytes, *, timeout: float = 30.0) -> None:
        """Deliver a rollout / loco payload / head announcement into ``peer``'s event queue."""
        self._call("push", {"peer": peer, "kind": kind, "data": data, "timeout": timeout},
                   timeout=timeout + _RPC_SLACK)

    def events(self, *, max_events: int = 64, wait_s: float = 0.0) -> list[WireEvent]:
        """Drain inbound pushes, waiting up to ``wait_s`` for the first one."""
        evs = self._call("events", {"max": max_events, "wait_s": wait_s}, timeout=wait_s + _RPC_SLACK)
        return [WireEvent(**e) for e in evs]

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def set_head(self, record: bytes) -> None:
        self._call("set_head", {"record": record})

    def probe(self, peer: str, kind: str, raw: bytes, *, timeout: float = 5.0) -> bytes:
        """Diagnostics: send raw bytes on a ``kind`` stream and return the raw reply."""
        return self._call("probe", {"peer": peer, "kind": kind, "raw": raw, "timeout": timeout},
                          timeout=timeout + _RPC_SLACK)["reply"]

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            for c in self._clients:
                c.close()
            self._clients.clear()
        self._proc.stop(timeout)


def _typed(exc: RpcError) -> errors.PulseError:
    """Turn the worker's ``"method: Type: message"`` back into the typed error."""
    m = _ERROR_RE.match(str(exc))
    if m and m.group(1) in _ERROR_TYPES:
        return _ERROR_TYPES[m.group(1)](m.group(2))
    return exc
