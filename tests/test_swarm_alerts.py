"""Every alert of issue 33, from fake status files (no processes): a fork, a version without
contributors, a round closed without an update and a node failing the same way again and again
each reach the piped terminal line, ``pulse-node status``, the JSON summary and the exit code of
``pulse-node swarm``; a healthy run has none and exits 0."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pulse_node.cli import main
from pulse_node.commands.swarm import exit_code
from pulse_node.config import SwarmConfig
from pulse_node.daemon.status import NodeStatus
from pulse_node.daemon.status_model import StatusReport, VersionEntry
from pulse_node.swarm.launcher import Child, LocalSwarm
from pulse_node.swarm.view import SwarmView

NAMES = ("trainer-0", "trainer-1")


class _Running:
    def poll(self) -> None:
        return None


def _trainer(peer: str, *, hashes: dict[int, str], contributors: dict[int, int], forks: int = 0,
             errors: list[str] = ()) -> StatusReport:
    st = NodeStatus(role="trainer", peer_id=peer, run_id="r")
    for v, h in hashes.items():
        st.record_version(VersionEntry(version=v, state_hash=h, patch_bytes=100 if v else 0, dense_bytes=5000,
                                       changed=0.0 if contributors.get(v) == 0 else 0.5, eval=0.5, reward=0.1,
                                       contributors=contributors.get(v)))
        with st.trainer() as c:
            c.patch_bytes_total += 100 if v else 0
            c.dense_bytes_total += 5000 if v else 0
    with st.trainer() as c:
        c.forks = forks
    for e in errors:
        st.error(e)
    top = max(hashes)
    st.update(version=top, state_hash=hashes[top])
    return st.snapshot()


def _run(root: Path, reports: dict[str, StatusReport]) -> tuple[str, dict, str]:
    """(piped progress, summary, ``pulse-node status --once`` screen) of a swarm whose nodes wrote ``reports``."""
    swarm = LocalSwarm(SwarmConfig(run_dir=root, run_id="r"), log=lambda m: None)
    swarm.bootstrap_addr = "/ip4/127.0.0.1/tcp/1/p2p/X"
    swarm.children = [Child(n, "trainer", root / n, _Running()) for n in reports]  # type: ignore[arg-type]
    for name, rep in reports.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "status.json").write_text(rep.to_json())
    piped = io.StringIO()
    view = SwarmView(swarm, stream=piped)
    view.started()
    view.tick()
    view.close()
    summary = swarm.summary()
    view.final(summary)
    return piped.getvalue(), summary, root


HEALTHY = {v: f"h{v}" for v in range(4)}
ALL_IN = dict.fromkeys(range(1, 4), 2)

CASES = {
    "fork": ({"trainer-0": dict(hashes=HEALTHY, contributors=ALL_IN),
              "trainer-1": dict(hashes={**HEALTHY, 2: "x2", 3: "x3"}, contributors=ALL_IN)},
             "state hashes disagree at version"),
    "no_contributors": ({n: dict(hashes=HEALTHY, contributors={**ALL_IN, 2: 0, 3: 0}) for n in NAMES},
                        "published with no contributors (v2, v3)"),
    "round_without_update": ({n: dict(hashes=HEALTHY, contributors=ALL_IN, forks=1 if n == "trainer-1" else 0)
                              for n in NAMES}, "trainer-1 closed 1 round(s) without an update"),
    "repeated_error": ({n: dict(hashes=HEALTHY, contributors=ALL_IN,
                                errors=[f"fetch of v{v} from 12D3KooW{v} failed" for v in range(6)] if n == "trainer-0"
                                else []) for n in NAMES}, "trainer-0 keeps failing the same way"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_alert_reaches_the_terminal_status_summary_and_exit_code(kind, tmp_path, capsys) -> None:
    nodes, says = CASES[kind]
    piped, summary, root = _run(tmp_path, {n: _trainer(f"p{n[-1]}", **kw) for n, kw in nodes.items()})
    line = next((ln for ln in piped.splitlines() if "ALERT" in ln and kind in ln), "")
    assert says in line, piped  # the progress line of its own, when it is first seen
    assert any(kind in ln and says in ln for ln in piped.splitlines() if ln.startswith("ALERT")), "not in the final lines"
    assert [a for a in summary["alerts"] if a["kind"] == kind and says in a["message"]], summary["alerts"]
    failing = kind != "repeated_error"
    assert main(["status", "--run-dir", str(root), "--once", "--width", "400"]) == (1 if failing else 0)
    assert says in capsys.readouterr().out
    assert (kind in summary["failed"]) == failing
    assert exit_code(summary, stopped=False, versions=3) == (2 if failing else 0)
    if kind == "no_contributors":
        v2 = next(ln for ln in piped.splitlines() if "] v2 " in ln)
        assert "NO CONTRIBUTORS" in v2 and "smaller than dense" not in v2 and "changed" not in v2, v2
        assert summary["versions_without_contributors"] == [2, 3]


def test_a_healthy_run_has_no_alert_and_exits_zero(tmp_path) -> None:
    piped, summary, _ = _run(tmp_path, {n: _trainer(f"p{n[-1]}", hashes=HEALTHY, contributors=ALL_IN) for n in NAMES})
    assert "ALERT" not in piped and not summary["alerts"] and not summary["failed"], piped
    assert "2 contributors" in next(ln for ln in piped.splitlines() if "] v3 " in ln)
    assert exit_code(summary, stopped=False, versions=3) == 0 and exit_code(summary, stopped=True, versions=3) == 130


class _Exited:
    returncode = 1

    def poll(self) -> int:
        return 1


def test_a_node_that_exits_is_reported_with_its_own_error_text(tmp_path) -> None:
    """Not only "see log.txt": the end of the node's own log, where its error is."""
    from pulse_node.errors import PulseError

    swarm = LocalSwarm(SwarmConfig(run_dir=tmp_path, run_id="r"), log=lambda m: None)
    d = tmp_path / "inference-1"
    d.mkdir()
    (d / "log.txt").write_text("".join(f"line {i}\n" for i in range(40)) +
                               "DataError: model Qwen/X: not in the local Hugging Face cache; hf download Qwen/X\n")
    swarm.children = [Child("inference-1", "inference", d, _Exited())]  # type: ignore[arg-type]
    with pytest.raises(PulseError) as err:
        swarm.check_alive()
    text = str(err.value)
    assert "inference-1 exited with code 1" in text and "| DataError: model Qwen/X" in text
    assert "hf download Qwen/X" in text and "line 39" in text and "line 20" not in text  # its last lines only
