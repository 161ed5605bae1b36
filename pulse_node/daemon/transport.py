"""The node's one swap point to the network: discovery + data plane behind a small interface.

``Transport`` is what trainer and inference roles use. ``P2PTransport`` (``p2p.py``) backs it
with the hivemind DHT worker and the py-libp2p wire worker; ``MemoryTransport`` (``testing/memory.py``) backs it with an
in-process hub so role logic is tested fast, and the same contract tests run on both.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pulse_node.chain.anchor import Piece
from pulse_node.errors import PulseError

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


@dataclass(frozen=True)
class AnchorFetch:
    """What a multi-provider anchor download did: its size, the providers that sent a piece
    failing its signed digest (``bad_peers``: lies, to strike) or failed otherwise, and, if it
    did not finish (``dest`` not written), why."""

    bytes: int
    bad_peers: list[str] = field(default_factory=list)
    failed_peers: list[str] = field(default_factory=list)
    error: str = ""


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
    """Network operations a role needs; every call is bounded by ``timeout``.

    ``fetch`` writes one file the peer serves to ``dest`` and refuses a body larger than
    ``max_bytes`` (what a signed record allows) before reading it; ``{"version", "offset",
    "length"}`` of an ``anchor`` is one byte range. ``fetch_anchor`` downloads a whole anchor from
    several ``providers`` at once, checking each of the signed ``pieces`` as it arrives."""

    peer_id: str

    def publish(self, info: PeerInfo) -> None: ...
    def peers(self) -> list[PeerInfo]: ...
    def fetch(self, peer: PeerInfo, kind: str, params: dict[str, Any], dest: Path, *, timeout: float,
              max_bytes: int | None = None) -> int: ...
    def fetch_anchor(self, providers: list[PeerInfo], *, version: int, pieces: list[Piece], dest: Path,
                     timeout: float) -> AnchorFetch: ...
    def push(self, peer: PeerInfo, kind: str, data: bytes, *, timeout: float) -> None: ...
    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...
