"""The DHT worker in a real local swarm: discovery, expiry, rejection of bad records, start failures.

Everything binds 127.0.0.1 port 0, waits on predicates with deadlines, and stops what it started
(by pid, never by name). One module-scoped swarm (the ``pulse-node bootstrap`` command plus two
workers) is shared to keep the whole file well under 90 s on two busy cores.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pydantic
import pytest
from helpers import wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.net.dht.client import DhtClient, DhtConfig, DuplicateIdentityError
from pulse_node.net.local.rpc_server import StartFailed

pytestmark = pytest.mark.slow  # DHT worker processes (hivemind, p2pd)

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
RUN = "test-run"
TTL = 3.0
PULSE_NODE = str(Path(sys.executable).with_name("pulse-node"))


def read_maddr_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first stdout line of ``pulse-node bootstrap`` (a full multiaddr), with a deadline."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert box and box[0], f"pulse-node bootstrap printed no address in {timeout:.0f}s"
    return box[0].strip()


@pytest.fixture(scope="module")
def tmp_dir():
    with tempfile.TemporaryDirectory(prefix="pulse-dht-test-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def bootstrap(tmp_dir):
    """``pulse-node bootstrap`` as a subprocess: (process, its stdout multiaddr, identity file)."""
    ident = tmp_dir / "boot.key"
    proc = subprocess.Popen(
        [PULSE_NODE, "bootstrap", "--host-maddrs", *LOCAL, "--identity", str(ident), "--run-id", RUN,
         "--print-maddrs-file", str(tmp_dir / "maddrs.txt"), "--status-every", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield proc, read_maddr_line(proc, 60), ident
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def swarm(bootstrap, tmp_dir):
    """Three workers joined through the bootstrap in parallel: a trainer and an inference node
    (TTL 3 s) and a short-lived inference node (TTL 2 s) that the expiry test crashes."""
    _, maddr, _ = bootstrap
    configs = [DhtConfig(run_id=RUN, host_maddrs=LOCAL, initial_peers=[maddr], identity=tmp_dir / f"w{i}.key",
                         ttl_s=TTL) for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(DhtClient.start, c) for c in configs]
        clients = [f.result() for f in futures]
        try:
            clients[0].publish_peer(PeerStatus(role="trainer", version=5, chain_hash="ab" * 32))
            wire = f"/ip4/127.0.0.1/tcp/7000/p2p/{clients[1].info().peer_id}"
            clients[1].publish_peer(PeerStatus(role="inference", wire_maddrs=[wire]))
            clients[2].publish_peer(PeerStatus(role="inference"), ttl_s=2.0)
            yield clients
        finally:
            list(pool.map(lambda c: c.stop(timeout=4), clients))


def test_bootstrap_prints_parsable_maddrs_with_its_persistent_peer_id(bootstrap, tmp_dir) -> None:
    _, maddr, ident = bootstrap
    from pulse_node.net.dht.validator import peer_id_of

    assert maddr.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in maddr
    assert maddr.rsplit("/p2p/", 1)[1] == peer_id_of(Identity.load(ident))
    assert maddr in (tmp_dir / "maddrs.txt").read_text().splitlines()


def test_peers_find_each_others_records(swarm) -> None:
    trainer, inference, _ = swarm
    ids = {trainer.info().peer_id: "trainer", inference.info().peer_id: "inference"}
    for client in swarm:
        roles = wait_for(lambda client=client: {p.peer_id: p.role for p in client.peers()}.items() >= ids.items()
                         and {p.role for p in client.peers()}, timeout=20, interval=0.1,
                         what="both workers see both records")
        assert {"bootstrap", "trainer", "inference"} <= roles
    rec = next(p for p in inference.peers() if p.role == "trainer")
    assert rec.version == 5 and rec.chain_hash == "ab" * 32 and rec.dht_maddrs
    assert all(m.endswith(f"/p2p/{rec.peer_id}") for m in rec.dht_maddrs)


def test_records_are_refreshed_before_they_expire(swarm) -> None:
    trainer, inference, _ = swarm
    pid = trainer.info().peer_id
    first = wait_for(lambda: [p for p in inference.peers() if p.peer_id == pid], timeout=20, interval=0.1,
                     what="trainer record")[0]
    wait_for(lambda: [p for p in inference.peers() if p.peer_id == pid and p.updated_at > first.updated_at],
             timeout=3 * TTL, interval=0.1, what="trainer record refreshed (ttl/3)")


def test_dead_peer_record_expires(swarm) -> None:
    _, watcher, victim = swarm
    pid = victim.info().peer_id
    wait_for(lambda: pid in {p.peer_id for p in watcher.peers()}, timeout=20, interval=0.1, what="victim visible")
    crash(victim.process.proc.pid)  # worker and its p2pd die without saying goodbye
    killed = time.monotonic()
    wait_for(lambda: pid not in {p.peer_id for p in watcher.peers()}, timeout=15, interval=0.1,
             what="victim record expired")
    assert time.monotonic() - killed < 2.0 + 6.0  # TTL 2 s, plus a slow read or two


def crash(pid: int) -> None:
    """SIGKILL a worker and the p2pd it started (by pid, read from /proc, never by name)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for p in [pid, *map(int, children)]:
        os.kill(p, signal.SIGKILL)
    for p in map(int, children):
        wait_for(lambda p=p: not Path(f"/proc/{p}").exists() or "Z" in Path(f"/proc/{p}/stat").read_text().split()[2],
                 timeout=5, interval=0.1, what=f"p2pd {p} gone")


