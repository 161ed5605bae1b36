"""The dashboard's pure core: node statuses + peer records -> SwarmSnapshot, and its rendering."""

from __future__ import annotations

import json
import time
import urllib.request

from pulse_node.daemon.status import NodeStatus, StatusServer
from pulse_node.daemon.status_model import StatusReport, VersionEntry
from pulse_node.ops.render import render_text, sparkline
from pulse_node.ops.snapshot import NodeInput, build_snapshot
from pulse_node.ops.sources import fetch_status, read_run_dir, status_url

NOW = 1_800_000_000.0
PID = {n: "12D3KooW" + n.ljust(44, "x") for n in ("t0", "t1", "i0", "i1")}


def _status(name: str, role: str, version: int, *, hashes: dict[int, str], reward: float = 0.5,
            dense: int = 1000, errors: tuple[str, ...] = ()) -> StatusReport:
    st = NodeStatus(role=role, peer_id=PID[name], run_id="r1")
    for v in range(1, version + 1):
        published = dict(dense_bytes=dense, changed=0.01 * v, reward=0.1 * v, reference_bytes=30 * v)
        st.record_version(VersionEntry(version=v, state_hash=hashes[v], patch_bytes=10 * v,
                                       **(published if role == "trainer" else {})))
    st.update(version=version, state_hash=hashes[version], reward_mean=reward)
    if role == "trainer":
        with st.trainer() as tc:
            tc.patch_bytes_total = 10 * version
    else:
        with st.inference() as ic:
            ic.patch_bytes_total = 10 * version
    st.set_data_plane({"bytes_in": 100, "bytes_out": 200 if role == "trainer" else 0})
    for e in errors:
        st.error(e)
    return st.snapshot().model_copy(update={"updated_at": NOW - 1})


def _swarm(hashes_i1: dict[int, str] | None = None, i1_version: int = 3) -> list[NodeInput]:
    good = {v: f"{v:02d}" * 8 for v in range(1, 6)}
    return [NodeInput("trainer-0", _status("t0", "trainer", 5, hashes=good)),
            NodeInput("trainer-1", _status("t1", "trainer", 5, hashes=good)),
            NodeInput("inference-0", _status("i0", "inference", 5, hashes=good, errors=("push failed: timeout",))),
            NodeInput("inference-1", _status("i1", "inference", i1_version, hashes=hashes_i1 or good))]


def test_versions_lag_agreement_and_bytes() -> None:
    snap = build_snapshot(_swarm(), now=NOW)
    by = {n.name: n for n in snap.nodes}
    assert snap.head == 5 and snap.roles == {"trainer": 2, "inference": 2}
    assert by["inference-1"].lag == 2 and by["trainer-0"].lag == 0
    assert all(n.hash_agrees for n in snap.nodes) and not snap.hash_disagreements
    assert snap.hash_checks_total == 5
    assert [v.version for v in snap.versions] == [1, 2, 3, 4, 5]
    assert snap.versions[1].compression == 1000 / 20 and snap.versions[1].changed == 0.02
    assert snap.totals.patch_bytes == 150 and snap.totals.dense_bytes == 5000 and snap.totals.saved_bytes == 4850
    assert by["inference-1"].saved_bytes == 3000 - 30
    assert [e.message for e in snap.errors] == ["push failed: timeout"]
    assert [a.message for a in snap.alerts] == ["inference-1 is 2 versions behind the head"]
    json.dumps(snap.model_dump(mode="json"))  # the --json output is plain JSON


def test_diverged_replica_is_a_failure_naming_the_nodes() -> None:
    bad = {v: f"{v:02d}" * 8 for v in range(1, 6)}
    bad[3] = "ff" * 8
    snap = build_snapshot(_swarm(hashes_i1=bad), now=NOW)
    assert [c.version for c in snap.hash_disagreements] == [3]
    assert snap.hash_disagreements[0].hashes["ff" * 8] == ["inference-1"]
    assert {n.name: n.hash_agrees for n in snap.nodes}["inference-1"] is False
    assert any(a.level == "fail" and "version 3" in a.message and "inference-1" in a.message for a in snap.alerts)


def test_duplicate_identity_stale_and_down_nodes_are_alerts() -> None:
    nodes = _swarm()
    stale = nodes[1].status.model_copy(update={"updated_at": NOW - 100})
    nodes[1] = NodeInput("trainer-1", stale, node_key="ab" * 32)
    nodes.append(NodeInput("inference-2", None, problem="pulse-node join: error: identity file x is already used",
                           node_key="ab" * 32))
    msgs = [a.message for a in build_snapshot(nodes, now=NOW).alerts]
    assert any("duplicate identity" in m and "inference-2" in m and "trainer-1" in m for m in msgs)
    assert any(m.startswith("trainer-1 status not updated for 100s") for m in msgs)
    assert any(m.startswith("inference-2 is not running") and "already used" in m for m in msgs)


