"""Named steps of applying a version, where a test may inject a failure.

Applying the next version (``codec/pipelined.py`` while it arrives, ``codec/inplace.py`` once it
is whole, then ``inference/streaming.py:apply_next`` and the live model, ``rl/liveweights.py``)
must leave the node at version v or v + 1 whole, whichever step fails. Each of those steps calls
``failpoints.reached(step)`` when it is done; production passes ``NEVER`` (a no-op), a test a
small injector (``testing/failpoints.py:FailAt``) that raises at the step it names. The apply is
then exercised exactly as it runs, never by replacing the method under test.
"""

from __future__ import annotations

from typing import Protocol

#: the steps, in the order a streamed apply passes them (the whole-patch apply: reported and
#: received first, written last, when the live model takes the changes)
STEPS = ("received", "decoded", "written", "hashed", "reported", "sealed")


class Failpoints(Protocol):
    def reached(self, step: str) -> None:
        """``step`` (one of ``STEPS``) is done; may raise (tests only)."""
        ...


class _Never:
    """Production: no step ever fails on purpose."""

    def reached(self, step: str) -> None:
        return None


NEVER: Failpoints = _Never()
