"""Aggregation rules the bench compares with ``loco.aggregate`` (the losers stay here, not in loco/).

A rule spec is ``robust``, ``mean`` (the two of ``LocoConfig.aggregate``), ``robust(KEY=VALUE,
...)`` (other parameters of the robust rule), or a candidate below:

- ``normclip``: the robust rule's weights with the centre at 0 (each payload's norm clipped to
  the upper median norm);
- ``median`` / ``trimmed``: coordinate-wise median / trimmed mean (``f`` largest and smallest
  values dropped per entry, ``f = (n - 1) // 3``) over the payloads' dense views (0 where a
  payload did not fire). They do not weigh whole payloads, so nothing returns to the error
  feedback (``kept`` is 1 for every payload).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from pulse_node.loco.aggregate import Weights, robust_weights
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload

CANDIDATES = ("normclip", "median", "trimmed")


class NormClipOuter(OuterOptimizer):
    def weigh(self, payloads: Sequence[LocoPayload], *, trust: Mapping[str, float] | None = None) -> Weights:
        self.last = robust_weights(payloads, momentum={}, scale=0.0, numel={n: t.numel() for n, t in self.params.items()},
                                   cfg=self.cfg.aggregate, trust=trust)
        return self.last


class CoordinateOuter(OuterOptimizer):
    """Coordinate-wise median or trimmed mean instead of the weighted mean."""

    kind = "median"

    def weigh(self, payloads: Sequence[LocoPayload], *, trust: Mapping[str, float] | None = None) -> Weights:
        self.last = Weights({p.trainer_id: 1.0 for p in payloads})
        return self.last

    def _mean_into_acc(self, name: str, ordered: Sequence[LocoPayload]) -> torch.Tensor:
        acc = self._scratch(name)[0]
        rows = np.zeros((len(ordered), acc.numel()), dtype=np.float32)
        for i, p in enumerate(ordered):
            if name in p.tensors:
                idx, vals = p.tensors[name]
                rows[i, idx] = vals
        if self.kind == "median":
            g = np.median(rows, axis=0)
        else:
            f = (len(ordered) - 1) // 3
            srt = np.sort(rows, axis=0)
            g = srt[f:len(ordered) - f].mean(axis=0)
        acc.view(-1).copy_(torch.from_numpy(g.astype(np.float32)))
        return acc


class TrimmedOuter(CoordinateOuter):
    kind = "trimmed"


def parse(spec: str, loco: LocoConfig) -> tuple[LocoConfig, type[OuterOptimizer]]:
    """(the run's LocoConfig, the OuterOptimizer class) of a rule spec (module docstring)."""
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", spec.strip())
    if m is None:
        raise ValueError(f"bad rule spec {spec!r}")
    name, args = m.group(1), m.group(2) or ""
    params = {k.strip(): float(v) for k, v in (a.split("=") for a in args.split(",") if a.strip())}
    for key in ("iterations", "power"):
        if key in params:
            params[key] = int(params[key])
    rule = "mean" if name in ("mean", "median", "trimmed") else "robust"
    agg = loco.aggregate.model_copy(update={"rule": rule, **params})
    cfg = loco.model_copy(update={"aggregate": agg})
    cls = {"normclip": NormClipOuter, "median": CoordinateOuter, "trimmed": TrimmedOuter}.get(name, OuterOptimizer)
    if name not in ("robust", "mean", *CANDIDATES):
        raise ValueError(f"unknown rule {name!r} (robust, mean, {', '.join(CANDIDATES)})")
    return cfg, cls
