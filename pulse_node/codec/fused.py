"""Fused decode kernels: rANS symbols to finished values in one pass per tensor.

Decoding a compact patch used to be a chain of whole-array passes (symbols per model group,
scatter back to element order, bins to values, ulp deltas into the copy), each with its own
temporaries and Python overhead per model. Here each stream is decoded by one compiled loop:

- ``decode_ranks``: gap symbols plus their raw extra bits -> sorted ranks (a position class).
- ``decode_planes_into``: the byte planes of overwrite coding, combined and scattered.
- ``decode_deltas_into``: per changed element, the base exponent picks the value model, the
  symbol plus raw bits give ``zigzag(delta) - 1``, and the element moves by that many keys in
  the caller's copy of the tensor, all in position order.

Raw bit fields are read from a pair of aligned 32-bit words (the stream padded by two words).
Kernels return a negative status (``TRUNCATED``, ``BAD_SYMBOL``, ``OUT_OF_RANGE``) instead of
raising; the wrappers turn it into a ``PatchError``.
"""

from __future__ import annotations

import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.codec import rans
from pulse_node.errors import PatchError

TRUNCATED, BAD_SYMBOL, OUT_OF_RANGE = K.TRUNCATED, K.BAD_SYMBOL, -3
#: a live parameter's words (flat, unsigned, writable) and the left shift of the stored bits in them
LiveWords = tuple[np.ndarray, int]
#: the index type positions are decoded into unless a caller names a narrower one
INT64 = np.dtype(np.int64)


def _load(buf: np.ndarray, pos: int, w: int) -> np.int64:
    """The ``w``-bit (<= 32) LSB-first field at bit ``pos`` of little-endian uint32 words."""
    i = pos >> 5
    pair = (np.uint64(buf[i + 1]) << np.uint64(32)) | np.uint64(buf[i])
    field: np.int64 = np.int64((pair >> np.uint64(pos & 31)) & ((np.uint64(1) << np.uint64(w)) - np.uint64(1)))
    return field


def _peek(buf: np.ndarray, pos: int, w: int) -> np.int64:
    """The ``w``-bit (<= 62) field at bit ``pos`` of a word buffer padded by two words."""
    if w > 32:
        wide: np.int64 = load(buf, pos, 32) | (load(buf, pos + 32, w - 32) << np.int64(32))
        return wide
    return load(buf, pos, w)


def _ranks(words: np.ndarray, p: int, x0: np.uint64, x1: np.uint64, t: int, count: int, slots: np.ndarray,
           freq: np.ndarray, cum: np.ndarray, raw: np.ndarray, rpos: int, rbits: int, low: np.ndarray,
           nextra: np.ndarray, size: int, out: np.ndarray) -> tuple[int, np.uint64, np.uint64, int]:
    """``count`` gap symbols + extra bits -> ranks in ``[0, size)``; ``(p, x0, x1, rpos)``, a status in p."""
    r = np.int64(-1)
    xa, xb = (x1, x0) if t else (x0, x1)
    for i in range(count):
        s, p, xa = step(words, p, xa, slots, freq, cum)
        if p < 0:
            return p, x0, x1, rpos
        if s >= low.size:
            return BAD_SYMBOL, x0, x1, rpos
        w = nextra[s]
        if rpos + w > rbits:
            return TRUNCATED, x0, x1, rpos
        r += low[s] + peek(raw, rpos, w) + 1
        rpos += w
        if r >= size:
            return OUT_OF_RANGE, x0, x1, rpos
        out[i] = r
        xa, xb = xb, xa
    p, x0, x1 = unswap(t, count, xa, xb, p)
    return p, x0, x1, rpos


