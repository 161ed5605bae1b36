"""Robust aggregation (loco/aggregate.py): Byzantine trainers held, bit-identical weights, the
removed part back in the error feedback."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from pulse_node.loco.aggregate import robust_weights
from pulse_node.loco.config import AggregateConfig, LocoConfig
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.testing.byzantine.toy import Hoarder, at_bound, run_toy

BYZ = ["z0", "z1"]  # a third of six trainers


def test_a_third_at_the_bound_cannot_shrink_the_weights() -> None:
    """Issue 32 item 1: members sending every entry at 0.999 x bound x sign(w) for 20 rounds (lr
    1e-6). The plain mean lets them shrink |w| several-fold; the default rule keeps |w| where
    honest training takes it."""
    cfg = LocoConfig(inner_steps=4)
    assert cfg.aggregate.rule == "robust"
    honest = run_toy(honest=4, rounds=20, lr=1e-6, cfg=cfg).norm_ratio()
    attacked = run_toy(honest=4, rounds=20, lr=1e-6, cfg=cfg, attack=at_bound(np.sign, ids=BYZ))
    assert attacked.norm_ratio() / honest == pytest.approx(1.0, abs=0.02)
    assert max(attacked.outer.kept[t] for t in BYZ) < 0.05
    mean = LocoConfig(inner_steps=4, aggregate={"rule": "mean"})
    assert run_toy(honest=4, rounds=20, lr=1e-6, cfg=mean, attack=at_bound(np.sign, ids=BYZ)).norm_ratio() < 0.5 * honest


def test_sign_flip_and_error_feedback_dump_are_held() -> None:
    """Members sending -sign(w) at the bound (the weights grow), or hoarding their error
    feedback for 3 rounds and dumping it at the bound: the honest loss stays near the honest-only
    run's, where the plain mean's does not."""
    lr, rounds = 1e-3, 12
    for rule, held in (("robust", True), ("mean", False)):
        cfg = LocoConfig(inner_steps=5, aggregate={"rule": rule})
        honest = run_toy(honest=4, rounds=rounds, lr=lr, cfg=cfg).loss()
        grow = run_toy(honest=4, rounds=rounds, lr=lr, cfg=cfg, attack=at_bound(lambda w: -np.sign(w), ids=BYZ))
        dump = run_toy(honest=4, rounds=rounds, lr=lr, cfg=cfg, attack=Hoarder(BYZ, hoard=3, lr=lr, cfg=cfg))
        assert (grow.loss() < 1.1 * honest) is held, (rule, honest, grow.loss())
        assert dump.loss() < 1.1 * honest, (rule, honest, dump.loss())


def _payloads(shapes: dict[str, tuple[int, ...]], n: int, *, seed: int, round: int = 0,
              base: bytes = b"") -> list[LocoPayload]:
    """Sparse payloads of very different sizes (one far outlier) and magnitudes."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        tensors = {}
        for name, shape in shapes.items():
            size = int(np.prod(shape))
            idx = np.flatnonzero(rng.random(size) < 0.3).astype(np.int64)
            scale = 10.0 if k == n - 1 else 1.0
            vals = (rng.standard_normal(idx.size) * scale * 10.0 ** rng.integers(-6, -2, idx.size)).astype(np.float32)
            tensors[name] = (idx, vals)
        out.append(LocoPayload(round, f"trainer-{k}", base, tensors, {m: int(np.prod(s)) for m, s in shapes.items()}))
    return out


SHAPES = {"big": (600, 100), "small": (77,)}  # 60k entries: torch splits such ops across threads


def _start() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {n: torch.randn(s, generator=g) * 0.05 for n, s in SHAPES.items()}


def _run(order: list[int], threads: int) -> tuple[bytes, dict[str, float]]:
    torch.set_num_threads(threads)
    opt = OuterOptimizer(_start(), LocoConfig())
    for rnd in range(3):
        ps = _payloads(SHAPES, 5, seed=rnd, round=rnd, base=opt.state_hash())
        opt.apply([ps[i] for i in order])
    return opt.state_hash(), opt.kept


