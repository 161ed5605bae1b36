"""The p2pd push plane (``net/dht/push.py``) between two real DHT workers on 127.0.0.1.

Run: ``/work/venv/bin/python -m pytest -q tests/test_net_dht_push.py``. Two workers start in
parallel without knowing each other; pushes dial the receiver's advertised DHT addresses. One
module-scoped pair serves every test (each start imports hivemind, ~10 s on a busy box).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import base58
import pytest
from helpers import gather

from pulse_node.errors import PeerUnavailable, WireError
from pulse_node.net.dht.client import DhtClient, DhtConfig
from pulse_node.net.dht.push import CAPS, PushHeader
from pulse_node.net.wire import protocol as wp

pytestmark = pytest.mark.slow  # DHT worker processes (hivemind, p2pd)

LOCAL = ["/ip4/127.0.0.1/tcp/0"]


@pytest.fixture(scope="module")
def pair():
    """(receiver, sender, receiver's peer id, receiver's DHT maddrs); both serve pushes."""
    with tempfile.TemporaryDirectory(prefix="pulse-push-test-") as d:
        configs = [DhtConfig(run_id="push-test", host_maddrs=LOCAL, identity=Path(d) / f"{n}.key",
                             accept_pushes=True) for n in ("a", "b")]
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(DhtClient.start, c) for c in configs]
            clients = [f.result() for f in futures]
            try:
                info = clients[0].info()
                yield clients[0], clients[1], info.peer_id, info.visible_maddrs
            finally:
                list(pool.map(lambda c: c.stop(timeout=4), clients))


def _answer(reply: bytes) -> wp.Response:
    assert len(reply) >= 4, f"no answer: {reply!r}"
    return wp.Response.decode(reply[4:4 + wp.frame_length(reply[:4], wp.RESPONSE_CAP)])


def test_multi_mb_payload_arrives_byte_exact_from_the_authenticated_sender(pair) -> None:
    receiver, sender, rid, maddrs = pair
    data = os.urandom(24 << 20)
    t0 = time.monotonic()
    sender.push(rid, maddrs, "loco", data, timeout=60)
    seconds = time.monotonic() - t0
    (ev,) = gather(receiver.events, count=1, timeout=30, what="the push event")
    assert ev.kind == "loco" and ev.sender == sender.info().peer_id
    assert len(ev.data) == len(data) and hashlib.sha256(ev.data).digest() == hashlib.sha256(data).digest()
    assert sender.push_stats().bytes_out["loco"] >= len(data)
    assert receiver.push_stats().bytes_in["loco"] >= len(data)
    print(f"24 MiB over p2pd incl. local RPC: {seconds:.2f} s")
    served = receiver.ping()  # the worker's RPC methods, each a DhtClient method of the same name
    assert {"push", "push_file", "events", "peers"} <= set(served)
    assert all(callable(getattr(DhtClient, name, None)) for name in served)


def test_oversized_or_malformed_requests_are_refused_before_any_body(pair) -> None:
    receiver, sender, rid, maddrs = pair
    too_big = PushHeader(v=wp.WIRE_VERSION, kind="loco", size=CAPS["loco"] + 1).encode()
    assert _answer(sender.probe(rid, too_big, maddrs=maddrs)).status == "too_large"
    huge_frame = (1 << 30).to_bytes(4, "big")  # a header frame declared at 1 GiB
    assert _answer(sender.probe(rid, huge_frame, maddrs=maddrs)).status == "bad_request"
    other_kind = PushHeader(v=wp.WIRE_VERSION, kind="rollouts", size=10).encode() + b"x" * 10
    assert _answer(sender.probe(rid, other_kind, maddrs=maddrs)).status == "unsupported"
    errors = receiver.push_stats().errors
    assert errors.get("refused_too_large") and errors.get("refused_bad_request") and errors.get("refused_unsupported")
    assert receiver.events() == []
    with pytest.raises(WireError, match="exceeds cap"):  # the sender refuses to send one at all
        sender.push(rid, maddrs, "loco", b"\0" * (CAPS["loco"] + 1), timeout=5)
    sender.push(rid, maddrs, "loco", b"still serving", timeout=30)
    assert [e.data for e in gather(receiver.events, count=1, timeout=30, what="the push event")] == [b"still serving"]


def test_push_to_an_unreachable_peer_fails_within_its_timeout(pair) -> None:
    _, sender, _, _ = pair
    ghost = base58.b58encode(b"\x00\x24\x08\x01\x12\x20" + os.urandom(32)).decode()  # an Ed25519 id nobody runs
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailable):
        sender.push(ghost, ["/ip4/127.0.0.1/tcp/9/p2p/" + ghost], "loco", b"x", timeout=5)
    assert time.monotonic() - t0 < 5 + 3
    assert sender.push_stats().errors.get("unreachable", 0) + sender.push_stats().errors.get("timeout", 0) >= 1
