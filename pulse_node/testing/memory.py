"""An in-process 'network' for fast tests of role logic: ``MemoryHub`` and its ``MemoryTransport``.

``MemoryTransport`` implements ``daemon.transport.Transport`` without sockets or workers: a fetch
copies the file the serving peer's resolver names (``chain/serving.py``, the same mapping the wire
worker uses; an anchor byte range when asked for one; refused above ``max_bytes``), a push
appends to the receiver's inbox. ``fetch_anchor`` takes each signed piece from the providers in
turn and checks it, as the wire worker does, naming the providers that sent a bad one. It keeps
the transport contract (the same kinds, errors and sender rule as ``P2PTransport``;
``tests/test_net_transport_contract.py``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path

import blake3

from pulse_node.chain.anchor import Piece
from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.daemon.transport import AnchorFetch, DataPlane
from pulse_node.errors import BusyError, IntegrityError, NotFound, PeerBusy, PeerUnavailable, PulseError, WireError
from pulse_node.fsutil import write_atomic
from pulse_node.net.wire.protocol import AnchorRequest, FetchRequest, kind_of, params_of
from pulse_node.net.wire.serving import Resolver
from pulse_node.peers.view import PeerView
from pulse_node.vocab import Event, PushKind, check_push_kind


def announced(peer_id: str, status: PeerStatus, *, at: float | None = None) -> PeerRecord:
    """The ``PeerRecord`` the in-memory hub shows for ``status`` published under ``peer_id``: built,
    not validated (hub ids such as ``"holder"`` are no libp2p peer ids, and nothing on the hub is
    signed), so tests may also claim keys and addresses a real record could not."""
    return PeerRecord.model_construct(**dict(status), peer_id=peer_id, session="00" * 16,
                                      updated_at=time.time() if at is None else at)


class MemoryHub:
    """An in-process 'network' connecting MemoryTransports (for fast tests of role logic)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[str, PeerRecord] = {}
        self.resolvers: dict[str, Resolver] = {}
        self.inboxes: dict[str, deque[Event]] = {}
        self.down: set[str] = set()

    def join(self, peer_id: str, resolver: Resolver) -> MemoryTransport:
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
        self.view = PeerView()  # what the node last told the (absent) workers
        self.push_caps: dict[PushKind, int] = {}

    def publish(self, status: PeerStatus) -> None:
        with self.hub.lock:
            self.hub.records[self.peer_id] = announced(self.peer_id, status)

    def peers(self) -> list[PeerRecord]:
        with self.hub.lock:
            return [p for pid, p in self.hub.records.items() if pid not in self.hub.down]

    def fetch(self, peer: PeerRecord, request: FetchRequest, dest: Path, *, timeout: float,
              max_bytes: int | None = None) -> int:
        kind = kind_of(request)
        src = self._source(peer, request)
        offset = request.offset if isinstance(request, AnchorRequest) else 0  # an anchor byte range
        size = max(0, src.stat().st_size - offset)
        size = min(request.length, size) if isinstance(request, AnchorRequest) else size
        if max_bytes is not None and size > max_bytes:  # as the wire worker: refused before reading
            raise IntegrityError(f"{kind} {params_of(request)} from {peer.peer_id} is {size} bytes, more than the "
                                 f"{max_bytes} its signed record allows")
        with open(src, "rb") as fh:
            fh.seek(offset)
            data = fh.read(size)
        write_atomic(dest, data, durable=False)
        self.bytes_in += size
        return size

    def fetch_anchor(self, providers: list[PeerRecord], *, version: int, pieces: list[Piece], dest: Path,
                     timeout: float) -> AnchorFetch:
        """Each signed piece from the providers in turn (a bad or missing one: the next provider)."""
        bad: set[str] = set()
        failed: set[str] = set()
        out = bytearray()
        for i, piece in enumerate(pieces):
            for peer in [providers[(i + k) % len(providers)] for k in range(len(providers))]:
                if peer.peer_id in bad | failed:
                    continue
                try:
                    data = self._range(peer, version, piece)
                except WireError:
                    failed.add(peer.peer_id)
                    continue
                if blake3.blake3(data).hexdigest() == piece.digest:
                    out += data
                    break
                bad.add(peer.peer_id)
            else:
                return AnchorFetch(0, bad_peers=sorted(bad), failed_peers=sorted(failed),
                                   error=f"anchor {version}: no provider served bytes {piece.offset}+{piece.length}")
        write_atomic(dest, bytes(out), durable=False)
        self.bytes_in += len(out)
        return AnchorFetch(len(out), bad_peers=sorted(bad), failed_peers=sorted(failed))

    def _range(self, peer: PeerRecord, version: int, piece: Piece) -> bytes:
        with open(self._source(peer, AnchorRequest(version=version, offset=piece.offset, length=piece.length)),
                  "rb") as fh:
            fh.seek(piece.offset)
            return fh.read(piece.length)

    def _source(self, peer: PeerRecord, request: FetchRequest) -> Path:
        """The serving peer's file for ``request`` (its resolver reads the request's kind and fields, as
        ``net/wire/serving.py`` does); ``NotFound``, ``PeerUnavailable`` or ``PeerBusy`` otherwise."""
        kind, params = kind_of(request), params_of(request)
        with self.hub.lock:
            resolver = None if peer.peer_id in self.hub.down else self.hub.resolvers.get(peer.peer_id)
        if resolver is None:
            raise PeerUnavailable(f"{peer.peer_id} unreachable")
        try:
            src = resolver(request)
        except BusyError as exc:  # e.g. still making a catch-up patch: ask again shortly
            raise PeerBusy(f"{peer.peer_id} is busy with {kind}: {exc}") from None
        except PulseError as exc:  # it cannot make the file (a catch-up from a base it lacks), as the wire says
            raise NotFound(f"{peer.peer_id} has no {kind} {params}: {exc}") from None
        except Exception as exc:  # a failure on the serving side is the peer's problem, not ours
            raise WireError(f"{peer.peer_id} failed to serve {kind}: {exc}") from None
        if src is None or not src.exists():
            raise NotFound(f"{peer.peer_id} has no {kind} {params}")
        return Path(src)

    def push(self, peer: PeerRecord, kind: PushKind, data: bytes, *, timeout: float) -> None:
        check_push_kind(kind)
        with self.hub.lock:
            inbox = None if peer.peer_id in self.hub.down else self.hub.inboxes.get(peer.peer_id)
        if inbox is None:
            raise PeerUnavailable(f"{peer.peer_id} unreachable")
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

    def stats(self) -> DataPlane:
        return DataPlane(bytes_in=self.bytes_in, bytes_out=self.bytes_out)

    def set_view(self, view: PeerView) -> None:
        self.view = view

    def cap_pushes(self, kind: PushKind, cap: int) -> None:
        self.push_caps[kind] = min(cap, self.push_caps.get(kind, cap))

    def alive(self) -> bool:
        with self.hub.lock:
            return self.peer_id not in self.hub.down

    def close(self) -> None:
        with self.hub.lock:
            self.hub.records.pop(self.peer_id, None)
            self.hub.down.add(self.peer_id)

