"""A failure injected after one named step of an apply (``codec/failpoints.py``), for tests.

``FailAt("hashed")`` is handed to the code under test where production passes ``NEVER`` (the
syncer's, the pipeline's and the live model's ``failpoints``); the ``nth`` time that step is
reached it raises ``error(step)``, once, and every step reached is recorded, so a test sees the
apply run exactly as it runs in production up to the failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pulse_node.codec.failpoints import STEPS
from pulse_node.errors import PulseError


class InjectedFault(PulseError):
    """A typed failure put there by a test (what a failed fetch or check raises in production)."""


class InjectedBug(RuntimeError):
    """An untyped failure put there by a test (what a bug raises)."""


class FailAt:
    """Raises at the ``nth`` time ``step`` is reached (once); records the steps reached."""

    def __init__(self, step: str, *, nth: int = 1,
                 error: Callable[[str], BaseException] = lambda step: InjectedFault(f"injected after {step}")) -> None:
        if step not in STEPS:
            raise ValueError(f"unknown step {step!r} (one of {', '.join(STEPS)})")
        self.step, self.nth, self.error = step, nth, error
        self.seen: list[str] = []
        self.fired = False
        self._lock = threading.Lock()

    def reached(self, step: str) -> None:
        with self._lock:  # decodes and live-model writes report from their own threads
            self.seen.append(step)
            if self.fired or step != self.step or self.seen.count(step) != self.nth:
                return
            self.fired = True
        raise self.error(step)
