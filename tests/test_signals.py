"""Stopping on Ctrl+C / SIGTERM never deadlocks a daemon that waits on its stop event."""

from __future__ import annotations

import signal
import threading

from pulse_node.signals import stop_on_signals


def test_handler_sets_the_event_even_while_the_main_thread_holds_its_lock():
    stop = threading.Event()
    previous = stop_on_signals(stop)
    try:
        handler = signal.getsignal(signal.SIGINT)
        # A signal can land while the main thread is inside stop.wait(), holding the event's
        # internal non-reentrant lock; a handler calling stop.set() there would hang forever.
        with stop._cond:
            handler(signal.SIGINT, None)
        assert stop.wait(5.0)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    assert signal.getsignal(signal.SIGINT) is previous[signal.SIGINT]