def test_forged_unsigned_and_bad_records_from_a_peer_are_rejected(bootstrap, swarm) -> None:
    _, maddr, _ = bootstrap
    victim_id = swarm[0].info().peer_id
    results = asyncio.run(attack(maddr, victim_id))
    assert results.pop("valid own record") == [True]  # control: the attacker can publish its own
    assert all(ok == [False] for ok in results.values()), results
    peers = {p.peer_id: p for p in swarm[1].peers()}
    assert peers[victim_id].role == "trainer"  # the victim's record still stands


async def attack(maddr: str, victim_id: str) -> dict[str, list[bool] | None]:
    """A hivemind node without our validator asks the bootstrap to store bad records."""
    from hivemind.dht.node import DHTNode
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.p2p import PeerID

    from pulse_node.chain.peer import PeerRecord
    from pulse_node.net.dht.records import dht_key
    from pulse_node.net.dht.validator import PulseRecordValidator, peer_id_of, sign_envelope

    me = Identity.generate()
    mine = peer_id_of(me)
    node = await DHTNode.create(initial_peers=[maddr], host_maddrs=LOCAL, client_mode=True)
    try:
        key = DHTID.generate(source=dht_key(RUN, "peers"))
        boot = PeerID.from_base58(maddr.rsplit("/p2p/", 1)[1])
        ser = node.protocol.serializer
        now = time.time()

        def body(pid: str, **extra) -> bytes:
            rec = PeerRecord(role="trainer", peer_id=pid, session="ee" * 16, updated_at=now).model_dump()
            return ser.dumps({**rec, **extra})

        def sign(pid: str, value: bytes, exp: float, who: Identity) -> bytes:
            return sign_envelope(DHTRecord(key.to_bytes(), ser.dumps(pid), value, exp), who)

        exp = now + 30
        cases = {
            "unsigned": (mine, body(mine)),
            "forged (victim's subkey, attacker's key)": (victim_id, sign(victim_id, body(victim_id), exp, me)),
            "schema violation (own key)": (mine, sign(mine, body(mine, role="admin"), exp, me)),
            "valid own record": (mine, sign(mine, body(mine), exp, me)),
        }
        assert PulseRecordValidator(RUN, me).reject_reason(
            DHTRecord(key.to_bytes(), ser.dumps(mine), cases["valid own record"][1], exp)) is None
        return {name: await node.protocol.call_store(boot, [key], [value], exp, subkeys=[sub])
                for name, (sub, value) in cases.items()}
    finally:
        await node.shutdown()


def test_duplicate_identity_is_refused(bootstrap, swarm, tmp_dir) -> None:
    _, maddr, _ = bootstrap
    started = time.monotonic()
    with pytest.raises(DuplicateIdentityError, match="already used by another running node"):
        DhtClient.start(DhtConfig(run_id=RUN, host_maddrs=LOCAL, initial_peers=[maddr],
                                  identity=tmp_dir / "w0.key"))
    assert time.monotonic() - started < 45
    assert swarm[0].info().duplicate is None  # the refused copy never published


