"""What a role needs from its node: config, identity, store, transport, status, a stop flag.

The same ``RoleContext`` is built by the real daemon (``runtime.py``, P2P transport) and by
tests (``MemoryTransport``), so role logic is exercised identically in both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerRecord, PeerStatus, Serves
from pulse_node.chain.store import VersionStore
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.daemon.fanout import Fanout, OnError
from pulse_node.daemon.status import NodeStatus
from pulse_node.daemon.status_model import StandingReport
from pulse_node.daemon.transport import Transport
from pulse_node.errors import PulseError
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Unexpected, Unreached
from pulse_node.peers.standing import PUSH_UNKNOWN, VIEW_UNKNOWN
from pulse_node.peers.view import PeerView
from pulse_node.vocab import PushKind

#: records of trainers carrying an admission read beyond the view's newcomers, at most
MAX_ADMISSION_CLAIMS = 8


C = TypeVar("C", bound=TrainerConfig | InferenceConfig)
D = TypeVar("D", bound=TrainerConfig | InferenceConfig)


@dataclass
class RoleContext(Generic[C]):
    """Everything a trainer or inference role runs on; ``C``: the role's config type."""

    cfg: C
    identity: Identity
    store: VersionStore
    transport: Transport
    status: NodeStatus
    stop: threading.Event = field(default_factory=threading.Event)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("pulse.node"))
    admission: bytes | None = None  # this trainer's admission to the trainer set, published in its record
    #: what this node thinks of every peer (``peers/book.py``): built from ``cfg`` unless given
    _book: PeerBook | None = field(default=None, repr=False)
    _fanout: Fanout | None = field(default=None, repr=False)
    _last_view: tuple[int, int, int] = (0, 0, 0)
    _view: list[PeerRecord] = field(default_factory=list, repr=False)
    _view_key: tuple[tuple[PeerRecord, ...], int, int] | None = field(default=None, repr=False)
    _told: PeerView | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self._book is None:
            self._book = PeerBook.for_node(self.cfg)

    @property
    def book(self) -> PeerBook:
        """What this node thinks of every peer (``peers/book.py``); one per node, shared by its roles."""
        assert self._book is not None
        return self._book

    def peers(self, role: str | None = None) -> list[PeerRecord]:
        """Live peers from discovery (never ourselves), optionally of one role: the view.

        Trainer-set members and peers with standing, then at most ``VIEW_UNKNOWN`` peers without
        standing (this node's draw, turning over every few seconds) and a few trainers carrying
        an admission (so an admitted trainer is learned); however many records fresh keys
        publish, the view holds the same honest peers."""
        me, book = self.transport.peer_id, self.book
        found = tuple(p for p in self.transport.peers() if p.peer_id != me)
        if self._view_key != (found, book.changes, book.epoch()):  # a flood makes ordering cost: once per change
            self._view, told = book.view_of(found, newcomers=VIEW_UNKNOWN, claims=MAX_ADMISSION_CLAIMS)
            self._tell(told)
            self._last_view = (len(found), len(self._view), sum(not book.known(p.peer_id) for p in self._view))
            self._view_key = (found, book.changes, book.epoch())
        return [p for p in self._view if role is None or p.role == role]

    def _tell(self, view: PeerView) -> None:
        """Tell the transport's workers the book's view (``peers/view.py``) when it changed."""
        if view == self._told:
            return
        try:
            self.transport.set_view(view)
            self._told = view
        except PulseError as exc:  # the workers keep the last view told
            self.log.warning("telling the data plane the peer view failed: %s", exc)

    def push_in_background(self, kind: PushKind, data: bytes, peers: list[PeerRecord], *, job: str | None = None,
                           timeout: float | None = None, newcomers: int = PUSH_UNKNOWN,
                           on_error: OnError | None = None, on_sent: Callable[[PeerRecord], None] | None = None) -> None:
        """Push to ``peers`` without waiting (``daemon/fanout.py``, the node's one pusher): members
        and peers with standing on one lane, at most ``newcomers`` others on their own (a silent
        newcomer never delays the next head to the others); a newer job of the same name (default
        ``kind``) replaces a waiting one; a peer whose push fails is demoted (``Unreached``)."""
        if self._fanout is None:
            book = self.book

            def unreached(peer: PeerRecord, exc: PulseError) -> None:
                book.judge(peer.peer_id, Unreached(str(exc)))

            self._fanout = Fanout(self.transport, order=lambda ps, n: book.order(ps, quota=n), known=book.known,
                                  on_error=unreached)
        self._fanout.submit(kind, data, peers, job=job, timeout=timeout, newcomers=newcomers, on_error=on_error,
                            on_sent=on_sent)

    def take_events(self, handlers: Mapping[str, Callable[[str, bytes], None]], *, wait_s: float = 0.0) -> None:
        """Hand each pushed event (waiting up to ``wait_s`` for the first) to its kind's handler
        ``(sender, data)``: the one place a role takes what peers push. A ``PulseError`` is the
        handler's refusal (it judged the sender); any other exception is contained by the book
        (``PeerBook.contain``: refused, sender struck, the role goes on). Both count as rejected
        and name the sender in the status."""
        for ev in self.transport.events(wait_s=wait_s):
            handle = handlers.get(ev.kind)
            if handle is None:
                continue
            try:
                got = self.book.contain(ev.sender, partial(handle, ev.sender, ev.data), what=f"pushed {ev.kind}")
            except PulseError as exc:
                self._rejected(f"bad {ev.kind} from {ev.sender[:12]}: {exc}")
                continue
            if isinstance(got, Unexpected) and got.struck:
                self._rejected(f"{ev.kind} from {ev.sender[:12]} refused: {got.why}")

    def _rejected(self, message: str) -> None:
        with self.status.node() as counters:
            counters.rejected += 1
            counters.unexpected = self.book.containment.failures
        self.status.error(message)

    def standing_report(self) -> StandingReport:
        found, view, newcomers = self._last_view
        pushes = self._fanout.counts if self._fanout is not None else {}
        return StandingReport(found=found, view=view, newcomers_in_view=newcomers, **self.book.summary(),
                              **{f"pushes_{k}": int(pushes.get(k, 0)) for k in ("submitted", "superseded",
                                                                                "failed", "skipped")})

    def close(self) -> None:
        """Stop the background pushes (what a role started)."""
        if self._fanout is not None:
            self._fanout.close()

    def announce(self, *, version: int, chain_hash: str, state_hash: str) -> None:
        """Publish our discovery record (version held, what we serve) and refresh status."""
        anchors = self.store.anchors()
        lowest = self.store.lowest_served()  # patches from there to the head, without a hole
        held = version if version >= 0 else None
        self.transport.publish(PeerStatus(
            role=self.cfg.role, version=held, chain_hash=chain_hash or None, state_hash=state_hash or None,
            serves=Serves(lowest=lowest, highest=held, anchors=anchors[-64:]),
            node_key=self.identity.public_key_hex, metrics_url=self.status.metrics_url, admission=self.admission))
        with self.status.node() as counters:
            counters.unexpected = self.book.containment.failures
        self.status.update(version=version, chain_hash=chain_hash, state_hash=state_hash,
                           lowest=-1 if lowest is None else lowest, anchors=anchors, peers=len(self.peers()),
                           standing=self.standing_report())
        self.status.set_data_plane(self.transport.stats())

    def with_cfg(self, cfg: D) -> RoleContext[D]:
        """This context with ``cfg`` narrowed to one role's config (same identity, store, transport,
        status and stop flag)."""
        return RoleContext(cfg=cfg, identity=self.identity, store=self.store, transport=self.transport,
                           status=self.status, stop=self.stop, log=self.log, admission=self.admission, _book=self.book)

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` unless asked to stop; True if stopping."""
        return self.stop.wait(seconds)
