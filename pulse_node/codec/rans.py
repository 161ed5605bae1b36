"""rANS entropy coder of the patch codec and the PULSELoCo payloads (compiled with numba).

A stack coder after Duda's rANS in the 64-bit-state / 32-bit-word form: state ``x`` in
``[L, L << 32)``, ``L = 2**31``; models are categorical with integer frequencies summing to
``2**PREC``. Symbols are encoded in reverse and decoded forward; a decoder finishes with the
encoder's initial state and no words left, which is how trailing or missing data is caught.

Two states take turns (symbol ``i`` uses state ``i % 2``), so a decoder runs two independent
dependency chains and the CPU overlaps them. Stream: little-endian uint32 words
``[x0 >> 32, x0 & 0xffffffff, x1 >> 32, x1 & 0xffffffff, w_k, ..., w_1]`` (the final states,
then the renormalisation words in the order the decoder needs them).

Models are built deterministically from float or integer frequencies (``quantize``: one
correctly rounded scaling, then integer fix-ups), so every machine derives the same model
from the same table and no quantised table travels on the wire. Decoding is a table lookup
(``slots``: the symbol of each of the ``2**PREC`` slots) and one multiply-add per symbol.

Kernels never raise: a negative word position is a status (``TRUNCATED``, ``BAD_SYMBOL``)
that the caller turns into a typed ``PatchError``. Without numba the same functions run as
plain Python (slow, same format).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.errors import PatchError

#: probability precision: frequencies sum to 2**PREC
PREC = 12
M = 1 << PREC
#: lower bound of the normalised state
L = 1 << 31
#: largest alphabet (slot tables are uint8)
MAX_SYMBOLS = 256

_U64 = np.uint64
TRUNCATED, BAD_SYMBOL = K.TRUNCATED, K.BAD_SYMBOL
_MASK = _U64(M - 1)
_LOW = _U64(L)
_XMAX_UNIT = _U64((L >> PREC) << 32)


@dataclass(frozen=True)
class Model:
    """A quantised categorical model: ``freq``/``cum`` (uint64, ``MAX_SYMBOLS`` long) and ``slots``."""

    n: int
    freq: np.ndarray
    cum: np.ndarray
    slots: np.ndarray


def _build(f: np.ndarray, leaky: float, freq: np.ndarray, cum: np.ndarray, slots: np.ndarray) -> int:
    """Quantise ``f`` to frequencies summing to ``M`` and fill the tables; 0 or -1 (bad table).

    Deterministic everywhere: one left-to-right float64 sum, one correctly rounded division
    per symbol (the scaling by ``M`` is exact), then integer fix-ups: a deficit goes to the
    first largest symbol, an excess (from symbols raised to 1) is taken from the largest.
    """
    n = f.size
    total = 0.0
    for i in range(n):
        if not f[i] >= 0.0:
            return -1
        total += f[i]
    if not (total > 0.0 and total < np.inf):
        return -1
    acc = 0
    best = 0
    for i in range(n):
        k = np.int64(np.floor((f[i] / total) * M))
        if k == 0 and (leaky or f[i] > 0.0):
            k = 1
        freq[i] = k
        acc += k
        if freq[i] > freq[best]:
            best = i
    excess = acc - M
    if excess < 0:
        freq[best] += np.uint64(-excess)
    while excess > 0:
        best = 0
        for i in range(n):
            if freq[i] > freq[best]:
                best = i
        take = min(excess, np.int64(freq[best]) - 1)
        if take <= 0:
            return -1
        freq[best] -= np.uint64(take)
        excess -= take
    c = 0
    for i in range(n):
        cum[i] = c
        for j in range(np.int64(freq[i])):
            slots[c + j] = i
        c += np.int64(freq[i])
    return 0


build_kernel = K.jit_or_python(_build)


def model(freqs: np.ndarray, *, leaky: bool = True) -> Model:
    """The model of a non-negative frequency table, quantised to ``2**PREC`` (see ``_build``).

    ``leaky``: every symbol gets at least 1 (for tables that may miss a symbol the encoder
    meets, e.g. far tails of a parametric model); otherwise zero stays zero.
    """
    f = np.ascontiguousarray(freqs, dtype=np.float64).reshape(-1)
    if f.size == 0 or f.size > MAX_SYMBOLS:
        raise PatchError(f"invalid frequency table ({f.size} symbols, 1..{MAX_SYMBOLS} allowed)")
    freq, cum, slots = np.zeros(MAX_SYMBOLS, np.uint64), np.zeros(MAX_SYMBOLS, np.uint64), np.empty(M, np.uint8)
    if build_kernel(f, leaky, freq, cum, slots) < 0:
        raise PatchError("invalid frequency table (negative, non-finite or no mass)")
    return Model(int(f.size), freq, cum, slots)


def _encode(syms: np.ndarray, rows: np.ndarray, freq: np.ndarray, cum: np.ndarray, n_sym: np.ndarray,
            out: np.ndarray) -> int:
    """Encode ``syms[i]`` with model ``rows[i]`` and state ``i % 2``, last symbol first.

    Returns the number of words written, or BAD_SYMBOL. Both states share one word stack,
    which works because the decoder undoes the operations in exactly the reverse order.
    """
    xs = np.full(2, _LOW, np.uint64)
    k = 0
    for i in range(syms.size - 1, -1, -1):
        m = rows[i]
        sym = syms[i]
        if sym < 0 or sym >= n_sym[m]:
            return BAD_SYMBOL
        f = freq[m, sym]
        if f == 0:
            return BAD_SYMBOL
        x = xs[i & 1]
        if x >= _XMAX_UNIT * f:
            out[k] = np.uint32(x & _U64(0xFFFFFFFF))
            k += 1
            x >>= _U64(32)
        xs[i & 1] = ((x // f) << _U64(PREC)) + (x % f) + cum[m, sym]
    for j in (1, 0):  # the decoder reads state 0 first
        out[k] = np.uint32(xs[j] & _U64(0xFFFFFFFF))
        out[k + 1] = np.uint32(xs[j] >> _U64(32))
        k += 2
    return k


def _renorm(words: np.ndarray, p: int, x: np.uint64) -> tuple[int, np.uint64]:
    """Pull the next word into a state below ``L`` (a rarely taken, well predicted branch:
    a branch-free select measured slower, it lengthens the state's dependency chain).

    ``words`` ends with one sentinel word that is not part of the stream (see ``Decoder``);
    reading past the last real word means the stream is truncated.
    """
    if x < _LOW:
        if p >= words.size - 1 or p < 0:
            return TRUNCATED, x
        x = (x << _U64(32)) | _U64(words[p])
        p += 1
    return p, x


def _step(words: np.ndarray, p: int, x: np.uint64, slots: np.ndarray, freq: np.ndarray,
          cum: np.ndarray) -> tuple[int, int, np.uint64]:
    """One decoded symbol: ``(symbol, p, x)``; ``p`` is TRUNCATED when words ran out."""
    slot = x & _MASK
    s = slots[slot]
    p, x = renorm(words, p, freq[s] * (x >> _U64(PREC)) + slot - cum[s])
    return s, p, x


def _decode(words: np.ndarray, p: int, x0: np.uint64, x1: np.uint64, t: int, count: int, slots: np.ndarray,
            freq: np.ndarray, cum: np.ndarray, out: np.ndarray) -> tuple[int, np.uint64, np.uint64]:
    """Decode ``count`` symbols; the next one uses state ``t``. ``(p, x0, x1)``, a status in ``p``."""
    xa, xb = (x1, x0) if t else (x0, x1)
    for i in range(count):
        s, p, xa = step(words, p, xa, slots, freq, cum)
        if p < 0:
            return p, x0, x1
        out[i] = s
        xa, xb = xb, xa
    return unswap(t, count, xa, xb, p)


def _unswap(t: int, count: int, xa: np.uint64, xb: np.uint64, p: int) -> tuple[int, np.uint64, np.uint64]:
    """``(p, x0, x1)`` from the loop's (next, other) states after ``count`` symbols from parity ``t``."""
    if (t + count) & 1:
        return p, xb, xa
    return p, xa, xb


def _step_row(words: np.ndarray, p: int, x: np.uint64, m: int, slots: np.ndarray, freq: np.ndarray,
              cum: np.ndarray) -> tuple[int, int, np.uint64]:
    """``step`` with model row ``m`` of stacked tables (no per-symbol array views)."""
    slot = x & _MASK
    s = slots[m, slot]
    p, x = renorm(words, p, freq[m, s] * (x >> _U64(PREC)) + slot - cum[m, s])
    return s, p, x


renorm = K.jit_or_python(_renorm, inline=True)
unswap = K.jit_or_python(_unswap, inline=True)
step = K.jit_or_python(_step, inline=True)
step_row = K.jit_or_python(_step_row, inline=True)
encode_kernel = K.jit_or_python(_encode)
decode_kernel = K.jit_or_python(_decode)


@dataclass(frozen=True)
class ModelStack:
    """Models side by side, for kernels that pick a model per symbol (row ``i`` = ``models[i]``)."""

    slots: np.ndarray  # uint8 [k, M]
    freq: np.ndarray  # uint64 [k, MAX_SYMBOLS]
    cum: np.ndarray
    n: np.ndarray  # int64 [k]


def stack(models: list[Model]) -> ModelStack:
    if not models:
        return ModelStack(np.zeros((0, M), np.uint8), np.zeros((0, MAX_SYMBOLS), np.uint64),
                          np.zeros((0, MAX_SYMBOLS), np.uint64), np.zeros(0, np.int64))
    return ModelStack(np.stack([m.slots for m in models]), np.stack([m.freq for m in models]),
                      np.stack([m.cum for m in models]), np.array([m.n for m in models], np.int64))


def encode_rows(syms: np.ndarray, rows: np.ndarray, models: ModelStack) -> bytes:
    """One stream of ``syms[i]`` coded with model row ``rows[i]`` of ``models``."""
    syms = np.ascontiguousarray(syms, dtype=np.int64).reshape(-1)
    if not syms.size:
        return b""
    rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    if rows.size != syms.size or int(rows.min()) < 0 or int(rows.max()) >= models.n.size:
        raise PatchError("model rows do not match the symbols")
    return _encode_rows(syms, rows, models.freq, models.cum, models.n)


def _encode_rows(syms: np.ndarray, rows: np.ndarray, freq: np.ndarray, cum: np.ndarray, n: np.ndarray) -> bytes:
    out = np.empty(syms.size + 4, np.uint32)
    k = encode_kernel(syms, rows, freq, cum, n, out)
    if k < 0:
        raise PatchError("symbol outside its model (encoder bug or corrupt input)")
    return out[:k][::-1].astype("<u4").tobytes()


def encode(segments: list[tuple[np.ndarray, Model]]) -> bytes:
    """One stream of ``[(symbols, model), ...]``, decodable in this order."""
    segments = [(np.ascontiguousarray(s, dtype=np.int64).reshape(-1), m) for s, m in segments]
    segments = [(s, m) for s, m in segments if s.size]
    if not segments:
        return b""
    rows_of: dict[int, int] = {}
    models: list[Model] = []
    for _, m in segments:
        if id(m) not in rows_of:
            rows_of[id(m)] = len(models)
            models.append(m)
    rows = np.repeat(np.array([rows_of[id(m)] for _, m in segments], np.int64), [s.size for s, _ in segments])
    syms = np.concatenate([s for s, _ in segments]) if len(segments) > 1 else segments[0][0]
    return _encode_rows(syms, rows, np.stack([m.freq for m in models]), np.stack([m.cum for m in models]),
                        np.array([m.n for m in models], np.int64))


class Decoder:
    """Decodes the segments of one ``encode`` stream in order (two interleaved states)."""

    def __init__(self, data: bytes) -> None:
        if len(data) % 4:
            raise PatchError("entropy-coded stream has a partial word")
        self._words = np.zeros(len(data) // 4 + 1, np.uint32)  # + the sentinel word (``_renorm``)
        self._words[:-1] = np.frombuffer(data, dtype="<u4")
        self._t = 0
        if self._words.size == 1:
            self._p, self._x0, self._x1 = 0, _LOW, _LOW
            return
        if self._words.size < 5:
            raise PatchError("entropy-coded stream is truncated")
        w = self._words[:4].astype(np.uint64)
        self._p, self._x0, self._x1 = 4, (w[0] << _U64(32)) | w[1], (w[2] << _U64(32)) | w[3]
        if self._x0 < _LOW or self._x1 < _LOW:
            raise PatchError("corrupt entropy-coded stream (bad initial state)")

    def decode(self, count: int, m: Model) -> np.ndarray:
        """The next ``count`` symbols (int64), coded with model ``m``."""
        out = np.empty(count, np.int64)
        if count == 0:
            return out
        p, x0, x1 = self.cursor
        self.advance(count, *decode_kernel(self._words, p, x0, x1, self._t, count, m.slots, m.freq, m.cum, out))
        return out

    @property
    def words(self) -> np.ndarray:
        """The stream's words plus one trailing sentinel (see ``_renorm``)."""
        return self._words

    @property
    def parity(self) -> int:
        """Which state decodes the next symbol."""
        return self._t

    @property
    def cursor(self) -> tuple[int, np.uint64, np.uint64]:
        """Word position and both states, for kernels that decode in place (see ``advance``)."""
        return self._p, self._x0, self._x1

    def advance(self, count: int, p: int, x0: np.uint64 | int, x1: np.uint64 | int) -> None:
        """Take the cursor a kernel returned after ``count`` symbols (negative ``p``: words ran out)."""
        if p < 0:
            raise PatchError("entropy-coded stream is truncated")
        self._p, self._x0, self._x1 = int(p), _U64(x0), _U64(x1)
        self._t = (self._t + count) & 1

    def is_empty(self) -> bool:
        """True when every word was used and both states are back at the start (no trailing data)."""
        return self._p == self._words.size - 1 and self._x0 == _LOW and self._x1 == _LOW
