"""Packing (prompt, completion) pairs into padded tensors and scoring them with an ``LM``.

Used by both the supervised warm start and the GRPO learner, so the two compute token
log-probs the same way the sampler does (same positions, same temperature scaling).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from pulse_node.rl.models import HFLM, Params, TinyLM


@dataclass
class Packed:
    ids: torch.Tensor  # [B, T] right-padded prompt+completion
    mask: torch.Tensor  # [B, T] True at real tokens
    target: torch.Tensor  # [B, T-1] True where ids[:, 1:] is a completion token


def pack(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, pad_id: int,
         device: torch.device) -> Packed:
    width = max(len(p) + len(c) for p, c in pairs)
    ids = np.full((len(pairs), width), pad_id, dtype=np.int64)
    lengths = np.array([[len(p), len(p) + len(c)] for p, c in pairs], dtype=np.int64).reshape(-1, 2)
    for i, (p, c) in enumerate(pairs):
        ids[i, :len(p)] = p
        ids[i, len(p):len(p) + len(c)] = c
    col = np.arange(width)[None, :]
    mask, target = col < lengths[:, 1:], (col >= lengths[:, :1]) & (col < lengths[:, 1:])
    return Packed(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device),
                  torch.from_numpy(target[:, 1:]).to(device))


def token_logprobs(lm: TinyLM | HFLM, packed: Packed, *, params: Params | None = None,
                   temperature: float = 1.0) -> torch.Tensor:
    """[B, T-1] log-prob of each next token under the (temperature-scaled) model."""
    logits = lm.logits(packed.ids, packed.mask, params)[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, packed.ids[:, 1:, None]).squeeze(-1)


def bf16_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Straight-through BF16 weights: forward sees bf16(w) exactly, gradients reach FP32 w."""
    return {n: p + (p.detach().to(torch.bfloat16).to(p.dtype) - p.detach())
            for n, p in module.named_parameters()}


@contextmanager
def bf16_rounded(module: torch.nn.Module) -> Iterator[None]:
    """``bf16_params`` in place: inside the block the parameters hold their BF16-rounded values
    (exact in FP32), so forward and backward, activation recomputation included, see bf16(w) and
    the gradient lands on the parameter; the FP32 masters are put back on leaving."""
    params = list(module.parameters())
    masters = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.copy_(p.to(torch.bfloat16))
    try:
        yield
    finally:
        with torch.no_grad():
            for p, master in zip(params, masters):
                p.copy_(master)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp_min(1)


def as_params(named: Mapping[str, torch.Tensor] | None) -> Params | None:
    return dict(named) if named else None
