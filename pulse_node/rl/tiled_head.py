"""The verifier's pass over the vocabulary: each chosen token's CDF interval and log-prob, with the
output head projected one vocabulary tile at a time, never a [tokens, vocabulary] logits tensor.

``rl/seeded.py`` defines the draw; verifying token ``t`` of a row needs three sums of
``e_j = exp(z_j / T - m)`` over that row (``j < t``, ``j = t``, ``j > t``) and ``z_t``. Made from a
whole-batch logits tensor, that is a write of 4 bytes x vocabulary per token by the head and two
more passes over it (exponentials, sums): at hidden 256 and 152k ids they cost more than the head
itself. Here the head runs on ``TILE`` ids at a time and each tile is summed while it is still in
cache, with an online maximum ``m`` per row (the accumulated sums are rescaled when a later tile
holds a larger logit), so no exponential overflows and no row needs a second forward.

On the CPU the tile is summed by a compiled kernel (numba, GIL released, rows split over torch's
thread count) whose ``exp`` is a vectorisable polynomial (relative error ~1e-7; the draw rule
leaves rounding of ``e`` and of the sums free: it is far below the tolerance). On other devices,
or without numba, torch does the same tile by tile.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from pulse_node.codec.kernels import AVAILABLE  # numba importable; else torch's tile path
from pulse_node.rl.chunked import Head
from pulse_node.rl.seeded import Intervals

#: token rows per head call, and ids per call: a CPU tile of rows x ids (~4 MB) stays in cache
CPU_ROWS, CPU_TILE, CPU_TILE_MAX, CPU_TILE_ELEMS = 1024, 1024, 8192, 1 << 20
GPU_ROWS, GPU_TILE = 4096, 16384
#: accumulator columns per token: sum of e before t, e_t, sum after t, (torch path) running maximum
BEFORE, AT, AFTER, MAX = range(4)

if TYPE_CHECKING:
    from collections.abc import Callable

    from llvmlite import ir
    from numba.core.base import BaseContext
    from numba.core.typing.context import BaseContext as TypingContext
    from numba.core.typing.templates import Signature

if AVAILABLE:
    from numba import njit
    from numba.core import types as nbt
    from numba.extending import intrinsic

    _FAST = {"contract", "arcp", "nsz", "reassoc"}

    @intrinsic
    def _as_float32(typingctx: TypingContext, bits: nbt.Integer
                    ) -> tuple[Signature, Callable[[BaseContext, ir.IRBuilder, Signature, tuple[ir.Value, ...]], ir.Value]]:
        """The float32 whose bit pattern is the int32 ``bits`` (LLVM bitcast: vectorises)."""
        def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature,
                    args: tuple[ir.Value, ...]) -> ir.Value:
            return builder.bitcast(args[0], context.get_value_type(nbt.float32))
        return nbt.float32(nbt.int32), codegen

    @njit(inline="always", fastmath=_FAST, cache=True)
    def _exp(x: np.float32) -> np.float32:
        """exp(x) of a float32 (0 below ~-87, inf above ~88): Cody-Waite reduction, degree-6 polynomial."""
        n = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
        n = min(max(n, np.float32(-127.0)), np.float32(128.0))
        r = x - n * np.float32(0.693359375)
        r = r - n * np.float32(-2.12194440e-4)
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        p = p * r * r + r + np.float32(1.0)
        two_n: np.float32 = _as_float32((np.int32(n) + np.int32(127)) << np.int32(23))  # type: ignore[call-arg]  # an intrinsic is called without its typing context
        return p * two_n

    @njit(inline="always", fastmath=_FAST, cache=True)
    def _sum(row: np.ndarray, a: int, b: int, scale: np.float32, shift: np.float32) -> np.float32:
        """sum of exp(row[j] * scale - shift) for j in [a, b) (float32 lanes; a tile holds few ids)."""
        s: np.float32 = np.float32(0.0)
        for j in range(a, b):
            e: np.float32 = _exp(row[j] * scale - shift)
            s += e
        return s

    @njit(nogil=True, fastmath=_FAST, cache=True)
    def _tile_kernel(tile: np.ndarray, tokens: np.ndarray, shift: np.ndarray, off: int,  # noqa: PLR0917 (numba: positional)
                     scale: np.float32, acc: np.ndarray, first: int, last: int) -> None:
        """Add tile ``tile`` ([rows, W] float32 logits of ids ``off..off+W``) into ``acc`` rows
        ``first..last`` ([rows, 3] float64: ``BEFORE``, ``AT``, ``AFTER``) for chosen ids
        ``tokens``, each row's exponentials shifted by ``shift`` (float32)."""
        width = tile.shape[1]
        for m in range(first, last):
            row, s, t = tile[m], shift[m], tokens[m] - off
            if t < 0:
                acc[m, 2] += _sum(row, 0, width, scale, s)
            elif t >= width:
                acc[m, 0] += _sum(row, 0, width, scale, s)
            else:
                acc[m, 0] += _sum(row, 0, t, scale, s)
                acc[m, 1] += _exp(row[t] * scale - s)
                acc[m, 2] += _sum(row, t + 1, width, scale, s)


