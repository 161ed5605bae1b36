"""GRPO learner: weights move, loss finite, staleness bound, importance correction."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import tiny_solo

from pulse_node.errors import WireError
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.grpo import GRPOLearner, group_advantages
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source


def make(cache_dir, **grpo):
    cfg = tiny_solo(cache_dir, **grpo)
    policy = build_policy(cfg.model, cfg.task, seed=1, grpo_cfg=cfg.grpo)
    worker = RolloutWorker(policy, cfg.sampling)
    worker.set_weights(policy.bf16_state(), version=0)
    return cfg, policy, worker, make_task_source(cfg.task)


def rollouts_with_signal(worker, task, *, n: int = 4) -> list[Rollout]:
    key = BatchKey("grpo", 0, "peer", 0)
    rs = worker.generate(assigned_problems(task, key, n), key=key)
    for i, r in enumerate(rs):  # force mixed rewards in every group
        r.reward = float(i % 2)
    return rs


def test_group_advantages() -> None:
    mk = lambda g, r: Rollout([1], [2], [-1.0], r, 0, "p", g)  # noqa: E731
    adv = group_advantages([mk("a", 1.0), mk("a", 0.0), mk("b", 1.0), mk("b", 1.0)])
    assert adv[0] == pytest.approx(1.0) and adv[1] == pytest.approx(-1.0) and adv[2:] == [0.0, 0.0]


def test_one_step_changes_weights_and_bf16_copy(warm_cache) -> None:
    _, policy, worker, task = make(warm_cache)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    bf16_before = policy.bf16_state()
    stats = GRPOLearner(policy, tiny_solo(warm_cache).grpo).step(rollouts_with_signal(worker, task), current_version=0)
    assert torch.isfinite(torch.tensor(stats["loss"])) and stats["stepped"] == 1.0
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3) and stats["clip_frac"] == 0.0
    assert any(not torch.equal(before[n], p) for n, p in policy.model.named_parameters())
    changed = sum(int((bf16_before[n].bits != t.bits).sum()) for n, t in policy.bf16_state().items())
    total = sum(t.numel for t in bf16_before.values())
    assert stats["bf16_changed"] == pytest.approx(changed / total) and changed > 0


def test_no_signal_means_no_step(warm_cache) -> None:
    _, policy, worker, task = make(warm_cache)
    key = BatchKey("grpo", 0, "peer", 1)
    rs = worker.generate(assigned_problems(task, key, 2), key=key)
    for r in rs:
        r.reward = 1.0
    bf16 = policy.bf16_state()
    stats = GRPOLearner(policy, tiny_solo(warm_cache).grpo).step(rs, current_version=0)
    assert stats["stepped"] == 0.0 and stats["informative"] == 0.0
    assert all((bf16[n].bits == t.bits).all() for n, t in policy.bf16_state().items())


def test_staleness_bound_drops_old_and_future_rollouts(warm_cache) -> None:
    _, policy, worker, task = make(warm_cache, max_staleness=2)
    rs = rollouts_with_signal(worker, task)
    for i, r in enumerate(rs):
        r.version = [7, 10, 12, 13][i % 4]  # 10-3 stale, 10..12 fresh, 13 from the future
    stats = GRPOLearner(policy, tiny_solo(warm_cache, max_staleness=2).grpo).step(rs, current_version=12)
    assert stats["dropped_stale"] == len(rs) // 2 and stats["kept"] == len(rs) // 2


def test_importance_correction_uses_behaviour_logprobs(warm_cache) -> None:
    cfg, policy, worker, task = make(warm_cache)
    rs = rollouts_with_signal(worker, task)
    learner = GRPOLearner(policy, cfg.grpo)
    adv = group_advantages(rs)
    _, same = learner.loss(rs, adv)
    assert same["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    # a behaviour policy that gave every token 0.1 nats less probability: rho = e^{0.1} everywhere
    older = copy.deepcopy(rs)
    for r in older:
        r.logprobs = [lp - 0.1 for lp in r.logprobs]
    _loss_old, shifted = learner.loss(older, adv)
    assert shifted["ratio_mean"] == pytest.approx(float(torch.exp(torch.tensor(0.1))), rel=1e-3)
    # far-off behaviour log-probs are clipped at 1 + eps_high / 1 - eps_low
    for r in older:
        r.logprobs = [lp - 5.0 for lp in r.logprobs]
    _, far = learner.loss(older, adv)
    assert far["clip_frac"] == pytest.approx(1.0)


def test_gradient_scales_with_importance_weight(warm_cache) -> None:
    cfg, policy, worker, task = make(warm_cache, eps_low=0.9, eps_high=10.0)  # clipping out of the way
    rs = rollouts_with_signal(worker, task)
    learner = GRPOLearner(policy, cfg.grpo)
    adv = group_advantages(rs)

    def grad(batch):
        policy.model.zero_grad(set_to_none=True)
        learner.loss(batch, adv)[0].backward()
        return torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])

    g1 = grad(rs)
    older = copy.deepcopy(rs)
    for r in older:
        r.logprobs = [lp - 0.5 for lp in r.logprobs]
    g2 = grad(older)
    assert torch.allclose(g2, g1 * float(torch.exp(torch.tensor(0.5))), rtol=1e-3, atol=1e-7)


def test_hostile_token_ids_rejected(warm_cache) -> None:
    cfg, policy, worker, task = make(warm_cache)
    rs = rollouts_with_signal(worker, task)
    rs[0].completion_ids = [10_000] * len(rs[0].completion_ids)
    with pytest.raises(WireError):
        GRPOLearner(policy, cfg.grpo).step(rs, current_version=0)


def test_only_local_rollouts_are_trained_on(warm_cache) -> None:
    """A rollout decoded from the wire carries a peer's numbers: GRPO refuses it."""
    from pulse_node.rl.rollout import decode_rollouts, encode_rollouts

    cfg, policy, worker, task = make(warm_cache)
    wire = decode_rollouts(encode_rollouts(rollouts_with_signal(worker, task)))
    with pytest.raises(ValueError, match="local"):
        GRPOLearner(policy, cfg.grpo).step(wire, current_version=0)
