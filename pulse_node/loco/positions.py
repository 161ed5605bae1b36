"""Fallback position coder: sorted flat indices -> gap varints (LEB128) -> one zstd frame.

Same signatures as ``pulse_node.codec.positions`` so ``payload`` can use either; ``payload``
prefers the shared codec when it is importable (see ``payload.POSITION_CODER``). Torch-free.
Decoding is hostile-input safe: the zstd frame must declare its size, which is capped before
any allocation, and every decoded index is range- and order-checked.
"""

from __future__ import annotations

import numpy as np
import zstandard

from pulse_node.errors import WireError

_MAX_VARINT_BYTES = 10  # 64-bit values


def bounded_decompress(blob: bytes, *, limit: int, what: str) -> bytes:
    """Decompress one zstd frame whose declared size is at most ``limit`` bytes."""
    if not blob:
        return b""
    try:
        size = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as exc:
        raise WireError(f"{what}: not a zstd frame ({exc})") from None
    if size < 0:
        raise WireError(f"{what}: zstd frame does not declare its size")
    if size > limit:
        raise WireError(f"{what}: declares {size} bytes, more than the cap {limit}")
    try:
        out = zstandard.ZstdDecompressor().decompress(blob, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise WireError(f"{what}: corrupt zstd frame ({exc})") from None
    if len(out) != size:
        raise WireError(f"{what}: frame size {len(out)} != declared {size}")
    return out


def varint_encode(values: np.ndarray) -> bytes:
    """LEB128 bytes of non-negative integers (vectorized)."""
    v = np.ascontiguousarray(values, dtype=np.uint64)
    if v.size == 0:
        return b""
    nbytes = np.ones(v.size, dtype=np.int64)
    for k in range(1, _MAX_VARINT_BYTES):
        nbytes += v >= np.uint64(1 << (7 * k)) if 7 * k < 64 else 0
    starts = np.cumsum(nbytes) - nbytes
    out = np.empty(int(nbytes.sum()), dtype=np.uint8)
    for k in range(int(nbytes.max())):
        sel = nbytes > k
        chunk = (v[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = np.where(nbytes[sel] > k + 1, 0x80, 0).astype(np.uint64)
        out[starts[sel] + k] = (chunk | more).astype(np.uint8)
    return out.tobytes()


def varint_decode(data: bytes, *, max_count: int, max_bytes_each: int = _MAX_VARINT_BYTES) -> np.ndarray:
    """Inverse of ``varint_encode``; refuses truncation, overlong codes and too many values."""
    b = np.frombuffer(data, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size == 0 or ends[-1] != b.size - 1:
        raise WireError("positions: truncated varint stream")
    if ends.size > max_count:
        raise WireError(f"positions: {ends.size} values, more than the cap {max_count}")
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if int(lengths.max()) > max_bytes_each:
        raise WireError("positions: overlong varint")
    out = np.zeros(ends.size, dtype=np.uint64)
    for k in range(int(lengths.max())):
        sel = lengths > k
        out[sel] |= (b[starts[sel] + k].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * k)
    return out


def encode_positions(idx: np.ndarray, numel: int, *, context: object = None) -> bytes:
    """Strictly increasing flat indices in ``[0, numel)`` -> bytes (empty for no indices)."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return b""
    if idx[0] < 0 or idx[-1] >= numel or (idx.size > 1 and np.any(np.diff(idx) <= 0)):
        raise ValueError("positions must be strictly increasing and inside [0, numel)")
    gaps = np.empty(idx.size, dtype=np.int64)
    gaps[0] = idx[0]
    gaps[1:] = idx[1:] - idx[:-1] - 1
    return zstandard.ZstdCompressor(level=3).compress(varint_encode(gaps.astype(np.uint64)))


def decode_positions(data: bytes, numel: int, *, context: object = None, max_count: int) -> np.ndarray:
    """Bytes -> int64 indices; raises ``WireError`` on anything malformed or out of range."""
    if not data:
        return np.zeros(0, dtype=np.int64)
    max_count = min(max_count, numel)
    raw = bounded_decompress(data, limit=max_count * _MAX_VARINT_BYTES, what="positions")
    gaps = varint_decode(raw, max_count=max_count)
    if gaps.size and (int(gaps.max()) >= numel
                      or float(gaps.sum(dtype=np.float64)) + gaps.size > numel + 1):
        raise WireError(f"positions: gaps run past a tensor of {numel} elements")
    idx = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if idx[-1] >= numel:
        raise WireError(f"positions: index {int(idx[-1])} outside a tensor of {numel} elements")
    return idx
