"""Fused decode kernels: rANS symbols to finished values in one pass per tensor.

Decoding a compact patch used to be a chain of whole-array passes (symbols per model group,
scatter back to element order, bins to values, ulp deltas into the copy), each with its own
temporaries and Python overhead per model. Here each stream is decoded by one compiled loop:

- ``decode_ranks``: gap symbols plus their raw extra bits -> sorted ranks (a position class).
- ``decode_deltas_into``: per changed element, the base exponent picks the value model, the
  symbol plus raw bits give ``zigzag(delta) - 1``, and the element moves by that many keys in
  the caller's copy of the tensor, all in position order.

Raw bit fields are read with one unaligned 64-bit load from a buffer padded by 8 bytes.
Kernels return a negative status (``TRUNCATED``, ``BAD_SYMBOL``, ``OUT_OF_RANGE``) instead of
raising; the wrappers turn it into a ``PatchError``.
"""

from __future__ import annotations

import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.codec import rans
from pulse_node.errors import PatchError

TRUNCATED, BAD_SYMBOL, OUT_OF_RANGE = K.TRUNCATED, K.BAD_SYMBOL, -3
_PAD = 8


def _load(buf, pos, w):
    """The ``w``-bit (<= 56) LSB-first field at bit ``pos`` (one unaligned 64-bit load)."""
    i = pos >> 3
    word = np.uint64(0)
    for b in range(8):
        word |= np.uint64(buf[i + b]) << np.uint64(8 * b)
    return np.int64((word >> np.uint64(pos & 7)) & ((np.uint64(1) << np.uint64(w)) - np.uint64(1)))


def _peek(buf, pos, w):
    """The ``w``-bit (<= 62) field at bit ``pos`` of a buffer padded by 8 bytes."""
    if w == 0:
        return np.int64(0)
    if w > 56:
        return load(buf, pos, 32) | (load(buf, pos + 32, w - 32) << np.int64(32))
    return load(buf, pos, w)


def _ranks(words, p, x, count, slots, freq, cum, raw, rpos, rbits, low, nextra, size, out):
    """``count`` gap symbols + extra bits -> ranks in ``[0, size)``; ``(p, x, rpos)`` or a status in p."""
    r = np.int64(-1)
    for i in range(count):
        s, p, x = step(words, p, x, slots, freq, cum)
        if p < 0:
            return p, x, rpos
        if s >= low.size:
            return BAD_SYMBOL, x, rpos
        w = nextra[s]
        if rpos + w > rbits:
            return TRUNCATED, x, rpos
        r += low[s] + peek(raw, rpos, w) + 1
        rpos += w
        if r >= size:
            return OUT_OF_RANGE, x, rpos
        out[i] = r
    return p, x, rpos


def _deltas(words, p, x, label_row, slots, freq, cum, raw, rpos, rbits, low, nextra, idx, bits,
            kind, width, mant, emask):
    """Move ``bits[idx[i]]`` by its decoded key delta, the model picked by the base exponent."""
    mask = (np.int64(1) << width) - 1
    sign = np.int64(1) << (width - 1)
    for i in range(idx.size):
        j = idx[i]
        b = np.int64(bits[j])
        m = label_row[(b >> mant) & emask]
        if m < 0:
            return BAD_SYMBOL, x, rpos
        s, p, x = step_row(words, p, x, m, slots, freq, cum)
        if p < 0:
            return p, x, rpos
        if s >= low.size:
            return BAD_SYMBOL, x, rpos
        w = nextra[s]
        if rpos + w > rbits:
            return TRUNCATED, x, rpos
        zig = low[s] + peek(raw, rpos, w) + 1
        rpos += w
        d = -((zig + 1) >> 1) if zig & 1 else zig >> 1
        bits[j] = unkey((key(b, kind, sign, mask) + d) & mask, kind, sign, mask)
    return p, x, rpos


load = K.jit_or_python(_load, inline=True)
peek = K.jit_or_python(_peek, inline=True)
step, step_row, key, unkey = rans.step, rans.step_row, K.key, K.unkey
ranks_kernel = K.jit_or_python(_ranks)
deltas_kernel = K.jit_or_python(_deltas)


class RawBits:
    """A raw bit stream (``entropy.BitWriter`` layout) read by the fused kernels."""

    def __init__(self, data: bytes) -> None:
        self.buf = np.zeros(len(data) + _PAD, np.uint8)
        self.buf[:len(data)] = np.frombuffer(data, np.uint8)
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
                 low: np.ndarray, nextra: np.ndarray) -> np.ndarray:
    """``count`` sorted ranks in ``[0, size)`` coded as binned gaps (``positions``)."""
    out = np.empty(count, np.int64)
    p, x = dec.cursor
    p, x, rpos = ranks_kernel(dec.words, p, x, count, model.slots, model.freq, model.cum, raw.buf, raw.pos,
                              raw.nbits, low, nextra, size, out)
    _check(int(p), "position stream")
    dec.advance(p, x)
    raw.pos = int(rpos)
    return out


def decode_deltas_into(dec: rans.Decoder, raw: RawBits, label_row: np.ndarray, models: rans.ModelStack,
                       idx: np.ndarray, bits: np.ndarray, kind: int, mant: int, emask: int,
                       low: np.ndarray, nextra: np.ndarray) -> None:
    """Apply the value stream to ``bits`` (the caller's copy) at the sorted unique ``idx``."""
    p, x = dec.cursor
    p, x, rpos = deltas_kernel(dec.words, p, x, label_row, models.slots, models.freq, models.cum, raw.buf,
                               raw.pos, raw.nbits, low, nextra, idx, bits, kind, 8 * bits.itemsize, mant, emask)
    _check(int(p), "value stream")
    dec.advance(p, x)
    raw.pos = int(rpos)

