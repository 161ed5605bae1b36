"""Typed blocking API of the libp2p data plane, used by the node process.

``WireClient.start(WireConfig(store=...))`` launches ``python -m pulse_node.net.wire_worker`` (its
own interpreter: py-libp2p and hivemind cannot share a process) and talks to it over the local
RPC (``process.WorkerClient``). Bulk data moves as files: ``fetch`` and ``fetch_anchor`` write
the destination atomically and return byte counts; only pushes and events carry bytes. Calls are
thread-safe and concurrent (one connection per call in flight), so a long ``events`` poll does
not hold up a ``fetch``. Failures raise the worker's typed errors: ``PeerUnavailable`` (dead,
busy, slow peer; ``PeerBusy`` when it asked us to come back), ``NotFound`` (the peer lacks the
file), ``WireError`` (protocol, bad arguments), ``IntegrityError`` (digest mismatch), ``RpcError``
(the worker itself failed or did not answer in time).

    with WireClient.start(WireConfig(store=Path("store"))) as wire:
        me = wire.info()
        wire.fetch(peer_maddr, "patch", {"version": 7}, dest=Path("in/7.patch"), timeout=30)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulse_node.net.process import WorkerClient
from pulse_node.net.worker_config import WireConfig
from pulse_node.vocab import Event

__all__ = ["AnchorResult", "FetchResult", "WireClient", "WireConfig", "WireInfo"]

_RPC_SLACK = 10.0  # the worker enforces each operation's timeout; the socket waits a little longer


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


class WireClient(WorkerClient[WireConfig]):
    """One running wire worker and typed calls into it."""

    module = "pulse_node.net.wire_worker"
    name = "wire"

    def info(self) -> WireInfo:
        r = self.call("info", timeout=10.0)
        return WireInfo(peer_id=r["peer_id"], listen_maddrs=list(r["listen_maddrs"]))

    def fetch(self, peer: str, kind: str, params: dict[str, int | str | None], dest: Path, *,
              timeout: float = 30.0, expected_digest: str | None = None,
              max_bytes: int | None = None) -> FetchResult:
        """Fetch a file of ``kind`` (a ``vocab.FetchKind``) from ``peer`` into ``dest`` (atomic); a body
        declared larger than ``max_bytes`` is refused before it is read."""
        r = self.call("fetch", {"peer": peer, "kind": kind, "params": params, "dest": str(dest),
                                "timeout": timeout, "expected_digest": expected_digest, "max_bytes": max_bytes},
                      timeout=timeout + _RPC_SLACK)
        return FetchResult(bytes=r["bytes"], seconds=r["seconds"], peer=r["peer"], total=r.get("total", 0))

    def fetch_anchor(self, peers: list[str], *, version: int, size: int, dest: Path,
                     digest: str | None = None, timeout: float = 600.0, chunk: int = 4 << 20,
                     per_peer: int = 2, pieces: list[tuple[int, int, str]] | None = None) -> AnchorResult:
        """Download anchor ``version`` from several providers at once; resumable, verified (each
        of the signed ``pieces`` (offset, length, BLAKE3 hex) as it arrives, when given)."""
        r = self.call("fetch_anchor", {"peers": list(peers), "version": version, "size": size,
                                       "dest": str(dest), "digest": digest, "timeout": timeout,
                                       "chunk": chunk, "per_peer": per_peer,
                                       "pieces": None if pieces is None else [list(p) for p in pieces]},
                      timeout=timeout + _RPC_SLACK)
        return AnchorResult(**r)

    def push(self, peer: str, kind: str, data: bytes, *, timeout: float = 30.0) -> None:
        """Deliver a push of ``kind`` (a ``vocab.PushKind``) into ``peer``'s event queue."""
        self.call("push", {"peer": peer, "kind": kind, "data": data, "timeout": timeout},
                  timeout=timeout + _RPC_SLACK)

    def events(self, *, max_events: int = 64, wait_s: float = 0.0) -> list[Event]:
        """Drain inbound pushes, waiting up to ``wait_s`` for the first one."""
        evs = self.call("events", {"max_events": max_events, "wait_s": wait_s}, timeout=wait_s + _RPC_SLACK)
        return [Event(**e) for e in evs]

    def stats(self) -> dict[str, Any]:
        return self.call("stats", timeout=10.0)

    def set_members(self, peer_ids: list[str]) -> None:
        """Tell the worker which peers are trainer-set members (their own stream pool, larger shares)."""
        self.call("set_members", {"peer_ids": sorted(peer_ids)}, timeout=10.0)

    def set_standing(self, peer_ids: list[str]) -> None:
        """Tell the worker which non-members have standing; the others share the newcomers' budgets."""
        self.call("set_standing", {"peer_ids": sorted(peer_ids)}, timeout=10.0)

    def set_head(self, record: bytes) -> None:
        self.call("set_head", {"record": record}, timeout=10.0)

    def probe(self, peer: str, kind: str, raw: bytes, *, timeout: float = 5.0) -> bytes:
        """Diagnostics: send raw bytes on a ``kind`` stream and return the raw reply."""
        return self.call("probe", {"peer": peer, "kind": kind, "raw": raw, "timeout": timeout},
                         timeout=timeout + _RPC_SLACK)
