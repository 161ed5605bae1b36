"""The libp2p data plane end to end: real wire workers on 127.0.0.1 port 0.

Each worker is a separate process (``WireClient.start``); this test process never imports
py-libp2p. Waits are predicates with deadlines; every worker is stopped by its fixture.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest
from helpers import gather, wait_for

from pulse_node.errors import IntegrityError, NotFound, PeerUnavailable, WireError
from pulse_node.net.dht import rpc as dht_rpc
from pulse_node.net.local import ipc
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.client import WireClient, WireConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]  # worker processes
MiB = 1 << 20


def _start(stores: list[Path], **kw: object) -> list[WireClient]:
    """Start several workers in parallel (each start is ~2 s of imports)."""
    with ThreadPoolExecutor(len(stores)) as pool:
        return list(pool.map(lambda s: WireClient.start(WireConfig(store=s, **kw)), stores))


def _write(root: Path, rel: str, data: bytes) -> bytes:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return data


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """``server`` holds patch 7, record 7, catch-up 5->7 and anchor 3; ``client`` holds nothing."""
    root = tmp_path_factory.mktemp("wire")
    src, dst = root / "server", root / "client"
    files = {
        "patch": _write(src, "patches/7.patch", os.urandom(3 * MiB + 17)),
        "record": _write(src, "records/7.rec", b"signed record 7"),
        "catchup": _write(src, "catchup/5-7.patch", os.urandom(1000)),
        "anchor": _write(src, "anchors/3.safetensors", os.urandom(12 * MiB + 5)),
    }
    dst.mkdir()
    server, client = _start([src, dst])
    try:
        yield {"server": server, "client": client, "files": files, "root": root,
               "addr": server.info().listen_maddrs[0], "src": src}
    finally:
        server.stop()
        client.stop()


def test_fetch_patch_record_catchup_and_head(swarm: dict, tmp_path: Path) -> None:
    client, addr, files = swarm["client"], swarm["addr"], swarm["files"]
    r = client.fetch(addr, wp.PatchRequest(version=7), tmp_path / "7.patch",
                     expected_digest="sha256:" + _sha(files["patch"]))
    assert (tmp_path / "7.patch").read_bytes() == files["patch"] and r.bytes == len(files["patch"])
    assert r.peer == swarm["server"].info().peer_id
    client.fetch(addr, wp.RecordRequest(version=7), tmp_path / "7.rec")
    assert (tmp_path / "7.rec").read_bytes() == files["record"]
    client.fetch(addr, wp.CatchupRequest(base=5, target=7), tmp_path / "c.patch")
    assert (tmp_path / "c.patch").read_bytes() == files["catchup"]
    swarm["server"].set_head(b"head record 7")
    client.fetch(addr, wp.RecordRequest(version=None), tmp_path / "head.rec")
    assert (tmp_path / "head.rec").read_bytes() == b"head record 7"
    assert client.stats().bytes_in["patch"] >= len(files["patch"])


def test_missing_file_and_wrong_digest_leave_no_file(swarm: dict, tmp_path: Path) -> None:
    client, addr = swarm["client"], swarm["addr"]
    with pytest.raises(NotFound):
        client.fetch(addr, wp.PatchRequest(version=8), tmp_path / "8.patch")
    with pytest.raises(IntegrityError):
        client.fetch(addr, wp.PatchRequest(version=7), tmp_path / "7.patch", expected_digest="0" * 64)
    with pytest.raises(WireError, match="not a fetch request"):  # a push frame is no fetch: refused before sending
        client.fetch(addr, wp.PushRequest(v=wp.WIRE_VERSION, kind="loco", size=1), tmp_path / "7.patch")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_push_then_events_long_poll(swarm: dict) -> None:
    server, client, addr = swarm["server"], swarm["client"], swarm["addr"]
    t0 = time.monotonic()
    assert server.events(wait_s=0.3) == []
    assert 0.25 <= time.monotonic() - t0 < 5
    got: list = []
    poller = threading.Thread(target=lambda: got.extend(server.events(wait_s=20)))
    poller.start()
    client.push(addr, "rollouts", b"r" * 1000)
    poller.join(timeout=25)
    client.push(addr, "loco", os.urandom(3 * MiB))
    got += gather(lambda: server.events(max_events=8), count=2 - len(got), timeout=10, what="two events")
    assert [e.kind for e in got] == ["rollouts", "loco"]
    assert got[0].data == b"r" * 1000 and len(got[1].data) == 3 * MiB
    assert {e.sender for e in got} == {client.info().peer_id}
    with pytest.raises(WireError, match="exceeds cap"):
        client.push(addr, "head", b"h" * (wp.PUSH_CAPS["head"] + 1))


def _reply(raw: bytes) -> wp.Response:
    n = wp.frame_length(raw[:4], wp.RESPONSE_CAP)
    return wp.Response.decode(raw[4:4 + n])


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("kind, raw, status", [
    ("patch", b"\xff\xff\xff\xff", "bad_request"),  # declared length far above the cap
    ("patch", _frame(b"\xc1garbage"), "bad_request"),
    ("patch", _frame(msgpack.packb({"v": 99, "version": 7})), "unsupported"),
    ("anchor", _frame(msgpack.packb({"v": wp.WIRE_VERSION, "version": 3, "offset": 0})), "bad_request"),
    ("push", _frame(msgpack.packb({"v": wp.WIRE_VERSION, "kind": "head", "size": wp.PUSH_CAPS["head"] + 1})),
     "too_large"),
    ("push", _frame(msgpack.packb({"v": wp.WIRE_VERSION, "kind": "nope", "size": 1})), "bad_request"),
    ("push", _frame(msgpack.packb({"v": wp.WIRE_VERSION, "kind": "rollout", "size": 1})), "bad_request"),  # old name
])
def test_hostile_stream_frames_get_an_error_and_server_stays_up(swarm: dict, tmp_path: Path, kind: str,
                                                                raw: bytes, status: str) -> None:
    client, addr = swarm["client"], swarm["addr"]
    assert _reply(client.probe(addr, kind, raw)).status == status
    client.fetch(addr, wp.RecordRequest(version=7), tmp_path / "7.rec", timeout=10)
    assert swarm["server"].process.alive()


def test_hostile_rpc_frames_get_an_error_and_worker_stays_up(swarm: dict) -> None:
    server = swarm["server"]
    for raw in (b"\xff\xff\xff\xff", _frame(b"\xc1\xc1"), _frame(msgpack.packb([1, 2]))):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(server.process.socket_path)
            s.sendall(raw)
            n = ipc.frame_length(s.recv(4))
            reply = ipc.decode_body(s.recv(n))
            assert reply["ok"] is False and reply["error"] == "WireError" and reply["message"]
    with pytest.raises(ipc.RpcError, match="Info is not a request of the wire worker"):  # refused before it is sent
        server.request(dht_rpc.Info(), timeout=5)
    pool = server._pool  # below the client's name check: the worker itself refuses
    with pytest.raises(WireError, match="unknown method"):
        pool.call("no_such_method", None, timeout=5)
    with pytest.raises(WireError, match="fetch: bad params: kind"):
        pool.call("fetch", {"peer": "x", "kind": "rollout", "request": b"", "dest": "/tmp/x", "timeout": 1}, timeout=5)
    with pytest.raises(WireError, match="fetch: bad params: dest: Field required"):
        pool.call("fetch", {"peer": "x", "kind": "patch", "request": b"", "timeout": 1}, timeout=5)
    with pytest.raises(WireError, match="PatchRequest fields"):  # the request body is checked as a peer's is
        pool.call("fetch", {"peer": "x", "kind": "patch", "request": wp.CatchupRequest(base=1, target=2).body(),
                            "dest": "/tmp/x", "timeout": 1}, timeout=5)
    with pytest.raises(WireError, match="push: bad params: timeout: Input should be a valid number"):
        pool.call("push", {"peer": "x", "kind": "loco", "data": b"", "timeout": "1"}, timeout=5)
    assert server.info().peer_id
    served = server.ping()  # the worker's RPC methods, each a WireClient method of the same name
    assert {"fetch", "fetch_anchor", "push", "events"} <= set(served)
    assert all(callable(getattr(WireClient, name, None)) for name in served)


def test_fetch_from_dead_or_silent_peer_times_out(swarm: dict, tmp_path: Path) -> None:
    client = swarm["client"]
    [gone] = _start([swarm["root"] / "gone"])
    gone_addr, peer_id = gone.info().listen_maddrs[0], gone.info().peer_id
    gone.stop()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts TCP connections in the kernel, never speaks
    try:
        silent_addr = f"/ip4/127.0.0.1/tcp/{silent.getsockname()[1]}/p2p/{peer_id}"
        for addr in (gone_addr, silent_addr):
            t0 = time.monotonic()
            with pytest.raises(PeerUnavailable):
                client.fetch(addr, wp.PatchRequest(version=7), tmp_path / "x", timeout=2.0)
            assert time.monotonic() - t0 < 2.0 + 1.5, addr
    finally:
        silent.close()
    client.fetch(swarm["addr"], wp.RecordRequest(version=7), tmp_path / "7.rec", timeout=10)


def test_dial_to_an_address_that_drops_syns_fails_within_the_dial_timeout(swarm: dict, tmp_path: Path) -> None:
    """A NATed peer's private address (or a firewall) drops SYNs: the dial gives up after the
    dial timeout, not after the request's whole deadline (bench/nat.py measured 60 s)."""
    [client] = _start([tmp_path / "client"], dial_timeout_s=1.0)
    peer_id = swarm["client"].info().peer_id  # a peer this new client has no connection to
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)
    filler = socket.create_connection(blackhole.getsockname(), timeout=5)  # the accept queue is now full:
    try:  # the kernel drops further SYNs, as a route into a private network does
        addr = f"/ip4/127.0.0.1/tcp/{blackhole.getsockname()[1]}/p2p/{peer_id}"
        t0 = time.monotonic()
        with pytest.raises(PeerUnavailable, match="no connection within 1 s"):
            client.fetch(addr, wp.RecordRequest(version=7), tmp_path / "x", timeout=30.0)
        assert time.monotonic() - t0 < 1.0 + 4.0
        assert client.stats().errors["dial_timeout"] == 1
        client.fetch(swarm["addr"], wp.RecordRequest(version=7), tmp_path / "7.rec", timeout=10)  # live peers: fine
    finally:
        filler.close()
        blackhole.close()
        client.stop()


