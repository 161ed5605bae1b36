"""Chaos, short: a swarm whose data plane drops, duplicates, reorders, delays and corrupts
messages, with an inference node stopped and restarted mid-run. No corrupted state may ever be
used: every state an inference node applied must equal the trainers' state at that version.

Two versions: the real roles as threads on the in-memory transport, and the real thing (separate
processes: role + DHT worker + wire worker per node) with every message kind faulted, trainer to
trainer included, an inference node's role process killed with SIGKILL and restarted, and a
forging peer (its own DHT and wire workers) serving a self-signed chain and pushing its head.
(``bench/chaos.py`` runs the long version with more nodes, kills and a forging peer.)
"""

from __future__ import annotations

import pytest
from helpers import read_status, wait_for

from pulse_node.config import InferenceConfig, SwarmConfig, TrainerConfig
from pulse_node.testing.faults import FaultRates, FaultyTransport
from pulse_node.testing.inprocess import InProcessSwarm, node_version

pytestmark = pytest.mark.slow  # swarms of training nodes (in-process and separate processes)

RATES = FaultRates(drop=0.1, duplicate=0.1, reorder=0.1, delay=0.1, corrupt=0.05, max_delay_s=0.05,
                   spare_kinds=("loco",))


def test_faulty_links_and_restart_never_use_a_corrupt_state(node_cfg):
    faulty: dict[str, FaultyTransport] = {}

    def wrap(name, transport):
        faulty[name] = FaultyTransport(transport, RATES, seed=len(faulty) + 1)
        return faulty[name]

    swarm = InProcessSwarm(wrap=wrap)
    try:
        t1 = swarm.start("trainer-a", node_cfg(TrainerConfig, "t1"))
        i1 = swarm.start("infer-a", node_cfg(InferenceConfig, "i1"))
        i2 = swarm.start("infer-b", node_cfg(InferenceConfig, "i2"))
        wait_for(lambda: node_version(i2) >= 3, timeout=240, what="infer-b at version 3")
        swarm.stop(i2)
        before = node_version(i2)
        swarm.start("infer-b", node_cfg(InferenceConfig, "i2"))
        wait_for(lambda: (not swarm.errors and min(node_version(i1), node_version(i2)) >= before + 4) or bool(swarm.errors),
                 timeout=240, what="both inference nodes 4 versions past the restart")
        top = max(node_version(i1), node_version(i2))
        wait_for(lambda: any(h.version >= top for h in read_status(t1).history), timeout=30, what="trainer status")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    trainer = {h.version: h.state_hash for h in read_status(t1).history}
    for node in (i1, i2):
        applied = read_status(node).history
        assert applied
        bad = [h.version for h in applied if trainer[h.version] != h.state_hash]
        assert not bad, f"{node.name} used wrong states at versions {bad}"
    injected = sum(sum(f.faults.values()) for f in faulty.values())
    assert injected > 0, "no faults were injected"


#: every kind a trainer sends or fetches from another trainer
TRAINER_KINDS = ("loco", "loco_decision", "loco_payload", "trainer_state")


def _process_config(tmp_path, cache_dir) -> SwarmConfig:
    faults = {"enabled": True, "drop": 0.1, "duplicate": 0.1, "reorder": 0.1, "delay": 0.1, "corrupt": 0.05,
              "max_delay_s": 0.1}
    return SwarmConfig.model_validate({
        "trainers": 2, "inference": 1, "run_dir": str(tmp_path / "swarm"), "run_id": "chaos-test",
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "cache_dir": str(cache_dir)},
        "task": {"digits": 2}, "sampling": {"prompts_per_batch": 4, "group_size": 4, "max_new_tokens": 6},
        "grpo": {"warmstart_steps": 0}, "loco": {"inner_steps": 2, "deadline_s": 10}, "rollout_wait_s": 0.5,
        "eval_every": 0, "rollout_batches_per_version": 1, "chain": {"anchor_every": 5, "keep_versions": 8},
        "net": {"faults": faults}})


def test_process_swarm_faulty_data_plane_and_kill_9(tmp_path, warm_cache):
    from pulse_node.testing.chaos import ChaosPlan, ProcessChaos

    chaos = ProcessChaos(_process_config(tmp_path, warm_cache), ChaosPlan(kill_every_s=float("inf"), forged_versions=200),
                         log=lambda m: None)

    def version_of(name: str) -> int:
        chaos.tick()  # reads every status, restarts what was killed
        s = chaos.current_status(chaos.node(name))
        return s.version if s is not None else -1

    try:
        chaos.start()
        wait_for(lambda: version_of("inference-0") >= 2, timeout=300, interval=0.5, what="inference-0 at version 2")
        killed = chaos.kill_one(role="inference", mode="role")  # its workers must exit on their own
        assert killed is not None
        target = chaos.ledger.head + 3
        wait_for(lambda: version_of("inference-0") >= target, timeout=300, interval=0.5,
                 what=f"restarted inference-0 at version {target}")
    finally:
        chaos.close()
    s = chaos.summary()
    assert s["restarts"] == 1 and not s["unexpected_exits"] and s["orphans_killed"] == 0, s
    assert s["corrupted_states_used"] == 0, s["wrong"]
    assert s["held_checked"] >= 3 and s["stored_checked"] >= 1, s
    assert s["trainer_versions_compared"] >= 3 and s["trainer_disagreement_count"] == 0, s
    faulted = s["faults_by_message"]
    assert sum(n for k, n in faulted.items() if k.split(":")[0] in TRAINER_KINDS) > 0, faulted
    assert sum(n for k, n in faulted.items() if k.split(":")[0] in ("record", "patch", "head")) > 0, faulted
    assert s["forged_rejected"] >= 1 and s["rogue_served"].get("record", 0) >= 1, s  # asked, and caught
