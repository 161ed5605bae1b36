"""The payload value bound: how large an honest PULSELoCo payload entry can be (torch-free).

A payload entry is ``s = e + d`` (``sparsify.py``): ``d = theta_global - theta_local`` after ``H``
inner AdamW steps from the global weights, ``e`` the error-feedback carry. Per entry ``i`` with
base weight ``w = theta_global[i]``:

- one AdamW step moves a weight by ``lr * (|m_hat / (sqrt(v_hat) + eps)| + wd * |theta|)``; the
  Adam ratio is at most ``A(beta1, beta2)`` whatever the gradients (Cauchy-Schwarz over the
  moment sums, with bias correction, maximised over the step count: ``adam_factor``; 1.17 for
  betas (0.9, 0.95), 7.3 for (0.9, 0.999));
- ``H`` steps: ``|d| <= D(w) = H * lr * (A + wd * (|w| + H * lr * A))``;
- ``outer_placement = "trainer"`` gates the trainer's own Nesterov update of ``d``:
  ``|u| <= outer_lr / (1 - outer_momentum) * D``;
- an entry the BF16 gate held back (``e``) did not change ``bf16(w)``:
  ``|e| <= 2^-7 * |w'| / gate_scale`` with ``w'`` the weight when it was held back, at most one
  outer step (``outer_lr * (1 + mu) / (1 - mu) * D``, the move a bounded round can make) from ``w``.

``limit(w) = margin * (P * D(w) + 2^-7 / c * (|w| + K * P * D_0))`` (``P``: the placement
factor, ``K``: the outer-step factor, ``D_0 = D(0)``), ``margin = loco.value_bound_margin``
(default 4). A trainer's own payload is clipped to ``limit / 2`` before it is sent (what exceeds
it stays in the error feedback: only a trainer left out of several rounds in a row ever has
that much, bench/RESULTS.md "Payload value bound"), and a receiver refuses any payload with an
entry above ``limit``: every trainer of a round holds the same base weights, so both compute
the same limit and an honest payload always fits, with a factor 2 to spare. Trainers of one
swarm must use the same ``grpo.lr``, ``grpo.betas``, ``grpo.weight_decay`` and ``loco`` values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pulse_node.errors import IntegrityError
from pulse_node.loco.config import LocoConfig

BF16_HALF_STEP = 2.0 ** -7  # a weight's BF16 rounding interval is at most 2^-7 of its magnitude
SENDER_SHARE = 0.5  # a trainer clips its own entries to this fraction of the limit
_T_MAX = 1_000_000  # steps over which the Adam ratio is maximised when beta1^2 >= beta2


class PayloadBoundError(IntegrityError):
    """A payload entry exceeds what an honest trainer's round can produce."""


def adam_factor(beta1: float, beta2: float) -> float:
    """The largest ``|m_hat| / sqrt(v_hat)`` any gradient sequence gives AdamW, over all steps.

    ``|m_t| <= (1 - b1) * sqrt(sum_k<t q^k) * sqrt(v_t / (1 - b2))`` with ``q = b1^2 / b2``, times
    the bias corrections ``sqrt(1 - b2^t) / (1 - b1^t)``; maximised over ``t`` (bounded when
    ``q < 1``; otherwise over the first ``_T_MAX`` steps, as far as FP64 reaches)."""
    t = np.unique(np.concatenate([np.arange(1, 10_001), np.geomspace(10_001, _T_MAX, 200).astype(np.int64)]))
    t = t.astype(np.float64)
    q = beta1 * beta1 / beta2
    with np.errstate(over="ignore", invalid="ignore"):
        series = t if abs(q - 1.0) < 1e-12 else (1.0 - q ** t) / (1.0 - q)
        ratio = (1 - beta1) / (1 - beta1 ** t) * np.sqrt((1 - beta2 ** t) / (1 - beta2)) * np.sqrt(series)
    finite = ratio[np.isfinite(ratio)]
    return float(max(1.0, finite.max() if finite.size else 1.0))


@dataclass(frozen=True)
class PayloadBound:
    """``limit(w) = absolute + relative * |w|`` per entry (see the module docstring)."""

    absolute: float
    relative: float

    @classmethod
    def of(cls, loco: LocoConfig, *, lr: float, betas: tuple[float, float], weight_decay: float) -> PayloadBound:
        h, a, wd = loco.inner_steps, adam_factor(*betas), weight_decay
        placement = loco.outer_lr / (1.0 - loco.outer_momentum) if loco.outer_placement == "trainer" else 1.0
        outer_move = loco.outer_lr * (1.0 + loco.outer_momentum) / (1.0 - loco.outer_momentum)
        d0 = h * lr * a * (1.0 + wd * h * lr)  # D(0)
        carry = BF16_HALF_STEP / loco.gate_scale
        m = loco.value_bound_margin
        return cls(absolute=m * (placement * d0 + carry * outer_move * placement * d0),
                   relative=m * (placement * h * lr * wd + carry))

    @classmethod
    def of_trainer(cls, cfg: Any) -> PayloadBound:
        """The bound of a trainer config (``cfg.loco``, ``cfg.grpo``)."""
        g = cfg.grpo
        return cls.of(cfg.loco, lr=g.lr, betas=tuple(g.betas), weight_decay=g.weight_decay)

    def limit(self, w: np.ndarray) -> np.ndarray:
        """Per-entry limit (float64) for base weights ``w``."""
        return self.absolute + self.relative * np.abs(np.asarray(w, dtype=np.float64))

    def ratio(self, tensors: Mapping[str, tuple[np.ndarray, np.ndarray]], base: Mapping[str, Any]) -> float:
        """The largest ``|value| / limit`` of a payload's entries against the base weights (0 if empty)."""
        worst = 0.0
        for name, (idx, vals) in tensors.items():
            if idx.size == 0:
                continue
            w = np.asarray(base[name]).reshape(-1)[idx]
            worst = max(worst, float(np.max(np.abs(vals.astype(np.float64)) / self.limit(w))))
        return worst

    def check(self, tensors: Mapping[str, tuple[np.ndarray, np.ndarray]], base: Mapping[str, Any],
              *, who: str = "payload") -> float:
        """The payload's ``ratio``; ``PayloadBoundError`` if any entry exceeds its limit."""
        worst = self.ratio(tensors, base)
        if not worst <= 1.0:
            raise PayloadBoundError(f"{who}: an entry is {worst:.3g}x the payload value bound")
        return worst


def max_payload_bytes(shapes: Mapping[str, tuple[int, ...]], *, cap: int) -> int:
    """The largest encoded payload of a model with these tensors: 8 B per parameter (an FP32 value
    and its position take at most ~4.2 B coded) plus the msgpack header and tensor names; never
    above ``cap`` (``loco.max_payload_bytes``)."""
    numel = sum(math.prod(s) for s in shapes.values())
    names = sum(len(n.encode()) + 16 for n in shapes)
    return min(cap, 8 * numel + names + (64 << 10))
