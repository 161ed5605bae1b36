"""``pulse-node solo``: trainer and inference in one process, no network.

Loop: the worker generates rollouts on the BF16 weights of version v with the same seeded
sampler and prompt assignment as inference nodes (batch key: run ``solo-<seed>``, producer
``solo``, batch = step; ``rl/assign.py``, ``rl/seeded.py``); the learner takes one
GRPO inner step on the FP32 masters (version v+1); every ``sync_every`` steps the worker loads
the new BF16 cast (so with ``sync_every > 1`` rollouts are up to that many versions stale and
the importance correction matters). Held-out greedy accuracy is measured before and after.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import SoloConfig
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import Policy, build_policy, check_prompts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import Problem, TaskSource, make_task_source


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _check_task(policy: Policy, task: TaskSource, cfg: SoloConfig) -> None:
    problems = task.all_problems() if hasattr(task, "all_problems") else task.eval_set()
    check_prompts(policy.tokenizer, problems, context=policy.lm.context,
                  max_new_tokens=cfg.sampling.max_new_tokens)


@dataclass
class _Totals:
    """What the GRPO phase adds up over its steps."""

    steps: int = 0
    rollouts: int = 0
    changed: float = 0.0
    reward: float = 0.0
    dropped: int = 0
    tokens: float = 0.0
    seconds: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)


def _train(cfg: SoloConfig, policy: Policy, worker: RolloutWorker, task: TaskSource, evals: Sequence[Problem], *,
           progress: bool) -> _Totals:
    """The GRPO phase: generate -> one inner step -> (every sync_every) push the BF16 cast."""
    learner = GRPOLearner(policy, cfg.grpo, temperature=cfg.sampling.temperature)
    t0 = time.monotonic()
    deadline = t0 + cfg.minutes * 60
    tot = _Totals()
    while time.monotonic() < deadline and (cfg.max_steps is None or tot.steps < cfg.max_steps):
        key = BatchKey(f"solo-{cfg.seed}", worker.version, "solo", tot.steps)
        rollouts = worker.generate_batch(task, key)
        stats = learner.step(rollouts, current_version=tot.steps)
        tot.steps += 1
        version = tot.steps
        tot.rollouts += len(rollouts)
        tot.changed += stats["bf16_changed"]
        tot.reward += stats["reward_mean"]
        tot.dropped += int(stats["dropped_stale"])
        tot.tokens += stats["tokens"]
        if version % cfg.sync_every == 0:
            worker.set_weights(policy.bf16_state(), version)
        note = ""
        if cfg.eval_every and version % cfg.eval_every == 0:
            score = evaluate(worker, evals)
            tot.history.append({"step": version, "seconds": round(time.monotonic() - t0, 1), "eval": score})
            note = f" eval {score:.3f}"
        if version % 20 == 0 or note:
            _log(progress, f"[solo] step {version} reward {stats['reward_mean']:.3f} loss "
                 f"{stats['loss']:+.4f} bf16_changed {stats['bf16_changed']:.4f} "
                 f"({time.monotonic() - t0:.0f}s){note}")
    tot.seconds = time.monotonic() - t0
    return tot


class SoloSummary(TypedDict):
    """What a solo run reports (``pulse-node solo --json`` prints it)."""

    eval_before: float
    eval_after: float
    eval_problems: int
    steps: int
    rollouts: int
    bf16_change_density: float
    train_reward_mean: float
    dropped_stale: int
    trainer_tokens: int
    grpo_seconds: float
    seconds: float
    seed: int
    history: list[dict[str, float]]


def run_solo(cfg: SoloConfig, *, progress: bool = True) -> SoloSummary:
    """Warm start (cached), evaluate, GRPO for ``cfg.minutes``, evaluate; returns a summary."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_start = time.monotonic()
    task = make_task_source(cfg.task)
    policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo, progress=progress)
    _check_task(policy, task, cfg)
    worker = RolloutWorker(policy, cfg.sampling)
    worker.set_weights(policy.bf16_state(), 0)
    evals = task.eval_set()
    eval_before = evaluate(worker, evals)
    _log(progress, f"[solo] held-out accuracy before GRPO: {eval_before:.3f} ({len(evals)} problems)")
    tot = _train(cfg, policy, worker, task, evals, progress=progress)
    worker.set_weights(policy.bf16_state(), tot.steps)
    eval_after = evaluate(worker, evals)
    _log(progress, f"[solo] held-out accuracy after {tot.steps} GRPO steps: {eval_after:.3f}")
    steps = max(1, tot.steps)
    return {"eval_before": eval_before, "eval_after": eval_after, "eval_problems": len(evals),
            "steps": tot.steps, "rollouts": tot.rollouts,
            "bf16_change_density": tot.changed / steps, "train_reward_mean": tot.reward / steps,
            "dropped_stale": tot.dropped, "trainer_tokens": int(tot.tokens),
            "grpo_seconds": round(tot.seconds, 3), "seconds": round(time.monotonic() - t_start, 3),
            "seed": cfg.seed, "history": tot.history}