def test_peer_records_merge_with_statuses_and_stand_alone() -> None:
    nodes = _swarm()[:1]
    rec_t0 = {"peer_id": PID["t0"], "role": "trainer", "version": 5, "session": "a" * 32,
              "counters": {"bytes_in": 1, "bytes_out": 2, "errors": 0}}
    rec_i0 = {"peer_id": PID["i0"], "role": "inference", "version": 4, "state_hash": "04" * 8,
              "session": "b" * 32, "counters": {"bytes_in": 7, "bytes_out": 0, "errors": 1}}
    snap = build_snapshot(nodes, [rec_t0, rec_i0, dict(rec_i0, session="c" * 32)], now=NOW)
    by = {n.peer_id: n for n in snap.nodes}
    assert len(snap.nodes) == 2
    assert by[PID["t0"]].sources == ["status", "dht"] and by[PID["t0"]].bytes_in == 100
    assert by[PID["i0"]].state == "record-only" and by[PID["i0"]].bytes_in == 7 and by[PID["i0"]].lag == 1
    assert by[PID["i0"]].hash_agrees is True  # v4 hash equals trainer-0's history at v4
    assert any("2 live sessions" in a.message for a in snap.alerts)


def test_reward_samples_fill_versions_without_history_reward() -> None:
    snap = build_snapshot(_swarm()[:1], now=NOW, reward_samples={5: 0.9, 7: 0.3})
    rewards = {v.version: v.reward for v in snap.versions}
    assert rewards[5] == 0.5  # the history's own value wins
    assert rewards[7] == 0.3


def test_rendered_screen_shows_every_section() -> None:
    text = render_text(build_snapshot(_swarm(), now=NOW, run_id="r1", source="test"), width=130)
    for needle in ("pulse-node status", "run r1", "head v5", "inference-1", "WARN inference-1 is 2 versions",
                   "vs dense", "50.0x", "vs ref", "4 ok", "reference codec 450 B (3.0x ours)", "reward",
                   "push failed: timeout", "saved"):
        assert needle in text, needle
    assert sparkline([0.0, 0.5, 1.0, None]) == "▁▄█·"


def test_run_dir_reader_reports_nodes_without_status(tmp_path) -> None:
    (tmp_path / "bootstrap").mkdir()
    (tmp_path / "bootstrap" / "maddrs.txt").write_text("/ip4/127.0.0.1/tcp/1/p2p/X\n")
    (tmp_path / "trainer-0").mkdir()
    trainer = _status("t0", "trainer", 2, hashes={1: "a" * 16, 2: "b" * 16})
    (tmp_path / "trainer-0" / "status.json").write_text(trainer.to_json())
    (tmp_path / "inference-0").mkdir()
    log = "starting\npulse-node join: error: identity file is already used\nbye\n"
    (tmp_path / "inference-0" / "log.txt").write_text(log)
    (tmp_path / "notes").mkdir()
    nodes = read_run_dir(tmp_path)
    assert [n.name for n in nodes] == ["inference-0", "trainer-0"]
    assert "already used" in (nodes[0].problem or "") and nodes[1].problem is None


def test_metrics_health_and_status_endpoints_scraped() -> None:
    st = NodeStatus(role="inference", peer_id=PID["i0"], run_id="r1")
    server = StatusServer(st, port=0)
    try:
        st.update(version=7, reward_mean=0.25)
        st.set_data_plane({"bytes_in": 12345})
        st.error("boom")
        body = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
        metrics = {ln.split()[0]: float(ln.split()[1]) for ln in body.splitlines() if ln and not ln.startswith("#")}
        assert metrics["pulse_version"] == 7 and metrics["pulse_bytes_in"] == 12345 and metrics["pulse_errors"] == 1
        assert json.loads(urllib.request.urlopen(server.url + "/health", timeout=5).read()) == {"ok": True}
        got = fetch_status(server.url + "/metrics")
        assert isinstance(got, StatusReport) and got.version == 7 and got.recent_errors[0].message == "boom"
        assert status_url("http://h:1/metrics") == "http://h:1/status"
    finally:
        server.close()
    assert isinstance(fetch_status(server.url), str)  # closed: a reason, not an exception


def _write_run_dir(root, *, inference_version: int) -> None:
    hashes = {v: f"{v:02d}" * 8 for v in range(1, 6)}
    nodes = (("trainer-0", "t0", "trainer", 5), ("inference-0", "i0", "inference", inference_version))
    for name, pid, role, version in nodes:
        (root / name).mkdir(exist_ok=True)
        st = _status(pid, role, version, hashes=hashes).model_copy(update={"updated_at": time.time()})
        (root / name / "status.json").write_text(st.to_json())


def test_live_dashboard_redraws_and_stops_on_sigint(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys

    _write_run_dir(tmp_path, inference_version=2)
    cmd = [sys.executable, "-m", "pulse_node", "status", "--run-dir", str(tmp_path), "--interval", "0.2"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "COLUMNS": "130"})
    try:
        assert "Ctrl+C to stop" in p.stderr.readline()  # running, signal handler installed
        _write_run_dir(tmp_path, inference_version=5)  # the swarm moves on while we watch
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    assert "inference-0" in out and "no alerts" in out  # the screen left behind is current: no lag