def _deltas(words: np.ndarray, p: int, x0: np.uint64, x1: np.uint64, t: int, label_row: np.ndarray,
            slots: np.ndarray, freq: np.ndarray, cum: np.ndarray, raw: np.ndarray, rpos: int, rbits: int,
            low: np.ndarray, nextra: np.ndarray, idx: np.ndarray, bits: np.ndarray, kind: int, width: int,
            mant: int, emask: int, old: np.ndarray, new: np.ndarray, live: np.ndarray,
            shift: int) -> tuple[int, np.uint64, np.uint64, int]:
    """Move ``bits[idx[i]]`` by its decoded key delta, the model picked by the base exponent.

    With ``old`` and ``new`` as long as ``idx``, each element's bits before and after are kept
    there as it is written (the undo log, without gathering twice), ``live`` (when not empty:
    the words of a parameter holding the same tensor) gets ``new << shift`` at the same
    position, and a failing stream puts back what it had written before returning its status."""
    mask = (np.int64(1) << width) - 1
    sign = np.int64(1) << (width - 1)
    keep = old.size == idx.size and new.size == idx.size
    to_live = keep and live.size > 0
    status = 0
    done = 0
    xa, xb = (x1, x0) if t else (x0, x1)
    n = idx.size
    for i in range(n):
        if i + K.PREFETCH_AHEAD < n:
            K.prefetch_write(bits, idx[i + K.PREFETCH_AHEAD])
            if to_live:
                K.prefetch_write(live, idx[i + K.PREFETCH_AHEAD])
        j = idx[i]
        b = np.int64(bits[j])
        m = label_row[(b >> mant) & emask]
        if m < 0:
            status = BAD_SYMBOL
            break
        s, p, xa = step_row(words, p, xa, m, slots, freq, cum)
        if p < 0:
            status = p
            break
        if s >= low.size:  # the bin lookup of _ranks, inline on purpose (a helper measured 5-7x slower)
            status = BAD_SYMBOL
            break
        w = nextra[s]
        if rpos + w > rbits:
            status = TRUNCATED
            break
        zig = low[s] + peek(raw, rpos, w) + 1
        rpos += w
        d = (zig >> 1) ^ -(zig & 1)  # un-zigzag, branch-free
        after = unkey((key(b, kind, sign, mask) + d) & mask, kind, sign, mask)
        bits[j] = after
        if keep:
            old[i] = b
            new[i] = after
            if to_live:
                live[j] = after << shift
        done = i + 1
        xa, xb = xb, xa
    if status < 0:
        if keep:
            for i in range(done):
                bits[idx[i]] = old[i]
                if to_live:
                    live[idx[i]] = np.int64(old[i]) << shift
        return status, x0, x1, rpos
    p, x0, x1 = unswap(t, idx.size, xa, xb, p)
    return p, x0, x1, rpos


def _planes(words: np.ndarray, p: int, x0: np.uint64, x1: np.uint64, t: int, slots: np.ndarray, freq: np.ndarray,
            cum: np.ndarray, n_planes: int, idx: np.ndarray, bits: np.ndarray) -> tuple[int, np.uint64, np.uint64]:
    """Overwrite coding: byte plane ``j`` of every element with model row ``j``, then scatter."""
    n = idx.size
    acc = np.zeros(n, np.uint64)
    xa, xb = (x1, x0) if t else (x0, x1)
    for j in range(n_planes):
        shift = np.uint64(8 * j)
        for i in range(n):
            s, p, xa = step_row(words, p, xa, j, slots, freq, cum)
            if p < 0:
                return p, x0, x1
            acc[i] |= np.uint64(s) << shift
            xa, xb = xb, xa
    for i in range(n):
        bits[idx[i]] = acc[i]
    return unswap(t, n * n_planes, xa, xb, p)


load = K.jit_or_python(_load, inline=True)
peek = K.jit_or_python(_peek, inline=True)
step, step_row, unswap, key, unkey = rans.step, rans.step_row, rans.unswap, K.key, K.unkey
ranks_kernel = K.jit_or_python(_ranks)
deltas_kernel = K.jit_or_python(_deltas)
planes_kernel = K.jit_or_python(_planes)


