"""No run, and no restarted node, takes a signed statement of an earlier run as its own (issue 33).

``pulse-node swarm`` run twice in one directory: the second run keeps the trainers' keys, the run
id and the genesis state (the seeded model: here the tests' tiny one, with its cached warm start), so
whatever the first run signed for a round is well signed in the second. Its rollouts differ (here
by another sampling temperature; with inference nodes, by timing), so its payloads do too: a
decision of the first run names payloads nobody has. Then one trainer started
again on its old directory, first with its store (it continues its chain and epoch), then without
it and alone (a new epoch; its old decisions mean nothing). Every version of every run has at least
one contributor, no round closes without an update, and all nodes agree at every version.

One test, one run dir, so the processes start as few times as the story needs. Statuses are read
as raw JSON so the same checks run on older code (its schema lacks ``contributors``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_overrides, wait_for

from pulse_node.chain.layout import store_path
from pulse_node.config import SwarmConfig
from pulse_node.swarm.launcher import LocalSwarm

pytestmark = pytest.mark.slow

#: short rounds; the default model, warm-started from the session's cache (an untrained one earns no
#: reward, so its payloads are empty and alike in every run: nothing to tell the runs apart)
#: the tests' tiny model and batches (``helpers.tiny_overrides``): the story needs runs, not a big model
TINY = {"model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2, "task.digits": 2,
        "sampling.prompts_per_batch": 4, "sampling.group_size": 4, "sampling.max_new_tokens": 6}
SETTINGS = {"loco.inner_steps": 1, "loco.deadline_s": 20, "eval_every": 0, "rollout_wait_s": 0, **TINY}


def _report(data_dir: Path) -> dict:
    return json.loads((data_dir / "status.json").read_text())


def _check_run(run_dir: Path, names: list[str], *, first: int = 1) -> dict[int, str]:
    """Every trainer closed every round with an update, the trainers agree at every version, and
    every version from ``first`` on has a contributor; returns version -> state hash."""
    reports = {name: _report(run_dir / name) for name in names}
    for name, rep in reports.items():
        assert rep["trainer"]["forks"] == 0, f"{name} closed rounds without an update: {rep['recent_errors'][-3:]}"
    hashes: dict[int, str] = {}
    for name, rep in reports.items():
        for h in rep["history"]:
            assert hashes.setdefault(h["version"], h["state_hash"]) == h["state_hash"], f"fork at v{h['version']}"
            if h["version"] >= first and rep["schema"] >= 8:  # schema 8 reports contributors per version
                assert h["contributors"] >= 1, f"{name}: v{h['version']} has no contributors"
    return hashes


def _genesis(data_dir: Path) -> bytes:
    return store_path(data_dir / "store", "record", 0).read_bytes()


def _swarm_twice(run_dir: Path, cache: Path) -> None:
    cmd = [sys.executable, "-m", "pulse_node", "swarm", "--versions", "2", "--trainers", "2", "--inference", "0",
           "--run-dir", str(run_dir), "--json", "--set", f"model.cache_dir={json.dumps(str(cache))}"]
    cmd += [a for key, value in SETTINGS.items() for a in ("--set", f"{key}={value}")]
    runs, said = [], []
    for extra in ([], ["--set", "sampling.temperature=0.7"]):
        done = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        hashes = _check_run(run_dir, ["trainer-0", "trainer-1"])
        assert summary["states_agree"] and summary["hash_disagreements"] == 0, summary
        assert done.returncode == 0 and not summary.get("failed"), done.stderr[-3000:]
        said.append(done.stderr)
        runs.append(hashes)
    assert all("[warm start]" in err for err in said), "the warm-up said nothing on the terminal"
    assert runs[0][0] == runs[1][0], "the two runs did not start from the same genesis state (the test's premise)"
    changed = [h["changed"] for h in _report(run_dir / "trainer-0")["history"] if h["version"] >= 1]
    assert changed and min(changed) > 0, "no update changed the weights: the runs could not tell apart (premise)"


def _restart_alone(run_dir: Path, cache: Path) -> None:
    """trainer-0 again on its directory: with its store it goes on from its head in the same epoch;
    killed, its store lost, it starts a new epoch alone and every round still has an update."""
    cfg = SwarmConfig.model_validate({**tiny_overrides(cache), "trainers": 1, "inference": 0, "run_dir": str(run_dir),
                                      "fresh": False, "loco": {"inner_steps": 1, "deadline_s": 20},
                                      "eval_every": 0, "rollout_wait_s": 0})
    swarm = LocalSwarm(cfg, log=lambda m: None)
    try:
        d = run_dir / "trainer-0"
        before, head = _genesis(d), _report(d)["version"]
        swarm.start()
        for lost in (False, True):
            child = swarm.children[0]
            top = 2 if lost else head + 1

            def at(c=child, v=top) -> bool:
                swarm.check_alive()
                return c.version() >= v and _report(c.data_dir)["trainer"]["rounds"] > 0

            wait_for(at, timeout=300, interval=0.5, what=f"trainer-0 at version {top} (store lost: {lost})")
            _check_run(run_dir, ["trainer-0"], first=1 if lost else head + 1)
            assert (_genesis(d) != before) == lost, "the genesis record changed" if not lost else "the same genesis"
            if not lost:
                swarm.kill(child, "node")
                shutil.rmtree(d / "store")
                (d / "status.json").unlink()
                swarm.restart(child)
    finally:
        swarm.stop()


def test_swarm_twice_in_one_directory_then_a_trainer_restarted_on_it(tmp_path, warm_cache):
    run_dir = tmp_path / "swarm"
    _swarm_twice(run_dir, warm_cache)
    _restart_alone(run_dir, warm_cache)
