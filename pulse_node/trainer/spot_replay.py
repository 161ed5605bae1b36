"""Replaying a committed round at a few coordinates: AdamW, the BF16 gate, the next start state.

Given a commitment's start state and every step's gradient opened at the drawn leaves
(``loco/opening.py``) and the round's FP32 base there, the trainer's whole round at those
coordinates is per-coordinate arithmetic: AdamW step after step (torch's own ``AdamW`` on the
opened values, the code the trainer ran), then the error-feedback gate and clip
(``ErrorFeedback`` itself, on the opened values), then ``restore`` if the trainer was left out.
``replay_round`` returns what the trainer must have held: the BF16 weights before each step, the
payload entries there, and the state the next round must start from. Every comparison is made
within a tolerance: the trainer may have run the same arithmetic with other kernels (CUDA,
vectorised tails), which moves a value by an ulp or two, never by a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.commit import settings_digest
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.rl.grpo import GRPOLearner

_NAME = "spot"


@dataclass(frozen=True)
class AdamSettings:
    """The inner AdamW settings of the swarm (every trainer of a swarm uses the same)."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float

    @classmethod
    def of(cls, opt: torch.optim.Optimizer) -> AdamSettings:
        d = opt.defaults
        return cls(float(d["lr"]), (float(d["betas"][0]), float(d["betas"][1])), float(d["eps"]),
                   float(d["weight_decay"]))


def inner_settings(learner: GRPOLearner, loco: LocoConfig) -> bytes:
    """The digest of everything that shapes an inner step and its payload (``loco/commit.py``):
    every trainer of a swarm must use the same, and a verifier refuses a commitment naming others."""
    cfg, d = learner.cfg, learner.opt.defaults
    return settings_digest({
        "lr": float(d["lr"]), "betas": [float(b) for b in d["betas"]], "eps": float(d["eps"]),
        "weight_decay": float(d["weight_decay"]), "max_grad_norm": cfg.max_grad_norm, "eps_low": cfg.eps_low,
        "eps_high": cfg.eps_high, "bf16_compute": cfg.bf16_compute, "max_staleness": cfg.max_staleness,
        "temperature": float(learner.temperature), "gate": loco.gate, "gate_scale": loco.gate_scale,
        "outer_placement": loco.outer_placement, "outer_lr": loco.outer_lr, "outer_momentum": loco.outer_momentum,
        "nesterov": loco.nesterov, "inner_steps": loco.inner_steps, "value_bound_margin": loco.value_bound_margin})


@dataclass
class Replayed:
    """A round replayed at the opened coordinates."""

    bf16_before: dict[int, np.ndarray]  # step -> BF16 bits (uint16) of the weights its forward ran on
    payload: tuple[np.ndarray, np.ndarray]  # positions (into the opened coordinates) and values sent
    end: dict[str, np.ndarray]  # the next round's start state: m, v, e [, u]
    adam_step: int  # the next round's AdamW step count


def _bf16_bits(w: torch.Tensor) -> np.ndarray:
    bits: np.ndarray = w.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()
    return bits


def replay_adam(*, base: np.ndarray, m: np.ndarray, v: np.ndarray, adam_step: int, grads: dict[int, np.ndarray],
                steps: int, adam: AdamSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[int, np.ndarray]]:
    """AdamW over ``steps`` steps at the opened coordinates from ``base`` (``grads``: the stepped
    steps' gradients); returns the weights, moments after the round and the BF16 bits before each step."""
    w = torch.nn.Parameter(torch.from_numpy(base.astype(np.float32).copy()))
    opt = torch.optim.AdamW([w], lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay,
                            foreach=False)
    opt.state[w] = {"step": torch.tensor(float(adam_step), dtype=torch.float32),
                    "exp_avg": torch.from_numpy(m.astype(np.float32).copy()),
                    "exp_avg_sq": torch.from_numpy(v.astype(np.float32).copy())}
    before = {}
    for k in range(steps):
        before[k] = _bf16_bits(w.detach())
        if k in grads:
            w.grad = torch.from_numpy(grads[k].astype(np.float32))
            opt.step()
    st = opt.state[w]
    return w.detach(), st["exp_avg"], st["exp_avg_sq"], before


