"""Rollout generation: seeded determinism, versions, and log-probs that the trainer agrees with."""

from __future__ import annotations

import random

import pytest
import torch

from pulse_node.errors import DataError
from pulse_node.rl.batch import pack, token_logprobs
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import Problem, make_task_source
from helpers import tiny_solo


@pytest.fixture
def setup(warm_cache):
    cfg = tiny_solo(warm_cache)
    policy = build_policy(cfg.model, cfg.task, seed=3, grpo_cfg=cfg.grpo)
    worker = RolloutWorker(policy, cfg.sampling)
    worker.set_weights(policy.bf16_state(), version=5)
    return cfg, policy, worker, make_task_source(cfg.task)


def test_same_seed_same_rollouts(setup) -> None:
    cfg, _, worker, task = setup
    problems = task.sample(3, random.Random(0))
    a = worker.generate(problems, rng=random.Random(42))
    b = worker.generate(problems, rng=random.Random(42))
    c = worker.generate(problems, rng=random.Random(43))
    assert [(r.completion_ids, r.logprobs) for r in a] == [(r.completion_ids, r.logprobs) for r in b]
    assert [r.completion_ids for r in a] != [r.completion_ids for r in c]
    assert len(a) == 3 * cfg.sampling.group_size and {r.version for r in a} == {5}
    assert len({r.group_id for r in a}) == 3
    for r in a:
        assert len(r.logprobs) == len(r.completion_ids) <= cfg.sampling.max_new_tokens
        assert all(lp <= 0 for lp in r.logprobs) and r.reward in (0.0, 1.0)


def test_logprobs_match_trainer_on_bf16_weights(setup) -> None:
    _, policy, worker, task = setup
    rollouts = worker.generate(task.sample(2, random.Random(1)), rng=random.Random(2))
    # the trainer scoring the BF16 cast (straight-through params) reproduces the behaviour log-probs
    from pulse_node.rl.batch import bf16_params

    packed = pack([(r.prompt_ids, r.completion_ids) for r in rollouts], pad_id=0, device=policy.device)
    with torch.no_grad():
        lp = token_logprobs(policy.lm, packed, params=bf16_params(policy.model))
    for i, r in enumerate(rollouts):
        start = len(r.prompt_ids) - 1
        got = lp[i, start:start + len(r.logprobs)].tolist()
        assert got == pytest.approx(r.logprobs, abs=1e-4)


def test_worker_uses_loaded_weights_not_the_masters(setup) -> None:
    _, policy, worker, task = setup
    problems = task.eval_set()[:8]
    before = worker.greedy(problems)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p))
    assert worker.greedy(problems) == before  # the worker holds its own copy
    worker.set_weights(policy.bf16_state(), version=6)
    assert worker.version == 6 and 0.0 <= evaluate(worker, problems) <= 1.0


def test_prompt_longer_than_context_names_source(setup) -> None:
    _, _, worker, _ = setup
    long = Problem(id="x", prompt="1+" * 40 + "1=", answer="41", source="data.jsonl:7")
    with pytest.raises(DataError, match="data.jsonl:7.*context"):
        worker.generate([long], rng=random.Random(0))
    odd = Problem(id="y", prompt="\u00e9+1=", answer="2", source="data.jsonl:9")
    with pytest.raises(DataError, match="data.jsonl:9"):
        worker.greedy([odd])
