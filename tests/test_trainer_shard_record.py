"""A trainer on 2 processes (torchrun, FSDP2 over gloo) records its inner steps as one process
does, and spot checks of it pass (``tests/shard_record_run.py`` runs both trainers in one launch).

Bit-identical commitments are out of reach: the ranks' gradients add up in another order than one
process's micro-batches (the tied head's and the embedding's parts of one tensor, too), so the
clipped gradients differ in their last bits and so do the payload and every later state. Everything
else a commitment holds must be the same bytes: base, settings, sizes, the first round's start
state root, each step's batch, the weights hash of each round's first step, and the gradient norm
of a step on the same two rollouts (one per rank); the gradients within 1e-6 of each other (a check's tolerance is 1e-3). Then every
step of a round on seeded batches (many micro-batches per rank), linked to the next round's start
state (AdamW moments and error feedback gathered from the ranks), passes a real check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a torchrun launch of 2 processes (~12 s)
HERE = Path(__file__).parent


def test_a_two_process_trainer_commits_what_one_process_does_and_passes_its_checks(tmp_path, warm_cache) -> None:
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(HERE / "shard_record_run.py"), str(warm_cache), str(report)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(report.read_text())
    assert out["initial_equal"]
    for r in range(4):
        got = out[f"round{r}"]
        assert all(got["fields"].values()) if r == 0 else \
            all(v for k, v in got["fields"].items() if k != "state_root"), (r, got["fields"])
        assert got["start_state"] == (r == 0), r  # later rounds start from moments made of the gradients
        assert all(s["stepped"] and s["batch"] for s in got["steps"]), (r, got["steps"])
        assert max(got["gradient_rel"]) < 1e-6, (r, got["gradient_rel"])
    for r in range(4):  # every round's first step runs on its base
        assert out[f"round{r}"]["steps"][0]["weights"], r
    for r in (0, 1):  # the norm over whole tensors, of the same two rollouts' gradients on the same weights
        assert out[f"round{r}"]["steps"][0]["grad_norm"], r
    assert [c["ok"] for c in out["checks"]] == [True, True], out["checks"]
    assert all(c["gradient_error"] < 1e-5 for c in out["checks"]), out["checks"]
