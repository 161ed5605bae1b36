"""Compute precisions of producers and verifiers, and the tolerances of the checks that follow.

A producer computing in BF16 or FP16 makes logits ``z + d`` where FP32 makes ``z``: ``d`` is its
rounding error, of range ``R = max d - min d`` over the vocabulary. Under softmax(z / T) a CDF
boundary ``C`` moves to ``C e^a / (C e^a + (1 - C) e^b)`` with ``a - b`` at most ``R / T`` (the
worst case puts the whole range between the ids below the boundary and those above), so by at most
``C (1 - C) (e^(R/T) - 1)``: nothing where the distribution is confident (``C`` near 0 or 1), at
most ``(e^(R/T) - 1) / 4`` at an even split; a log-prob moves by at most ``R / T``. The verifier
widens each boundary of each token's interval by that (``beyond``) and the log-prob tolerance by
``R / T``, with ``R`` measured and multiplied by ``SAFETY``: ``probe`` recomputes the batch's
spot rows (``rl/verify.py``) in the declared precision (torch autocast over the verifier's own
weights, at most ``MAX_PROBE`` positions) beside FP32 and takes the largest range seen (on the
default model autocast's range was 0.8x a BF16-cast module's). FP32 producers keep
``verify.score_tolerance`` / ``logprob_tolerance``. A verifier computing in BF16 itself adds its
own error the same way (``RolloutWorker.compute``).

A wider interval is a choice for a forger: wherever ``u`` falls within the widening of a
boundary it may emit the neighbouring id. An honest BF16 producer lands outside the FP32 interval
only where ``u`` falls in the sliver between its boundary and FP32's, at a rate the probe also
measures (the mean of ``|dC_lo| + |dC_hi|`` over probed tokens). The batch-level test counts the
tokens outside their FP32 interval widened by ``score_tolerance`` ("near-boundary
disagreements") and refuses the batch (``not_sampled``) when they exceed ``near_limit``: a
Poisson bound around ``RATE_SAFETY`` times the measured rate. A forger steering at every chance
it has makes ~``2 tau`` such tokens per token, far above an honest producer's sliver rate, so to
pass it must steer about as rarely as honest rounding moves a draw (bench/rollout_forgery.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pulse_node.rl.batch import Packed
from pulse_node.rl.chunked import hidden_states, output_head
from pulse_node.rl.config import Precision
from pulse_node.rl.models import HFLM, TinyLM

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SAFETY = 3.0  # the producer's error range may exceed the probe's (other kernels, other positions)
RATE_SAFETY = 3.0  # and its rate of near-boundary draws
MAX_PROBE = 128  # positions recomputed in the declared precision per batch
MAX_TOLERANCE = 0.25  # a draw interval is never widened past this (probability)


@dataclass(frozen=True)
class Probe:
    """The declared precision's error on the probed positions: largest logit range ``R`` (in
    units of z / T) and mean sliver per token (probability)."""

    logit_range: float
    sliver: float
    tokens: int

    @classmethod
    def none(cls) -> Probe:
        return cls(0.0, 0.0, 0)


@dataclass(frozen=True)
class Tolerances:
    """What the checks of one batch allow: ``draw`` (probability outside the FP32 interval) plus
    ``spread * C (1 - C)`` at a boundary ``C``, ``logprob`` (nats), ``rate`` (expected
    near-boundary disagreements per token; 0 for FP32)."""

    draw: float
    logprob: float
    rate: float
    spread: float = 0.0

    @property
    def widest(self) -> float:
        """The tolerance at an even split (``C = 1/2``), the most any boundary gets."""
        return min(MAX_TOLERANCE, self.draw + self.spread / 4)

    def at(self, c: torch.Tensor) -> torch.Tensor:
        """The tolerance at CDF boundaries ``c`` (probability)."""
        return (self.draw + self.spread * c * (1 - c)).clamp_max(MAX_TOLERANCE)

    def near_limit(self, tokens: int) -> int:
        """Most near-boundary disagreements an honest batch of ``tokens`` tokens makes (Poisson
        mean ``rate * tokens``, bound mean + 5 sd + 8: a false refusal well under 1e-6)."""
        lam = self.rate * tokens
        return int(lam + 5 * math.sqrt(lam) + 8) if self.rate > 0 else tokens


def tolerances(probe: Probe, *, score_tolerance: float, logprob_tolerance: float, temperature: float) -> Tolerances:
    """The checks' tolerances for a batch whose producer's (and verifier's) errors ``probe`` measured."""
    if probe.tokens == 0:
        return Tolerances(score_tolerance, logprob_tolerance, 0.0)
    r = SAFETY * probe.logit_range  # already divided by T
    return Tolerances(score_tolerance, logprob_tolerance + r, RATE_SAFETY * probe.sliver, spread=math.expm1(r))


def beyond(u: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, tol: Tolerances) -> torch.Tensor:
    """Per token, how far ``u`` lies outside ``[lo, hi)`` widened by the tolerance at each boundary
    (> 0: not the draw, whatever the precision's rounding)."""
    u = u.to(lo.device)
    return torch.clamp(torch.maximum(lo - tol.at(lo) - u, u - hi - tol.at(hi)), min=0.0)


def _logits_at(lm: TinyLM | HFLM, packed: Packed, rows: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """[N, V] FP32 logits at (rows, pos) of ``packed``, computed under autocast to ``dtype`` (None: FP32)."""
    device = packed.ids.device
    ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else torch.autocast(device.type, enabled=False)
    with torch.no_grad(), ctx:
        try:
            weight, bias = output_head(lm)
        except TypeError:
            return lm.logits(packed.ids, packed.mask)[rows, pos].float()
        hidden, _ = hidden_states(lm, packed)
        z = torch.nn.functional.linear(hidden[rows, pos], weight, bias)
    return z.float()


def _cdf_at(z: torch.Tensor, tokens: torch.Tensor, vocab: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.softmax(z[:, :vocab].double() / temperature, -1)
    cum = p.cumsum(-1)
    hi = cum.gather(-1, tokens[:, None]).squeeze(-1)
    return hi - p.gather(-1, tokens[:, None]).squeeze(-1), hi


def probe(lm: TinyLM | HFLM, packed: Packed, rows: torch.Tensor, pos: torch.Tensor, tokens: torch.Tensor, *, precision: Precision,
          verifier: Precision, vocab: int, temperature: float) -> Probe:
    """The error of ``precision`` (plus the verifier's own, if not FP32) in the logits at the
    completion positions (``rows``, ``pos``: predicting ``tokens``) of ``packed``, at most
    ``MAX_PROBE`` of them."""
    if (precision == "fp32" and verifier == "fp32") or len(tokens) == 0:
        return Probe.none()
    pick = torch.linspace(0, len(tokens) - 1, min(MAX_PROBE, len(tokens))).long()
    rows, pos, tokens = rows[pick], pos[pick], tokens[pick].clamp(0, vocab - 1)
    exact = _logits_at(lm, packed, rows, pos, None)
    lo, hi = _cdf_at(exact, tokens, vocab, temperature)
    ranges, slivers = torch.zeros(len(tokens)), torch.zeros(len(tokens))
    for p in {precision, verifier} - {"fp32"}:
        z = _logits_at(lm, packed, rows, pos, DTYPES[p])
        d = (z - exact)[:, :vocab] / temperature
        ranges += (d.amax(-1) - d.amin(-1)).cpu()
        lo_p, hi_p = _cdf_at(z, tokens, vocab, temperature)
        slivers += ((lo_p - lo).abs() + (hi_p - hi).abs()).float().cpu()
    return Probe(float(ranges.max()), float(slivers.mean()), len(tokens))