def test_anchor_from_several_providers_survives_missing_and_dying_provider(swarm: dict, tmp_path: Path) -> None:
    client, anchor = swarm["client"], swarm["files"]["anchor"]
    slow_root, empty_root = tmp_path / "slow", tmp_path / "empty"
    _write(slow_root, "anchors/3.safetensors", anchor)
    empty_root.mkdir()
    slow, empty = _start([slow_root, empty_root], max_upload_rate=float(MiB))
    try:
        peers = [empty.info().listen_maddrs[0], slow.info().listen_maddrs[0], swarm["addr"]]
        result: dict = {}
        job = threading.Thread(target=lambda: result.update(r=client.fetch_anchor(
            peers, version=3, size=len(anchor), dest=tmp_path / "a.st", digest=_sha(anchor),
            timeout=40, chunk=MiB)))
        job.start()
        wait_for(lambda: slow.stats().bytes_out.get("anchor", 0) >= 128 * 1024, timeout=20, interval=0.02,
             what="slow provider sending")
        slow.process.proc.kill()  # dies mid-transfer: its chunks must move to another provider
        job.join(timeout=45)
        r = result["r"]
    finally:
        slow.stop()
        empty.stop()
    assert (tmp_path / "a.st").read_bytes() == anchor
    assert set(r.failed_providers) == set(peers[:2])  # the one without the file, the one that died
    assert "not_found" in r.errors[peers[0]] and peers[1] in r.errors
    assert r.fetched == len(anchor) and r.resumed == 0
    assert not (tmp_path / "a.st.part").exists() and not (tmp_path / "a.st.part.map").exists()


