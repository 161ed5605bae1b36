"""``push_to_all``: every peer gets the push, failures are counted, and the pushes run at once
(one vanished peer must not hold back the others for its whole timeout)."""

from __future__ import annotations

import threading

import pytest

from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.daemon.transport import push_to_all
from pulse_node.errors import WireError
from pulse_node.testing.memory import announced


class BarrierTransport:
    """Each push waits until ``parties`` pushes are in flight together (or fails the wait)."""

    peer_id = "me"

    def __init__(self, parties: int, failing: set[str]) -> None:
        self.barrier = threading.Barrier(parties, timeout=10.0)
        self.failing = failing
        self.got: list[str] = []
        self.lock = threading.Lock()

    def push(self, peer: PeerRecord, kind: str, data: bytes, *, timeout: float) -> None:
        self.barrier.wait()  # BrokenBarrierError (a test failure) if pushes ran one after another
        if peer.peer_id in self.failing:
            raise WireError(f"{peer.peer_id} unreachable")
        with self.lock:
            self.got.append(peer.peer_id)


def _peers(n: int) -> list[PeerRecord]:
    return [announced(f"p{i}", PeerStatus(role="inference", wire_maddrs=[f"/ip4/127.0.0.1/tcp/{4000 + i}"]))
            for i in range(n)]


def test_pushes_run_concurrently_and_failures_are_counted() -> None:
    t = BarrierTransport(parties=4, failing={"p1"})
    assert push_to_all(t, _peers(4), "head", b"record", timeout=5.0) == 1
    assert sorted(t.got) == ["p0", "p2", "p3"]


@pytest.mark.parametrize("n", [0, 1])
def test_zero_or_one_peer_needs_no_threads(n: int) -> None:
    t = BarrierTransport(parties=1, failing=set())
    assert push_to_all(t, _peers(n), "head", b"record", timeout=5.0) == 0
    assert t.got == [p.peer_id for p in _peers(n)]


def test_each_failure_is_reported_with_its_peer() -> None:
    t = BarrierTransport(parties=3, failing={"p0", "p2"})
    failed: dict[str, str] = {}
    assert push_to_all(t, _peers(3), "loco", b"payload", timeout=5.0,
                       on_error=lambda peer, exc: failed.__setitem__(peer.peer_id, str(exc))) == 2
    assert failed == {"p0": "p0 unreachable", "p2": "p2 unreachable"} and t.got == ["p1"]
