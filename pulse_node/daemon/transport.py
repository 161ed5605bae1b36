"""The node's one swap point to the network: discovery + data plane behind a small interface.

``Transport`` is what trainer and inference roles use. ``P2PTransport`` (``p2p.py``) backs it
with the hivemind DHT worker and the py-libp2p wire worker; ``MemoryTransport``
(``testing/memory.py``) backs it with an in-process hub so role logic is tested fast. Both keep
one contract, checked on both by ``tests/test_net_transport_contract.py``:

- ``publish(status)`` makes this node's ``PeerStatus`` visible to every peer's ``peers()`` as a
  ``PeerRecord`` (the one peer type, ``chain/peer.py``) under this transport's ``peer_id`` (until
  ``close``);
- ``fetch(peer, request, dest)`` writes the file the peer serves (``chain/serving.py``) for a
  ``FetchRequest`` (``net/wire/protocol.py``: ``PatchRequest(version=7)``, one struct per
  ``FetchKind``; the same struct travels to the wire worker and to the peer) to ``dest`` and
  returns its size; a file the peer lacks raises ``NotFound``, an unreachable peer
  ``PeerUnavailable`` (``PeerBusy``: ask again shortly);
- ``push(peer, kind, data)`` delivers a ``PushKind``; the receiver's ``events()`` returns it as an
  ``Event`` whose ``sender`` is the pushing transport's ``peer_id`` (authenticated by the
  transport, never claimed by the peer);
- ``stats()`` is the status model's ``DataPlane`` (byte counters, refusals), not a free map;
- ``set_view(view)`` tells the workers what the peer book thinks of peers (``peers/view.py``:
  members and peers with standing get their own budgets), ``cap_pushes(kind, cap)`` lowers the
  cap of a push kind before a body is read, ``alive()`` says whether the workers still run (an
  in-memory transport has none: it keeps the view and caps, and is alive until closed);
- a push kind outside the vocabulary (``vocab.py``), or a fetch request that is none of the
  ``FetchRequest`` structs, is refused with ``WireError`` before anything is sent;
- every call is bounded by its ``timeout``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pulse_node.chain.anchor import Piece
from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.daemon.status_model import DataPlane
from pulse_node.errors import PulseError
from pulse_node.net.wire.protocol import FetchRequest
from pulse_node.peers.view import PeerView
from pulse_node.vocab import Event, PushKind

__all__ = ["AnchorFetch", "DataPlane", "Event", "Fetch", "FetchRequest", "Transport", "push_to_all"]

@dataclass(frozen=True)
class AnchorFetch:
    """What a multi-provider anchor download did: its size, the providers that sent a piece
    failing its signed digest (``bad_peers``: lies, to strike) or failed otherwise, and, if it
    did not finish (``dest`` not written), why."""

    bytes: int
    bad_peers: list[str] = field(default_factory=list)
    failed_peers: list[str] = field(default_factory=list)
    error: str = ""


#: pushes of one ``push_to_all`` call that run at once
MAX_PARALLEL_PUSHES = 8


def push_to_all(transport: Transport, peers: list[PeerRecord], kind: PushKind, data: bytes, *, timeout: float,
                on_error: Callable[[PeerRecord, PulseError], None] | None = None) -> int:
    """Push ``data`` to every peer at once, best effort; returns how many pushes failed.

    One peer that has vanished (or whose NAT mapping just died) costs at most ``timeout`` for all
    of them together, not ``timeout`` per peer before the next one is tried (measured across a real
    NAT: sequential head pushes stalled trainer rounds by 7-10 s, bench/RESULTS.md "NAT").
    ``on_error(peer, exc)`` is told of each failed push (from the pushing thread).
    """
    def one(peer: PeerRecord) -> bool:
        try:
            transport.push(peer, kind, data, timeout=timeout)
            return True
        except PulseError as exc:
            if on_error is not None:
                on_error(peer, exc)
            return False

    if len(peers) <= 1:
        return sum(not one(p) for p in peers)
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PUSHES, len(peers)), thread_name_prefix="push") as pool:
        return sum(not ok for ok in pool.map(one, peers))


class Fetch(Protocol):
    """``Transport.fetch`` as a value (what a helper that only fetches is handed)."""

    def __call__(self, peer: PeerRecord, request: FetchRequest, dest: Path, *, timeout: float,
                 max_bytes: int | None = None) -> int: ...


class Transport(Protocol):
    """Network operations a role needs; every call is bounded by ``timeout``.

    ``fetch`` writes the one file the peer serves for ``request`` to ``dest`` and refuses a body
    larger than ``max_bytes`` (what a signed record allows) before reading it; an
    ``AnchorRequest`` asks for one byte range of an anchor. ``fetch_anchor`` downloads a whole anchor from
    several ``providers`` at once, checking each of the signed ``pieces`` as it arrives."""

    peer_id: str

    def publish(self, status: PeerStatus) -> None: ...
    def peers(self) -> list[PeerRecord]: ...
    def fetch(self, peer: PeerRecord, request: FetchRequest, dest: Path, *, timeout: float,
              max_bytes: int | None = None) -> int: ...
    def fetch_anchor(self, providers: list[PeerRecord], *, version: int, pieces: list[Piece], dest: Path,
                     timeout: float) -> AnchorFetch: ...
    def push(self, peer: PeerRecord, kind: PushKind, data: bytes, *, timeout: float) -> None: ...
    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]: ...
    def stats(self) -> DataPlane: ...
    def set_view(self, view: PeerView) -> None: ...
    def cap_pushes(self, kind: PushKind, cap: int) -> None: ...
    def alive(self) -> bool: ...
    def close(self) -> None: ...
