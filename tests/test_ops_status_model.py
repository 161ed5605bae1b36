"""The declared status model: typed writes that refuse undeclared names, /metrics derived from the
declaration, statuses of another schema refused (and shown, not crashed on, by the dashboard),
catch-up savings and the reference codec in the snapshot, and ``pulse-node swarm`` without a
terminal: plain progress lines and the JSON summary, from a fake run dir (no processes)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from pulse_node.config import SwarmConfig
from pulse_node.daemon.status import NodeStatus
from pulse_node.daemon.status_model import (
    STATUS_SCHEMA,
    StatusFieldError,
    StatusReport,
    StatusSchemaError,
    VersionEntry,
    gauge_fields,
    new_report,
    parse_status,
)
from pulse_node.ops.render import render_text
from pulse_node.ops.snapshot import NodeInput, build_snapshot
from pulse_node.ops.sources import read_run_dir
from pulse_node.swarm.launcher import Child, LocalSwarm
from pulse_node.swarm.progress import ProgressLines
from pulse_node.swarm.view import SwarmView


def test_undeclared_names_and_wrong_types_fail_loudly() -> None:
    trainer = NodeStatus(role="trainer", peer_id="t", run_id="r")
    with trainer.trainer() as c:
        c.rollouts_used += 3
    # a wrong name fails the type checker first, the run too
    with pytest.raises(ValueError, match="rollouts_usd"), trainer.trainer() as c:
        c.rollouts_usd = 1  # type: ignore[attr-defined]
    with pytest.raises(ValueError), trainer.trainer() as c:
        c.rounds = -1  # declared ge=0: checked on assignment
    with pytest.raises(StatusFieldError, match="verison"):
        trainer.update(verison=2)  # type: ignore[call-arg]  # the type checker refuses it first
    with pytest.raises(StatusFieldError):
        trainer.update(history=[])  # type: ignore[call-arg]  # sections change only through their typed methods
    with pytest.raises(ValueError):
        trainer.update(version="two")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        trainer.set_data_plane({"bytes_in": 1, "byts_out": 2})
    with pytest.raises(StatusFieldError):
        trainer.record_version({"version": 1, "state_hash": "ab"})  # type: ignore[arg-type]
    inference = NodeStatus(role="inference", peer_id="i", run_id="r")
    with pytest.raises(StatusFieldError, match="inference node has no trainer counters"), \
            inference.trainer():  # a trainer's counters
        pass
    with inference.inference() as ic:
        ic.catchups, ic.strikes = 2, {"p": 1}
    with inference.node() as nc:
        nc.rejected = 1
    snap = inference.snapshot()
    assert (snap.inference.catchups, snap.counters.rejected, snap.inference.strikes) == (2, 1, {"p": 1})
    assert snap.trainer is None and trainer.snapshot().trainer.rollouts_used == 3


def test_the_typed_keywords_of_update_are_the_settable_fields() -> None:
    from pulse_node.daemon.status import _settable
    from pulse_node.daemon.status_model import StatusFields

    assert set(StatusFields.__annotations__) == set(_settable())


def test_metrics_are_every_declared_numeric_field() -> None:
    st = NodeStatus(role="trainer", peer_id="t", run_id="r")
    with st.trainer() as c:
        c.reference_bytes_total += 1234
    st.set_data_plane({"bytes_in": 7, "duplicate": True})
    body = generate_latest(st.registry).decode()
    metrics = {ln.split()[0]: float(ln.split()[1]) for ln in body.splitlines() if ln and not ln.startswith("#")}
    declared = {f"pulse_{name}" for name, _, _ in gauge_fields(st.snapshot())}
    assert set(metrics) == declared
    assert metrics["pulse_reference_bytes_total"] == 1234 and metrics["pulse_bytes_in"] == 7
    assert metrics["pulse_duplicate"] == 1 and metrics["pulse_rollouts_used"] == 0
    assert "# HELP pulse_rollouts_refused rollouts in batches refused by verification or intake" in body
    for role in ("trainer", "inference"):  # one name per gauge across a node's sections
        names = [name for name, _, _ in gauge_fields(new_report(role=role, peer_id="p", run_id="r"))]
        assert len(names) == len(set(names)), names


def test_status_round_trips_and_other_schemas_are_refused_clearly() -> None:
    st = NodeStatus(role="trainer", peer_id="t", run_id="r")
    st.record_version(VersionEntry(version=1, state_hash="ab", patch_bytes=9, dense_bytes=90, eval=0.5))
    st.error("x" * 1000)
    back = parse_status(st.to_json())
    assert back == st.snapshot() and back.first_eval.version == 1 and len(back.recent_errors[0].message) == 300
    data = json.loads(st.to_json())
    assert data["schema"] == STATUS_SCHEMA
    with pytest.raises(StatusSchemaError, match=f"schema 99, this pulse-node reads schema {STATUS_SCHEMA}"):
        parse_status({**data, "schema": 99})
    with pytest.raises(StatusSchemaError, match="no schema version"):
        parse_status({k: v for k, v in data.items() if k != "schema"})
    with pytest.raises(StatusSchemaError, match="does not match its declaration.*bogus"):
        parse_status({**data, "bogus": 1})
    for junk in (b"{not json", b"[1, 2]"):
        with pytest.raises(StatusSchemaError):
            parse_status(junk)


def _trainer(peer: str, versions: range, *, patch: int = 100) -> StatusReport:
    st = NodeStatus(role="trainer", peer_id=peer, run_id="r")
    for v in versions:
        st.record_version(VersionEntry(version=v, state_hash=f"h{v}", patch_bytes=patch if v else 0, dense_bytes=5000,
                                       reference_bytes=3 * patch if v else None, changed=0.01 if v else 1.0,
                                       eval=0.5 + v / 100, reward=0.1 * v))
        with st.trainer() as c:
            c.patch_bytes_total += patch if v else 0
            c.dense_bytes_total += 5000 if v else 0
            c.reference_bytes_total += 3 * patch if v else 0
    st.update(version=versions[-1], state_hash=f"h{versions[-1]}")
    return st.snapshot()


def _inference(peer: str, entries: list[VersionEntry], *, holds: int | None = None) -> StatusReport:
    """An inference node that applied ``entries`` and holds ``holds`` (default: the last entry's version)."""
    st = NodeStatus(role="inference", peer_id=peer, run_id="r")
    for e in entries:
        st.record_version(e)
    held = entries[-1].version if holds is None else holds
    st.update(version=held, state_hash=f"h{held}" if holds is not None else entries[-1].state_hash)
    return st.snapshot()


def test_catchup_savings_reference_codec_and_agreement_per_version() -> None:
    caught = VersionEntry(version=6, state_hash="h6", patch_bytes=150, catchup_from=2)
    unknown_range = VersionEntry(version=7, state_hash="h7", patch_bytes=40, catchup_from=0)  # v1 is unknown
    nodes = [NodeInput("trainer-0", _trainer("t0", range(2, 8))), NodeInput("trainer-1", _trainer("t1", range(2, 8))),
             NodeInput("inference-0", _inference("i0", [VersionEntry(version=2, state_hash="h2"), caught])),
             NodeInput("inference-1", _inference("i1", [VersionEntry(version=5, state_hash="X"), unknown_range]))]
    snap = build_snapshot(nodes, now=time.time())
    t = snap.totals
    assert (t.catchups, t.catchup_bytes, t.catchup_replaced_bytes) == (1, 150, 400)  # v3..v6: 4 patches of 100
    assert t.reference_ratio == 3.0 and t.reference_bytes == 1800 and t.changed_mean == pytest.approx(0.01)
    by = {v.version: v for v in snap.versions}
    assert (by[6].holders, by[6].agree, by[6].vs_reference, by[6].compression) == (3, True, 3.0, 50.0)
    assert by[5].agree is False and by[2].agree is True and by[2].holders == 3
    assert [c.version for c in snap.hash_disagreements] == [5]
    assert "catch-up  1 patches 150 B instead of 400 B" in render_text(snap, width=140)


def _write(root: Path, name: str, report: StatusReport) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "status.json").write_text(report.to_json())


