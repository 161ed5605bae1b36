"""Rollout generation: the seeded sampler, versions, and log-probs that the trainer agrees with."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_solo

from pulse_node.errors import DataError
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.batch import pack, token_logprobs
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.seeded import SampleNoise, draw
from pulse_node.rl.tasks import Problem, make_task_source


@pytest.fixture
def setup(warm_cache):
    cfg = tiny_solo(warm_cache)
    policy = build_policy(cfg.model, cfg.task, seed=3, grpo_cfg=cfg.grpo)
    worker = RolloutWorker(policy, cfg.sampling)
    worker.set_weights(policy.bf16_state(), version=5)
    return cfg, policy, worker, make_task_source(cfg.task)


def test_same_key_same_rollouts_whatever_the_batch_shape(setup) -> None:
    cfg, _, worker, task = setup
    key = BatchKey("run", 5, "peer-a", 2)
    problems = assigned_problems(task, key, 3)
    assert [p.id for p in problems] == [p.id for p in assigned_problems(task, key, 3)]
    a = worker.generate(problems, key=key)
    b = worker.generate(problems, key=key, rows_per_pass=5)
    c = worker.generate(problems, key=BatchKey("run", 5, "peer-a", 3))
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]  # the draws: exactly
    for ra, rb in zip(a, b):  # log-probs: up to kernel rounding of another batch shape (~1e-6)
        assert ra.logprobs == pytest.approx(rb.logprobs, abs=1e-5)
    assert [r.completion_ids for r in a] != [r.completion_ids for r in c]
    assert len(a) == 3 * cfg.sampling.group_size and {r.version for r in a} == {5}
    assert [r.group_id for r in a[::cfg.sampling.group_size]] == ["5:2:0", "5:2:1", "5:2:2"]
    assert [(r.batch, r.sample) for r in a] == [(2, i) for i in range(len(a))] and all(r.local for r in a)
    with pytest.raises(ValueError, match="version"):
        worker.generate(problems, key=BatchKey("run", 4, "peer-a", 2))
    for r in a:
        assert len(r.logprobs) == len(r.completion_ids) <= cfg.sampling.max_new_tokens
        assert all(lp <= 0 for lp in r.logprobs) and r.reward in (0.0, 1.0)


def test_logprobs_match_trainer_on_bf16_weights(setup) -> None:
    _, policy, worker, task = setup
    key = BatchKey("run", 5, "peer-a", 0)
    rollouts = worker.generate(assigned_problems(task, key, 2), key=key)
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
        worker.generate([long], key=BatchKey("run", 5, "p", 0))
    odd = Problem(id="y", prompt="\u00e9+1=", answer="2", source="data.jsonl:9")
    with pytest.raises(DataError, match="data.jsonl:9"):
        worker.greedy([odd])


def test_prompts_are_assigned_by_key_from_the_train_split(setup) -> None:
    _, _, _, task = setup
    keys = [BatchKey("run", v, p, b) for v in (1, 2) for p in ("peer-a", "peer-b") for b in (0, 1)]
    batches = [tuple(p.id for p in assigned_problems(task, k, 8)) for k in keys]
    assert len(set(batches)) == len(keys)  # every part of the key changes the prompts
    assert all(task.split_of(pid) == "train" for batch in batches for pid in batch)


def test_seeded_draws_follow_the_softmax() -> None:
    """Gumbel-max with the keyed noise draws token j with probability softmax(z / T)_j."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    n, temperature = 6000, 0.7
    digest = BatchKey("stats", 0, "p", 0).digest()
    counts = torch.zeros(5)
    for i in range(n):
        counts[int(draw(logits, SampleNoise(digest, i).steps(0, 1, 5), temperature))] += 1
    p = torch.softmax(logits[0] / temperature, -1)
    assert torch.allclose(counts / n, p, atol=4 * float(torch.sqrt(p.max() / n)))


def test_noise_is_fixed_by_key_sample_and_step() -> None:
    """Test vector of the draw rule (changing it must change ``rl/settings.SAMPLER``)."""
    digest = BatchKey("run", 7, "peer", 1).digest()
    a = SampleNoise(digest, 3).steps(0, 4, 11)
    assert torch.equal(a[2:3], SampleNoise(digest, 3).steps(2, 1, 11))
    assert not torch.equal(a[:1], SampleNoise(digest, 4).steps(0, 1, 11))
    assert digest.hex()[:16] == "41b732157a7845f9"
    assert [round(float(x), 5) for x in a[1, :3]] == [-0.5741, -0.34755, 0.23431]
