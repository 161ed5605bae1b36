"""Entropy-coding primitives shared by the position and value coders.

- ``gap_bins`` / ``gap_unbins``: a non-negative integer becomes a bin symbol (exact for values
  below 16, then four bins per octave) plus raw low bits ("extra bits").
- ``geometric_freqs``: integer frequency table of the bins under a geometric distribution,
  computed with deterministic fixed-point integer arithmetic, so every machine builds the same
  table from the same (count, universe) pair and no table travels on the wire.
- ``pack_bits`` / ``unpack_bits``: variable-width raw fields, vectorized.
- ``AnsStream``: thin wrapper over ``constriction``'s rANS coder with categorical models built
  from integer frequency tables.

Everything is vectorized numpy; no per-element Python loops.
"""

from __future__ import annotations

import numpy as np

from pulse_node.errors import PatchError

#: values below this are their own bin
EXACT_BINS = 16
#: mantissa bits kept in the bin for larger values (4 bins per octave)
SUB_BITS = 2
_Q = 31  # fixed-point fraction bits of the geometric tables


def n_gap_bins(max_value: int) -> int:
    """Number of bin symbols needed for values in ``[0, max_value]``."""
    if max_value < EXACT_BINS:
        return EXACT_BINS
    return EXACT_BINS + (1 << SUB_BITS) * (int(max_value).bit_length() - 4)


