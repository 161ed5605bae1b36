"""Ctrl+C / SIGTERM handling for daemons that stop by setting a ``threading.Event``.

Setting the event inside the signal handler itself can deadlock: the handler runs on the main
thread, possibly while that thread is inside ``stop.wait()`` holding the event's internal,
non-reentrant lock. The handler therefore hands ``set()`` to a short-lived thread.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def stop_on_signals(stop: threading.Event, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> dict[int, Any]:
    """Install handlers that set ``stop``; returns the previous handlers (to restore them)."""

    def handler(signum: int, frame: object) -> None:
        threading.Thread(target=stop.set, name="signal-stop", daemon=True).start()

    return {sig: signal.signal(sig, handler) for sig in signals}
