"""The role's loop never waits on a DHT store or read (``daemon/background.py``): a DHT node
anyone runs may answer slowly, and a record flood made the trainers' loops wait in them."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import base58
from helpers import wait_for

from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.config import TrainerConfig
from pulse_node.daemon.background import Background
from pulse_node.daemon.p2p import P2PTransport
from pulse_node.daemon.transport import DataPlane
from pulse_node.net.wire.client import WireInfo


def test_the_newest_call_of_a_name_replaces_a_waiting_one_and_a_failure_ends_nothing() -> None:
    bg, started, release, ran = Background(), threading.Event(), threading.Event(), []
    try:
        bg.submit("publish", lambda: started.set() or release.wait(10))  # running: the next ones wait
        assert started.wait(5)
        for n in range(5):
            bg.submit("publish", lambda n=n: ran.append(n))
        bg.submit("boom", lambda: 1 / 0)
        release.set()
        wait_for(bg.idle, timeout=10, what="the calls done")
        assert ran == [4] and bg.counts["publish_superseded"] == 4 and bg.counts["boom_failed"] == 1
        bg.submit("publish", lambda: ran.append(5))
        wait_for(lambda: ran == [4, 5], timeout=10, what="a call after a failure")
    finally:
        bg.close()


class _SlowDht:
    """A DHT worker whose stores and reads take ``delay_s`` (other DHT nodes answering slowly)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.published, self.reads = delay_s, [], 0

    def publish_peer(self, status: PeerStatus) -> bool:
        time.sleep(self.delay_s)
        self.published.append(status.version)
        return True

    def peers(self, *, prefer: list[str], limit: int) -> list[PeerRecord]:
        time.sleep(self.delay_s)
        self.reads += 1
        pid = base58.b58encode(b"\x00\x24\x08\x01\x12\x20" + os.urandom(32)).decode()
        return [PeerRecord(role="trainer", peer_id=pid, session="ab" * 16, updated_at=1.0,
                           wire_maddrs=[f"/ip4/127.0.0.1/tcp/9/p2p/{pid}"])]


def test_publishing_and_reading_peers_do_not_wait_on_the_dht() -> None:
    dht = _SlowDht(delay_s=1.0)
    wire = SimpleNamespace(info=lambda: WireInfo(peer_id="12D3KooWme", listen_maddrs=[]))
    transport = P2PTransport(TrainerConfig.model_validate({"net": {"head_poll_s": 0.01}}), dht, wire)  # type: ignore[arg-type]
    transport.stats = DataPlane  # type: ignore[method-assign]
    try:
        first = transport.peers()  # the first view is waited for: there is none before it
        assert len(first) == 1 and dht.reads == 1
        t0 = time.monotonic()
        for v in range(1, 6):
            transport.publish(PeerStatus(role="trainer", version=v))
            assert len(transport.peers()) == 1  # the last view, while the next is read
        assert time.monotonic() - t0 < 0.5, "the loop waited on the DHT"
        wait_for(lambda: dht.published and dht.published[-1] == 5, timeout=15, what="the newest record published")
        assert len(dht.published) < 5  # statuses superseded while a store was in flight were not stored
        wait_for(lambda: len(transport.peers()) == 1 and dht.reads >= 2, timeout=15, what="a background read")
    finally:
        transport._dht_calls.close()