def test_anchor_resumes_after_partial_download(swarm: dict, tmp_path: Path) -> None:
    client, anchor = swarm["client"], swarm["files"]["anchor"]
    slow_root = tmp_path / "slow"
    _write(slow_root, "anchors/3.safetensors", anchor)
    [slow] = _start([slow_root], max_upload_rate=float(4 * MiB))
    try:
        with pytest.raises(PeerUnavailable, match="timed out"):
            client.fetch_anchor([slow.info().listen_maddrs[0]], version=3, size=len(anchor),
                                dest=tmp_path / "a.st", digest=_sha(anchor), timeout=1.5, chunk=MiB)
    finally:
        slow.stop()
    assert (tmp_path / "a.st.part.map").exists() and not (tmp_path / "a.st").exists()
    r = client.fetch_anchor([swarm["addr"]], version=3, size=len(anchor), dest=tmp_path / "a.st",
                            digest=_sha(anchor), timeout=30, chunk=MiB)
    assert (tmp_path / "a.st").read_bytes() == anchor
    assert 0 < r.resumed < len(anchor) and r.fetched == len(anchor) - r.resumed


def test_corrupt_provider_is_caught_by_the_digest(swarm: dict, tmp_path: Path) -> None:
    client, anchor = swarm["client"], swarm["files"]["anchor"]
    with pytest.raises(IntegrityError):
        client.fetch_anchor([swarm["addr"]], version=3, size=len(anchor), dest=tmp_path / "a.st",
                            digest="1" * 64, timeout=30, chunk=4 * MiB)
    assert list(tmp_path.iterdir()) == []


