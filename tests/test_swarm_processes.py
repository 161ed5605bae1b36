"""The real thing: bootstrap, 2 trainers and 2 inference nodes as separate processes on 127.0.0.1.

Every inference node must hold exactly the trainers' state at every version it applied,
rollouts must reach the trainers and improve held-out accuracy, and an inference node that
joins late must catch up from its peers (the genesis anchor, then one catch-up patch made on
demand by a peer's wire worker) and end bit-identical. One swarm serves all assertions to keep
the suite short.
"""

from __future__ import annotations

import pytest

from pulse_node.config import SwarmConfig
from pulse_node.swarm.launcher import LocalSwarm
from helpers import wait_for

pytestmark = pytest.mark.slow


def _swarm_config(tmp_path, cache_dir) -> SwarmConfig:
    """The embedded default model and task (so learning is visible), short rounds."""
    return SwarmConfig.model_validate({
        "trainers": 2, "inference": 2, "run_dir": str(tmp_path / "swarm"), "run_id": "test-swarm",
        "model": {"cache_dir": str(cache_dir)}, "loco": {"inner_steps": 5, "deadline_s": 30},
        "eval_every": 1, "chain": {"anchor_every": 1000}})  # only genesis is an anchor: the late joiner
    # starts from anchor 0 however far the swarm got while it started, so it needs a catch-up patch


def _history(status: dict) -> dict[int, str]:
    return {h["version"]: h["state_hash"] for h in status.get("history", [])}


@pytest.fixture
def swarm(tmp_path, warm_cache):
    s = LocalSwarm(_swarm_config(tmp_path, warm_cache), log=lambda m: None)
    try:
        s.start()
        yield s
    finally:
        s.stop()
    for c in s.children:
        assert c.proc.poll() is not None, f"{c.name} still running after stop"


def test_process_swarm_bit_identical_with_late_joiner(swarm):
    def at_least(v: int) -> bool:
        swarm.check_alive()
        return swarm.min_version() >= v

    wait_for(lambda: at_least(5), timeout=420, interval=0.5, what="every node at version 5")
    late = swarm.add_node("inference-late", "inference")
    wait_for(lambda: (swarm.check_alive() or True) and late.status().get("version", -1) >= 6,
             timeout=300, interval=0.5, what="late joiner at version 6")

    top = late.status().get("version", -1)
    wait_for(lambda: all(any(h["version"] >= top for h in s.get("history", []))
                         for c, s in swarm.statuses() if c.role == "trainer"),
             timeout=30, interval=0.2, what="trainer status files to catch up")
    stats = {c.name: s for c, s in swarm.statuses()}
    trainer_hashes: dict[int, str] = {}
    for name in ("trainer-0", "trainer-1"):
        for v, h in _history(stats[name]).items():
            assert trainer_hashes.setdefault(v, h) == h, f"trainers disagree at version {v}"
    for name in ("inference-0", "inference-1", "inference-late"):
        applied = _history(stats[name])
        assert applied or name == "inference-late", f"{name} applied no versions"
        for v, h in applied.items():
            assert trainer_hashes[v] == h, f"{name} holds a different state at version {v}"
    late_now = stats["inference-late"]  # it may have jumped straight to an anchor
    assert trainer_hashes.get(late_now["version"]) == late_now["state_hash"], "late joiner holds a different state"
    assert stats["inference-late"].get("anchor_loads", 0) + stats["inference-late"].get("patches_applied", 0) > 0
    late_counters = {k: v for k, v in late_now.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert late_now.get("catchups", 0) >= 1, f"the late joiner did not use a catch-up patch: {late_counters}"
    rollouts_in = sum(stats[n].get("rollouts_in", 0) for n in ("trainer-0", "trainer-1"))
    assert rollouts_in > 0, "no rollouts reached the trainers"
    for name in ("trainer-0", "trainer-1"):  # PULSELoCo payloads ride hivemind's p2pd, not the wire
        assert stats[name]["bytes_in_by_plane"]["hivemind"] > 0, f"{name} received no payload over p2pd"
        assert stats[name]["loco_fallbacks"] == 0, f"{name} fell back to the wire for a payload"
    assert stats["trainer-0"]["patch_bytes_total"] < stats["trainer-0"]["dense_bytes_total"]
    evals = {h["version"]: h["eval"] for name in ("trainer-0", "trainer-1")  # genesis: whoever published it
             for h in stats[name]["history"] if "eval" in h}
    assert max(evals[v] for v in evals if v >= 4) > evals[0], f"held-out accuracy did not improve: {evals}"
