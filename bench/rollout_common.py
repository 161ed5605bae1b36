"""Shared by the rollout benches: the default solo policy at two versions, GRPO steps apart."""

from __future__ import annotations

from pathlib import Path

from pulse_node.configload import load_config
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import SoloConfig
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source

ROOT = Path(__file__).resolve().parents[1]


def solo_versions(steps: int) -> tuple[SoloConfig, object, dict[int, object]]:
    """configs/solo.toml, its warm-started policy, and the BF16 states of version 0 (the warm
    start) and version 1 (``steps`` on-policy GRPO steps later; the policy is left there)."""
    cfg = load_config(SoloConfig, ROOT / "configs" / "solo.toml")
    policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo, progress=True)
    task, states = make_task_source(cfg.task), {0: policy.bf16_state()}
    worker, learner = RolloutWorker(policy, cfg.sampling), GRPOLearner(policy, cfg.grpo)
    for s in range(steps):
        worker.set_weights(policy.bf16_state(), 0)
        learner.step(worker.generate_batch(task, BatchKey("warm", 0, "bench", s)), current_version=0)
    states[1] = policy.bf16_state()
    return cfg, policy, states
