"""The payload value bound (``loco/bound.py``): AdamW's step factor, honest rounds fit, a trainer
left out of many rounds sends at most half the bound and keeps the rest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pulse_node.config import TrainerConfig
from pulse_node.loco.bound import SENDER_SHARE, PayloadBound, PayloadBoundError, adam_factor, max_payload_bytes
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.sparsify import ErrorFeedback


def test_adam_factor_bounds_every_adamw_step():
    assert adam_factor(0.9, 0.95) == pytest.approx(1.165, abs=1e-3)
    assert adam_factor(0.9, 0.999) == pytest.approx(7.27, abs=1e-2)
    rng = np.random.default_rng(0)
    for betas in ((0.9, 0.95), (0.9, 0.999), (0.5, 0.9)):
        a = adam_factor(*betas)
        # random, constant, and a spike after a long quiet stretch (the worst case for m / sqrt(v))
        seqs = [rng.standard_normal((300, 32)), np.ones((300, 32)),
                np.concatenate([np.full((250, 32), 1e-4), np.ones((50, 32))])]
        for grads in seqs:
            p = torch.zeros(32, requires_grad=True)
            opt = torch.optim.AdamW([p], lr=1.0, betas=betas, weight_decay=0.0, eps=0.0)
            worst = 0.0
            for g in grads:
                before = p.detach().clone()
                p.grad = torch.tensor(g, dtype=torch.float32)
                opt.step()
                worst = max(worst, float((p.detach() - before).abs().max()))
            assert worst <= a * (1 + 1e-5), (betas, worst, a)


def _round(ef: ErrorFeedback, g: torch.Tensor, rng: np.random.Generator, *, lr: float, steps: int):
    """``steps`` AdamW steps of a local copy of ``g`` on random gradients, then the payload."""
    local = g.clone().requires_grad_(True)
    opt = torch.optim.AdamW([local], lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    for _ in range(steps):
        local.grad = torch.tensor(rng.standard_normal(g.shape) * rng.choice([1e-3, 1, 1e3]), dtype=torch.float32)
        opt.step()
    return ef.make_payload({"w": g}, {"w": local.detach()}, round=0, trainer_id="t")


def test_honest_payloads_fit_and_a_left_out_trainer_sends_at_most_half_the_bound():
    loco = LocoConfig(inner_steps=5)
    bound = PayloadBound.of(loco, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(1)
    g = torch.tensor(rng.standard_normal(4096) * 0.05, dtype=torch.float32)
    ef = ErrorFeedback({"w": (4096,)}, cfg=loco, bound=bound)
    p = _round(ef, g, rng, lr=1e-3, steps=5)
    assert ef.clipped == 0 and 0 < bound.ratio(p.tensors, {"w": g.numpy()}) <= SENDER_SHARE
    for _ in range(12):  # left out of 12 rounds in a row: the pseudo-gradients pile up in e
        ef.restore(p)
        before = ef.e["w"].clone()
        p = _round(ef, g, rng, lr=1e-3, steps=5)
    assert ef.clipped > 0
    bound.check(p.tensors, {"w": g.numpy()})
    assert bound.ratio(p.tensors, {"w": g.numpy()}) <= SENDER_SHARE * (1 + 1e-6)
    idx, vals = p.tensors["w"]
    clipped = np.abs(vals) >= np.float32(bound.limit(g.numpy()[idx]) * SENDER_SHARE) * (1 - 1e-6)
    pile = before.numpy()[idx] + 0  # what was restored before this round's drift was added
    assert clipped.sum() == ef.clipped and np.all(ef.e["w"].numpy()[idx][clipped] != 0), "the excess was lost"
    assert np.all(np.sign(ef.e["w"].numpy()[idx][clipped]) == np.sign(vals[clipped]))
    assert np.abs(pile).max() > np.abs(vals).max(), "nothing piled up beyond what one round sends"
    with pytest.raises(PayloadBoundError):
        bound.check({"w": (idx, vals * 3)}, {"w": g.numpy()})


def test_trainer_config_bound_and_model_cap():
    b = PayloadBound.of_trainer(TrainerConfig())
    assert b.absolute > 0 and b.relative >= 2.0 ** -7
    assert max_payload_bytes({"a": (10, 10), "b": (5,)}, cap=1 << 30) == 8 * 105 + 2 * 17 + (64 << 10)
    assert max_payload_bytes({"a": (1 << 20, 1 << 10)}, cap=1 << 20) == 1 << 20
