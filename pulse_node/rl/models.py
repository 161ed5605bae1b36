"""Policy networks behind one adapter: the embedded tiny transformer and local HF causal LMs.

``LM`` is what samplers and learners use: ``logits`` over whole (padded) sequences for
training, ``prefill``/``decode`` with a KV cache for generation, and ``keep_rows`` to drop
finished rows from that cache (HF models: a ``transformers`` ``DynamicCache``); ``static_cache``,
``prefill_static`` and ``step`` do the same with fixed shapes (``rl/static_decode.py``). Padding is described by a
boolean ``mask`` (True = real token); position ids are derived from it, so left padding
(generation) and right padding (training) give the same numbers.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Params = Mapping[str, torch.Tensor]


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids from a padding mask: 0, 1, ... over real tokens."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


class KVCache:
    """Preallocated per-layer keys/values for the tiny model. Static (``slot`` a tensor): keys are
    written at ``slot`` and attention runs over every slot (the mask hides the empty ones), so a
    step's shapes never change (``rl/static_decode.py``)."""

    def __init__(self, n_layers: int, shape: tuple[int, int, int, int], like: torch.Tensor, *,
                 static: bool = False) -> None:
        self.k = [like.new_zeros(shape) for _ in range(n_layers)]
        self.v = [like.new_zeros(shape) for _ in range(n_layers)]
        self.length = 0
        self.slot = torch.zeros((), dtype=torch.long, device=like.device) if static else None

    def fix_addresses(self) -> None:
        """Tell torch.compile the tensors stay put, so a compiled step replays as a CUDA graph."""
        for t in [*self.k, *self.v, *([self.slot] if self.slot is not None else [])]:
            torch._dynamo.mark_static_address(t)

    def reset(self) -> None:
        """Empty (static): every slot zeroed, the next write at slot 0."""
        for t in [*self.k, *self.v]:
            t.zero_()
        if self.slot is not None:
            self.slot.zero_()

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the keys/values of the next ``t`` positions; the keys/values to attend to."""
        t = k.shape[2]
        if self.slot is not None:
            at = self.slot + torch.arange(t, device=k.device)
            self.k[layer].index_copy_(2, at, k)
            self.v[layer].index_copy_(2, at, v)
            return self.k[layer], self.v[layer]
        end = self.length + t
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, t: int) -> None:
        if self.slot is not None:
            self.slot.add_(t)
        else:
            self.length += t

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (finished rows leave the batch)."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attend(self, x: torch.Tensor, allowed: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = cache.write(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, d))
        return out

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        x = x + self.attend(self.ln1(x), allowed, cache, layer)
        mlp: torch.Tensor = self.out(F.gelu(self.fc(self.ln2(x))))
        return x + mlp


class TinyGPT(nn.Module):
    """A small pre-LN decoder-only transformer with learned positions and tied embeddings."""

    def __init__(self, *, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
                 max_len: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_len, self.n_heads = max_len, n_heads
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = init_std / math.sqrt(2 * n_layers) if name.endswith(("proj.weight", "out.weight")) else init_std
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, allowed: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        x = self.tok_emb(ids) + self.pos_emb(pos.clamp_max(self.max_len - 1))
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, cache, i)
        if cache is not None:
            cache.advance(ids.shape[1])
        h: torch.Tensor = self.ln_f(x)
        return h @ self.tok_emb.weight.T


def _full_allowed(mask: torch.Tensor) -> torch.Tensor:
    """[B, T, T] attention pattern: causal, real keys only; each token may see itself."""
    t = mask.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=mask.device)
    return (causal & mask[:, None, :]) | eye


class TinyLM:
    """``LM`` adapter of ``TinyGPT``."""

    def __init__(self, module: TinyGPT) -> None:
        self.module = module
        self.context = module.max_len

    def logits(self, ids: torch.Tensor, mask: torch.Tensor, params: Params | None = None, *,
               last: int = 0) -> torch.Tensor:
        """[B, T, V] logits (``last``: only those of the last ``last`` positions)."""
        args = (ids, positions(mask), _full_allowed(mask))
        out: torch.Tensor = functional_call(self.module, dict(params), args) if params else self.module(*args)
        return out[:, -last:] if last else out

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, max_new: int) -> tuple[torch.Tensor, Any]:
        m = self.module
        d = m.tok_emb.weight.shape[1]
        shape = (ids.shape[0], m.n_heads, ids.shape[1] + max_new, d // m.n_heads)
        cache = KVCache(len(m.blocks), shape, m.tok_emb.weight)
        out = m(ids, positions(mask), _full_allowed(mask), cache)
        return out[:, -1], cache

    def decode(self, tok: torch.Tensor, mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        pos = positions(mask)[:, -1:]
        out = self.module(tok[:, None], pos, mask[:, None, :], cache)
        return out[:, -1], cache

    @staticmethod
    def keep_rows(cache: KVCache, rows: torch.Tensor) -> KVCache:
        """The cache of batch rows ``rows`` only."""
        cache.keep(rows)
        return cache

    def static_cache(self, rows: int, length: int) -> KVCache:
        """An empty static cache of ``rows`` x ``length`` slots (``rl/static_decode.py``)."""
        m = self.module
        d = m.tok_emb.weight.shape[1]
        return KVCache(len(m.blocks), (rows, m.n_heads, length, d // m.n_heads), m.tok_emb.weight, static=True)

    def prefill_static(self, ids: torch.Tensor, full: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits of the last prompt position; the prompt's keys fill the first slots of ``cache``
        (``full``: [B, L] mask of the slots, the prompt's in the first ``ids.shape[1]``)."""
        width = ids.shape[1]
        mask = full[:, :width]
        allowed = torch.zeros((*ids.shape, full.shape[1]), dtype=torch.bool, device=ids.device)
        allowed[:, :, :width] = _full_allowed(mask)
        out: torch.Tensor = self.module(ids, positions(mask), allowed, cache)
        return out[:, -1]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, full: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits after tokens ``tok`` ([B, 1]) at positions ``pos`` ([B, 1]), written at the
        cache's next slot; ``full`` ([B, L]) marks the slots to attend to, this one included."""
        out: torch.Tensor = self.module(tok, pos, full[:, None, :], cache)
        return out[:, -1]


