"""The dashboard and the doctor against a real DHT: a bootstrap peer started by the test that also
publishes a signed peer record pointing at an in-process /status server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pulse_node.daemon.status import NodeStatus, StatusServer
from pulse_node.daemon.status_model import VersionEntry
from pulse_node.ops.sources import dialable_url

PULSE = [sys.executable, "-m", "pulse_node"]
RUN = "ops-test"


@pytest.fixture(scope="module")
def live_peer(tmp_path_factory):
    from pulse_node.chain.peer import PeerStatus
    from pulse_node.net.dht.client import DhtClient, DhtConfig

    key = tmp_path_factory.mktemp("peer") / "identity.key"
    client = DhtClient.start(DhtConfig(run_id=RUN, host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity=key))
    server = None
    try:
        info = client.info()
        status = NodeStatus(role="trainer", peer_id=info.peer_id, run_id=RUN)
        server = StatusServer(status, port=0)
        status.record_version(VersionEntry(version=1, state_hash="ab" * 8, patch_bytes=100, dense_bytes=5000,
                                           changed=0.02, reward=0.25))
        status.update(version=1, state_hash="ab" * 8, metrics_url=server.url)
        status.set_data_plane({"bytes_out": 4321})
        status.error("loco push to 12D3KooWxyz failed: timed out")
        assert client.publish_peer(PeerStatus(role="trainer", version=1, state_hash="ab" * 8, metrics_url=server.url))
        yield info.visible_maddrs[0], key, info.peer_id
    finally:
        if server is not None:
            server.close()
        client.stop()


@pytest.mark.slow
def test_status_reads_records_and_each_peers_status_endpoint(live_peer) -> None:
    addr, _key, peer_id = live_peer
    r = subprocess.run([*PULSE, "status", "--bootstrap", addr, "--run-id", RUN, "--once", "--json"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    (node,) = snap["nodes"]
    assert node["peer_id"] == peer_id and node["sources"] == ["http", "dht"] and node["state"] == "live"
    assert node["bytes_out"] == 4321 and snap["versions"][0]["compression"] == 50.0
    assert snap["errors"][0]["message"].startswith("loco push") and "DHT (1 peer records)" in snap["source"]


@pytest.mark.slow
def test_doctor_against_a_live_bootstrap_sees_the_swarm_and_the_identity_in_use(live_peer, tmp_path) -> None:
    addr, key, peer_id = live_peer
    r = subprocess.run([*PULSE, "doctor", "--json", "--bootstrap", addr, "--run-id", RUN, "--identity", str(key),
                        "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp_path), "--only", "daemon",
                        "--only", "bootstrap", "--only", "reachable", "--only", "clocks", "--only", "identity"],
                       capture_output=True, text=True, timeout=90)
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert r.returncode == 0, checks
    assert [c["status"] for c in checks.values()] == ["PASS", "PASS", "PASS", "PASS", "WARN"]
    assert "1 trainer" in checks["bootstrap"]["detail"] and "LAN/local swarm" in checks["reachable"]["detail"]
    assert peer_id in checks["identity"]["detail"] and "in use by a live trainer" in checks["identity"]["detail"]
    assert "copied" in checks["identity"]["fix"]


def test_metrics_url_on_all_interfaces_is_dialled_at_the_dht_address() -> None:
    assert dialable_url("http://0.0.0.0:9100", ["/ip4/10.0.0.5/tcp/1/p2p/X"]) == "http://10.0.0.5:9100"
    assert dialable_url("http://127.0.0.1:9100", ["/ip4/10.0.0.5/tcp/1"]) == "http://127.0.0.1:9100"
    # a container announces its loopback first: the dashboard on the host needs the bridge address
    both = ["/ip4/127.0.0.1/tcp/1/p2p/X", "/ip4/172.18.0.3/tcp/1/p2p/X"]
    assert dialable_url("http://0.0.0.0:9100", both) == "http://172.18.0.3:9100"
    assert dialable_url("http://0.0.0.0:9100", both[:1]) == "http://127.0.0.1:9100"
    assert dialable_url("http://0.0.0.0:9100", ["/ip6/::1/tcp/1"]) == "http://0.0.0.0:9100"
