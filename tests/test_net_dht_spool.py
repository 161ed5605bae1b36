"""The p2pd push plane's file spool (``net/local/spool.py``): payloads above the old 48 MiB cap.

Run: ``/work/venv/bin/python -m pytest -q tests/test_net_dht_spool.py``. Fast unit tests of the
spool, the inbox budgets and the inbound handler (a real asyncio stream, no p2pd), then three
real DHT workers on 127.0.0.1 port 0 started at once and shared by the module: a sender and a
receiver with default spools, and a receiver with a tiny disk budget that one test stops. Last,
the wire fallback's own 48 MiB cap (``P2PTransport.push``), with stand-ins for both workers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import resource
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import gather, wait_for

from pulse_node.errors import PeerUnavailable, WireError
from pulse_node.net.dht.client import DhtClient, DhtConfig
from pulse_node.net.dht.push import CAPS, PushHeader, PushPlane
from pulse_node.net.local.inbox import EVENTS_BYTES_PER_CALL, Inbox
from pulse_node.net.local.spool import THRESHOLD, Spool
from pulse_node.net.wire import protocol as wp
from pulse_node.vocab import Event

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
SMALL_DISK = 3 * THRESHOLD  # the third worker's disk budget: one 2-MiB push fits, a second does not


def _answer(reply: bytes) -> wp.Response:
    assert len(reply) >= 4, f"no answer: {reply!r}"
    return wp.Response.decode(reply[4:4 + wp.frame_length(reply[:4], wp.RESPONSE_CAP)])


# ---- spool and inbox, no network ------------------------------------------------------------
def test_prepare_makes_a_private_dir_and_removes_an_earlier_runs_files(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir(mode=0o755)
    (d / "in-stale.push").write_bytes(b"x")
    os.symlink("/etc/hostname", d / "link")
    spool = Spool(d).prepare()
    assert spool.files() == [] and (d.stat().st_mode & 0o777) == 0o700
    path = spool.write_file(b"payload")
    assert path.parent == spool.directory and spool.take(str(path), 7) == b"payload" and spool.files() == []


def test_paths_outside_the_spool_or_of_another_size_are_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool").prepare()
    outside = tmp_path / "secret"
    outside.write_bytes(b"s" * 10)
    link = spool.directory / ("in-" + "0" * 24 + ".push")
    os.symlink(outside, link)  # a spool-like name that resolves outside
    for bad in (str(outside), str(link), str(spool.directory / ".." / "secret"), "", None, 7):
        with pytest.raises(WireError):
            spool.open_checked(bad, 10)
        with pytest.raises(WireError):
            spool.take(bad, 10)
    assert outside.read_bytes() == b"s" * 10  # never deleted through a bad path
    path = spool.write_file(b"abc")
    with pytest.raises(WireError, match="expected 4"):
        spool.take(str(path), 4)
    assert not path.exists()  # our own file of the wrong size is removed all the same


def test_spooled_events_use_the_disk_budget_and_cost_nothing_per_call() -> None:
    inbox = Inbox(max_events=8, max_bytes=100 << 20, max_disk_bytes=100 << 20)
    for i in range(2):
        assert inbox.reserve(40 << 20, spooled=True)
        inbox.put(Event("loco", "p", b"", float(i)), path=f"/s/in-{i}", size=40 << 20)
    assert not inbox.reserve(40 << 20, spooled=True)  # disk budget full
    assert inbox.reserve(40 << 20)  # the memory budget is separate
    inbox.put(Event("loco", "p", b"m" * (40 << 20), 2.0))
    assert EVENTS_BYTES_PER_CALL < 3 * (40 << 20)
    assert len(inbox.take_ready(8)) == 3  # only the in-memory 40 MiB counts against one answer
    assert inbox.reserve(80 << 20, spooled=True) and inbox.reserve(80 << 20)  # everything released


class _Writer:
    """Stands in for a p2pd stream's writer: collects what the handler answers."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _handle(plane: PushPlane, raw: bytes, *, eof: bool = True) -> _Writer:
    """Feed ``raw`` (then EOF) to ``plane.handle`` as one inbound stream."""
    async def run() -> _Writer:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        if eof:
            reader.feed_eof()
        writer = _Writer()
        info = SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda: "12D3KooWsender"))
        await plane.handle(info, reader, writer)  # type: ignore[arg-type]
        return writer
    return asyncio.run(run())


