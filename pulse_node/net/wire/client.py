"""Typed blocking API of the libp2p data plane, used by the node process.

``WireClient.start(WireConfig(store=...))`` launches ``python -m pulse_node.net.wire.worker`` (its
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
        wire.fetch(peer_maddr, PatchRequest(version=7), dest=Path("in/7.patch"), timeout=30)
"""

from __future__ import annotations

from pathlib import Path

from pulse_node.net.local.process import WorkerClient
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire import rpc as wire_rpc
from pulse_node.net.wire.config import WireConfig
from pulse_node.net.wire.protocol import StreamKind
from pulse_node.net.wire.rpc import AnchorResult, FetchResult, WireInfo
from pulse_node.vocab import Event, PushKind

__all__ = ["AnchorResult", "FetchResult", "WireClient", "WireConfig", "WireInfo"]

_RPC_SLACK = 10.0  # the worker enforces each operation's timeout; the socket waits a little longer


class WireClient(WorkerClient[WireConfig]):
    """One running wire worker and typed calls into it (``net/wire/rpc.py``: a request per handler)."""

    module = "pulse_node.net.wire.worker"
    name = "wire"
    api = wire_rpc.WireRequest

    def info(self) -> WireInfo:
        return self.request(wire_rpc.Info(), timeout=10.0)

    def fetch(self, peer: str, request: wp.FetchRequest, dest: Path, *,
              timeout: float = 30.0, expected_digest: str | None = None,
              max_bytes: int | None = None) -> FetchResult:
        """Fetch the file ``request`` asks for from ``peer`` into ``dest`` (atomic); a body declared
        larger than ``max_bytes`` is refused before it is read."""
        req = wire_rpc.Fetch(peer=peer, kind=wp.kind_of(request), request=request.body(), dest=str(dest),
                             timeout=timeout, expected_digest=expected_digest, max_bytes=max_bytes)
        return self.request(req, timeout=timeout + _RPC_SLACK)

    def fetch_anchor(self, peers: list[str], *, version: int, size: int, dest: Path,
                     digest: str | None = None, timeout: float = 600.0, chunk: int = 4 << 20,
                     per_peer: int = 2, pieces: list[tuple[int, int, str]] | None = None) -> AnchorResult:
        """Download anchor ``version`` from several providers at once; resumable, verified (each
        of the signed ``pieces`` (offset, length, BLAKE3 hex) as it arrives, when given)."""
        req = wire_rpc.FetchAnchor(peers=list(peers), version=version, size=size, dest=str(dest), digest=digest,
                              timeout=timeout, chunk=chunk, per_peer=per_peer,
                              pieces=None if pieces is None else [list(p) for p in pieces])
        return self.request(req, timeout=timeout + _RPC_SLACK)

    def push(self, peer: str, kind: PushKind, data: bytes, *, timeout: float = 30.0) -> None:
        """Deliver a push of ``kind`` (a ``vocab.PushKind``) into ``peer``'s event queue."""
        self.request(wire_rpc.Push(peer=peer, kind=kind, data=data, timeout=timeout),
                     timeout=timeout + _RPC_SLACK)

    def events(self, *, max_events: int = 64, wait_s: float = 0.0) -> list[Event]:
        """Drain inbound pushes, waiting up to ``wait_s`` for the first one."""
        return [q.event for q in self.request(wire_rpc.Events(max_events=max_events, wait_s=wait_s),
                                               timeout=wait_s + _RPC_SLACK)]

    def stats(self) -> wire_rpc.WireStats:
        return self.request(wire_rpc.Stats(), timeout=10.0)

    def set_members(self, peer_ids: list[str]) -> None:
        """Tell the worker which peers are trainer-set members (their own stream pool, larger shares)."""
        self.request(wire_rpc.SetMembers(peer_ids=sorted(peer_ids)), timeout=10.0)

    def set_standing(self, peer_ids: list[str]) -> None:
        """Tell the worker which non-members have standing; the others share the newcomers' budgets."""
        self.request(wire_rpc.SetStanding(peer_ids=sorted(peer_ids)), timeout=10.0)

    def set_head(self, record: bytes) -> None:
        self.request(wire_rpc.SetHead(record=record), timeout=10.0)

    def probe(self, peer: str, kind: StreamKind, raw: bytes, *, timeout: float = 5.0) -> bytes:
        """Diagnostics: send raw bytes on a ``kind`` stream and return the raw reply."""
        return self.request(wire_rpc.Probe(peer=peer, kind=kind, raw=raw, timeout=timeout),
                            timeout=timeout + _RPC_SLACK)
