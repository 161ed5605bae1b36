"""Held-out evaluation: greedy accuracy under the task reward (reward >= 1 counts as solved)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pulse_node.rl.config import SamplingConfig
from pulse_node.rl.tasks import Problem

if TYPE_CHECKING:
    from pulse_node.rl.policy import Policy
    from pulse_node.rl.sampler import RolloutWorker


def evaluate(worker_or_policy: RolloutWorker | Policy, problems: Sequence[Problem], *,
             max_new_tokens: int | None = None) -> float:
    """Fraction of ``problems`` whose greedy completion earns full reward.

    A ``Policy`` is evaluated on its BF16 cast (a temporary worker), like inference would.
    """
    from pulse_node.rl.sampler import RolloutWorker

    if isinstance(worker_or_policy, RolloutWorker):
        worker = worker_or_policy
    else:
        cfg = SamplingConfig(max_new_tokens=max_new_tokens or SamplingConfig().max_new_tokens)
        worker = RolloutWorker(worker_or_policy, cfg)
        worker.set_weights(worker_or_policy.bf16_state(), version=0)
    if not problems:
        return 0.0
    texts = worker.greedy(problems)
    solved = sum(worker.reward_fn(t, p.answer) >= 1.0 for t, p in zip(texts, problems))
    return solved / len(problems)
