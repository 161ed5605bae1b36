"""The seeded sampler: every token of a rollout is a Gumbel-max draw a verifier can recompute.

Token ``k`` of sample ``i`` of the batch with key digest ``K`` (``rl/assign.py``) is

    argmax_j  z_j / T + G_j,   G_j = -log(-log U_j),   j < V

with ``V`` the smaller of the logits' width and the tokenizer's vocabulary (padding rows of an
embedding are never drawn), ``z`` the logits of the version's BF16 weights, ``T`` the declared temperature, and
``U_j = (x_j + 1/2) / 2^32`` for the uint32 ``x_j`` at offset ``4 (k V + j)`` of the BLAKE3 XOF
output keyed by ``K`` over ``i`` (8 bytes, little endian). Gumbel-max draws exactly from
softmax(z / T), so learning is unchanged; but the draw is a function of (weights, key, sample,
step) alone: independent of the batch shape, the machine and the device. A verifier that
recomputes ``z`` teacher-forced checks that each token is the draw: its ``gap`` (best score minus
the token's) is 0 up to honest numeric differences. The noise is computed on the CPU in
float64 up to ``1 - U``, then in float32 (``log1p`` keeps it accurate near U = 1).
"""

from __future__ import annotations

from typing import Sequence

import blake3
import numpy as np
import torch

_TWO32 = 4294967296.0


def _gumbel(raw: bytes, rows: int, vocab: int) -> torch.Tensor:
    x = np.frombuffer(raw, dtype="<u4").reshape(rows, vocab)
    tail = ((_TWO32 - x.astype(np.float64)) - 0.5) / _TWO32  # 1 - U, exact
    t = torch.from_numpy(tail.astype(np.float32))
    return -torch.log(-torch.log1p(-t))


class SampleNoise:
    """The Gumbel noise of one sample: ``steps(k0, n, vocab)`` -> [n, vocab] float32 (CPU)."""

    def __init__(self, batch_digest: bytes, sample: int) -> None:
        self._xof = blake3.blake3(int(sample).to_bytes(8, "little"), key=batch_digest)

    def raw(self, first: int, count: int, vocab: int) -> bytes:
        width = 4 * vocab
        return self._xof.digest(length=width * count, seek=width * first)

    def steps(self, first: int, count: int, vocab: int) -> torch.Tensor:
        return _gumbel(self.raw(first, count, vocab), count, vocab)


def noise_block(batch_digest: bytes, lengths: Sequence[tuple[int, int]], vocab: int) -> torch.Tensor:
    """[sum of counts, vocab] noise of steps ``0..count-1`` of each ``(sample, count)``, stacked."""
    raw = b"".join(SampleNoise(batch_digest, s).raw(0, n, vocab) for s, n in lengths)
    return _gumbel(raw, sum(n for _, n in lengths), vocab)


def noise_rows(noises: Sequence[SampleNoise], step: int, vocab: int) -> torch.Tensor:
    """[len(noises), vocab] noise of one decoding step for several samples."""
    return _gumbel(b"".join(n.raw(step, 1, vocab) for n in noises), len(noises), vocab)


def seeded_scores(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """The scores the draw maximises: logits / T + G (float32), over the ``V`` ids the noise covers."""
    return logits[..., : noise.shape[-1]].float() / temperature + noise.to(logits.device)


def drawable(logits: torch.Tensor, vocab_size: int) -> int:
    """``V``: how many ids a draw ranges over (never the padding rows past the tokenizer's vocabulary)."""
    return min(int(logits.shape[-1]), vocab_size)


def draw(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """The seeded token of each row."""
    return seeded_scores(logits, noise, temperature).argmax(-1)


def gaps(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Best score minus the score of ``tokens`` (0 where the token is the draw)."""
    return scores.max(-1).values - scores.gather(-1, tokens[..., None]).squeeze(-1)
