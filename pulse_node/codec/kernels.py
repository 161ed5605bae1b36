"""Compiled inner loops of the patch codec (numba, GIL released, cached on disk).

The codec's per-element work (raw bit fields, gap bins, label grouping, ulp deltas) is a
handful of short scalar loops; as numpy passes each costs several full array sweeps and
temporaries, compiled they are one sweep each. Every kernel has a vectorized numpy twin in
``entropy`` / ``values`` that defines the same format: the twins are the test oracle
(tests/test_codec_kernels.py) and the fallback when numba is not importable (``AVAILABLE``).
Compiling them all ahead of the first patch, and dropping compiled kernels whose sources
changed, is ``codec/warmup.py``'s job.

Kernels never raise: they return a negative status that the caller turns into a typed
``PatchError``. Element kinds for the order-preserving key: ``FLOAT`` (sign-magnitude),
``SIGNED`` (two's complement), ``UNSIGNED``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

try:  # numba is a declared dependency; the numpy twins keep the codec working without it
    from numba import njit

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only on platforms without numba wheels
    AVAILABLE = False

FLOAT, SIGNED, UNSIGNED = 0, 1, 2
#: kernel status codes
TRUNCATED, BAD_SYMBOL = -1, -2

F = TypeVar("F", bound=Callable[..., Any])


def jit_or_python(fn: F, *, inline: bool = False) -> F:
    """``fn`` compiled, or ``fn`` itself without numba (for kernels with no vectorized twin)."""
    if not AVAILABLE:
        return fn
    # a numba dispatcher is called with the arguments of the function it compiled
    return cast(F, njit(cache=True, nogil=True, inline="always" if inline else "never")(fn))


_jit = jit_or_python  # the kernels below: without numba, callers take their numpy twins (``AVAILABLE``)

#: how many changes ahead a sparse write into a large array asks for its cache line
PREFETCH_AHEAD = 32


def _prefetch_write_python(arr: np.ndarray, i: int) -> None:
    """Without numba there is nothing to prefetch for."""


def _prefetch_write_intrinsic() -> Any:
    """``prefetch_write(arr, i)`` for compiled kernels: ask for ``arr[i]``'s cache line for writing.

    A sparse write into a multi-GB array (1 change in ~40 entries: a live FP32 model) misses
    the cache at every store, and stores retire in order, so the loop waits on each line in
    turn. Asking ``PREFETCH_AHEAD`` changes early overlaps those misses. Measured on the shared
    2-core box over a 1 B model's version (26.6 M changes, one thread, bench/RESULTS.md "Live
    sync at 1 B: lines asked for ahead"): the value kernel 24.5 -> 16 ns per change, 35-37 ->
    28 ns with a CPU live model written in the same pass; ``scatter_shifted`` 12.7-15.8 -> 10.3.
    A prefetch never faults, whatever the address."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def prefetch_write(typingctx: Any, arr: Any, i: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            aryty, indty = signature.args
            ary = context.make_array(aryty)(context, builder, args[0])
            at = context.cast(builder, args[1], indty, types.intp)  # uint32 positions past 2**31 stay positive
            ptr = cgutils.get_item_pointer(  # type: ignore[no-untyped-call]
                context, builder, aryty, ary, [at], wraparound=False, boundscheck=False)
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            signature_ir = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])  # address, write, locality, data
            fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
                builder.module, signature_ir, "llvm.prefetch.p0i8")
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(arr, i), codegen

    return prefetch_write


prefetch_write = _prefetch_write_intrinsic() if AVAILABLE else _prefetch_write_python


def _take_bits(buf: np.ndarray, pos: int, w: int) -> int:
    """The ``w``-bit LSB-first field at bit ``pos`` (the caller checked the bounds)."""
    v = 0
    got = 0
    while got < w:
        off = (pos + got) & 7
        take = min(8 - off, w - got)
        v |= ((np.int64(buf[(pos + got) >> 3]) >> off) & ((1 << take) - 1)) << got
        got += take
    return v


def _read_fields(buf: np.ndarray, pos: int, nbits: int, widths: np.ndarray, out: np.ndarray) -> int:
    """Read ``widths[i]``-bit LSB-first fields from bit ``pos``; new position or TRUNCATED."""
    for i in range(widths.size):
        w = widths[i]
        if pos + w > nbits:
            return TRUNCATED
        out[i] = _take_bits(buf, pos, w)
        pos += w
    return pos


def _write_fields(values: np.ndarray, widths: np.ndarray, out: np.ndarray) -> int:
    """OR the fields into the zeroed byte buffer ``out`` back to back; bits written."""
    pos = 0
    for i in range(values.size):
        w = widths[i]
        v = values[i]
        while w > 0:
            off = pos & 7
            take = min(8 - off, w)
            out[pos >> 3] |= np.uint8((v & ((1 << take) - 1)) << off)
            v >>= take
            w -= take
            pos += take
    return pos


def _bin_values(values: np.ndarray, sym: np.ndarray, nextra: np.ndarray, extra: np.ndarray) -> None:
    """Gap bins of non-negative values: exact below 16, then 4 bins per octave."""
    for i in range(values.size):
        x = values[i]
        if x < 16:
            sym[i] = x
            nextra[i] = 0
            extra[i] = 0
            continue
        blen = 0
        t = x
        while t:
            t >>= 1
            blen += 1
        ne = blen - 3
        sym[i] = 16 + (ne - 2) * 4 + ((x >> ne) & 3)
        nextra[i] = ne
        extra[i] = x & ((1 << ne) - 1)