def test_a_ping_back_reaching_a_live_copy_of_our_identity_names_the_duplicate(bootstrap, swarm, tmp_dir,
                                                                             monkeypatch) -> None:
    """The bootstrap checks that a joiner is reachable by pinging its peer id back. When another live node
    holds that peer id, the ping may reach it instead (libp2p picks one of the two connections), and
    hivemind says "can't access this node": the start must name the duplicate, not a NAT. Forced here."""
    from pulse_node.net.dht import join, worker

    real = join.create_dht_node

    async def ping_back_reaches_the_other(*args, client_mode: bool, **kwargs):
        if not client_mode:
            raise join.UnreachableError("bootstrap", "the bootstrap cannot connect back to this node (NAT or firewall)")
        return await real(*args, client_mode=client_mode, **kwargs)

    monkeypatch.setattr(join, "create_dht_node", ping_back_reaches_the_other)
    _, maddr, _ = bootstrap
    taken = DhtConfig(run_id=RUN, host_maddrs=LOCAL, initial_peers=[maddr], identity=tmp_dir / "w0.key")
    with pytest.raises(StartFailed, match="already used by another running node") as refused:
        asyncio.run(worker.start_worker(taken))
    assert refused.value.kind == "duplicate"
    fresh = taken.model_copy(update={"identity": tmp_dir / "unreachable.key"})
    with pytest.raises(join.UnreachableError, match="NAT or firewall"):  # no copy: the network is to blame
        asyncio.run(worker.start_worker(fresh))
    assert swarm[0].info().duplicate is None  # the refused copy never published


def test_unreachable_bootstrap_fails_with_a_clear_message_within_its_bound(tmp_dir) -> None:
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts TCP, never speaks libp2p: a bootstrap that does not answer
    peers = [f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}/p2p/{_peer_id()}" for s in (refused, hung)]
    err, config = tmp_dir / "err.json", tmp_dir / "unreachable.json"
    config.write_text(DhtConfig(run_id=RUN, host_maddrs=LOCAL, initial_peers=peers,
                                bootstrap_timeout_s=3).model_dump_json())
    started = time.monotonic()
    try:  # the worker as a user would run it by hand: its whole config is one JSON file
        proc = subprocess.run(
            [sys.executable, "-m", "pulse_node.net.dht.worker", "--ipc", str(tmp_dir / "never.sock"),
             "--config", str(config), "--error-file", str(err)],
            capture_output=True, text=True, timeout=60)
    finally:
        refused.close()
        hung.close()
    assert proc.returncode == 2
    assert time.monotonic() - started < 40  # interpreter + hivemind import + p2pd + the 3 s bound
    assert f"bootstrap {peers[0]} refused the connection" in proc.stderr
    assert f"bootstrap {peers[1]} did not answer in 3 s: check the address, that it is running, and your firewall" \
        in proc.stderr
    assert '"kind":"bootstrap"' in err.read_text()


def test_malformed_bootstrap_address_is_refused_before_starting_anything() -> None:
    with pytest.raises(pydantic.ValidationError, match="not a full multiaddr"):
        DhtConfig(run_id=RUN, initial_peers=["/ip4/127.0.0.1/tcp/1"])  # no /p2p/<peer id>
    assert DhtConfig(run_id=RUN, initial_peers=[f"/dns4/boot.example.org/tcp/31337/p2p/{_peer_id()}"])


def test_bootstrap_command_stops_on_sigterm_within_10s(bootstrap) -> None:
    proc, _, _ = bootstrap
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 10


def _peer_id() -> str:
    from pulse_node.net.dht.validator import peer_id_of

    return peer_id_of(Identity.generate())


def test_daemon_start_failure_names_the_cause_and_the_next_step(tmp_dir) -> None:
    from pulse_node.net.dht.join import JoinError, start_daemon
    from pulse_node.net.dht.validator import libp2p_private_key

    key = tmp_dir / "daemon.key"
    key.write_bytes(libp2p_private_key(Identity.generate()))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        cases = {f"/ip4/127.0.0.1/tcp/{port}": "another process already listens on that port",
                 "/ip4/203.0.113.7/tcp/0": "that IP is not on this machine"}
        for maddr, hint in cases.items():
            with pytest.raises(JoinError, match=hint) as info:
                asyncio.run(start_daemon(DhtConfig(run_id=RUN, host_maddrs=[maddr]), str(key)))
            assert info.value.kind == "daemon" and maddr in str(info.value)
    finally:
        busy.close()