def replay_round(*, base: np.ndarray, start: dict[str, np.ndarray], adam_step: int, grads: dict[int, np.ndarray],
                 steps: int, adam: AdamSettings, loco: LocoConfig, bound: PayloadBound, keep: float,
                 round: int, trainer: str) -> Replayed:
    """The committed round at the opened coordinates (see the module docstring); ``keep``: the
    share of the payload the round applied (0: left out, 1: whole; the robust rule's factor)."""
    w, m, v, before = replay_adam(base=base, m=start["m"], v=start["v"], adam_step=adam_step, grads=grads,
                                  steps=steps, adam=adam)
    ef = ErrorFeedback({_NAME: (int(base.size),)}, cfg=loco, bound=bound)
    ef.e[_NAME].copy_(torch.from_numpy(start["e"].astype(np.float32)))
    if "u" in start:
        ef.v[_NAME].copy_(torch.from_numpy(start["u"].astype(np.float32)))
    g = torch.from_numpy(base.astype(np.float32).copy())
    payload = ef.make_payload({_NAME: g}, {_NAME: w}, round=round, trainer_id=trainer)
    idx, vals = payload.tensors[_NAME]
    if keep < 1.0:
        ef.restore(payload, keep=keep)  # what the round did not apply stays in the error feedback
    end = {"m": m.numpy().copy(), "v": v.numpy().copy(), "e": ef.e[_NAME].numpy().copy()}
    if "u" in start:
        end["u"] = ef.v[_NAME].numpy().copy()
    return Replayed(before, (np.asarray(idx, dtype=np.int64), np.asarray(vals, dtype=np.float32)), end,
                    adam_step + len(grads))


def close(a: np.ndarray, b: np.ndarray, *, rtol: float, atol: float) -> np.ndarray:
    """Entrywise: ``|a - b| <= rtol * max(|a|, |b|) + atol`` (bit-equal values, infinities included, pass)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.abs(a64 - b64) <= rtol * np.maximum(np.abs(a64), np.abs(b64)) + atol
    same: np.ndarray = ok | (a.view(np.uint32) == b.view(np.uint32))
    return same


def _common(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.intersect1d(a, b, assume_unique=True, return_indices=True)`` of unique ``a`` and ``b``,
    the same arrays: by a table of ``b``'s indices when both ascend and are positions into the
    opened coordinates (as both sides of a replay are; no sort of their concatenation)."""
    ascending = all(x.size < 2 or bool((x[1:] > x[:-1]).all()) for x in (a, b))
    if not ascending or not (a.size and b.size) or min(a[0], b[0]) < 0 or max(a[-1], b[-1]) >= 1 << 22:
        common, ia, ib = np.intersect1d(a, b, assume_unique=True, return_indices=True)
        return common, ia, ib
    where = np.full(int(max(a[-1], b[-1])) + 1, -1, dtype=np.int64)
    where[b] = np.arange(b.size)
    at = where[a]
    ia = np.flatnonzero(at >= 0)
    return a[ia], ia, at[ia]


def payload_mismatch(expected: tuple[np.ndarray, np.ndarray], sent: tuple[np.ndarray, np.ndarray], *,
                     rtol: float, atol: float) -> tuple[int, int]:
    """(entries that differ, entries either side sent) between the replayed and the sent payload at
    the opened coordinates: a position only one side sent, or a value outside the tolerance."""
    (pe, ve), (ps, vs) = expected, sent
    common, ie, is_ = _common(pe, ps)
    only = (pe.size - common.size) + (ps.size - common.size)
    off = int((~close(ve[ie], vs[is_], rtol=rtol, atol=atol)).sum())
    return only + off, int(pe.size + ps.size - common.size)


def state_mismatch(expected: dict[str, np.ndarray], opened: dict[str, np.ndarray], *, rtol: float,
                   atol: float) -> int:
    """Coordinates where a start-state array opened from the next commitment differs from the replay."""
    if set(expected) != set(opened):
        return int(next(iter(expected.values())).size)
    bad = np.zeros(next(iter(expected.values())).size, dtype=bool)
    for name, want in expected.items():
        bad |= ~close(want, opened[name], rtol=rtol, atol=atol)
    return int(bad.sum())
