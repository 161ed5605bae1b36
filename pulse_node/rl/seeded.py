"""The seeded sampler: every token of a rollout is an inverse-CDF draw a verifier can recompute.

Token ``k`` of sample ``i`` of the batch with key digest ``K`` (``rl/assign.py``) is the first
id ``j`` (in id order, ``j < V``) whose cumulative probability exceeds one keyed uniform:

    token = min { j : C_j > u },   C_j = (e_0 + ... + e_j) / (e_0 + ... + e_{V-1}),
    e_j = exp((z_j - max z) / T)  (float32),   u = (floor(x / 2^11) + 1/2) / 2^53

with ``V`` the smaller of the logits' width and the tokenizer's vocabulary (padding rows of an
embedding are never drawn), ``z`` the logits of the version's BF16 weights, ``T`` the declared
temperature, and ``x`` the uint64 at offset ``8 k`` of the BLAKE3 XOF output keyed by ``K`` over
``i`` (8 bytes, little endian). Inverse-CDF sampling draws exactly from softmax(z / T), so
learning is unchanged; the draw is a function of (weights, key, sample, step) alone:
independent of the batch shape, the rows decoded together, the machine and the device.

Cost: 8 bytes of keyed hash per token (made once per row for all steps, moved to the device
once) and three passes over the logits on the model's device, in place (max, exp, sums by
blocks of about sqrt(V) ids); the cumulative sums are taken by block (float32 sums inside a
block, float64 across blocks), then inside the one block that holds ``u``. Their rounding
(~1e-7) is far below the tolerance, so no order of summation is part of the rule, nor whether
``e`` is computed as exp(z / T) or exp(z / T - max) (the same up to rounding).

Verifying: a verifier recomputes ``z`` teacher-forced (FP32) and the token's interval
``[C_{t-1}, C_t)``; the token is the draw when ``u`` lies inside it widened by the tolerance
``tol`` (``VerifyConfig.score_tolerance``, in units of probability). ``gap`` is how far ``u``
lies outside the interval (0 inside), ``closest`` how near ``u`` is to a boundary.

Forgery margin: a producer can emit token ``j`` instead of the draw only if ``u`` lies in
``[C_{j-1} - tol, C_j + tol)``, i.e. within ``tol`` of the boundary of an interval next to the
draw's in id order. So whatever it does, each token is ``j`` with probability at most
``p_j + 2 tol`` (an absolute shift, where the Gumbel rule's tolerance bounded a shift in score),
and a set of ids forming ``r`` runs of consecutive ids gains at most ``2 tol r``. It has a
choice at all only when ``u`` falls within ``tol`` of a boundary: chance ``2 tol`` per boundary
near ``u``, so about ``2 tol`` per token where the probability sits on a few tokens, more in a
flat tail (a near-uniform random-init model over V ids: ~``2 tol V``, capped at 1).
bench/rollout_honest.py counts the honest rollouts that had such a choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, overload

import blake3
import numpy as np
import torch

_TWO53 = float(1 << 53)
#: largest |z / T| exponentiated without subtracting the row's maximum (exp(88) overflows float32)
SAFE = 80.0


def uniforms(batch_digest: bytes, samples: Sequence[int], steps: int) -> torch.Tensor:
    """[len(samples), steps] float64 keyed uniforms in (0, 1): ``u`` of each sample's first ``steps`` tokens."""
    raw = b"".join(blake3.blake3(int(s).to_bytes(8, "little"), key=batch_digest).digest(length=8 * steps)
                   for s in samples)
    x = np.frombuffer(raw, dtype="<u8").reshape(len(samples), steps) >> np.uint64(11)
    return torch.from_numpy((x.astype(np.float64) + 0.5) / _TWO53)


def drawable(logits: torch.Tensor | int, vocab_size: int) -> int:
    """``V``: how many ids a draw ranges over (never the padding rows past the tokenizer's
    vocabulary) for ``logits`` or a logits width."""
    return min(logits if isinstance(logits, int) else int(logits.shape[-1]), vocab_size)


def block_size(vocab: int) -> int:
    """Ids per block of the cumulative sums: the power of two at or above sqrt(V)."""
    return 1 << max(0, math.ceil(math.log2(max(vocab, 1)) / 2))


