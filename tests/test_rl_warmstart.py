"""The supervised warm start is cached on disk keyed by a config hash and reused.

These tests test the cache itself, so each starts from an empty cache of its own (not the
session's ``warm_cache``).
"""

from __future__ import annotations

import torch
from helpers import tiny_solo

from pulse_node.rl.policy import build_policy
from pulse_node.rl.warmstart import cache_path


def params(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters()}


def test_warm_start_trains_once_then_loads_from_cache(tmp_path, capsys) -> None:
    cfg = tiny_solo(tmp_path / "cache", warmstart_steps=5, warmstart_batch=8)
    cold = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=cfg.grpo.model_copy(update={"warmstart_steps": 0}))
    first = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=cfg.grpo, progress=True)
    err = capsys.readouterr().err
    assert "training 5 steps" in err and "step 5/5" in err
    files = list((tmp_path / "cache").glob("warmstart-*.safetensors"))
    assert files == [cache_path(first, model_cfg=cfg.model, grpo_cfg=cfg.grpo, seed=0)]
    assert any(not torch.equal(cold_p, p) for cold_p, p in zip(params(cold).values(), params(first).values()))

    second = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=cfg.grpo, progress=True)
    assert "loaded cached weights" in capsys.readouterr().err
    assert all(torch.equal(a, b) for a, b in zip(params(first).values(), params(second).values()))

    other = cfg.grpo.model_copy(update={"warmstart_steps": 6})
    assert cache_path(first, model_cfg=cfg.model, grpo_cfg=other, seed=0) != files[0]
    assert cache_path(first, model_cfg=cfg.model, grpo_cfg=cfg.grpo, seed=1) != files[0]
    device_only = cfg.model.model_copy(update={"device": "cpu", "cache_dir": str(tmp_path / "cache")})
    assert cache_path(first, model_cfg=device_only, grpo_cfg=cfg.grpo, seed=0) == files[0]


def test_corrupt_cache_is_retrained(tmp_path, capsys) -> None:
    cfg = tiny_solo(tmp_path / "cache", warmstart_steps=3, warmstart_batch=8)
    first = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=cfg.grpo)
    path = cache_path(first, model_cfg=cfg.model, grpo_cfg=cfg.grpo, seed=0)
    path.write_bytes(b"not safetensors")
    again = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=cfg.grpo, progress=True)
    assert "ignoring unusable cache" in capsys.readouterr().err
    assert all(torch.equal(a, b) for a, b in zip(params(first).values(), params(again).values()))


def test_warm_start_is_the_same_whatever_the_process_thread_count(tmp_path) -> None:
    """The swarm's model warmed up by processes on 2 and on 1 intra-op threads (a CPU matmul's
    rounding follows the thread count: 50 of its 52 tensors differed before warm-ups were pinned to
    ``WARMSTART_THREADS``) gives the same weights, so every machine starts from the same state."""
    from pulse_node.rl.config import SoloConfig

    base = SoloConfig()  # the default (swarm) dims: big enough for the thread count to matter
    grpo = base.grpo.model_copy(update={"warmstart_steps": 5, "warmstart_batch": 8})
    before = torch.get_num_threads()
    got = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            model = base.model.model_copy(update={"cache_dir": str(tmp_path / f"cache-{threads}")})
            got.append(params(build_policy(model, base.task, seed=0, grpo_cfg=grpo)))
            assert torch.get_num_threads() == threads, "the warm start did not give the thread count back"
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(got[0][n], got[1][n]) for n in got[0])


def test_the_torch_free_key_reads_the_release_torch_reports():
    import torch

    from pulse_node.rl.warmstart_key import torch_release

    assert torch_release() == torch.__version__.split("+")[0]
