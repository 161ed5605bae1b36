"""Fixed-shape decoding: a preallocated KV cache and a decode step that can be compiled.

``RolloutWorker`` decodes "eager" by default (``rl/sampler.py``: finished rows leave the batch and
its cache, every step has its own shapes). ``StaticDecoder`` is the engine-style alternative
(``decode = "static" | "compiled"``): the KV cache is sized (rows, prompt width + new tokens) once
per batch shape and reused (HF models: ``transformers.StaticCache``; the tiny model: its own
``KVCache`` in static mode), every row stays in the batch until the last one ends (finished rows
are fed padding), and one decode step always has the same shapes: tokens [B, 1], positions
[B, 1] and a [B, L] mask of the filled cache slots. So the step can be compiled
(``torch.compile``, ``mode="reduce-overhead"`` on CUDA: replayed as a CUDA graph).

The draws are the seeded sampler's (``rl/seeded.py``) on the same logits up to kernel rounding
(attention over the whole masked cache instead of its filled part, ~1e-7 in FP32), so rollouts are
verified exactly as the eager path's. Whether all rows ended is asked every ``CHECK_EVERY`` steps
(one host sync; on CUDA the draw itself never waits: ``seeded.draw(no_sync=True)``), and the
steps decoded past the end are cut off by the sampler as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pulse_node.rl.config import DecodeMode
from pulse_node.rl.models import HFLM, KVCache, TinyLM, positions
from pulse_node.rl.seeded import draw, drawable, greedy

__all__ = ["DecodeMode", "StaticDecoder", "compile_step"]
CHECK_EVERY = 8  # decode steps between two "have all rows ended?" checks (each a host sync)
LENGTH_BUCKET = 64  # compiled: cache lengths rounded up to this, so prompt widths share a graph

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]


def compile_step(lm: TinyLM | HFLM, *, device: torch.device, backend: str = "inductor") -> Step:
    """``lm.step`` compiled as one graph (fullgraph); on CUDA with inductor, as CUDA graphs."""
    mode = "reduce-overhead" if device.type == "cuda" and backend == "inductor" else None
    compiled: Step = torch.compile(lm.step, backend=backend, mode=mode, fullgraph=True, dynamic=False)
    return compiled


class StaticDecoder:
    """Decodes batches of one model with a preallocated cache and a fixed-shape step."""

    def __init__(self, lm: TinyLM | HFLM, *, device: torch.device, compiled: bool = False,
                 backend: str = "inductor") -> None:
        self.lm, self.device, self.compiled = lm, device, compiled
        self.no_sync = device.type == "cuda"  # the host runs ahead of the GPU between the done checks
        self.step: Step = compile_step(lm, device=device, backend=backend) if compiled else lm.step
        self._cache: tuple[tuple[int, int], Any] | None = None  # the last batch shape's cache

    def cache_for(self, rows: int, length: int) -> Any:
        """The preallocated cache of a (rows, length) batch: the last one, emptied, when the shape
        is the same (a compiled step keeps its addresses), else a new one."""
        if self._cache is not None and self._cache[0] == (rows, length):
            cache = self._cache[1]
            cache.reset()
            return cache
        self._cache = None  # free the old one first
        cache = self.lm.static_cache(rows, length)
        if self.compiled and isinstance(cache, KVCache):  # HF's StaticCache marks its own
            cache.fix_addresses()
        self._cache = ((rows, length), cache)
        return cache

    def length(self, width: int, max_new: int) -> int:
        """Cache slots of a batch: its prompt width and new tokens (rounded up when compiled)."""
        n = width + max_new
        return -(-n // LENGTH_BUCKET) * LENGTH_BUCKET if self.compiled else n

    @torch.no_grad()
    def run(self, ids: torch.Tensor, mask: torch.Tensor, u: torch.Tensor | None, *, max_new: int,
            pad_id: int, eos_id: int, vocab: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and log-probs ([B, max_new], on the device) of left-padded prompts ``ids`` /
        ``mask``: seeded draws with uniforms ``u`` ([B, max_new]), or greedy when ``u`` is None
        (``vocab``: the tokenizer's; draws range over ``rl/seeded.drawable`` ids)."""
        b, width = ids.shape
        length = self.length(width, max_new)
        cache = self.cache_for(b, length)
        full = torch.zeros((b, length), dtype=torch.bool, device=self.device)
        full[:, :width] = mask
        logits = self.lm.prefill_static(ids, full, cache)
        vocab = drawable(logits, vocab)
        pos = positions(mask)[:, -1:] + 1
        toks = torch.full((b, max_new), pad_id, dtype=torch.long, device=self.device)
        lps = torch.zeros((b, max_new), dtype=torch.float32, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        for step in range(max_new):
            if u is None:
                tok, lp = greedy(logits, vocab=vocab)
            else:
                tok, lp = draw(logits, u[:, step], vocab=vocab, temperature=temperature, no_sync=self.no_sync)
            toks[:, step], lps[:, step] = tok, lp
            done |= tok == eos_id
            if step == max_new - 1 or (step % CHECK_EVERY == CHECK_EVERY - 1 and bool(done.all())):
                break
            full[:, width + step] = True
            logits = self._step(torch.where(done, pad_id, tok)[:, None], pos, full, cache)
            pos = pos + 1
        return toks, lps

    def _step(self, tok: torch.Tensor, pos: torch.Tensor, full: torch.Tensor, cache: Any) -> torch.Tensor:
        if not self.compiled:
            return self.lm.step(tok, pos, full, cache)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
            return self.step(tok, pos, full, cache).clone()  # the graph's output buffer is reused
        return self.step(tok, pos, full, cache)

