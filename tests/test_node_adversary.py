"""Hostile peers, short (``bench/adversary.py`` is the long version): a small process swarm (2
trusted trainers, 1 inference node) while hostile peers with fresh keys, each with its own DHT
and wire workers, all at once: announce version 1e15 (and try a trainer's key and address),
bait ``metrics_url`` and push wrong-run heads, serve genuine records with garbage patches and
anchors, and flood trainers with well-formed rollouts. Only what main defends is asserted:
every held and stored state is one the trainers signed, no honest process exits or restarts,
and the nodes report what they refused. (Attacks that announce the trainer role stall rounds on
main and are left to ``bench/adversary.py``.)
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers import wait_for

from pulse_node.config import SwarmConfig

pytestmark = pytest.mark.slow  # a process swarm

ATTACKS = ("huge_version", "smaller", "bad_anchor", "rollout_flood")
ATTACK_S = 8.0


def _config(tmp_path, cache_dir) -> SwarmConfig:
    return SwarmConfig.model_validate({
        "trainers": 2, "inference": 1, "run_dir": str(tmp_path / "swarm"), "run_id": "adversary-test",
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "cache_dir": str(cache_dir)},
        "task": {"digits": 2}, "sampling": {"prompts_per_batch": 4, "group_size": 4, "max_new_tokens": 6},
        "grpo": {"warmstart_steps": 0}, "loco": {"inner_steps": 2, "deadline_s": 10}, "rollout_wait_s": 0.5,
        "eval_every": 0, "rollout_batches_per_version": 1, "chain": {"anchor_every": 5, "keep_versions": 8}})


def test_hostile_peers_move_nothing(tmp_path, warm_cache):
    from pulse_node.swarm.launcher import LocalSwarm
    from pulse_node.testing.attackers import run_attack
    from pulse_node.testing.chaos import ChaosLedger

    cfg = _config(tmp_path, warm_cache)
    swarm, ledger = LocalSwarm(cfg, log=lambda m: None), ChaosLedger()
    results: dict[str, dict] = {}

    def attack(name: str) -> None:
        results[name] = run_attack(name, tmp_path / "hostile" / name, run_id=cfg.run_id,
                                   bootstrap=[swarm.bootstrap_addr], seconds=ATTACK_S)

    def inference_version() -> int:
        ledger.poll(swarm.children)
        return next(c.version() for c in swarm.children if c.role == "inference")

    try:
        swarm.start()
        wait_for(lambda: inference_version() >= 2, timeout=240, interval=0.5, what="inference-0 at version 2")
        started = {c.name: c.status().started_at for c in swarm.children}
        threads = [threading.Thread(target=attack, args=(n,), daemon=True) for n in ATTACKS]
        for t in threads:
            t.start()
        end = time.monotonic() + ATTACK_S + 90

        def attacks_over() -> bool:  # the ledger follows the swarm meanwhile; a hung attacker shows in `results`
            ledger.poll(swarm.children)
            return not any(t.is_alive() for t in threads) or time.monotonic() >= end

        wait_for(attacks_over, timeout=ATTACK_S + 120, interval=0.5, what="the attacks to end")
        target = ledger.head + 1
        wait_for(lambda: inference_version() >= target, timeout=120, interval=0.5, what=f"version {target}")
        # a trainer's status file is written on its own loop: the version it published may show later
        wait_for(lambda: max(c.version() for c in swarm.children if c.role == "trainer") >= target,
                 timeout=30, interval=0.5, what=f"a trainer's status at version {target}")
        exited = [c.name for c in swarm.children if c.proc.poll() is not None]
        restarted = [c.name for c in swarm.children if (s := c.status()) and s.started_at != started[c.name]]
        statuses = [c.status() for c in swarm.children]
    finally:
        swarm.stop()
    ledger.read_stores(swarm.children)
    check = ledger.check()
    assert set(results) == set(ATTACKS) and not any("attacker_error" in r for r in results.values()), results
    assert check["corrupted_states_used"] == 0, check["wrong"]
    assert check["held_checked"] >= 2 and check["trainer_disagreement_count"] == 0, check
    assert not exited and not restarted, (exited, restarted)
    assert results["rollout_flood"]["sent"].get("rollouts_pushed", 0) > 0, results["rollout_flood"]
    assert sum(s.counters.rejected for s in statuses) > 0  # the nodes said what they refused
    assert max(s.version for s in statuses if s.role == "trainer") >= target