def _pieces(data: bytes, size: int) -> list[tuple[int, int, str]]:
    import blake3

    return [(off, min(size, len(data) - off), blake3.blake3(data[off:off + size]).hexdigest())
            for off in range(0, len(data), size)]


def test_a_bad_anchor_piece_blames_only_the_provider_that_sent_it(swarm: dict, tmp_path: Path) -> None:
    """Signed pieces (offset, length, BLAKE3): a provider whose copy differs in one byte is named in
    ``bad_providers`` (the download returns incomplete, as data, keeping the good pieces); the honest
    provider then supplies only what is missing and the file is exact, with nobody else blamed."""
    client, anchor = swarm["client"], swarm["files"]["anchor"]
    bad = bytearray(anchor)
    bad[len(anchor) // 2] ^= 1
    _write(tmp_path / "liar", "anchors/3.safetensors", bytes(bad))
    (liar,) = _start([tmp_path / "liar"])
    pieces = _pieces(anchor, 3 * MiB)
    try:
        liar_addr = liar.info().listen_maddrs[0]
        r = client.fetch_anchor([liar_addr], version=3, size=len(anchor), dest=tmp_path / "a.st", timeout=40,
                                chunk=MiB, pieces=pieces)
    finally:
        liar.stop()
    assert not r.complete and r.bad_providers == [liar_addr] and "signed digest" in r.errors[liar_addr]
    assert not (tmp_path / "a.st").exists()
    r = client.fetch_anchor([swarm["addr"]], version=3, size=len(anchor), dest=tmp_path / "a.st", timeout=40,
                            chunk=MiB, pieces=pieces)
    assert (tmp_path / "a.st").read_bytes() == anchor
    assert r.complete and r.bad_providers == [] and r.resumed > 0  # the liar's good pieces were kept
    assert r.fetched == len(anchor) - r.resumed


def test_a_body_larger_than_the_signed_size_is_refused_before_reading(swarm: dict, tmp_path: Path) -> None:
    client, addr, files = swarm["client"], swarm["addr"], swarm["files"]
    before = client.stats().bytes_in.get("patch", 0)
    with pytest.raises(IntegrityError, match="signed record allows"):
        client.fetch(addr, wp.PatchRequest(version=7), tmp_path / "7.patch", max_bytes=len(files["patch"]) - 1)
    assert client.stats().bytes_in.get("patch", 0) - before < 64 * 1024 and not list(tmp_path.iterdir())
    client.fetch(addr, wp.PatchRequest(version=7), tmp_path / "7.patch", max_bytes=len(files["patch"]))


def test_identity_file_raw_seed_and_pem_give_one_peer_id(tmp_path: Path) -> None:
    from pulse_node.chain.identity import Identity

    ident = Identity.generate()
    (tmp_path / "raw.key").write_bytes(ident.private_bytes())
    (tmp_path / "pem.key").write_bytes(ident.private_pem())
    stores = [tmp_path / "s1", tmp_path / "s2"]
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda kv: WireClient.start(WireConfig(store=kv[0], identity=kv[1])),
                        zip(stores, [tmp_path / "raw.key", tmp_path / "pem.key"]))
    try:
        assert a.info().peer_id == b.info().peer_id
    finally:
        a.stop()
        b.stop()


