"""Pushes in the background: publishing or applying a version never waits on a peer.

A trainer pushes each new head to every peer it knows, an inference node to the other inference
nodes. Done inline, one peer that never answers held the version back for the whole push
timeout, and a flood of records announcing dead addresses for minutes (issue 21). ``Fanout``
takes a job (kind, data, peers) and returns at once; one thread works through the jobs, the
peers of each in the one order of ``net/peers/standing.py`` (members, then peers with standing, then
a few without), with short per-push timeouts. At most one job per kind waits: a newer head
replaces an older one not yet sent (``superseded``). A failed push is reported (``on_error``),
which demotes the peer.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

from pulse_node.chain.peer import PeerRecord
from pulse_node.daemon.transport import Transport, push_to_all
from pulse_node.errors import PulseError
from pulse_node.vocab import PushKind

log = logging.getLogger("pulse.fanout")

#: per-push timeout of background pushes (heads are a few hundred bytes)
PUSH_TIMEOUT_S = 3.0

Order = Callable[[list[PeerRecord]], list[PeerRecord]]


class Fanout:
    """A bounded background pusher: one worker thread, at most one waiting job per kind."""

    def __init__(self, transport: Transport, *, order: Order = list, timeout: float = PUSH_TIMEOUT_S,
                 on_error: Callable[[PeerRecord, PulseError], None] | None = None) -> None:
        self.transport, self.order, self.timeout, self.on_error = transport, order, timeout, on_error
        self.counts: Counter[str] = Counter()
        self._pending: dict[PushKind, tuple[bytes, list[PeerRecord]]] = {}
        self._busy = False
        self._closed = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="fanout", daemon=True)
        self._thread.start()

    def submit(self, kind: PushKind, data: bytes, peers: list[PeerRecord]) -> None:
        """Push ``data`` to ``peers`` soon; returns at once. Replaces a waiting job of ``kind``."""
        with self._cv:
            if self._closed:
                return
            if kind in self._pending:
                self.counts["superseded"] += 1
            self._pending[kind] = (data, list(peers))
            self.counts["submitted"] += 1
            self._cv.notify()

    def idle(self) -> bool:
        with self._cv:
            return not self._pending and not self._busy

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                kind = next(iter(self._pending))
                data, peers = self._pending.pop(kind)
                self._busy = True
            try:
                targets = self.order(peers)
                self.counts["skipped"] += len(peers) - len(targets)
                failed = push_to_all(self.transport, targets, kind, data,
                                     timeout=self.timeout, on_error=self.on_error)
                self.counts["pushed"] += len(targets) - failed
                self.counts["failed"] += failed
            except Exception as exc:  # a bug must not end the fan-out thread
                log.warning("background %s push failed: %s", kind, exc)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking jobs; waits up to ``timeout`` for the one in flight."""
        with self._cv:
            self._closed = True
            self._pending.clear()
            self._cv.notify_all()
        self._thread.join(timeout)
