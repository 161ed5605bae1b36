"""Base-context coding of PULSELoCo payload values and positions (torch-free).

Every trainer of a round holds the same FP32 global weights ``w`` (the payload names their
hash), so the receiver can condition on ``w`` at every position. An entry of ``s`` fires only
if ``w - s`` leaves the BF16 rounding interval of ``w``; so, at a fired entry:

- the sign of ``s`` is predictable from where ``w`` sits in its interval (the nearer boundary
  is the likelier one to be crossed): symbol ``toward`` = 1 iff ``s`` moves ``w`` toward zero,
  coded with ``N_DIST`` contexts (``dz``, the distance from ``w`` to the boundary toward zero);
- ``|s|`` is at least the distance ``T`` to the crossed boundary, which is an integer number of
  FP32 ulps of ``w``. ``|s|`` itself is (almost always) an integer multiple ``Q`` of
  ``ulp(w) / 2**delta``: ``s`` sums differences of FP32 weights in ``w``'s binade. So the coder
  sends the excess ``R = Q - (T << delta)`` as its bit length (an rANS symbol whose model is
  conditioned on ``w``'s exponent and the ``toward`` bit) plus the bits below the leading one
  raw. The bit length *is* ``s``'s exponent relative to ``w``'s; the raw bits are the
  mantissa bits of ``s`` above ``w``'s ulp. Lossless: any value that is not such a multiple,
  or lies inside the interval, or has a huge ``R``, takes the escape symbol and its 31
  magnitude bits raw.
- ``threshold=False`` sets ``T = 0`` (plain exponent-relative coding; kept for measurement).

Models are semi-static: the encoder counts symbols and sends every table as log2-quantized
counts (one byte per cell, ``FREQ`` maps them back to integer frequencies), so both sides
build identical rANS models (``codec.rans``). The value stream (``VALUES_FORMAT``)::

    msgpack [VALUES_FORMAT, delta, threshold, toward_table(16 B), length_table(zstd), rans, raw]

``length_table`` has one row of ``N_LEN`` cells per length context present, in ascending
context order; the decoder derives which contexts are present from ``w`` and the decoded
``toward`` bits, so the context list itself is never sent.

``position_labels(w)`` gives the position coder's per-element class (``w``'s exponent and the
distance to the nearer BF16 boundary); see ``pulse_node.codec.positions``.

Cost: contexts are derived per value from ``w`` (O(count)); ``position_labels`` is O(model size)
per payload and the position classes materialise an index for every element outside the most
common class -- fine for the models here, LLM scale needs chunked classes (``codec/context.py``).

Decoding treats its input as hostile: every table size is fixed by the base before anything
is decompressed, widths and shifts are range-checked, and errors are ``PatchError`` (the
payload layer turns them into ``WireError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgpack
import numpy as np
import zstandard

from pulse_node.codec.entropy import AnsDecoder, BitReader, BitWriter, ans_encode
from pulse_node.errors import PatchError
from pulse_node.loco.bounded_zstd import bounded_decompress

VALUES_FORMAT = 2
MAXQ = 40
"""Excess bit lengths 0..MAXQ are coded; ``ESC`` marks a value sent raw."""
ESC = MAXQ + 1
N_LEN = MAXQ + 2
N_DIST = 8
MAX_DELTA = 3
_Q_MAX = 41
#: table cell q (1.._Q_MAX) -> integer frequency ~ 2**((q - 1) / 2) * 1024 (0 = symbol absent)
FREQ = np.array([0] + [math.isqrt(1 << (q + 19)) for q in range(1, _Q_MAX + 1)], dtype=np.float64)
_U = np.uint64
#: elements per slice when labelling every weight (bounds the temporaries to a few MB)
LABEL_SLICE = 1 << 20


def _base_fields(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exponent field, sign and ``dz`` (ulps of ``w`` to the BF16 boundary toward zero)."""
    w = w.astype(np.int64)
    ew = (w >> 23) & 0xFF
    mw = (w & 0x7FFFFF) | np.where(ew > 0, 1 << 23, 0)
    dz = ((mw & 0xFFFF) + 0x8000) & 0xFFFF
    return ew, (w >> 31) & 1, dz