def _label_order(labels: np.ndarray, order: np.ndarray, counts: np.ndarray) -> None:
    """Stable counting sort of uint8 labels: ``order`` and per-label ``counts`` (256)."""
    for i in range(labels.size):
        counts[labels[i]] += 1
    starts = np.zeros(256, np.int64)
    acc = 0
    for k in range(256):
        starts[k] = acc
        acc += counts[k]
    for i in range(labels.size):
        label = labels[i]
        order[starts[label]] = i
        starts[label] += 1


def _key(b: int, kind: int, sign: int, mask: int) -> int:
    """Order-preserving key of raw bits ``b`` (branch-free: weight signs are random)."""
    if kind == 0:  # negative: all bits flipped; positive: sign bit set
        return b ^ (sign | (-((b & sign) != 0) & mask))
    if kind == 1:
        return b ^ sign
    return b


def _unkey(k: int, kind: int, sign: int, mask: int) -> int:
    """Inverse of ``_key`` (branch-free)."""
    if kind == 0:
        return k ^ (sign | (-((k & sign) == 0) & mask))
    if kind == 1:
        return k ^ sign
    return k


def _delta_zig(old: np.ndarray, new: np.ndarray, kind: int, width: int, out: np.ndarray) -> None:
    """``zigzag(key(new) - key(old) mod 2**width) - 1`` of changed elements (all >= 0)."""
    mask = (1 << width) - 1
    sign = 1 << (width - 1)
    for i in range(old.size):
        ko = _key(np.int64(old[i]), kind, sign, mask)
        kn = _key(np.int64(new[i]), kind, sign, mask)
        d = (kn - ko) & mask
        if d >= sign:
            d -= 1 << width
        out[i] = 2 * d - 1 if d >= 0 else -2 * d - 2


def _count_below(bits: np.ndarray, limit: int, magnitude_mask: int) -> int:
    """How many elements have magnitude (bits without the sign) below ``limit``."""
    n = 0
    for i in range(bits.size):
        if (np.int64(bits[i]) & magnitude_mask) < limit:
            n += 1
    return n


def _members_below(bits: np.ndarray, limit: int, magnitude_mask: int, mant: int, members: np.ndarray,
                   labels: np.ndarray) -> int:
    """Indices and exponent fields of the elements with magnitude below ``limit``.

    Branch-free compaction (members are sparse and scattered, a branch mispredicts): every
    element is written at slot ``k`` and ``k`` advances only for members, so ``members`` and
    ``labels`` need one spare slot beyond the member count.
    """
    k = 0
    for i in range(bits.size):
        m = np.int64(bits[i]) & magnitude_mask
        members[k] = i
        labels[k] = m >> mant
        k += m < limit
    return k


def _background_positions(ranks: np.ndarray, members: np.ndarray, out: np.ndarray) -> None:
    """Absolute positions of background ranks (both sorted): skip the members before each."""
    j = 0
    for i in range(ranks.size):
        r = ranks[i]
        while j < members.size and members[j] - j <= r:
            j += 1
        out[i] = r + j


def _locate(members: np.ndarray, idx: np.ndarray, hit: np.ndarray, before: np.ndarray) -> None:
    """For sorted ``idx``: members strictly before each index, and whether it is a member."""
    j = 0
    for i in range(idx.size):
        x = idx[i]
        while j < members.size and members[j] < x:
            j += 1
        before[i] = j
        hit[i] = j < members.size and members[j] == x


def _differ(have: np.ndarray, want: np.ndarray, shift: int, lo: int, out: np.ndarray) -> int:
    """Positions ``lo + i`` where ``have[i] >> shift != want[i]``, written to ``out``; how many.

    A branch, unlike ``_members_below``: differences are rare (a few %), so it predicts well and
    saves writing a position per element."""
    k = 0
    for i in range(have.size):
        if (np.int64(have[i]) >> shift) != np.int64(want[i]):
            out[k] = lo + i
            k += 1
    return k


def _scatter_shifted(dst: np.ndarray, idx: np.ndarray, bits: np.ndarray, shift: int) -> None:
    """``dst[idx[i]] = bits[i] << shift``: stored bits into a (wider) parameter's words in one
    pass, without the upcast temporary and the int64 positions numpy's fancy assignment makes."""
    n = idx.size
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_write(dst, idx[i + PREFETCH_AHEAD])
        dst[idx[i]] = np.int64(bits[i]) << shift


_take_bits = jit_or_python(_take_bits, inline=True)
_key = jit_or_python(_key, inline=True)
_unkey = jit_or_python(_unkey, inline=True)
key, unkey = _key, _unkey
read_fields = _jit(_read_fields)
write_fields = _jit(_write_fields)
bin_values = _jit(_bin_values)
label_order = _jit(_label_order)
delta_zig = _jit(_delta_zig)
count_below = _jit(_count_below)
members_below = _jit(_members_below)
background_positions = _jit(_background_positions)
locate = _jit(_locate)
differ = _jit(_differ)
scatter_shifted = _jit(_scatter_shifted)
