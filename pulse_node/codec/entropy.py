"""Entropy-coding primitives shared by the position and value coders.

- ``gap_bins`` / ``gap_unbins_np``: a non-negative integer becomes a bin symbol (exact for values
  below 16, then four bins per octave) plus raw low bits ("extra bits").
- ``geometric_freqs``: integer frequency table of the bins under a geometric distribution,
  computed with correctly rounded IEEE operations only, so every machine builds the same
  table from the same (count, universe) pair and no table travels on the wire.
- ``BitWriter`` / ``BitReader``: variable-width raw fields back to back in one bit stream, vectorized.
- ``ans_encode`` / ``AnsDecoder``: the codec's rANS coder (``rans``) with categorical models
  built from frequency tables.

Per-element work is vectorized numpy or a compiled kernel (``kernels``); no Python loops per element.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.codec import rans
from pulse_node.errors import PatchError

#: values below this are their own bin
EXACT_BINS = 16
#: mantissa bits kept in the bin for larger values (4 bins per octave)
SUB_BITS = 2


def n_gap_bins(max_value: int) -> int:
    """Number of bin symbols needed for values in ``[0, max_value]``."""
    if max_value < EXACT_BINS:
        return EXACT_BINS
    return EXACT_BINS + (1 << SUB_BITS) * (int(max_value).bit_length() - 4)


def gap_bins(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split values in [0, 2**52) into (bin symbol, number of extra bits, extra bits)."""
    if not K.AVAILABLE:
        return gap_bins_np(values)
    v = np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
    sym, nextra, extra = np.empty(v.size, np.int32), np.empty(v.size, np.int64), np.empty(v.size, np.int64)
    K.bin_values(v, sym, nextra, extra)
    return sym, nextra, extra


