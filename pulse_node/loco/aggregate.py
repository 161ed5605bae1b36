"""Robust aggregation of a round's payloads: how much of each payload the outer step applies.

The plain mean lets one trainer move the global weights as far as the payload value bound
allows, every round, in a direction of its choosing (issue 32: 0.999 x bound x sign(w) shrinks
the weights 30-fold in 20 rounds). Each payload ``p_i`` comes with its sender's trust weight
``w_i`` (``loco/ledger.py``: 1 for a member; open trainers by verified work, all newcomers of a
round sharing one weight), ``W = sum_i w_i``. The ``"robust"`` rule (``loco.aggregate``) gives
each payload a clip factor ``k_i`` in [0, 1] and the outer step applies
``g = sum_i w_i * k_i * p_i / W`` instead of the mean. The factors are those of CenteredClip
(Karimireddy et al. 2021) around the outer momentum, on whole payloads, weighted by trust:

    v_0 = (1 - mu) * m                     # an average of the last rounds' aggregates (0 at first)
    for l in 1..L:                         # loco.aggregate.iterations
        D_i = ||p_i - v_{l-1}||            # over the whole model, every trainer alike
        tau = c * upper median of D_i      # loco.aggregate.tau_scale; the median weighted by w_i
        k_i = min(1, tau / D_i) ** power   # loco.aggregate.power (1: CenteredClip)
        v_l = v_{l-1} + sum_i w_i * k_i * (p_i - v_{l-1}) / W

and the ``k_i`` of the last iteration are the weights. A payload more than ``tau`` from the
centre counts as one of norm ``tau``, so each trainer moves a round by at most about what an
honest one does, whatever the bound allows; with fewer than half of the payloads hostile the
median distance is an honest one. A power above 1 gives far payloads less, but then an honest
trainer whose payload stays farthest (its own data) delivers ever less and its error feedback
grows without bound; with 1 it still delivers ``tau`` a round. Measured against the standard
attacks and the alternatives (coordinate median, trimmed mean, norm clip around 0, power 2):
bench/byzantine.py, bench/RESULTS.md "Byzantine trainers". With ``outer_placement = "trainer"``
the global momentum is 0 and the centre starts at 0 (each payload's norm clipped against the
median norm).

What the rule removes from a payload, ``p_i - fp32(k_i * p_i)``, is that trainer's work
delayed, not lost (the trust weight is not removed: it is how much the swarm believes that
work, not a part of it): every trainer computes every weight, so each knows its own and puts the
removed part back into its error feedback (``ErrorFeedback.restore(payload, keep=k)``).

Determinism: every trainer must get the same weights bit for bit, whatever its CPU, thread
count or the order payloads arrived in. Payloads are taken in trainer-id order; all arithmetic
is float64 on the FP32 values: the distances per tensor in name order by a compiled loop of
sequential float64 adds and multiplies (``loco/clip_kernel.py``: bit for bit its pure-Python
body), the per-tensor parts added with ``math.fsum`` (exact), the rest 1-D ``np.add.reduce``
sums, whose pairwise order depends only on the array's length (NumPy neither threads nor
reorders them). No BLAS (``dot``, ``norm``) and no torch reduction is used. The weights
are then rounded to FP32 once; the outer step multiplies each entry by its FP32 weight (one
rounding) before the ordered adds of ``loco/outer.py``, so a payload with weight 1 is applied
exactly as the plain mean applies it (with ``w_i`` the factor is ``fp32(w_i * k_i)``, the sum
divided by ``W``). The weights are computed on whole payloads and whole
tensors (a trainer on several processes computes them once on rank 0 and hands them to every
rank with the payloads' row slices).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pulse_node.errors import WireError
from pulse_node.loco.clip_kernel import centre_add, centre_start, distance_part, sum_squares
from pulse_node.loco.config import AggregateConfig
from pulse_node.loco.payload import LocoPayload


@dataclass(frozen=True)
class Weights:
    """The weight of each trainer's payload in this round's step, and how it was found."""

    keep: dict[str, float]
    """trainer id -> the FP32 share of its payload the outer step applies, in [0, 1]."""
    tau: float = math.inf
    """The clip radius of the last iteration (inf: nothing clipped, the plain mean)."""
    distance: dict[str, float] | None = None
    """trainer id -> its payload's distance from the last iteration's centre."""


def uniform(payloads: Sequence[LocoPayload]) -> Weights:
    """Every payload applied whole: the plain mean."""
    return Weights({p.trainer_id: 1.0 for p in payloads})


def _sum(a: np.ndarray) -> float:
    """A float64 sum whose rounding depends only on ``a``'s length (pairwise, 1-D, contiguous)."""
    return float(np.add.reduce(np.ascontiguousarray(a, dtype=np.float64).reshape(-1)))


