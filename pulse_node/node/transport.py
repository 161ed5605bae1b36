"""The node's one swap point to the network: discovery + data plane behind a small interface.

``Transport`` is what trainer and inference roles use. ``P2PTransport`` (``p2p.py``) backs it
with the hivemind DHT worker and the py-libp2p wire worker; ``MemoryTransport`` backs it with an
in-process hub so role logic is tested fast, and the same contract tests run on both.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pulse_node.errors import BusyError, PulseError, WireError

#: kinds a peer can push to another peer
PUSH_KINDS = ("rollouts", "loco", "head", "loco_decision")
#: kinds a peer can fetch from another peer's store
FETCH_KINDS = ("record", "patch", "anchor", "catchup", "trainer_state", "loco_payload", "loco_decision")


@dataclass
class PeerInfo:
    """What discovery says about a live peer (from its signed DHT record)."""

    peer_id: str
    role: str
    address: str  # data-plane address to fetch from / push to
    version: int = -1
    chain_hash: str = ""
    state_hash: str = ""
    lowest: int = -1  # lowest version whose patch it serves
    anchors: list[int] = field(default_factory=list)
    node_key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Event:
    """Something a peer pushed to us."""

    kind: str
    sender: str
    data: bytes
    received_at: float


#: pushes of one ``push_to_all`` call that run at once
MAX_PARALLEL_PUSHES = 8


def push_to_all(transport: "Transport", peers: list[PeerInfo], kind: str, data: bytes, *, timeout: float) -> int:
    """Push ``data`` to every peer at once, best effort; returns how many pushes failed.

    One peer that has vanished (or whose NAT mapping just died) costs at most ``timeout`` for all
    of them together, not ``timeout`` per peer before the next one is tried (measured across a real
    NAT: sequential head pushes stalled trainer rounds by 7-10 s, bench/RESULTS.md "NAT").
    """
    def one(peer: PeerInfo) -> bool:
        try:
            transport.push(peer, kind, data, timeout=timeout)
            return True
        except PulseError:
            return False

    if len(peers) <= 1:
        return sum(not one(p) for p in peers)
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PUSHES, len(peers)), thread_name_prefix="push") as pool:
        return sum(not ok for ok in pool.map(one, peers))


class Transport(Protocol):
    """Network operations a role needs; every call is bounded by ``timeout``."""

    peer_id: str

    def publish(self, info: PeerInfo) -> None: ...
    def peers(self) -> list[PeerInfo]: ...
    def fetch(self, peer: PeerInfo, kind: str, params: dict[str, Any], dest: Path, *, timeout: float) -> int: ...
    def push(self, peer: PeerInfo, kind: str, data: bytes, *, timeout: float) -> None: ...
    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


Resolver = Callable[[str, dict[str, Any]], "Path | None"]


class MemoryHub:
    """An in-process 'network' connecting MemoryTransports (for fast tests of role logic)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[str, PeerInfo] = {}
        self.resolvers: dict[str, Resolver] = {}
        self.inboxes: dict[str, deque[Event]] = {}
        self.down: set[str] = set()

    def join(self, peer_id: str, resolver: Resolver) -> "MemoryTransport":
        with self.lock:
            self.resolvers[peer_id] = resolver
            self.inboxes[peer_id] = deque(maxlen=4096)
            self.down.discard(peer_id)  # a restarted node rejoins under its old id
        return MemoryTransport(self, peer_id)


class MemoryTransport:
    """Transport over a MemoryHub: fetch copies files from the serving peer's store."""

    def __init__(self, hub: MemoryHub, peer_id: str) -> None:
        self.hub = hub
        self.peer_id = peer_id
        self.bytes_in = 0
        self.bytes_out = 0

    def publish(self, info: PeerInfo) -> None:
        with self.hub.lock:
            self.hub.records[self.peer_id] = info

    def peers(self) -> list[PeerInfo]:
        with self.hub.lock:
            return [p for pid, p in self.hub.records.items() if pid not in self.hub.down]

    def fetch(self, peer: PeerInfo, kind: str, params: dict[str, Any], dest: Path, *, timeout: float) -> int:
        if kind not in FETCH_KINDS:
            raise WireError(f"unknown fetch kind {kind!r}")
        with self.hub.lock:
            resolver = None if peer.peer_id in self.hub.down else self.hub.resolvers.get(peer.peer_id)
        try:
            src = resolver(kind, params) if resolver else None
        except BusyError as exc:  # e.g. still making a catch-up patch: ask again shortly
            raise BusyError(f"{peer.peer_id} is busy with {kind}: {exc}") from None
        except Exception as exc:  # a failure on the serving side is the peer's problem, not ours
            raise WireError(f"{peer.peer_id} failed to serve {kind}: {exc}") from None
        if src is None or not src.exists():
            raise WireError(f"{peer.peer_id} has no {kind} {params}")
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(src, tmp)
        tmp.replace(dest)
        size = dest.stat().st_size
        self.bytes_in += size
        return size

    def push(self, peer: PeerInfo, kind: str, data: bytes, *, timeout: float) -> None:
        if kind not in PUSH_KINDS:
            raise WireError(f"unknown push kind {kind!r}")
        with self.hub.lock:
            inbox = None if peer.peer_id in self.hub.down else self.hub.inboxes.get(peer.peer_id)
        if inbox is None:
            raise WireError(f"{peer.peer_id} unreachable")
        inbox.append(Event(kind, self.peer_id, bytes(data), time.time()))
        self.bytes_out += len(data)

    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]:
        deadline = time.monotonic() + wait_s
        inbox = self.hub.inboxes[self.peer_id]
        while not inbox and time.monotonic() < deadline:
            time.sleep(0.01)
        out: list[Event] = []
        while inbox and len(out) < max_items:
            out.append(inbox.popleft())
        return out

    def stats(self) -> dict[str, Any]:
        return {"bytes_in": self.bytes_in, "bytes_out": self.bytes_out}

    def close(self) -> None:
        with self.hub.lock:
            self.hub.records.pop(self.peer_id, None)
            self.hub.down.add(self.peer_id)
