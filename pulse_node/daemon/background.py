"""Calls a role's loop must not wait for: publishing our DHT record and reading the others'.

A DHT store or read waits on the other DHT nodes' answers, and anyone can run a DHT node, store
records under free keys and answer slowly: with a 1,000-key record flood the trainers' loops
spent about a quarter of their time in ``publish_peer`` and ``peers`` (issue 21; py-spy of a
trainer). ``Background`` runs such calls on one thread, the newest call of each name replacing
one not started yet (a record newer than the one waiting supersedes it), so the loop hands a
record over and goes on, and reads the last view while the next one is fetched.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

log = logging.getLogger("pulse.background")


class Background:
    """One worker thread; at most one waiting call per name, the newest."""

    def __init__(self, name: str = "background") -> None:
        self.counts: Counter[str] = Counter()
        self._pending: dict[str, Callable[[], object]] = {}
        self._busy: str | None = None
        self._closed = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, call: Callable[[], object]) -> None:
        """Run ``call`` soon; returns at once. Replaces a waiting call of ``name``."""
        with self._cv:
            if self._closed:
                return
            if name in self._pending:
                self.counts[f"{name}_superseded"] += 1
            self._pending[name] = call
            self._cv.notify()

    def waiting_or_running(self, name: str) -> bool:
        with self._cv:
            return name in self._pending or self._busy == name

    def idle(self) -> bool:
        with self._cv:
            return not self._pending and self._busy is None

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                name = next(iter(self._pending))
                call = self._pending.pop(name)
                self._busy = name
            try:
                call()
                self.counts[name] += 1
            except Exception as exc:  # logged; the next call of that name tries again
                self.counts[f"{name}_failed"] += 1
                log.warning("background %s failed: %s", name, exc)
            finally:
                with self._cv:
                    self._busy = None
                    self._cv.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking calls; waits up to ``timeout`` for the one running."""
        with self._cv:
            self._closed = True
            self._pending.clear()
            self._cv.notify_all()
        self._thread.join(timeout)