def test_a_status_of_another_schema_is_shown_not_crashed_on(tmp_path) -> None:
    _write(tmp_path, "trainer-0", _trainer("t0", range(3)))
    (tmp_path / "inference-0").mkdir()
    newer = json.loads(_inference("i0", [VersionEntry(version=1, state_hash="h1")]).to_json())
    (tmp_path / "inference-0" / "status.json").write_text(json.dumps({**newer, "schema": STATUS_SCHEMA + 1, "new_field": 1}))
    snap = build_snapshot(read_run_dir(tmp_path), now=time.time())
    node = {n.name: n for n in snap.nodes}["inference-0"]
    assert node.state == "unknown-schema" and f"schema {STATUS_SCHEMA + 1}" in (node.problem or "")
    assert any(a.level == "warn" and "inference-0: unknown status schema" in a.message for a in snap.alerts)
    assert "unknown-schema" in render_text(snap, width=160)


class _Running:
    """Stands in for a node's ``Popen`` that has not exited."""

    def poll(self) -> None:
        return None


def _fake_swarm(root: Path) -> LocalSwarm:
    """A LocalSwarm whose nodes are only status files (what the view and summary read)."""
    swarm = LocalSwarm(SwarmConfig(run_dir=root, run_id="r"), log=lambda m: None)
    swarm.bootstrap_addr = "/ip4/127.0.0.1/tcp/1/p2p/X"
    swarm.children = [Child(n, n.split("-")[0], root / n, _Running())  # type: ignore[arg-type]
                      for n in ("trainer-0", "inference-0")]
    return swarm


