"""Static decoding (``rl/static_decode.py``): the same draws as the eager sampler, a cache reused
per batch shape, and a decode step that compiles as one graph."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_solo

from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.seeded import draw, uniforms
from pulse_node.rl.static_decode import StaticDecoder
from pulse_node.rl.tasks import make_task_source


@pytest.fixture(scope="module")
def workers(warm_cache):
    """An eager and a static worker holding the same version of a tiny policy."""
    cfg = tiny_solo(warm_cache)
    policy = build_policy(cfg.model, cfg.task, seed=3, grpo_cfg=cfg.grpo)
    out = {}
    for mode in ("eager", "static"):
        out[mode] = RolloutWorker(policy, cfg.sampling, decode=mode)
        out[mode].set_weights(policy.bf16_state(), version=5)
    out["policy"] = policy
    return cfg, make_task_source(cfg.task), out


def _prompts(worker: RolloutWorker, task, batch: int, n: int) -> tuple[list[list[int]], torch.Tensor]:
    key = BatchKey("run", 5, "peer-a", batch)
    prompts = [p for p in worker._encode(assigned_problems(task, key, n)) for _ in range(4)]
    return prompts, uniforms(key.digest(), range(len(prompts)), worker.cfg.max_new_tokens)


def same(a, b) -> None:
    """The same tokens and finished flags; FP32 log-probs bit-identical or within 1e-6."""
    assert a[0] == b[0] and a[2] == b[2]
    assert max(abs(x - y) for la, lb in zip(a[1], b[1]) for x, y in zip(la, lb)) <= 1e-6


def test_static_decode_draws_what_the_eager_sampler_draws(workers) -> None:
    """Same seeded tokens and log-probs (FP32: within 1e-6, measured 0 here) and the same greedy
    text, though finished rows stay in the static batch; the cache is made once per batch shape."""
    cfg, task, w = workers
    prompts, u = _prompts(w["eager"], task, 4, 8)
    eager = w["eager"]._sample(prompts, u=u)
    assert any(f and len(t) < cfg.sampling.max_new_tokens for t, f in zip(eager[0], eager[2]))  # rows ended early
    static = w["static"]._sample(prompts, u=u)
    same(eager, static)
    assert w["static"].static is not None
    cache = w["static"].static._cache
    again = w["static"]._sample(prompts, u=u)  # the same shape: the same cache, emptied
    assert w["static"].static._cache is cache and again[0] == static[0] and again[1] == static[1]
    problems = assigned_problems(task, BatchKey("run", 5, "peer-a", 6), 3)
    assert w["static"].greedy(problems) == w["eager"].greedy(problems)


def test_static_rollouts_are_the_eager_rollouts(workers) -> None:
    """Whole batches, any rows per pass: the rollouts (tokens, rewards, flags) of the eager path."""
    _, task, w = workers
    key = BatchKey("run", 5, "peer-a", 2)
    problems = assigned_problems(task, key, 3)
    a = w["eager"].generate(problems, key=key)
    b = w["static"].generate(problems, key=key, rows_per_pass=5)
    assert [(r.completion_ids, r.reward, r.finished) for r in a] == [(r.completion_ids, r.reward, r.finished) for r in b]
    for ra, rb in zip(a, b):
        assert ra.logprobs == pytest.approx(rb.logprobs, abs=1e-5)


def test_the_decode_step_compiles_as_one_graph(workers) -> None:
    """``fullgraph=True`` traces the tiny model's step whole (a graph break would raise), and the
    compiled decoder draws the same tokens (dynamo's eager backend: the trace, not inductor's code)."""
    cfg, task, w = workers
    worker = RolloutWorker(w["policy"], cfg.sampling)
    worker.set_weights(w["policy"].bf16_state(), version=5)
    worker.static = StaticDecoder(worker.lm, device=worker.device, compiled=True, backend="eager")
    prompts, u = _prompts(worker, task, 7, 2)
    torch._dynamo.reset()
    same(w["eager"]._sample(prompts, u=u), worker._sample(prompts, u=u))


@pytest.mark.parametrize("scale", [3.0, 300.0])  # within and beyond seeded.SAFE: no shift, then each row's max
def test_the_draw_without_a_host_sync_is_the_same_draw(scale) -> None:
    """``draw(no_sync=True)`` (the static decoder's on CUDA) picks the shift on the device: the same
    tokens and log-probs, bit for bit."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 1000, generator=gen) * scale
    u = torch.rand(64, generator=gen, dtype=torch.float64)
    for temperature in (1.0, 0.7):
        a = draw(logits.clone(), u, vocab=990, temperature=temperature)
        b = draw(logits.clone(), u, vocab=990, temperature=temperature, no_sync=True)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_an_inference_node_names_its_decode_mode() -> None:
    """``decode`` is an inference node's setting (default "eager"), validated like the others."""
    from pulse_node.config import load_node_config
    from pulse_node.errors import ConfigError

    assert load_node_config(None, [], role="inference").decode == "eager"
    assert load_node_config(None, ["decode=compiled"], role="inference").decode == "compiled"
    with pytest.raises(ConfigError, match="decode"):
        load_node_config(None, ["decode=fast"], role="inference")