def test_catchup_is_made_on_demand_from_verified_states(swarm: dict, tmp_path: Path) -> None:
    """A real store: the worker makes 3 -> 17 on a thread; a base it cannot rebuild fails fast."""
    from test_chain_synth import adam_like_chain, build_chain, states_equal, verified

    from pulse_node.chain.catchup import check_catchup
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.patch import apply_patch

    states = adam_like_chain(5, 18)
    chain = build_chain(states, anchor_every=10)
    with VersionStore(tmp_path / "store", trusted_signers=None) as store:
        for v, (record, patch) in enumerate(chain):
            if record.is_anchor:
                store.put_anchor(verified(record, state=states[v]))
            if patch is not None:
                store.put_patch(verified(record, patch))
    (server,) = _start([tmp_path / "store"])
    try:
        addr, client = server.info().listen_maddrs[0], swarm["client"]
        client.fetch(addr, wp.CatchupRequest(base=3, target=17), tmp_path / "c.patch")
        patch = (tmp_path / "c.patch").read_bytes()
        check_catchup(patch, from_record=chain[3][0], to_record=chain[17][0])
        assert states_equal(apply_patch(states[3], patch, verify=True), states[17])
        t0 = time.monotonic()
        with pytest.raises(NotFound, match="does not hold v30"):
            client.fetch(addr, wp.CatchupRequest(base=3, target=30), tmp_path / "x.patch")
        assert time.monotonic() - t0 < 5
    finally:
        server.stop()


def test_loco_payload_and_decision_are_served_and_decisions_pushed(swarm: dict, tmp_path: Path) -> None:
    """The trainers' round files (``trainer/agreement.py``) go through the real wire worker."""
    client, server, addr, src = swarm["client"], swarm["server"], swarm["addr"], swarm["src"]
    digest = "cd" * 32
    payload = _write(src, f"loco/4/{digest}.payload", os.urandom(5000))
    decision = _write(src, "loco/4/decision", b"signed decision")
    commitment = _write(src, f"loco/4/{digest}.commit", b"signed commitment")
    client.fetch(addr, wp.LocoPayloadRequest(round=4, digest=digest), tmp_path / "p")
    client.fetch(addr, wp.LocoDecisionRequest(round=4), tmp_path / "d")
    client.fetch(addr, wp.LocoCommitRequest(round=4, digest=digest), tmp_path / "c")
    assert (tmp_path / "p").read_bytes() == payload and (tmp_path / "d").read_bytes() == decision
    assert (tmp_path / "c").read_bytes() == commitment
    with pytest.raises(NotFound):
        client.fetch(addr, wp.LocoPayloadRequest(round=4, digest="../" + digest[3:]), tmp_path / "x")
    server.events(max_events=64)  # whatever earlier tests left
    client.push(addr, "loco_decision", b"d" * 100)
    got = gather(lambda: server.events(max_events=8), count=1, timeout=10, what="the decision push")
    assert [(e.kind, e.data) for e in got] == [("loco_decision", b"d" * 100)]


def test_fetch_over_a_dns4_address(swarm: dict, tmp_path: Path) -> None:
    """Announced names work (docker compose announces /dns4/<service>/...): the dialer resolves them."""
    addr = swarm["addr"]
    assert addr.startswith("/ip4/127.0.0.1/tcp/")
    named = addr.replace("/ip4/127.0.0.1/", "/dns4/localhost/", 1)
    swarm["server"].set_head(b"head record 9")
    swarm["client"].fetch(named, wp.RecordRequest(version=None), tmp_path / "head.rec")
    assert (tmp_path / "head.rec").read_bytes() == b"head record 9"