def test_a_quiet_node_that_still_answers_is_live_not_stale() -> None:
    quiet = _swarm()[0].status.model_copy(update={"updated_at": NOW - 600})  # nothing changed for 10 minutes
    views = build_snapshot([NodeInput("t", quiet, seen_at=NOW - 0.4),
                            NodeInput("u", quiet.model_copy(update={"peer_id": "x"}))], now=NOW).nodes
    assert [v.state for v in views] == ["live", "stale"]


def test_logged_failures_and_nodes_without_a_version_are_visible() -> None:
    fresh = _status("i1", "inference", 1, hashes={1: "aa" * 8}).model_copy(
        update={"version": -1, "history": [], "state_hash": ""})
    nodes = _swarm()[:1] + [NodeInput("inference-9", fresh,
                                      seen_at=NOW - 1, log_error="anchor 0 from 12D3KooW failed: bad params")]
    snap = build_snapshot(nodes, now=NOW)
    assert "inference-9 holds no version yet while the head is v5" in [a.message for a in snap.alerts]
    logged = [e.message for e in snap.errors if e.node == "inference-9"]
    assert logged == ["log: anchor 0 from 12D3KooW failed: bad params"]


def test_genesis_anchor_is_not_counted_as_a_patch() -> None:
    st = _swarm()[0].status
    genesis = VersionEntry(version=0, state_hash="00" * 8, patch_bytes=0, dense_bytes=1000, changed=1.0)
    snap = build_snapshot([NodeInput("trainer-0", st.model_copy(update={"history": [genesis, *st.history]}))],
                          now=NOW)
    assert snap.versions[0].version == 0 and snap.versions[0].compression is None
    assert snap.totals.dense_bytes == 5000 and snap.totals.patch_bytes == 150


def test_rollout_senders_per_trainer_are_shown_refused_first() -> None:
    nodes = _swarm()
    senders = {PID["i0"]: {"accepted": 7, "accepted_rollouts": 112},
               "12D3KooWforger" + "y" * 38: {"rejected": {"not_sampled": 2, "wrong_reward": 1}, "strikes": 3,
                                               "banned": True}}
    t0 = StatusReport.model_validate(nodes[0].status.model_dump(by_alias=True) | {"rollout_senders": senders})
    snap = build_snapshot([NodeInput("trainer-0", t0), *nodes[1:]], now=NOW)
    assert [(r.sender, r.accepted, r.refused, r.banned) for r in snap.senders] == [
        ("12D3KooWforg", 0, 3, True), ("inference-0", 7, 0, False)]
    text = render_text(snap, width=140)
    for needle in ("rollout senders", "12D3KooWforg BANNED", "not_sampled 2, wrong_reward 1", "inference-0"):
        assert needle in text, needle
    assert "rollout senders" not in render_text(build_snapshot(_swarm(), now=NOW), width=140)


def test_each_trainers_trust_weight_and_checks_are_shown() -> None:
    """``pulse-node status`` shows the trust ledger a trainer reports: its weight in the last round
    and its spot checks passed and failed, and commitments left unrevealed (``trainer/trust_report.py``, ``ops/trust.py``)."""
    from pulse_node.loco.config import TrustConfig
    from pulse_node.loco.ledger import Ledger, RoundFacts, Verdict
    from pulse_node.trainer.trust_report import trust_report

    newcomer = "12D3KooWnew" + "z" * 41
    ledger = Ledger(TrustConfig())
    ledger.record(RoundFacts(0, digest=b"\x01" * 32, contributors=(PID["t0"], newcomer), members=frozenset({PID["t0"]})))
    ledger.record(RoundFacts(1, digest=b"\x02" * 32, contributors=(PID["t0"],), members=frozenset({PID["t0"]}),
                             verdicts=(Verdict(0, newcomer, PID["t0"], False),), unrevealed=(newcomer,)))
    report = trust_report(ledger, {PID["t0"]: 1.0})
    assert [(e.key, e.weight, e.contributed, e.failed, e.owing) for e in report] == [
        (PID["t0"], 1.0, 2, 0, False), (newcomer, 0.0, 1, 1, True)]
    nodes = _swarm()
    t0 = StatusReport.model_validate(nodes[0].status.model_dump(by_alias=True)
                                     | {"trust": [e.model_dump() for e in report]})
    snap = build_snapshot([NodeInput("trainer-0", t0), *nodes[1:]], now=NOW)
    assert [(r.trainer, r.weight, r.failed, r.unrevealed, r.state) for r in snap.trust] == [
        ("trainer-0", 1.0, 0, 0, ""), ("12D3KooWnewz", 0.0, 1, 1, "owing")]
    text = render_text(snap, width=140)
    for needle in ("trainers' trust", "member", "open", "1.000", "unrevealed", "owing"):
        assert needle in text, needle