def gap_bins(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split values >= 0 into (bin symbol, number of extra bits, extra bits)."""
    v = values.astype(np.int64, copy=False)
    big = v >= EXACT_BINS
    blen = np.zeros(v.shape, np.int64)
    if big.any():
        blen[big] = np.floor(np.log2(v[big].astype(np.float64))).astype(np.int64) + 1
        # float log2 may be off by one near powers of two: fix exactly with integer compares
        blen[big] += (v[big] >> blen[big]) > 0
        blen[big] -= (v[big] >> (blen[big] - 1)) == 0
    nextra = np.where(big, blen - 1 - SUB_BITS, 0)
    sub = np.where(big, (v >> np.maximum(nextra, 0)) & ((1 << SUB_BITS) - 1), 0)
    sym = np.where(big, EXACT_BINS + (blen - 5) * (1 << SUB_BITS) + sub, v)
    extra = np.where(big, v & ((np.int64(1) << nextra) - 1), 0)
    return sym.astype(np.int32), nextra.astype(np.int64), extra


def bin_bounds(n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(lowest value, number of extra bits) of every bin symbol."""
    sym = np.arange(n_bins, dtype=np.int64)
    k = np.maximum(sym - EXACT_BINS, 0)
    blen = 5 + k // (1 << SUB_BITS)
    sub = k % (1 << SUB_BITS)
    low = np.where(sym < EXACT_BINS, sym, ((1 << SUB_BITS) + sub) << (blen - 1 - SUB_BITS))
    nextra = np.where(sym < EXACT_BINS, 0, blen - 1 - SUB_BITS)
    return low, nextra


def gap_unbins(sym: np.ndarray, extra_reader: "BitReader") -> np.ndarray:
    """Inverse of ``gap_bins``: bin symbols plus extra bits from ``extra_reader``."""
    n_bins = int(sym.max()) + 1 if sym.size else EXACT_BINS
    low, nextra = bin_bounds(max(n_bins, EXACT_BINS))
    s = sym.astype(np.int64)
    return low[s] + extra_reader.read(nextra[s])


def _pow_q(base: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """``base ** exp`` in Q31 fixed point, elementwise, deterministic integer arithmetic."""
    result = np.full(exp.shape, 1 << _Q, dtype=np.uint64)
    b = np.broadcast_to(base, exp.shape).astype(np.uint64)
    e = exp.astype(np.int64).copy()
    while (e > 0).any():
        odd = (e & 1).astype(bool)
        result = np.where(odd, (result * b) >> np.uint64(_Q), result)
        b = (b * b) >> np.uint64(_Q)
        e >>= 1
    return result


def geometric_freqs(count: int, universe: int, n_bins: int) -> np.ndarray:
    """Frequencies of the gap bins when ``count`` of ``universe`` elements are set at random.

    Gaps then follow P(g) = p (1-p)^g with p = count / universe; the table holds the mass of
    each bin in Q31 integers (plus one, so every bin stays encodable).
    """
    q = np.uint64(((universe - count) << _Q) // universe)
    low, _ = bin_bounds(n_bins)
    surv = _pow_q(np.array(q, dtype=np.uint64), low)
    upper = np.append(surv[1:], np.uint64(0))
    mass = np.where(surv > upper, surv - upper, np.uint64(0))
    return mass.astype(np.float64) + 1.0


class BitWriter:
    """Collects variable-width raw fields and packs them into bytes (little-endian bit order)."""

    def __init__(self) -> None:
        self._values: list[np.ndarray] = []
        self._widths: list[np.ndarray] = []

    def write(self, values: np.ndarray, widths: np.ndarray) -> None:
        self._values.append(values.astype(np.uint64, copy=False))
        self._widths.append(widths.astype(np.int64, copy=False))

    def getvalue(self) -> bytes:
        if not self._values:
            return b""
        values = np.concatenate(self._values)
        widths = np.concatenate(self._widths)
        wmax = int(widths.max()) if widths.size else 0
        if wmax == 0:
            return b""
        shifts = np.arange(wmax, dtype=np.uint64)
        bits = ((values[:, None] >> shifts[None, :]) & np.uint64(1)).astype(np.uint8)
        keep = np.arange(wmax)[None, :] < widths[:, None]
        return np.packbits(bits[keep], bitorder="little").tobytes()


class BitReader:
    """Reads back fields written by ``BitWriter`` (caller supplies the widths)."""

    def __init__(self, data: bytes) -> None:
        self._bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        self._pos = 0

    def read(self, widths: np.ndarray) -> np.ndarray:
        widths = widths.astype(np.int64, copy=False)
        if widths.size == 0:
            return np.zeros(0, np.int64)
        total = int(widths.sum())
        if self._pos + total > self._bits.size:
            raise PatchError("raw bit stream is truncated")
        wmax = int(widths.max())
        if wmax == 0:
            return np.zeros(widths.shape, np.int64)
        if wmax > 62:
            raise PatchError("raw field wider than 62 bits")
        starts = self._pos + np.cumsum(widths) - widths
        idx = starts[:, None] + np.arange(wmax)[None, :]
        keep = np.arange(wmax)[None, :] < widths[:, None]
        bits = np.where(keep, self._bits[np.minimum(idx, self._bits.size - 1)], 0).astype(np.int64)
        self._pos += total
        return (bits << np.arange(wmax, dtype=np.int64)[None, :]).sum(axis=1)

    def remaining_bytes(self) -> int:
        return (self._bits.size - self._pos) // 8


def categorical(freqs: np.ndarray):
    """A constriction categorical model from a non-negative frequency table."""
    from constriction.stream.model import Categorical

    f = np.asarray(freqs, dtype=np.float64)
    if f.ndim != 1 or f.size == 0 or not np.isfinite(f).all() or (f < 0).any() or f.sum() <= 0:
        raise PatchError("invalid frequency table")
    return Categorical(f, perfect=False)


def ans_encode(segments: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Encode ``[(symbols, freqs), ...]`` into one rANS stream, decodable in the same order."""
    from constriction.stream.stack import AnsCoder

    coder = AnsCoder()
    for symbols, freqs in reversed(segments):
        if symbols.size:
            coder.encode_reverse(symbols.astype(np.int32, copy=False), categorical(freqs))
    return coder.get_compressed().astype("<u4").tobytes()


class AnsDecoder:
    """Decodes segments written by ``ans_encode``, one ``(count, freqs)`` at a time."""

    def __init__(self, data: bytes) -> None:
        from constriction.stream.stack import AnsCoder

        if len(data) % 4:
            raise PatchError("entropy-coded stream has a partial word")
        words = np.frombuffer(data, dtype="<u4").astype(np.uint32)
        try:
            self._coder = AnsCoder(words)
        except Exception as exc:  # constriction rejects some corrupt streams up front
            raise PatchError(f"corrupt entropy-coded stream: {exc}") from None

    def decode(self, count: int, freqs: np.ndarray) -> np.ndarray:
        if count == 0:
            return np.zeros(0, np.int32)
        try:
            out = self._coder.decode(categorical(freqs), int(count))
        except Exception as exc:
            raise PatchError(f"corrupt entropy-coded stream: {exc}") from None
        return np.asarray(out, dtype=np.int64)

    def is_empty(self) -> bool:
        return bool(self._coder.is_empty())
