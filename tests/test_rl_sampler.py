"""Rollout generation: the seeded sampler, versions, and log-probs that the trainer agrees with."""

from __future__ import annotations

import blake3
import pytest
import torch
from helpers import tiny_solo

from pulse_node.errors import DataError
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.batch import pack, token_logprobs
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.seeded import draw, intervals, outside, uniforms
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


def test_finished_rows_leaving_the_batch_change_nothing(setup) -> None:
    """Rows that finished leave the batch and its KV cache: the same tokens as decoding them on."""
    cfg, _, worker, task = setup
    key = BatchKey("run", 5, "peer-a", 4)
    prompts = [p for p in worker._encode(assigned_problems(task, key, 4)) for _ in range(4)]
    u = uniforms(key.digest(), range(len(prompts)), cfg.sampling.max_new_tokens)
    kept = worker._sample(prompts, u=u, compact=True)
    ref = worker._sample(prompts, u=u, compact=False)
    assert any(f and len(t) < cfg.sampling.max_new_tokens - 1 for t, f in zip(kept[0], kept[2]))  # some left early
    assert kept[0] == ref[0] and kept[2] == ref[2]
    for a, b in zip(kept[1], ref[1]):
        assert a == pytest.approx(b, abs=1e-5)


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
    """Inverse-CDF with the keyed uniforms draws token j with probability softmax(z / T)_j
    (a chi-square test with fixed keys: it fails if the draw is biased)."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0, 1.5])
    n, temperature = 6000, 0.7
    u = uniforms(BatchKey("stats", 0, "p", 0).digest(), range(n), 1)[:, 0]
    tokens, logp = draw(logits.expand(n, -1).clone(), u, vocab=6, temperature=temperature)  # id 6: padding, never drawn
    p = torch.softmax(logits[:6] / temperature, -1)
    counts = torch.bincount(tokens, minlength=7).double()
    assert counts[6] == 0
    chi2 = float(((counts[:6] - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 20.5  # 5 degrees of freedom: p = 0.001
    assert torch.allclose(logp, torch.log(p)[tokens].float(), atol=1e-5)


def test_draw_is_the_same_for_any_rows_and_block_split() -> None:
    """A row's draw depends on its logits and uniform only (not on the other rows), and is the
    first id whose cumulative probability exceeds u (checked against a float64 reference)."""
    torch.manual_seed(0)
    logits = torch.randn(64, 1000) * 3
    u = uniforms(BatchKey("rows", 1, "p", 0).digest(), range(64), 1)[:, 0]
    tokens, _ = draw(logits.clone(), u, vocab=1000, temperature=1.3)
    ref = torch.softmax(logits.double() / 1.3, -1).cumsum(-1)
    assert torch.equal(tokens, torch.searchsorted(ref, u[:, None], right=True).squeeze(-1))
    alone = torch.cat([draw(logits[i:i + 1].clone(), u[i:i + 1], vocab=1000, temperature=1.3)[0]
                       for i in range(0, 64, 9)])
    assert torch.equal(alone, tokens[::9])
    rows = torch.arange(64)
    lo, hi, _ = intervals(logits.clone(), rows, tokens, vocab=1000, temperature=1.3)
    gap, closest = outside(u, lo, hi)
    assert float(gap.max()) == 0.0 and bool((closest >= 0).all())
    lo2, hi2, _ = intervals(logits.clone(), rows, (tokens + 1) % 1000, vocab=1000, temperature=1.3)
    big = logits * 60  # rows past +-SAFE: exp(z / T - max), the same draws up to rounding
    ref_big = torch.softmax(big.double() / 1.3, -1).cumsum(-1)
    big_tokens = draw(big.clone(), u, vocab=1000, temperature=1.3)[0]
    assert torch.equal(big_tokens, torch.searchsorted(ref_big, u[:, None], right=True).squeeze(-1))
    assert intervals(big.clone(), rows, big_tokens, vocab=1000, temperature=1.3, unshifted=True) is None
    lo4, hi4, _ = intervals(logits.clone(), rows, tokens, vocab=1000, temperature=1.3, unshifted=True)
    assert torch.allclose(lo4, lo, atol=1e-9) and torch.allclose(hi4, hi, atol=1e-9)
    lo3, hi3, logp3 = intervals(big.clone(), rows, big_tokens, vocab=1000, temperature=1.3)
    assert float(outside(u, lo3, hi3)[0].max()) == 0.0
    assert torch.allclose(logp3.double(), torch.log_softmax(big.double() / 1.3, -1)[rows, big_tokens], atol=1e-4)
    assert bool((outside(u, lo2, hi2)[0] > 0).all())  # any other id is outside


def test_uniforms_are_fixed_by_key_sample_and_step() -> None:
    """Test vector of the draw rule (changing it must change ``rl/settings.SAMPLER``)."""
    digest = BatchKey("run", 7, "peer", 1).digest()
    a = uniforms(digest, [3, 4], 4)
    assert torch.equal(a[0, :2], uniforms(digest, [3], 2)[0])  # step k's uniform does not depend on the steps made
    assert a.dtype == torch.float64 and not torch.equal(a[0], a[1])
    x = int.from_bytes(blake3.blake3((3).to_bytes(8, "little"), key=digest).digest(length=16)[8:], "little")
    assert float(a[0, 1]) == ((x >> 11) + 0.5) / 2**53
    assert digest.hex()[:16] == "41b732157a7845f9"
    assert [round(float(x), 6) for x in a[0, :3]] == [0.296297, 0.704674, 0.758535]