class RawBits:
    """A raw bit stream (``entropy.BitWriter`` layout) as little-endian uint32 words plus two
    zero words of padding, read by the fused kernels."""

    def __init__(self, data: bytes) -> None:
        padded = np.zeros(4 * (len(data) // 4 + 3), np.uint8)
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        self.buf = padded.view("<u4")
        self.nbits = 8 * len(data)
        self.pos = 0

    def remaining_bytes(self) -> int:
        return (self.nbits - self.pos) // 8


def _check(status: int, what: str) -> None:
    if status == TRUNCATED:
        raise PatchError(f"{what}: stream is truncated")
    if status == BAD_SYMBOL:
        raise PatchError(f"{what}: symbol outside its model")
    if status == OUT_OF_RANGE:
        raise PatchError(f"{what}: decoded position lies outside its tensor")


def decode_ranks(dec: rans.Decoder, raw: RawBits, count: int, model: rans.Model, size: int,
                 low: np.ndarray, nextra: np.ndarray, dtype: np.dtype = INT64) -> np.ndarray:
    """``count`` sorted ranks in ``[0, size)`` coded as binned gaps (``positions``), as ``dtype``
    (an integer type that holds ``size - 1``)."""
    out = np.empty(count, dtype)
    p, x0, x1 = dec.cursor
    p, x0, x1, rpos = ranks_kernel(dec.words, p, x0, x1, dec.parity, count, model.slots, model.freq, model.cum,
                                   raw.buf, raw.pos, raw.nbits, low, nextra, size, out)
    _check(int(p), "position stream")
    dec.advance(count, p, x0, x1)
    raw.pos = int(rpos)
    return out


def decode_deltas_into(dec: rans.Decoder, raw: RawBits, label_row: np.ndarray, models: rans.ModelStack,
                       idx: np.ndarray, bits: np.ndarray, kind: int, mant: int, emask: int,
                       low: np.ndarray, nextra: np.ndarray, *, old: np.ndarray | None = None,
                       new: np.ndarray | None = None, live: LiveWords | None = None) -> None:
    """Apply the value stream to ``bits`` at the sorted unique ``idx``. ``old`` / ``new`` (arrays
    of ``bits``' dtype, as long as ``idx``): filled with each element's bits before and after,
    and on a corrupt stream ``bits`` is left as it was (without them it is left part-written,
    for callers that decode into a copy). ``live`` (with ``old`` / ``new``): a parameter's words
    written with the new bits in the same pass, and restored with ``bits``."""
    none = np.empty(0, bits.dtype)
    old, new = (none, none) if old is None or new is None else (old, new)
    words, shift = live if live is not None else (np.empty(0, np.uint32), 0)
    p, x0, x1 = dec.cursor
    p, x0, x1, rpos = deltas_kernel(dec.words, p, x0, x1, dec.parity, label_row, models.slots, models.freq,
                                    models.cum, raw.buf, raw.pos, raw.nbits, low, nextra, idx, bits, kind,
                                    8 * bits.itemsize, mant, emask, old, new, words, shift)
    _check(int(p), "value stream")
    dec.advance(idx.size, p, x0, x1)
    raw.pos = int(rpos)



def write_live(live: LiveWords, idx: np.ndarray, bits: np.ndarray) -> None:
    """``words[idx] = bits << shift``: stored bits into a live parameter's words."""
    words, shift = live
    if K.AVAILABLE:
        K.scatter_shifted(words, idx, bits, shift)
    else:
        words[idx] = (bits.astype(words.dtype) << shift) if shift else bits


def decode_planes_into(dec: rans.Decoder, models: rans.ModelStack, idx: np.ndarray, bits: np.ndarray) -> None:
    """Write the new bits of the overwrite coding (one model per byte plane) at ``idx``."""
    if models.n.size != bits.itemsize:
        raise PatchError(f"value stream needs {bits.itemsize} plane models, patch has {models.n.size}")
    p, x0, x1 = dec.cursor
    p, x0, x1 = planes_kernel(dec.words, p, x0, x1, dec.parity, models.slots, models.freq, models.cum,
                              bits.itemsize, idx, bits)
    _check(int(p), "value stream")
    dec.advance(idx.size * bits.itemsize, p, x0, x1)