class HFLM:
    """``LM`` adapter of a ``transformers`` causal LM (its own KV cache)."""

    def __init__(self, module: PreTrainedModel, context: int) -> None:
        self.module = module
        self.context = context
        names = inspect.signature(module.forward).parameters
        # transformers 5.2x names the cache argument ``cache`` (``past_key_values`` is deprecated)
        self._cache_kw = "cache" if "cache" in names else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in names), None)

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        takes_config = "config" in inspect.signature(DynamicCache.__init__).parameters
        return DynamicCache(config=self.module.config) if takes_config else DynamicCache()

    def _call(self, params: Params | None, **kw: Any) -> Any:
        return functional_call(self.module, dict(params), (), kw) if params else self.module(**kw)

    def logits(self, ids: torch.Tensor, mask: torch.Tensor, params: Params | None = None, *,
               last: int = 0) -> torch.Tensor:
        """[B, T, V] FP32 logits (``last``: only those of the last ``last`` positions, the others'
        vocabulary projection skipped where the model supports ``logits_to_keep``)."""
        keep = {self._keep_kw: last} if last and self._keep_kw else {}
        out = self._call(params, input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask),
                         use_cache=False, **keep)
        logits: torch.Tensor = out.logits.float()
        return logits[:, -last:] if last else logits

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, max_new: int) -> tuple[torch.Tensor, Any]:
        cache = self._new_cache()
        keep = {self._keep_kw: 1} if self._keep_kw else {}
        out = self.module(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask),
                          use_cache=True, **{self._cache_kw: cache}, **keep)
        return out.logits[:, -1].float(), cache

    def decode(self, tok: torch.Tensor, mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        out = self.module(input_ids=tok[:, None], attention_mask=mask.long(),
                          position_ids=positions(mask)[:, -1:], use_cache=True, **{self._cache_kw: cache})
        return out.logits[:, -1].float(), cache

    @staticmethod
    def keep_rows(cache: Any, rows: torch.Tensor) -> Any:
        """The ``DynamicCache`` of batch rows ``rows`` only (finished rows leave the batch)."""
        cache.batch_select_indices(rows)
        return cache

    def static_cache(self, rows: int, length: int) -> Any:
        """An empty ``transformers.StaticCache`` of ``length`` slots (its [rows, ...] tensors are
        allocated by the prefill)."""
        from transformers import StaticCache

        return StaticCache(config=self.module.config, max_cache_len=length)

    def prefill_static(self, ids: torch.Tensor, full: torch.Tensor, cache: Any) -> torch.Tensor:
        """As ``TinyLM.prefill_static``, into a ``StaticCache``."""
        keep = {self._keep_kw: 1} if self._keep_kw else {}
        out = self.module(input_ids=ids, attention_mask=full.long(), position_ids=positions(full[:, :ids.shape[1]]),
                          use_cache=True, **{self._cache_kw: cache}, **keep)
        logits: torch.Tensor = out.logits[:, -1].float()
        return logits

    def step(self, tok: torch.Tensor, pos: torch.Tensor, full: torch.Tensor, cache: Any) -> torch.Tensor:
        """As ``TinyLM.step``, into a ``StaticCache``."""
        out = self.module(input_ids=tok, attention_mask=full.long(), position_ids=pos, use_cache=True,
                          **{self._cache_kw: cache})
        logits: torch.Tensor = out.logits[:, -1].float()
        return logits