def position_labels(w_bits: np.ndarray) -> np.ndarray:
    """Per-element class of the position coder: (exponent window, distance to the nearer boundary).

    One byte per element, computed in uint32 slices of ``LABEL_SLICE`` elements: the whole
    model's labels cost 1 B per parameter, not the ~50 B of int64 temporaries over every weight.
    The low 16 bits of a BF16-rounded FP32 mantissa are the low 16 bits of its bit pattern, so
    ``dz`` here is ``_base_fields``'s exactly.
    """
    w = np.asarray(w_bits, dtype=np.uint32).reshape(-1)
    out = np.empty(w.size, dtype=np.uint8)
    for lo in range(0, w.size, LABEL_SLICE):
        c = w[lo:lo + LABEL_SLICE]
        window = np.clip(((c >> 23) & 0xFF).astype(np.int32) - 96, 0, 63)
        dz = ((c & 0xFFFF) + 0x8000) & 0xFFFF
        near = np.minimum(np.minimum(dz, 0x10000 - dz) >> 13, 3).astype(np.int32)
        out[lo:lo + LABEL_SLICE] = window * 4 + near
    return out


def _bitlen(x: np.ndarray) -> np.ndarray:
    """Bit length of non-negative integers below 2**53 (0 for 0)."""
    _, e = np.frexp(x.astype(np.float64))
    return e.astype(np.int64)


def _quantize(counts: np.ndarray) -> np.ndarray:
    """Counts -> table cells (0 only for a zero count)."""
    c = counts.astype(np.float64)
    with np.errstate(divide="ignore"):
        q = np.rint(2.0 * np.log2(np.maximum(c, 1.0))) + 1
    return np.where(c > 0, np.clip(q, 1, _Q_MAX), 0).astype(np.uint8)


def _freqs(cells: np.ndarray) -> np.ndarray:
    if cells.size and int(cells.max()) > _Q_MAX:
        raise PatchError("value model table cell out of range")
    f = FREQ[cells.astype(np.int64)]
    if f.sum() <= 0:
        raise PatchError("value model table row is empty")
    return f


