"""PULSELoCo outer step: canonical order, validation before mutation, Nesterov SGD, adopting a peer state."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from pulse_node.errors import BaseMismatchError, WireError
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload


def start(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(40, 30, generator=g) * 0.02, "b": torch.randn(30, generator=g)}


def payloads(opt: OuterOptimizer, n: int, seed: int) -> list[LocoPayload]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        tensors = {}
        for name, t in opt.params.items():
            idx = np.flatnonzero(rng.random(t.numel()) < 0.3).astype(np.int64)
            # values of very different magnitudes so the summation order matters in FP32
            vals = (rng.standard_normal(idx.size) * 10.0 ** rng.integers(-8, 2, idx.size)).astype(np.float32)
            tensors[name] = (idx, vals)
        out.append(LocoPayload(opt.round, f"trainer-{k}", opt.state_hash(), tensors,
                               {n: t.numel() for n, t in opt.params.items()}))
    return out


def test_result_is_independent_of_arrival_order() -> None:
    hashes = set()
    for perm in itertools.permutations(range(4)):
        opt = OuterOptimizer(start(), LocoConfig())
        for rnd in range(3):
            ps = payloads(opt, 4, seed=rnd)
            opt.apply([ps[i] for i in perm])
        hashes.add(opt.state_hash())
    assert len(hashes) == 1


def test_naive_arrival_order_sum_would_differ() -> None:
    """Guards the test above: with these values FP32 summation order does change bits."""
    opt = OuterOptimizer(start(), LocoConfig())
    ps = payloads(opt, 4, seed=0)
    sums = set()
    for perm in itertools.permutations(range(4)):
        acc = torch.zeros(1200)
        for i in perm:
            idx, vals = ps[i].tensors["w"]
            acc.index_add_(0, torch.from_numpy(idx), torch.from_numpy(vals))
        sums.add(acc.numpy().tobytes())
    assert len(sums) > 1


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_step_matches_torch_sgd(nesterov: bool) -> None:
    cfg = LocoConfig(outer_lr=0.7, outer_momentum=0.9, nesterov=nesterov, aggregate={"rule": "mean"})
    opt = OuterOptimizer(start(), cfg)
    ref = {n: torch.nn.Parameter(t.clone()) for n, t in start().items()}
    sgd = torch.optim.SGD(ref.values(), lr=0.7, momentum=0.9, nesterov=nesterov)
    for rnd in range(4):
        ps = payloads(opt, 3, seed=10 + rnd)
        for name, p in ref.items():
            g = torch.zeros(p.numel())
            for q in ps:
                idx, vals = q.tensors[name]
                g.index_add_(0, torch.from_numpy(idx), torch.from_numpy(vals))
            p.grad = (g / 3).view(p.shape)
        sgd.step()
        opt.apply(ps)
    for name, p in ref.items():
        torch.testing.assert_close(opt.params[name], p.detach(), rtol=1e-5, atol=1e-6)


def test_bad_payload_leaves_state_unchanged() -> None:
    opt = OuterOptimizer(start(), LocoConfig())
    before = opt.state_hash()
    good = payloads(opt, 2, seed=1)
    stale = LocoPayload(0, "x", b"\x00" * 32, {}, {})
    wrong_round = LocoPayload(5, "y", before, {}, {})
    out_of_range = LocoPayload(0, "z", before, {"b": (np.array([30]), np.array([1.0], np.float32))}, {"b": 30})
    unknown = LocoPayload(0, "z", before, {"q": (np.array([0]), np.array([1.0], np.float32))}, {"q": 1})
    with pytest.raises(BaseMismatchError):
        opt.apply(good + [stale])
    for bad in ([wrong_round], [out_of_range], [unknown], [good[0], good[0]]):
        with pytest.raises(WireError):
            opt.apply(good[:1] + bad)
    assert opt.state_hash() == before and opt.round == 0


def test_load_state_dict_adopts_a_peer_state() -> None:
    """How a trainer re-syncs (``trainer/state.py`` checks the fetched state's hashes first)."""
    a, b = OuterOptimizer(start(), LocoConfig()), OuterOptimizer(start(), LocoConfig())
    for rnd in range(2):
        ps = payloads(a, 2, seed=rnd)
        a.apply(ps)
    assert a.state_hash() != b.state_hash()
    wrong = a.state_dict()
    wrong["params"] = {n: t[:1] for n, t in wrong["params"].items()}
    with pytest.raises(WireError):
        b.load_state_dict(wrong)
    assert b.round == 0
    b.load_state_dict(a.state_dict())
    assert b.state_hash() == a.state_hash() and b.round == 2


def test_too_few_contributors_close_the_round_without_update() -> None:
    opt = OuterOptimizer(start(), LocoConfig(min_contributors=2))
    w0 = opt.params["w"].clone()
    opt.apply(payloads(opt, 1, seed=0))
    assert opt.round == 1 and torch.equal(opt.params["w"], w0)
    assert opt.kept == {"trainer-0": 0.0}  # nothing applied: its sender puts it all back