def _header(size: int) -> bytes:
    return PushHeader(v=wp.WIRE_VERSION, kind="loco", size=size).encode()


def test_inbound_body_goes_to_a_spool_file_and_failures_leave_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_push=8 * THRESHOLD, disk_bytes=16 * THRESHOLD).prepare()
    plane = PushPlane(None, spool=spool)
    body = os.urandom(3 * THRESHOLD)
    assert _answer(bytes(_handle(plane, _header(len(body)) + body).out)).status == "ok"
    (queued,) = plane.inbox.take_ready(4)
    assert queued.event.data == b"" and queued.size == len(body) and spool.take(queued.path, queued.size) == body
    small = b"s" * THRESHOLD  # at the threshold: in memory, as before
    _handle(plane, _header(len(small)) + small)
    assert [(q.event.data, q.path) for q in plane.inbox.take_ready(4)] == [(small, None)]

    writer = _handle(plane, _header(len(body)) + body[:THRESHOLD + 5])  # the sender is cut mid-body
    assert writer.out == b"" and plane.errors["inbound_cut"] == 1
    assert _answer(bytes(_handle(plane, _header(9 * THRESHOLD)).out)).status == "too_large"
    assert spool.files() == [] and len(plane.inbox) == 0

    old = resource.getrlimit(resource.RLIMIT_FSIZE)  # a disk that fills up after 1.5 MiB
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (THRESHOLD + THRESHOLD // 2, old[1]))
    try:
        reply = _answer(bytes(_handle(plane, _header(len(body)) + body).out))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert reply.status == "busy" and "spool write failed" in reply.message and plane.errors["spool_write"] == 1
    spool.directory.rmdir()  # the spool is gone: refused, not crashed
    assert _answer(bytes(_handle(plane, _header(len(body)) + body).out)).status == "busy"
    assert plane.inbox.reserve(16 * THRESHOLD, spooled=True)  # every refused push gave its room back
    plane.close()


def test_the_worker_removes_files_nobody_collected_when_it_stops(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool").prepare()
    plane = PushPlane(None, spool=spool)
    body = os.urandom(2 * THRESHOLD)
    _handle(plane, _header(len(body)) + body)
    assert len(spool.files()) == 1
    plane.close()
    assert spool.files() == []


# ---- three real workers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def swarm():
    """(sender, receiver, small receiver) DhtClients with spools in one temporary directory."""
    with tempfile.TemporaryDirectory(prefix="pulse-spool-test-") as d:
        base = Path(d)
        configs = [DhtConfig(run_id="spool-test", host_maddrs=LOCAL, identity=base / f"{n}.key",
                             accept_pushes=True, spool_dir=base / f"spool-{n}") for n in ("sender", "receiver")]
        configs.append(DhtConfig(run_id="spool-test", host_maddrs=LOCAL, identity=base / "small.key",
                                 accept_pushes=True, spool_dir=base / "spool-small",
                                 spool_max_push_bytes=2 * THRESHOLD, spool_disk_bytes=SMALL_DISK))
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(DhtClient.start, c) for c in configs]
            clients = [f.result() for f in futures]
            try:
                # the sender is a trainer-set member for the receiver (a non-member's share is 48 MiB)
                clients[1].set_members([clients[0].info().peer_id])
                yield SimpleNamespace(sender=clients[0], receiver=clients[1], small=clients[2])
            finally:
                list(pool.map(lambda c: c.stop(timeout=4), clients))


def _target(client: DhtClient) -> tuple[str, list[str]]:
    info = client.info()
    return info.peer_id, info.visible_maddrs


@pytest.mark.slow
def test_a_payload_above_the_old_cap_arrives_byte_identical_and_leaves_no_files(swarm) -> None:
    rid, maddrs = _target(swarm.receiver)
    data = os.urandom(80_000_000)
    assert len(data) > CAPS["loco"] == 48 << 20
    swarm.sender.push(rid, maddrs, "loco", data, timeout=120)
    (ev,) = gather(swarm.receiver.events, count=1, timeout=30, what="the push event")
    assert ev.kind == "loco" and ev.sender == swarm.sender.info().peer_id
    assert len(ev.data) == len(data) and hashlib.sha256(ev.data).digest() == hashlib.sha256(data).digest()
    assert swarm.sender.spool.files() == [] and swarm.receiver.spool.files() == []
    stats = swarm.receiver.push_stats()
    assert stats.caps["loco"] == 1 << 30 and stats.bytes_in["loco"] >= len(data)


@pytest.mark.slow
def test_small_pushes_still_travel_as_bytes(swarm) -> None:
    rid, maddrs = _target(swarm.receiver)
    for body in (b"tiny", os.urandom(THRESHOLD)):
        swarm.sender.push(rid, maddrs, "loco", body, timeout=30)
        assert [e.data for e in gather(swarm.receiver.events, count=1, timeout=30, what="the push event")] == [body]
    assert swarm.receiver.spool.files() == []


@pytest.mark.slow
def test_an_oversized_declared_size_is_refused_before_anything_is_written(swarm) -> None:
    rid, maddrs = _target(swarm.receiver)
    too_big = _header((1 << 30) + 1) + b"x" * 1000
    assert _answer(swarm.sender.probe(rid, too_big, maddrs=maddrs)).status == "too_large"
    assert swarm.receiver.spool.files() == [] and swarm.receiver.events() == []
    over = 2 * THRESHOLD + 1  # above the small worker's cap
    with pytest.raises(WireError, match="exceeds cap"):  # its client refuses before writing a file
        swarm.small.push(rid, maddrs, "loco", b"\0" * over, timeout=5)
    with pytest.raises(WireError, match="exceeds cap"):  # its worker refuses before opening one
        swarm.small.push_file(rid, maddrs, "loco", swarm.small.spool.directory / "out-x.push", over, timeout=5)
    assert swarm.small.spool.files() == []


@pytest.mark.slow
def test_a_sender_cut_mid_body_leaves_no_partial_file(swarm) -> None:
    rid, maddrs = _target(swarm.receiver)
    cuts = swarm.receiver.push_stats().errors.get("inbound_cut", 0)
    raw = _header(8 * THRESHOLD) + os.urandom(3 * THRESHOLD)  # declares 8 MiB, sends 3, then closes
    probe = threading.Thread(target=swarm.sender.probe, args=(rid, raw), kwargs={"maddrs": maddrs, "timeout": 3})
    probe.start()
    try:
        wait_for(lambda: swarm.receiver.spool.files() != [], timeout=10, what="the partial spool file")
    finally:
        probe.join(20)
    wait_for(lambda: swarm.receiver.push_stats().errors.get("inbound_cut", 0) > cuts, timeout=20,
             what="the receiver to notice the cut")
    assert swarm.receiver.spool.files() == [] and swarm.receiver.events() == []


@pytest.mark.slow
def test_the_worker_refuses_a_file_outside_its_spool(swarm, tmp_path: Path) -> None:
    rid, maddrs = _target(swarm.receiver)
    outside = tmp_path / "out-000000000000000000000000.push"
    outside.write_bytes(b"secret" * 1000)
    link = swarm.sender.spool.directory / ("out-" + "1" * 24 + ".push")
    os.symlink(outside, link)
    try:
        for path in (outside, link, swarm.sender.spool.directory / ".." / outside.name):
            with pytest.raises(WireError, match="is not a file of the spool"):
                swarm.sender.push_file(rid, maddrs, "loco", path, 6000, timeout=5)
        good = swarm.sender.spool.write_file(b"g" * (2 * THRESHOLD))
        with pytest.raises(WireError, match="expected"):  # the announced size must match
            swarm.sender.push_file(rid, maddrs, "loco", good, 2 * THRESHOLD + 1, timeout=5)
        good.unlink()
    finally:
        link.unlink()
    assert outside.read_bytes() == b"secret" * 1000 and swarm.receiver.events() == []


@pytest.mark.slow
def test_a_trainer_lowers_the_cap_to_its_models_payload_bound(swarm) -> None:
    """``set_push_cap`` (a trainer's agreement: ``loco/bound.max_payload_bytes`` of its shapes): a push
    above it is refused on its declared size, before a byte of it is read or spooled."""
    rid, maddrs = _target(swarm.receiver)
    cap = 2 * THRESHOLD
    assert swarm.receiver.set_push_cap("loco", cap) == cap and swarm.receiver.spool.max_push == cap
    assert swarm.receiver.set_push_cap("loco", 1 << 30) == cap, "a cap was raised"
    assert _answer(swarm.sender.probe(rid, _header(cap + 1) + b"x" * 1000, maddrs=maddrs)).status == "too_large"
    body = os.urandom(cap)
    swarm.sender.push(rid, maddrs, "loco", body, timeout=30)
    assert [e.data for e in gather(swarm.receiver.events, count=1, timeout=30, what="the push event")] == [body]
    assert swarm.receiver.spool.files() == [] and swarm.receiver.push_stats().caps["loco"] == cap


@pytest.mark.slow
def test_a_full_spool_answers_busy_and_a_stopped_worker_leaves_it_empty(swarm) -> None:
    sid, maddrs = _target(swarm.small)
    body = os.urandom(2 * THRESHOLD)
    swarm.sender.push(sid, maddrs, "loco", body, timeout=30)  # queued, never collected
    with pytest.raises(PeerUnavailable):  # refused before the body: the sender sees its stream closed
        swarm.sender.push(sid, maddrs, "loco", body, timeout=30)
    assert swarm.small.push_stats().errors.get("refused_busy") == 1
    assert len(swarm.small.spool.files()) == 1 and swarm.sender.spool.files() == []
    swarm.small.stop(timeout=4)
    assert swarm.small.spool.files() == []


def test_the_wire_fallback_refuses_a_payload_above_its_cap_with_a_clear_error() -> None:
    import base58

    from pulse_node.chain.peer import PeerRecord
    from pulse_node.config import TrainerConfig
    from pulse_node.daemon.p2p import P2PTransport
    from pulse_node.net.wire.client import WireInfo

    class NoWorkerWire:  # only ``info``: anything reaching the wire worker would fail loudly
        def info(self) -> WireInfo:
            return WireInfo(peer_id="12D3KooWme", listen_maddrs=[])

    tried: list[int] = []

    def p2pd_down(peer_id: str, maddrs: list[str], kind: str, data: bytes, *, timeout: float) -> None:
        tried.append(len(data))
        raise PeerUnavailable("p2pd plane down")

    transport = P2PTransport(TrainerConfig(), SimpleNamespace(push=p2pd_down), NoWorkerWire())  # type: ignore[arg-type]
    peer_id = base58.b58encode(b"\x00\x24\x08\x01\x12\x20" + os.urandom(32)).decode()
    peer = PeerRecord(role="trainer", peer_id=peer_id, session="ab" * 16, updated_at=1.0,
                      wire_maddrs=[f"/ip4/127.0.0.1/tcp/9/p2p/{peer_id}"], dht_maddrs=[f"/ip4/127.0.0.1/tcp/9/p2p/{peer_id}"])
    with pytest.raises(WireError, match="exceeds the wire plane's cap of 50331648 bytes"):
        transport.push(peer, "loco", b"\0" * (wp.PUSH_CAPS["loco"] + 1), timeout=5)
    assert tried == [wp.PUSH_CAPS["loco"] + 1]  # p2pd was tried first; the wire then refused without trying