class _Centre:
    """The current centre ``v = a * v_0 + sum_i b_i * p_i``, kept as scalars (never materialised)."""

    def __init__(self, n: int) -> None:
        self.a = 1.0
        self.b = np.zeros(n, dtype=np.float64)

    def move(self, share: np.ndarray, total: float) -> None:
        """``v += sum_i s_i * (p_i - v) / W`` (``s_i = w_i * k_i``, ``W = sum_i w_i``)."""
        shrink = 1.0 - _sum(share) / total
        self.a *= shrink
        self.b = self.b * shrink + share / total


def _squared_distances(payloads: Sequence[LocoPayload], *, momentum: Mapping[str, np.ndarray], scale: float,
                       numel: Mapping[str, int], centre: _Centre) -> np.ndarray:
    """``||p_i - v||^2`` for every payload, over every tensor (sorted by name; ``loco/clip_kernel.py``,
    the per-tensor parts added with ``math.fsum``)."""
    n = len(payloads)
    parts: list[list[float]] = [[] for _ in payloads]
    scratch = np.empty(max(numel.values(), default=0), dtype=np.float64)  # the centre, one tensor at a time
    none_f, none_i = np.zeros(0, np.float32), np.zeros(0, np.int64)
    c0 = scale * centre.a
    for name in sorted(numel):
        size = int(numel[name])
        ref = momentum.get(name)
        m = none_f if ref is None or c0 == 0.0 else np.ascontiguousarray(ref, dtype=np.float32).reshape(-1)
        if m.size not in (0, size):
            raise ValueError(f"{name}: momentum of {m.size} entries for a tensor of {size}")
        entries = [p.tensors.get(name, (none_i, none_f)) for p in payloads]
        centre_start(m, c0, size, scratch)
        for i in range(n):
            if centre.b[i] != 0.0 and not centre_add(entries[i][0], entries[i][1], float(centre.b[i]), size, scratch):
                raise WireError(f"{name}: payload position out of range")
        vv = sum_squares(scratch, size)
        for i, (idx, vals) in enumerate(entries):
            part = distance_part(idx, vals, size, scratch)
            if math.isnan(part):
                raise WireError(f"{name}: payload position out of range")
            parts[i].append(vv + part)
    return np.array([max(0.0, math.fsum(x)) for x in parts], dtype=np.float64)


def trust_of(payloads: Sequence[LocoPayload], trust: Mapping[str, float] | None) -> np.ndarray:
    """Each payload's trust weight (``loco/ledger.py``; absent: 1), in the order given, as float64."""
    return np.array([float(np.float32((trust or {}).get(p.trainer_id, 1.0))) for p in payloads], dtype=np.float64)


def upper_median(dist: np.ndarray, w: np.ndarray) -> float:
    """The smallest distance whose trainers, with every nearer one, weigh more than half of all
    (with equal weights: the upper median, ``sorted(dist)[n // 2]``)."""
    order = np.argsort(dist, kind="stable")
    cum = np.cumsum(w[order])  # sequential float64 adds in a fixed order
    return float(dist[order][int(np.searchsorted(cum, cum[-1] / 2.0, side="right"))])


def robust_weights(payloads: Sequence[LocoPayload], *, momentum: Mapping[str, np.ndarray],
                   scale: float, numel: Mapping[str, int], cfg: AggregateConfig,
                   trust: Mapping[str, float] | None = None) -> Weights:
    """CenteredClip weights of ``payloads`` (see the module docstring).

    ``momentum``: tensor name -> the FP32 outer momentum (absent: 0), the first centre being
    ``scale`` times it; ``numel``: tensor name -> element count, for every tensor of the model;
    ``trust``: trainer id -> its trust weight ``w_i`` (``loco/ledger.py``; absent: 1): the centre
    and the median are weighted by it, so keys of little weight move neither however many there are.
    """
    ordered = sorted(payloads, key=lambda p: p.trainer_id.encode())
    n = len(ordered)
    w = trust_of(ordered, trust)
    total = math.fsum(w)
    if n == 0 or total <= 0.0:
        return Weights({p.trainer_id: 1.0 for p in ordered})
    centre, keep = _Centre(n), np.ones(n, dtype=np.float64)
    tau, dist = math.inf, np.zeros(n)
    for it in range(cfg.iterations):
        if it:
            centre.move(w * keep, total)
        dist = np.sqrt(_squared_distances(ordered, momentum=momentum, scale=scale, numel=numel, centre=centre))
        tau = cfg.tau_scale * upper_median(dist, w)
        ratio = np.where(dist > tau, tau / np.where(dist > 0, dist, 1.0), 1.0)
        keep = ratio.copy()
        for _ in range(cfg.power - 1):  # multiplications, not pow(): libm's pow differs between systems
            keep = keep * ratio
    shares = {p.trainer_id: float(np.float32(k)) for p, k in zip(ordered, keep)}
    return Weights(shares, tau, {p.trainer_id: float(d) for p, d in zip(ordered, dist)})
