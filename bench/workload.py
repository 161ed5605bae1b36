"""Synthetic but real optimizer-step workload: BF16 states of a small transformer under AdamW.

A ~30M-parameter decoder-only transformer gets FP32 master weights with pretrained-like
magnitudes (linear weights normal(0, 0.03) scaled per output row by a log-normal factor, so the
median |w| is about 0.02; norm weights near 1; biases small), then is trained with
``torch.optim.AdamW`` (betas 0.9/0.95) on next-token prediction over a synthetic Markov-chain
corpus. After each step the BF16 compute copy is taken with ``pulse_node.torchbits.module_state``.

Used by ``bench/codec.py`` and other benchmarks::

    from bench.workload import adamw_bf16_states
    for step, state in adamw_bf16_states(lr=3e-6, steps=30):
        ...

Run directly to print the per-step BF16 change density:
``/work/venv/bin/python bench/workload.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from pulse_node.codec.state import State
from pulse_node.torchbits import module_state


@dataclass(frozen=True)
class ModelSize:
    """The size dial of the workload model."""

    vocab: int = 8192
    d_model: int = 512
    n_layers: int = 8
    n_heads: int = 8
    seq_len: int = 128
    batch: int = 4


#: named sizes for ``--size`` (param counts of ``TinyLM``; "1b" is a ~1.04 G-parameter shape like
#: Llama-3.2-1B / TinyLlama: d 2048, 18 layers, vocab 32000, untied head; BF16 ~2.1 GB)
SIZES: dict[str, ModelSize] = {
    "34m": ModelSize(),
    "166m": ModelSize(vocab=32000, d_model=1024, n_layers=8, n_heads=16, seq_len=64, batch=2),
    "1b": ModelSize(vocab=32000, d_model=2048, n_layers=18, n_heads=32, seq_len=64, batch=2),
}


class Block(nn.Module):
    """Pre-norm transformer block (attention + GELU MLP) with biases, like GPT-2."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """Decoder-only LM: embedding, blocks, final norm, untied head."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        self.emb = nn.Embedding(size.vocab, size.d_model)
        self.pos = nn.Embedding(size.seq_len, size.d_model)
        self.blocks = nn.ModuleList(Block(size.d_model, size.n_heads) for _ in range(size.n_layers))
        self.ln_f = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, size.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def pretrained_like_(model: nn.Module, gen: torch.Generator) -> None:
    """Give the FP32 master weights realistic pretrained magnitudes (median |w| ~= 0.02)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                row_scale = torch.exp(0.5 * torch.randn(p.shape[0], 1, generator=gen))
                p.copy_(torch.randn(p.shape, generator=gen) * 0.03 * row_scale)
            elif "ln" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.01 * torch.randn(p.shape, generator=gen))


def markov_batches(size: ModelSize, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Token batches from a sparse random Markov chain (a learnable next-token task)."""
    fanout = 512
    succ = torch.randint(0, size.vocab, (size.vocab, fanout), generator=gen)
    while True:
        tok = torch.randint(0, size.vocab, (size.batch,), generator=gen)
        rows = [tok]
        for _ in range(size.seq_len):
            pick = torch.randint(0, fanout, (size.batch,), generator=gen)
            tok = succ[tok, pick]
            rows.append(tok)
        yield torch.stack(rows, dim=1)


def adamw_bf16_states(*, lr: float, steps: int, seed: int = 0, weight_decay: float = 0.01,
                      size: ModelSize = ModelSize(), warmup_steps: int = 20) -> Iterator[tuple[int, State]]:
    """Yield ``(step, bf16_state)`` for step 0 (before training) and after each AdamW step.

    ``warmup_steps`` steps run first (not yielded) so Adam's moment estimates are warm, as
    in the middle of RL post-training.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyLM(size)
    pretrained_like_(model, gen)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    batches = markov_batches(size, gen)
    for step in range(-warmup_steps, steps + 1):
        if step > -warmup_steps:
            tokens = next(batches)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, size.vocab), tokens[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if step >= 0:
            yield step, module_state(model.named_parameters())


def param_count(size: ModelSize = ModelSize()) -> int:
    with torch.device("meta"):  # shapes only: no 4 GB allocation for the 1b preset
        return sum(p.numel() for p in TinyLM(size).parameters())


def _main() -> None:
    import numpy as np

    torch.set_num_threads(2)
    print(f"params: {param_count() / 1e6:.1f} M")
    prev = None
    for step, state in adamw_bf16_states(lr=3e-6, steps=5):
        if prev is not None:
            changed = sum(int(np.count_nonzero(state[k].bits != prev[k].bits)) for k in state)
            total = sum(t.numel for t in state.values())
            print(f"step {step}: density {changed / total:.4%}")
        prev = state
    med = np.median(np.abs(np.concatenate([
        (t.bits.astype(np.uint32) << 16).view(np.float32) for t in prev.values()])))
    print(f"median |w| {med:.4f} (log10 {math.log10(med):.2f})")


if __name__ == "__main__":
    _main()