def exp_weights_(logits: torch.Tensor, vocab: int, temperature: float, *, unshifted: bool = False,
                 no_sync: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``e`` ([N, V] float32: exp(z / T - shift), unnormalised probabilities) made IN PLACE of
    ``logits`` (of its FP32 copy if it is not FP32), and the ``shift`` of each row ([N]): 0 unless
    some row's largest z / T is beyond +-``SAFE`` (then every row's own maximum). The
    log-normaliser of softmax(z / T) is ``shift + log(sum e)``. Two passes over the logits when
    no shift is needed (max, exp), three otherwise: no [N, V] tensor is allocated. ``unshifted``:
    one pass (exp), never shifted; the sums overflow or vanish when some z / T is past ~+-80.
    ``no_sync``: always three passes, the shift chosen on the device (the same values; the host
    never waits for the device, so a GPU's next steps queue behind this one).)"""
    z = logits[..., :vocab].float()
    if temperature != 1.0:
        z.div_(temperature)
    if unshifted:  # no max pass: the caller checks that the sums are finite and positive
        return z.exp_(), z.new_zeros(z.shape[0])
    top = z.amax(-1)
    if no_sync:  # subtracting 0 is exact: the same e as the branch below
        shift = torch.where((top.abs() > SAFE).any(), top, torch.zeros_like(top))
        return z.sub_(shift[:, None]).exp_(), shift
    if bool((top.abs() > SAFE).any()):
        z.sub_(top[:, None])
        return z.exp_(), top
    return z.exp_(), torch.zeros_like(top)


def block_sums(e: torch.Tensor, block: int) -> torch.Tensor:
    """[N, ceil(V / block)] float64 sums of ``e`` by block (float32 inside a block)."""
    vocab = e.shape[1]
    full = vocab // block
    parts = [e[:, : full * block].unflatten(-1, (full, block)).sum(-1)] if full else []
    if vocab % block:
        parts.append(e[:, full * block:].sum(-1, keepdim=True))
    return torch.cat(parts, -1).double()


def _block_of(e: torch.Tensor, b: torch.Tensor, block: int, vocab: int, rows: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids ([M, block]) of block ``b`` ([M, 1]) of each row (or of rows ``rows`` of ``e``) and
    their ``e`` (0 past ``V``)."""
    cols = b * block + torch.arange(block, device=e.device)
    vals = e.gather(-1, cols.clamp_max(vocab - 1)) if rows is None else e[rows[:, None], cols.clamp_max(vocab - 1)]
    return cols, vals * (cols < vocab)


def draw(logits: torch.Tensor, u: torch.Tensor, *, vocab: int, temperature: float, no_sync: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The seeded token of each row of ``logits`` ([N, width], overwritten: ``exp_weights_``, as is
    ``no_sync``) for its uniform ``u`` ([N] float64), and its log-prob under softmax(z / T) (float32)."""
    e, _ = exp_weights_(logits, vocab, temperature, no_sync=no_sync)
    block = block_size(vocab)
    cum = block_sums(e, block).cumsum(-1)
    target = u.to(cum.device)[:, None] * cum[:, -1:]
    b = torch.searchsorted(cum, target, right=True).clamp_max(cum.shape[1] - 1)
    before = torch.where(b > 0, cum.gather(-1, (b - 1).clamp_min(0)), torch.zeros_like(target))
    _, inside = _block_of(e, b, block, vocab)
    off = torch.searchsorted(inside.double().cumsum(-1) + before, target, right=True).clamp_max(block - 1)
    token = (b * block + off).clamp_max(vocab - 1)
    logp = torch.log(e.gather(-1, token)).squeeze(-1) - torch.log(cum[:, -1]).float()
    return token.squeeze(-1), logp


def greedy(logits: torch.Tensor, *, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely token of each row and its log-prob (the reference decode of the benches;
    ``logits`` overwritten like ``draw``'s)."""
    token = logits[..., :vocab].argmax(-1, keepdim=True)
    e, _ = exp_weights_(logits, vocab, 1.0)
    return token.squeeze(-1), (torch.log(e.gather(-1, token)).squeeze(-1) - torch.log(e.sum(-1)))


Intervals = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # lo, hi, logp


@overload
def intervals(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, *, vocab: int, temperature: float,
              unshifted: Literal[False] = False) -> Intervals: ...
@overload
def intervals(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, *, vocab: int, temperature: float,
              unshifted: bool) -> Intervals | None: ...
def intervals(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, *, vocab: int, temperature: float,
              unshifted: bool = False) -> Intervals | None:
    """For completion tokens ``tokens`` ([M]) read at rows ``rows`` ([M]) of ``logits`` ([N, width],
    overwritten like ``draw``'s): each token's CDF interval ``[lo, hi)`` (float64, normalised) and
    its log-prob under softmax(z / T) (float32). Per token only these are kept. ``unshifted``
    saves the max pass (``exp_weights_``) and returns None when a row's sum is not finite and
    positive (then call again on fresh logits without it)."""
    t = tokens.clamp(0, vocab - 1)[:, None]
    z_t = logits[rows[:, None], t].float().squeeze(-1) / temperature
    e, shift = exp_weights_(logits, vocab, temperature, unshifted=unshifted)
    block = block_size(vocab)
    sums = block_sums(e, block)
    total = sums.sum(-1)
    if unshifted and not bool((torch.isfinite(total) & (total > 0)).all()):
        return None
    b = t // block
    before = torch.where(b > 0, sums.cumsum(-1)[rows].gather(-1, (b - 1).clamp_min(0)), 0.0).squeeze(-1)
    cols, inside = _block_of(e, b, block, vocab, rows)
    lo = before + (inside * (cols < t)).double().sum(-1)
    hi = lo + e[rows[:, None], t].squeeze(-1).double()
    logp = z_t - (shift[rows] + torch.log(total[rows]).float())
    return lo / total[rows], hi / total[rows], logp


def outside(u: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``gap``: how far ``u`` lies outside ``[lo, hi)`` (0 inside); ``closest``: its distance to the
    nearer boundary (how near a choice between two tokens the draw was)."""
    u = u.to(lo.device)
    return torch.clamp(torch.maximum(lo - u, u - hi), min=0.0), torch.minimum((u - lo).abs(), (hi - u).abs())