def test_bit_identical_across_thread_counts_and_arrival_orders() -> None:
    threads = torch.get_num_threads()
    try:
        runs = {_run(list(order), t)[0] for t in (1, 2) for order in itertools.islice(itertools.permutations(range(5)), 0, 120, 37)}
        kept = _run(list(range(5)), 1)[1]
    finally:
        torch.set_num_threads(threads)
    assert len(runs) == 1
    assert kept["trainer-4"] < 0.5 and min(kept.values()) > 0.0  # the outlier was weighed down, nobody dropped


def test_nothing_clipped_is_the_plain_mean_bit_for_bit() -> None:
    same = [OuterOptimizer(_start(), LocoConfig(aggregate={"rule": r})) for r in ("robust", "mean")]
    for rnd in range(3):
        one = _payloads(SHAPES, 1, seed=rnd, round=rnd, base=same[0].state_hash())[0]
        ps = [LocoPayload(rnd, f"t{k}", one.base_hash, one.tensors, one.numel) for k in range(3)]  # none beyond tau
        for opt in same:
            opt.apply(ps)
        assert set(same[0].kept.values()) == {1.0}
    assert same[0].state_hash() == same[1].state_hash()


def test_weights_follow_centered_clip() -> None:
    """One iteration around 0: each weight is min(1, upper median norm / norm)."""
    ps = _payloads(SHAPES, 5, seed=7)
    norms = [np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for _, v in p.tensors.values())) for p in ps]
    w = robust_weights(ps, momentum={}, scale=0.0, numel={n: int(np.prod(s)) for n, s in SHAPES.items()},
                       cfg=AggregateConfig(iterations=1))
    tau = sorted(norms)[2]
    assert w.tau == pytest.approx(tau, rel=1e-12)
    for p, norm in zip(ps, norms):
        assert w.keep[p.trainer_id] == pytest.approx(min(1.0, tau / norm), rel=1e-6)


def test_what_the_rule_removes_goes_back_into_the_error_feedback() -> None:
    cfg = LocoConfig()
    opt = OuterOptimizer(_start(), cfg)
    ef = ErrorFeedback(SHAPES, cfg=cfg)
    local = {n: t - 0.01 * torch.sign(t) for n, t in opt.params.items()}  # a big, dense pseudo-gradient
    mine = ef.make_payload(opt.params, local, round=0, trainer_id="trainer-9", base_hash=opt.state_hash())
    e_before = {n: t.clone() for n, t in ef.e.items()}
    before = {n: t.clone() for n, t in opt.params.items()}
    others = _payloads(SHAPES, 3, seed=1, base=opt.state_hash())[:2]
    opt.apply([mine, *others])
    k = opt.kept["trainer-9"]
    assert 0.0 < k < 0.5
    ef.restore(mine, keep=k)
    lr, mu = cfg.outer_lr, cfg.outer_momentum
    for name, (idx, vals) in mine.tensors.items():
        v = torch.from_numpy(vals)
        applied = torch.mul(v, k)  # what the outer step added for us
        back = ef.e[name].view(-1)[idx] - e_before[name].view(-1)[idx]
        assert torch.equal(applied + back, v) or float((applied + back - v).abs().max()) <= float(v.abs().max()) * 2**-23
        step = (before[name] - opt.params[name]).view(-1)[idx]
        others_part = sum(torch.from_numpy(dense(o, name)[idx]) * opt.kept[o.trainer_id] for o in others)
        g = (applied + others_part) / 3
        torch.testing.assert_close(step, lr * (1 + mu) * g, rtol=1e-4, atol=2e-8)


def dense(p: LocoPayload, name: str) -> np.ndarray:
    out = np.zeros(int(np.prod(SHAPES[name])), dtype=np.float32)
    if name in p.tensors:
        idx, vals = p.tensors[name]
        out[idx] = vals
    return out