class _Threads:
    """The threads the kernel's rows are split over: one pool, made once and remade larger when
    torch's thread count grows (the old one is shut down)."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.size = 0
        self.lock = threading.Lock()

    def get(self, threads: int) -> ThreadPoolExecutor:
        with self.lock:
            if self.pool is None or self.size < threads:
                if self.pool is not None:
                    self.pool.shutdown(wait=False)
                self.pool, self.size = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tiled-head"), threads
            return self.pool


_THREADS = _Threads()


def _split(tile: np.ndarray, tokens: np.ndarray, shift: np.ndarray, off: int, scale: float, acc: np.ndarray) -> None:
    """The CPU kernel over ``tile``, its rows split over torch's thread count (the GIL released)."""
    threads = max(1, min(torch.get_num_threads(), tile.shape[0] // 16))
    args = (tile, tokens, shift, off, np.float32(scale), acc)
    if threads == 1:
        _tile_kernel(*args, 0, tile.shape[0])
        return
    pool = _THREADS.get(threads)
    bounds = np.linspace(0, tile.shape[0], threads + 1).astype(int)
    for job in [pool.submit(_tile_kernel, *args, int(a), int(b)) for a, b in itertools.pairwise(bounds)]:
        job.result()


def _torch_tile(tile: torch.Tensor, tokens: torch.Tensor, off: int, scale: float, acc: torch.Tensor) -> None:
    """A tile into ``acc`` ([rows, 4] float64: ``BEFORE``, ``AT``, ``AFTER`` and the running
    maximum, by which the sums are shifted and rescaled when it grows), in torch ops (any
    device); ``tile`` is overwritten."""
    t = (tokens - off)[:, None]
    inside = (t >= 0) & (t < tile.shape[1])
    at = t.clamp(0, tile.shape[1] - 1)
    z = tile.float().mul_(scale)
    top = torch.maximum(acc[:, MAX], z.amax(1).double())
    acc[:, :MAX] *= torch.exp(acc[:, MAX] - top)[:, None]
    acc[:, MAX] = top
    e = z.sub_(top.float()[:, None]).exp_()
    cols = torch.arange(tile.shape[1], device=tile.device)[None, :]
    acc[:, BEFORE] += torch.where(cols < t, e, 0.0).sum(1, dtype=torch.float64)
    acc[:, AFTER] += torch.where(cols > t, e, 0.0).sum(1, dtype=torch.float64)
    acc[:, AT] += torch.where(inside, e.gather(1, at), 0.0).squeeze(1).double()


def _tiles(h: torch.Tensor, head: Head, vocab: int, tile: tuple[int, int] | None
           ) -> Iterator[tuple[slice, int, torch.Tensor]]:
    """(token rows, first id, logits [rows, ids]) of each head call, row chunk by row chunk."""
    weight, bias = head
    rows, ids = tile or ((CPU_ROWS, 0) if h.device.type == "cpu" else (GPU_ROWS, GPU_TILE))
    for r in range(0, h.shape[0], rows):
        part = h[r:r + rows]
        step = ids or min(CPU_TILE_MAX, max(CPU_TILE, CPU_TILE_ELEMS // part.shape[0]))
        for off in range(0, vocab, step):
            end = min(off + step, vocab)
            yield slice(r, r + part.shape[0]), off, F.linear(part, weight[off:end], None if bias is None else bias[off:end])


def _chosen_logits(h: torch.Tensor, head: Head, tokens: torch.Tensor, scale: float) -> torch.Tensor:
    """[N] float32 ``z_t / T`` of each row's chosen id."""
    weight, bias = head
    z = (h * weight[tokens]).sum(-1)
    if bias is not None:
        z += bias[tokens]
    return z.float().mul_(scale)


def _compiled(h: torch.Tensor, head: Head, tokens: torch.Tensor, shift: torch.Tensor, *, vocab: int, scale: float,
              tile: tuple[int, int] | None) -> torch.Tensor:
    """[N, 3] sums (``BEFORE``, ``AT``, ``AFTER``) shifted by ``shift`` (each row's chosen
    logit: an honest draw's is within a few dozen of its row's maximum, so no exponential
    overflows; a row whose sums do overflow is not finite, and the caller redoes it)."""
    acc, tokens_np, shift_np = np.zeros((h.shape[0], 3)), tokens.numpy(), shift.numpy()
    for rows, off, logits in _tiles(h, head, vocab, tile):
        _split(logits.float().numpy(), tokens_np[rows], shift_np[rows], off, scale, acc[rows])
    return torch.from_numpy(acc)


def _online(h: torch.Tensor, head: Head, tokens: torch.Tensor, *, vocab: int, scale: float,
            tile: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``_compiled``'s sums in torch ops (any device), shifted by each row's maximum (returned)."""
    acc = torch.zeros(h.shape[0], 4, dtype=torch.float64, device=h.device)
    acc[:, MAX] = -math.inf
    for rows, off, logits in _tiles(h, head, vocab, tile):
        _torch_tile(logits, tokens[rows], off, scale, acc[rows])
    return acc[:, :MAX], acc[:, MAX]


def chosen_intervals(h: torch.Tensor, head: Head, tokens: torch.Tensor, *, vocab: int, temperature: float,
                     tile: tuple[int, int] | None = None, compiled: bool = True) -> Intervals:
    """For hidden states ``h`` ([N, d], the positions that predict ``tokens``) and chosen ids
    ``tokens`` ([N]): each token's CDF interval ``[lo, hi)`` under softmax(z / T) over ids
    ``0..vocab-1`` (float64) and its log-prob (float32), as ``rl/seeded.intervals`` computes them
    from whole logits (the same up to float rounding). ``tile``: (token rows, ids) per head call
    (default by device); ``compiled=False`` takes torch's path on the CPU too."""
    chosen = tokens.clamp(0, vocab - 1).to(h.device)
    scale = 1.0 / temperature
    with torch.no_grad():
        h = h.detach().contiguous()
        z_t = _chosen_logits(h, head, chosen, scale)
        if h.device.type == "cpu" and AVAILABLE and compiled:
            sums, shift = _compiled(h, head, chosen, z_t, vocab=vocab, scale=scale, tile=tile), z_t.double()
            total = sums.sum(1)
            redo = torch.nonzero(~torch.isfinite(total) | (total <= 0)).squeeze(1)
            if len(redo):  # a token far below its row's maximum (never an honest draw): exactly, apart
                sums[redo], shift[redo] = _online(h[redo], head, chosen[redo], vocab=vocab, scale=scale, tile=tile)
        else:
            sums, shift = _online(h, head, chosen, vocab=vocab, scale=scale, tile=tile)
    total = sums.sum(1)
    # log(e_t / sum e), consistent with the interval; from z_t where e_t underflowed (far below the maximum)
    at = sums[:, AT]
    logp = torch.where(at > 0, torch.log(at), z_t.double() - shift) - torch.log(total)
    return sums[:, BEFORE] / total, (sums[:, BEFORE] + at) / total, logp.float()
