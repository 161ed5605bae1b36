"""Every push in the background: publishing, applying or deciding never waits on a peer.

A trainer pushes each new head to every peer it knows, its payload and decisions to the other
trainers, evidence to everyone; an inference node pushes heads to the other inference nodes and
rollouts to a trainer. Done inline, one peer that never answered held the version back for the
whole push timeout, and a flood of records announcing dead addresses for minutes (issue 21).
``Fanout`` takes a job (kind, data, peers) and returns at once; the peers of each are taken in
the one order of the peer book (``peers/standing.py``: members, then peers with standing, then a
few without, ``newcomers``), each push bounded by its timeout. Per push kind two lanes, one
thread each (``daemon/background.py``): members and peers with standing (``known``), and the
newcomers. A job's pushes to newcomers run on their own lane, so a silent newcomer (a fresh key's
record announcing an address that never answers) costs only other newcomers its timeout: with
one lane, each job waited for it, and the next head reached the inference nodes a push timeout
late (issue 21); and a kind never waits behind another (a payload push to a vanished trainer
does not hold the round's decision back). In each lane at most one job per name waits (the name
is the kind unless given): a newer head replaces an older one not yet sent (``superseded``). A
failed push is reported (``on_error``: the peer book demotes the peer).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

from pulse_node.chain.peer import PeerRecord
from pulse_node.daemon.background import Background
from pulse_node.daemon.transport import Transport, push_to_all
from pulse_node.errors import PulseError
from pulse_node.vocab import PushKind

#: per-push timeout of background pushes (heads are a few hundred bytes)
PUSH_TIMEOUT_S = 3.0
#: newcomers (peers without membership or standing) a job reaches, at most, by default
NEWCOMERS = 4

#: peers in push order, at most the given number of newcomers among them
Order = Callable[[list[PeerRecord], int], list[PeerRecord]]
OnError = Callable[[PeerRecord, PulseError], None]


def _as_is(peers: list[PeerRecord], _newcomers: int) -> list[PeerRecord]:
    return list(peers)


class Fanout:
    """A bounded background pusher: per kind two lanes (known peers, newcomers), one worker thread
    each (``daemon/background.py``), at most one waiting job per name in each."""

    def __init__(self, transport: Transport, *, order: Order = _as_is, known: Callable[[str], bool] = lambda _: True,
                 timeout: float = PUSH_TIMEOUT_S, on_error: OnError | None = None) -> None:
        self.transport, self.order, self.known, self.timeout, self.on_error = transport, order, known, timeout, on_error
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # the lanes count into one Counter
        self._lanes: dict[tuple[PushKind, bool], Background] = {}
        self._closed = False

    @property
    def counts(self) -> Counter[str]:
        """Jobs submitted and superseded (in the known peers' lanes), pushes made, failed and
        skipped (by the order's quota)."""
        with self._lock:
            superseded = sum(n for (_, known), lane in self._lanes.items() if known
                             for k, n in lane.counts.items() if k.endswith("_superseded"))
            return self._counts + Counter(superseded=superseded)

    def submit(self, kind: PushKind, data: bytes, peers: list[PeerRecord], *, job: str | None = None,
               timeout: float | None = None, newcomers: int = NEWCOMERS, on_error: OnError | None = None,
               on_sent: Callable[[PeerRecord], None] | None = None) -> None:
        """Push ``data`` to ``peers`` soon; returns at once. Replaces a waiting job of the same name
        (``job``, default ``kind``). ``timeout``: per push (default the fan-out's); ``newcomers``:
        peers without membership or standing reached, at most; ``on_error`` / ``on_sent``: told of
        each push that failed / went through (from the pushing thread)."""
        targets = list(peers)
        lane = self._lane(kind, known=True)
        if lane is None:
            return
        with self._lock:
            self._counts["submitted"] += 1
        limit = self.timeout if timeout is None else timeout
        lane.submit(job or kind, lambda: self._push(kind, data, targets, job=job or kind, timeout=limit,
                                                    newcomers=newcomers, on_error=on_error, on_sent=on_sent))

    def _lane(self, kind: PushKind, *, known: bool) -> Background | None:
        with self._lock:
            if self._closed:
                return None
            lane = self._lanes.get((kind, known))
            if lane is None:
                lane = self._lanes[kind, known] = Background(f"push-{kind}" + ("" if known else "-newcomers"))
            return lane

    def idle(self) -> bool:
        with self._lock:
            lanes = list(self._lanes.values())
        return all(lane.idle() for lane in lanes)

    def _push(self, kind: PushKind, data: bytes, peers: list[PeerRecord], *, job: str, timeout: float,
              newcomers: int, on_error: OnError | None, on_sent: Callable[[PeerRecord], None] | None) -> None:
        targets = self.order(peers, newcomers)
        with self._lock:
            self._counts["skipped"] += len(peers) - len(targets)
        known: list[PeerRecord] = []
        others: list[PeerRecord] = []
        for p in targets:
            (known if self.known(p.peer_id) else others).append(p)
        lane = self._lane(kind, known=False) if others else None
        if lane is not None:
            lane.submit(job, lambda: self._send(kind, data, others, timeout, on_error, on_sent))
        self._send(kind, data, known, timeout, on_error, on_sent)

    def _send(self, kind: PushKind, data: bytes, targets: list[PeerRecord], timeout: float,
              on_error: OnError | None, on_sent: Callable[[PeerRecord], None] | None) -> None:
        failed: set[str] = set()

        def error(peer: PeerRecord, exc: PulseError) -> None:
            failed.add(peer.peer_id)
            for tell in (self.on_error, on_error):
                if tell is not None:
                    tell(peer, exc)

        push_to_all(self.transport, targets, kind, data, timeout=timeout, on_error=error)
        with self._lock:
            self._counts["pushed"] += len(targets) - len(failed)
            self._counts["failed"] += len(failed)
        if on_sent is not None:
            for peer in targets:
                if peer.peer_id not in failed:
                    on_sent(peer)

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking jobs; waits up to ``timeout`` in all for the ones in flight."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.close(max(0.0, deadline - time.monotonic()))