def _groups(ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stable order by context, the contexts present (ascending) and their run boundaries."""
    order = np.argsort(ctx, kind="stable")
    present, starts = np.unique(ctx[order], return_index=True)
    ends = np.append(starts[1:], ctx.size)
    return order, present, np.stack([starts, ends], axis=1) if ctx.size else np.zeros((0, 2), np.int64)


class _Fields:
    """Per-value quantities both sides derive from the base (and, later, the toward bits)."""

    def __init__(self, w_bits: np.ndarray) -> None:
        self.ew, self.sign_w, self.dz = _base_fields(w_bits)
        self.ewc = np.maximum(self.ew, 1)
        self.dist_ctx = self.dz >> 13  # 0..7

    def threshold(self, toward: np.ndarray, delta: int, enabled: bool) -> np.ndarray:
        if not enabled:
            return np.zeros(toward.size, np.int64)
        return np.where(toward == 1, self.dz, 0x10000 - self.dz) << delta

    def len_ctx(self, toward: np.ndarray) -> np.ndarray:
        ctx: np.ndarray = self.ew * 2 + toward
        return ctx


def _excess(s: np.ndarray, f: _Fields, toward: np.ndarray, delta: int, thresh: bool) -> tuple[np.ndarray, np.ndarray]:
    """(excess R, ok mask) of every value; R is meaningful only where ok."""
    s = s.astype(np.int64)
    es = (s >> 23) & 0xFF
    ms = (s & 0x7FFFFF) | np.where(es > 0, 1 << 23, 0)
    shift = np.maximum(es, 1) - f.ewc + delta
    up = np.clip(shift, 0, 62)
    down = np.clip(-shift, 0, 62)
    exact = (ms & ((np.int64(1) << down) - 1)) == 0
    fits = _bitlen(ms) + up <= MAXQ
    q = np.where(shift >= 0, ms << np.where(fits, up, 0), ms >> down)
    r = q - f.threshold(toward, delta, thresh)
    ok = exact & fits & (shift > -63) & (r >= 0) & (r < (1 << MAXQ)) & (es != 0xFF) & (f.ew != 0xFF)
    return np.where(ok, r, 0), ok


def _choose_delta(s: np.ndarray, f: _Fields) -> int:
    """Smallest estimated cost: escapes (32 bits) against one more raw bit per value per step."""
    s = s.astype(np.int64)
    es = (s >> 23) & 0xFF
    ms = (s & 0x7FFFFF) | np.where(es > 0, 1 << 23, 0)
    tz = _bitlen(ms & -ms) - 1  # -1 for zero
    slack = tz + np.maximum(es, 1) - f.ewc
    costs = [32 * int(np.count_nonzero((slack + d < 0) & (ms != 0))) + d * s.size for d in range(MAX_DELTA + 1)]
    return int(np.argmin(costs))


def encode_values_ctx(values: np.ndarray, w_bits: np.ndarray, *, threshold: bool = True,
                      level: int = 3) -> bytes:
    """FP32 ``values`` at positions whose FP32 base weights have bits ``w_bits`` -> bytes."""
    s = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).reshape(-1)
    w = np.asarray(w_bits, dtype=np.uint32).reshape(-1)
    if s.size != w.size:
        raise ValueError(f"{s.size} values but {w.size} base weights")
    if s.size == 0:
        return b""
    f = _Fields(w)
    toward = (((s >> 31).astype(np.int64)) == f.sign_w).astype(np.int64)
    delta = _choose_delta(s, f)
    r, ok = _excess(s, f, toward, delta, threshold)
    lens = np.where(ok, _bitlen(r), ESC)
    segments, tables = [], []
    for ctx, sym, n_sym in ((f.dist_ctx, toward, 2), (f.len_ctx(toward), lens, N_LEN)):
        order, present, runs = _groups(ctx)
        table = np.zeros((present.size, n_sym), np.uint8)
        for row, (a, b) in enumerate(runs):
            seg = sym[order[a:b]]
            table[row] = _quantize(np.bincount(seg, minlength=n_sym))
            segments.append((seg, _freqs(table[row])))
        tables.append((present, table))
    dist_table = np.zeros((N_DIST, 2), np.uint8)
    dist_table[tables[0][0]] = tables[0][1]
    raw = BitWriter()
    widths = np.where(ok, np.maximum(lens - 1, 0), 31)
    low = np.where(lens >= 1, r - (np.int64(1) << np.maximum(lens - 1, 0)), 0)
    raw.write(np.where(ok, low, s.astype(np.int64) & 0x7FFFFFFF).astype(_U), widths)
    body = [VALUES_FORMAT, delta, bool(threshold), dist_table.tobytes(),
            zstandard.ZstdCompressor(level=level).compress(tables[1][1].tobytes()),
            ans_encode(segments), raw.getvalue()]
    return msgpack.packb(body, use_bin_type=True)


def _parse(blob: bytes) -> tuple[int, bool, np.ndarray, bytes, bytes, bytes]:
    try:
        body = msgpack.unpackb(blob, raw=False, max_bin_len=len(blob), max_array_len=8, max_map_len=0,
                               max_str_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise PatchError(f"value stream is not valid msgpack ({type(exc).__name__})") from None
    if not (isinstance(body, list) and len(body) == 7 and body[0] == VALUES_FORMAT):
        raise PatchError("unknown value stream format")
    _, delta, thresh, dist, lens, words, raw = body
    if not (isinstance(delta, int) and not isinstance(delta, bool) and 0 <= delta <= MAX_DELTA
            and isinstance(thresh, bool) and all(isinstance(x, bytes) for x in (dist, lens, words, raw))
            and len(dist) == 2 * N_DIST):
        raise PatchError("malformed value stream header")
    return delta, thresh, np.frombuffer(dist, np.uint8).reshape(N_DIST, 2), lens, words, raw


def _decode_segments(dec: AnsDecoder, ctx: np.ndarray, table_of: Callable[[int, int], np.ndarray], n_sym: int
                     ) -> np.ndarray:
    order, present, runs = _groups(ctx)
    out = np.zeros(ctx.size, np.int64)
    for row, (a, b) in enumerate(runs):
        sym = dec.decode(int(b - a), _freqs(table_of(row, int(present[row]))))
        if sym.size and int(sym.max()) >= n_sym:
            raise PatchError("decoded value symbol out of range")
        out[order[a:b]] = sym
    return out


def _rebuild(q: np.ndarray, ewc: np.ndarray, delta: int) -> np.ndarray:
    """Magnitude bits of ``|s| = q * ulp(w) / 2**delta`` (``ewc``: w's exponent field, at least 1)."""
    if q.size and (int(q.max()) >= 1 << 52 or int(ewc.max()) >= 0xFF):
        raise PatchError("decoded value out of range")
    e = ewc - 24 - delta + _bitlen(q)  # biased exponent of the result
    ec = np.maximum(e, 1)
    sh = ewc - delta - ec  # >= 0 unless q needs more than 24 bits
    down = np.clip(-sh, 0, 62)
    if np.any((q & ((np.int64(1) << down) - 1)) != 0):
        raise PatchError("decoded value is not representable in FP32")
    if np.any((q > 0) & (e >= 0xFF)):
        raise PatchError("decoded value overflows FP32")
    ms = np.where(sh >= 0, q << np.clip(sh, 0, 62), q >> down)
    return np.where(q == 0, 0, np.where(e >= 1, (ec << 23) | (ms & 0x7FFFFF), ms))


def decode_values_ctx(blob: bytes, w_bits: np.ndarray) -> np.ndarray:
    """Inverse of ``encode_values_ctx`` for one value per base weight in ``w_bits``."""
    w = np.asarray(w_bits, dtype=np.uint32).reshape(-1)
    if w.size == 0:
        if blob:
            raise PatchError("value data present for zero values")
        return np.zeros(0, np.float32)
    delta, thresh, dist, lens_blob, words, raw_bytes = _parse(blob)
    f = _Fields(w)
    dec = AnsDecoder(words)
    toward = _decode_segments(dec, f.dist_ctx, lambda row, ctx: dist[ctx], 2)
    len_ctx = f.len_ctx(toward)
    n_rows = int(np.unique(len_ctx).size)
    table = bounded_decompress(lens_blob, limit=n_rows * N_LEN, what="value model table")
    if len(table) != n_rows * N_LEN:
        raise PatchError("value model table does not match the base")
    lens_table = np.frombuffer(table, np.uint8).reshape(n_rows, N_LEN)
    lens = _decode_segments(dec, len_ctx, lambda row, ctx: lens_table[row], N_LEN)
    if not dec.is_empty():
        raise PatchError("value stream has trailing entropy-coded data")
    ok = lens != ESC
    reader = BitReader(raw_bytes)
    low = reader.read(np.where(ok, np.maximum(lens - 1, 0), 31))
    if reader.remaining_bytes() > 0:
        raise PatchError("value stream has trailing raw data")
    mag = low & 0x7FFFFFFF  # escaped values: the magnitude bits themselves
    r = np.where(lens >= 1, (np.int64(1) << np.maximum(lens - 1, 0)) + low, 0)[ok]
    mag[ok] = _rebuild(r + f.threshold(toward, delta, thresh)[ok], f.ewc[ok], delta)
    sign = np.where(toward == 1, f.sign_w, 1 - f.sign_w)
    return ((sign << 31) | mag).astype(np.uint32).view(np.float32)
