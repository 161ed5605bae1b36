"""Pushes in the background: publishing or applying a version never waits on a peer.

A trainer pushes each new head to every peer it knows, an inference node to the other inference
nodes. Done inline, one peer that never answers held the version back for the whole push
timeout, and a flood of records announcing dead addresses for minutes (issue 21). ``Fanout``
takes a job (kind, data, peers) and returns at once; the peers of each are taken in the one order
of ``net/peers/standing.py`` (members, then peers with standing, then a few without), with short
per-push timeouts. Two lanes, one thread each: members and peers with standing (``known``), and
the newcomers. A job's pushes to newcomers run on their own lane, so a silent newcomer (a fresh
key's record announcing an address that never answers) costs only other newcomers its timeout:
with one lane, each job waited for it, and the next head reached the inference nodes a push
timeout late (an inference node 2-3 versions behind in the record floods, issue 21). In each lane
at most one job per kind waits: a newer head replaces an older one not yet sent (``superseded``).
A failed push is reported (``on_error``), which demotes the peer.
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

Order = Callable[[list[PeerRecord]], list[PeerRecord]]


class Fanout:
    """A bounded background pusher: two lanes (known peers, newcomers), one worker thread each
    (``daemon/background.py``), at most one waiting job per kind in each."""

    def __init__(self, transport: Transport, *, order: Order = list, known: Callable[[str], bool] = lambda _: True,
                 timeout: float = PUSH_TIMEOUT_S,
                 on_error: Callable[[PeerRecord, PulseError], None] | None = None) -> None:
        self.transport, self.order, self.known, self.timeout, self.on_error = transport, order, known, timeout, on_error
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # the two lanes count into one Counter
        self._worker = Background("fanout")
        self._newcomers = Background("fanout-newcomers")

    @property
    def counts(self) -> Counter[str]:
        """Jobs submitted and superseded (in the known peers' lane), pushes made, failed and
        skipped (by the order's quota)."""
        superseded = sum(n for k, n in self._worker.counts.items() if k.endswith("_superseded"))
        with self._lock:
            return self._counts + Counter(superseded=superseded)

    def submit(self, kind: PushKind, data: bytes, peers: list[PeerRecord]) -> None:
        """Push ``data`` to ``peers`` soon; returns at once. Replaces a waiting job of ``kind``."""
        targets = list(peers)
        with self._lock:
            self._counts["submitted"] += 1
        self._worker.submit(kind, lambda: self._push(kind, data, targets))

    def idle(self) -> bool:
        return self._worker.idle() and self._newcomers.idle()

    def _push(self, kind: PushKind, data: bytes, peers: list[PeerRecord]) -> None:
        targets = self.order(peers)
        with self._lock:
            self._counts["skipped"] += len(peers) - len(targets)
        known: list[PeerRecord] = []
        others: list[PeerRecord] = []
        for p in targets:
            (known if self.known(p.peer_id) else others).append(p)
        if others:
            self._newcomers.submit(kind, lambda: self._send(kind, data, others))
        self._send(kind, data, known)

    def _send(self, kind: PushKind, data: bytes, targets: list[PeerRecord]) -> None:
        failed = push_to_all(self.transport, targets, kind, data, timeout=self.timeout, on_error=self.on_error)
        with self._lock:
            self._counts["pushed"] += len(targets) - failed
            self._counts["failed"] += failed

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking jobs; waits up to ``timeout`` in all for the ones in flight."""
        deadline = time.monotonic() + timeout
        for lane in (self._worker, self._newcomers):
            lane.close(max(0.0, deadline - time.monotonic()))