def test_swarm_without_a_terminal_prints_one_plain_line_per_version(tmp_path) -> None:
    swarm = _fake_swarm(tmp_path)
    piped = io.StringIO()  # not a TTY: no live screen
    view = SwarmView(swarm, stream=piped)
    view.started()
    view.tick()  # no status yet: nothing but the header
    starting = swarm.snapshot()
    assert [n.state for n in starting.nodes] == ["starting", "starting"] and not starting.alerts
    for top in (1, 3):
        _write(tmp_path, "trainer-0", _trainer("t0", range(top + 1)))
        applied = [VersionEntry(version=v, state_hash=f"h{v}", patch_bytes=100) for v in range(1, top)]
        _write(tmp_path, "inference-0", _inference("i0", applied, holds=top - 1))
        view.tick()
    view.close()  # the stop: versions not yet settled are written too
    out = piped.getvalue()
    lines = [ln for ln in out.splitlines() if "] v" in ln]
    assert out.splitlines()[1] == "bootstrap: /ip4/127.0.0.1/tcp/1/p2p/X" and "\x1b[" not in out
    assert [ln.split("] ")[1].split()[0] for ln in lines] == ["v0", "v1", "v2", "v3"]
    assert "v2  hashes agree on 2 nodes  patch 100 B (50.0x smaller than dense, 3.0x smaller than ref codec)  " \
           "changed 1%  reward 0.200  eval 0.520" in lines[2]
    assert "held by 1 node" in lines[3]  # the inference node never got v3
    summary = swarm.summary()
    assert summary["versions"] == 2 and summary["states_agree"] and summary["smaller_than_dense"] == 50.0
    assert summary["smaller_than_reference"] == 3.0 and summary["changed_fraction_mean"] == 0.01
    assert summary["eval_first"] == 0.5 and summary["eval_last"] == 0.53 and summary["bytes_patch_total"] == 300
    assert [v["version"] for v in summary["per_version"]] == [0, 1, 2, 3]
    json.dumps(summary)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    seen = readme.split("## What you will see")[1].split("\n## ")[0]
    assert [k for k in summary if f"`{k}`" not in seen] == [], "README 'What you will see' misses summary keys"


def test_progress_heartbeat_when_nothing_settles() -> None:
    now = [0.0]
    out: list[str] = []
    lines = ProgressLines(out.append, heartbeat_s=10, clock=lambda: now[0])
    snap = build_snapshot([NodeInput("trainer-0", new_report(role="trainer", peer_id="t", run_id="r"))], now=0.0)
    lines.update(snap)
    now[0] = 11.0
    lines.update(snap)
    assert out == ["[    11s] waiting: trainer-0 live"]  # no version yet; a silent log means a stuck swarm