def gap_bins_np(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The numpy twin of ``gap_bins`` (reference and fallback)."""
    v = values.astype(np.int64, copy=False)
    _, blen = np.frexp(v.astype(np.float64))  # exact bit length below 2**53
    big = v >= EXACT_BINS
    nextra = np.where(big, blen.astype(np.int64) - 1 - SUB_BITS, 0)
    sub = (v >> nextra) & ((1 << SUB_BITS) - 1)
    sym = np.where(big, EXACT_BINS + (nextra - 2) * (1 << SUB_BITS) + sub, v)  # SUB_BITS == 2
    extra = v & ((np.int64(1) << nextra) - 1)
    return sym.astype(np.int32), nextra, extra


@functools.lru_cache(maxsize=64)
def bin_bounds(n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(lowest value, number of extra bits) of every bin symbol (cached, read-only arrays)."""
    sym = np.arange(n_bins, dtype=np.int64)
    k = np.maximum(sym - EXACT_BINS, 0)
    blen = 5 + k // (1 << SUB_BITS)
    sub = k % (1 << SUB_BITS)
    low = np.where(sym < EXACT_BINS, sym, ((1 << SUB_BITS) + sub) << (blen - 1 - SUB_BITS))
    nextra = np.where(sym < EXACT_BINS, 0, blen - 1 - SUB_BITS)
    low.flags.writeable = False
    nextra.flags.writeable = False
    return low, nextra


def gap_unbins_np(sym: np.ndarray, extra_reader: BitReader) -> np.ndarray:
    """Inverse of ``gap_bins``: bin symbols plus extra bits (numpy reference of the fused decoders)."""
    n_bins = int(sym.max()) + 1 if sym.size else EXACT_BINS
    low, nextra = bin_bounds(max(n_bins, EXACT_BINS))
    s = sym.astype(np.int64)
    gaps: np.ndarray = low[s] + extra_reader.read(nextra[s])
    return gaps


def _geometric(count: int, universe: int, out: np.ndarray) -> None:
    q = (universe - count) / universe
    n_bins = out.size
    surv = np.empty(n_bins + EXACT_BINS + 5, np.float64)
    surv[0] = 1.0
    x = 1.0
    for k in range(1, EXACT_BINS + 1):
        x *= q
        surv[k] = x  # q**k for k <= 16
    a = q * q  # q ** (2 ** (octave - 2)) for octave 4
    a = a * a
    n = EXACT_BINS  # q**16 is recomputed as the first bin of octave 4 when that octave is used
    while n < n_bins + 1:
        a2 = a * a
        a4 = a2 * a2
        surv[n] = a4
        surv[n + 1] = a4 * a
        surv[n + 2] = a4 * a2
        surv[n + 3] = a4 * a2 * a
        n += 4
        a = a2
    surv[n_bins] = 0.0
    for k in range(n_bins):
        out[k] = max(surv[k] - surv[k + 1], 0.0)


_geometric_kernel = K.jit_or_python(_geometric)


def geometric_freqs(count: int, universe: int, n_bins: int) -> np.ndarray:
    """Frequencies of the gap bins when ``count`` of ``universe`` elements are set at random.

    Gaps then follow P(g) = p (1-p)^g with p = count / universe. Only IEEE-754 division,
    multiplication and subtraction are used (correctly rounded everywhere), in a fixed order,
    so every machine derives the identical table and no table travels on the wire.
    """
    out = np.empty(n_bins, np.float64)
    _geometric_kernel(count, universe, out)
    return out


def group_by_label(labels: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """Stable order of small-int labels (0..255) and the (label, start, end) runs of that order."""
    if not K.AVAILABLE:
        return group_by_label_np(labels)
    lab = np.ascontiguousarray(labels, dtype=np.uint8).reshape(-1)
    order, counts = np.empty(lab.size, np.int64), np.zeros(256, np.int64)
    K.label_order(lab, order, counts)
    ends = np.cumsum(counts)
    return order, [(int(k), int(ends[k] - counts[k]), int(ends[k])) for k in np.flatnonzero(counts)]


def group_by_label_np(labels: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The numpy twin of ``group_by_label``."""
    order = np.argsort(labels.astype(np.uint8), kind="stable")  # radix sort on uint8
    w = labels[order]
    cuts = np.flatnonzero(w[1:] != w[:-1]) + 1
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    ends = np.concatenate([cuts, [w.size]]).astype(np.int64)
    return order, [(int(w[s]), int(s), int(e)) for s, e in zip(starts, ends)] if w.size else []


#: bins of every value below 2**62 (their lowest values fit int64); higher symbols are corrupt
MAX_BINS = n_gap_bins((1 << 62) - 1)
#: fields at most this wide are read with one unaligned 64-bit load (offset in a byte <= 7)
_ONE_LOAD_BITS = 56
#: widest raw field (gap extra bits of values below 2**62)
MAX_FIELD_BITS = 62
_U64 = np.uint64


def _masks(widths: np.ndarray) -> np.ndarray:
    masks: np.ndarray = (_U64(1) << widths.astype(_U64)) - _U64(1)
    return masks


def _split_at_32(values: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fields wider than 32 bits as two fields (low 32 bits, then the rest): same bit stream."""
    wide = widths > 32
    if not wide.any():
        return values, widths
    reps = np.where(wide, 2, 1)
    first = np.cumsum(reps) - reps
    v, w = np.repeat(values, reps), np.repeat(widths, reps)
    v[first[wide]] = values[wide] & _U64(0xFFFFFFFF)
    w[first[wide]] = 32
    v[first[wide] + 1] = values[wide] >> _U64(32)
    w[first[wide] + 1] = widths[wide] - 32
    return v, w


class BitWriter:
    """Collects variable-width raw fields and packs them into bytes.

    Fields are stored in call order, each LSB-first, back to back in one little-endian bit
    stream; widths are at most ``MAX_FIELD_BITS``.
    """

    def __init__(self) -> None:
        self._values: list[np.ndarray] = []
        self._widths: list[np.ndarray] = []

    def write(self, values: np.ndarray, widths: np.ndarray) -> None:
        if values.size:
            self._values.append(values.astype(np.int64).reshape(-1))
            self._widths.append(widths.astype(np.int64).reshape(-1))

    def getvalue(self) -> bytes:
        if not self._values:
            return b""
        values, widths = np.concatenate(self._values), np.concatenate(self._widths)
        if not K.AVAILABLE:
            return pack_fields_np(values, widths)
        out = np.zeros((int(widths.sum()) + 7) // 8, np.uint8)
        K.write_fields(values, widths, out)
        return out.tobytes()


def pack_fields_np(values: np.ndarray, widths: np.ndarray) -> bytes:
    """The numpy twin of ``BitWriter.getvalue``: fields never overlap, so OR-ing them into
    32-bit words is a weighted ``bincount`` (exact in float64) of each field's two words."""
    values, widths = _split_at_32(values.astype(_U64), widths)
    if not widths.any():
        return b""
    ends = np.cumsum(widths)
    starts = ends - widths
    nwords = (int(ends[-1]) + 31) // 32
    shifted = (values & _masks(widths)) << (starts & 31).astype(_U64)
    word = starts >> 5
    lo = np.bincount(word, weights=(shifted & _U64(0xFFFFFFFF)).astype(np.float64), minlength=nwords + 2)
    hi = np.bincount(word + 1, weights=(shifted >> _U64(32)).astype(np.float64), minlength=nwords + 2)
    return (lo + hi)[:nwords].astype("<u4").tobytes()[:(int(ends[-1]) + 7) // 8]


class BitReader:
    """Reads back fields written by ``BitWriter`` (caller supplies the same widths)."""

    def __init__(self, data: bytes) -> None:
        self._buf = np.frombuffer(data, dtype=np.uint8)
        self._nbits = 8 * len(data)
        self._pos = 0

    def read(self, widths: np.ndarray) -> np.ndarray:
        widths = np.ascontiguousarray(widths, dtype=np.int64).reshape(-1)
        if widths.size == 0:
            return np.zeros(0, np.int64)
        if int(widths.max()) > MAX_FIELD_BITS or int(widths.min()) < 0:
            raise PatchError("raw field width out of range")
        if not K.AVAILABLE:
            return self._read_np(widths)
        out = np.empty(widths.size, np.int64)
        self._advance(K.read_fields(self._buf, self._pos, self._nbits, widths, out))
        return out

    def _advance(self, status: int) -> None:
        if status == K.TRUNCATED:
            raise PatchError("raw bit stream is truncated")
        self._pos = int(status)

    def _read_np(self, widths: np.ndarray) -> np.ndarray:
        if widths.size == 0:
            return np.zeros(0, np.int64)
        ends = np.cumsum(widths) + self._pos
        if int(ends[-1]) > self._nbits:
            raise PatchError("raw bit stream is truncated")
        starts = ends - widths
        padded = np.zeros(self._buf.size + 8, np.uint8)
        padded[:self._buf.size] = self._buf
        words = np.ndarray((self._buf.size + 1,), dtype="<u8", buffer=padded.data, strides=(1,))
        wide = widths > _ONE_LOAD_BITS
        out = _load(words, starts, np.where(wide, 32, widths))
        if wide.any():
            out[wide] |= _load(words, starts[wide] + 32, widths[wide] - 32) << _U64(32)
        self._pos = int(ends[-1])
        return out.view(np.int64)

    def remaining_bytes(self) -> int:
        """Whole unread bytes (padding of the last byte does not count)."""
        return (self._nbits - self._pos) // 8


def _load(words: np.ndarray, starts: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Fields of <= 56 bits at bit offsets ``starts`` (``words[j]``: 8 bytes from byte j)."""
    word = np.take(words, starts >> 3)
    word >>= (starts & 7).astype(_U64)
    word &= _masks(widths)
    return word


def categorical(freqs: np.ndarray, *, leaky: bool = True) -> rans.Model:
    """An rANS model of a non-negative frequency table (see ``rans.quantize``).

    ``leaky=False`` keeps zero-frequency symbols impossible (tables counted from the coded
    symbols themselves); the default gives every symbol some probability.
    """
    return rans.model(freqs, leaky=leaky)


#: rANS segments: ``(symbols, frequencies or a built model)``, coded in order
Segments = list[tuple[np.ndarray, "np.ndarray | rans.Model"]]


def ans_encode(segments: Sequence[tuple[np.ndarray, np.ndarray | rans.Model]]) -> bytes:
    """Encode ``[(symbols, freqs or model), ...]`` into one rANS stream, decodable in order."""
    return rans.encode([(s, categorical(f) if isinstance(f, np.ndarray) else f) for s, f in segments])


class AnsDecoder(rans.Decoder):
    """Decodes segments written by ``ans_encode``, one ``(count, freqs or model)`` at a time."""

    def decode(self, count: int, freqs: np.ndarray | rans.Model) -> np.ndarray:
        return super().decode(count, categorical(freqs) if isinstance(freqs, np.ndarray) else freqs)
