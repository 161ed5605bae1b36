"""Re-implementation of the reference system's patch codec "v3.1" (Covenant's grail), for comparison.

Written from the description in shared/reference/PULSE.md (not from its source), so details
are our reading of it:

- per changed tensor: flat changed indices of the 2-D view (1-D tensors are one row; N-D
  tensors are ``(shape[0], rest)``), lexsorted by (row, col);
- row gaps (difference to the previous change's row) and column gaps (difference to the
  previous column in the same row; the column itself at the first change of a row), each
  array downcast to the smallest unsigned type that fits (uint8 / uint16, else int32);
- values: the raw new BF16 bits (uint16);
- a JSON header with per-tensor dtypes/offsets, then all arrays; everything in one zstd
  level-1 frame.

Not part of the package: bench/codec.py uses it to measure bytes per change and speed.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import zstandard

from pulse_node.codec.state import State


def _two_d(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    cols = int(np.prod(shape[1:], dtype=np.int64))
    return shape[0], cols


def _downcast(a: np.ndarray) -> np.ndarray:
    top = int(a.max()) if a.size else 0
    if top < 1 << 8:
        return a.astype(np.uint8)
    if top < 1 << 16:
        return a.astype(np.uint16)
    return a.astype(np.int32)


def encode(base: State, new: State) -> bytes:
    meta, blobs, offset = [], [], 0
    for name in sorted(base):
        old_bits, new_bits = base[name].bits, new[name].bits
        idx = np.flatnonzero(old_bits != new_bits)
        if not idx.size:
            continue
        _, ncols = _two_d(base[name].shape)
        rows, cols = np.divmod(idx, ncols)
        order = np.lexsort((cols, rows))
        rows, cols = rows[order], cols[order]
        row_gap = np.diff(rows, prepend=0)
        new_row = np.ones(rows.size, bool)
        new_row[1:] = rows[1:] != rows[:-1]
        col_gap = np.where(new_row, cols, cols - np.concatenate([[0], cols[:-1]]))
        parts = [_downcast(row_gap), _downcast(col_gap), new_bits[idx[order]]]
        entry = {"name": name, "n": int(idx.size), "ncols": ncols, "arrays": []}
        for arr in parts:
            entry["arrays"].append([arr.dtype.str, offset, arr.nbytes])
            blobs.append(arr.tobytes())
            offset += arr.nbytes
        meta.append(entry)
    header = json.dumps({"version": "3.1", "tensors": meta}).encode()
    raw = struct.pack("<I", len(header)) + header + b"".join(blobs)
    return zstandard.ZstdCompressor(level=1).compress(raw)


def decode_apply(base: State, patch: bytes) -> dict[str, np.ndarray]:
    """New bit arrays of the changed tensors (copies of the base arrays, patched)."""
    raw = zstandard.ZstdDecompressor().decompress(patch)
    (hlen,) = struct.unpack_from("<I", raw, 0)
    header = json.loads(raw[4:4 + hlen])
    data = memoryview(raw)[4 + hlen:]
    out = {}
    for entry in header["tensors"]:
        arrays = [np.frombuffer(data[o:o + n], dtype=np.dtype(dt)).astype(np.int64) for dt, o, n in entry["arrays"]]
        row_gap, col_gap, values = arrays
        rows = np.cumsum(row_gap)
        new_row = np.ones(rows.size, bool)
        new_row[1:] = rows[1:] != rows[:-1]
        # columns restart at every new row: cumulative sum within runs of equal rows
        seg_start = np.maximum.accumulate(np.where(new_row, np.arange(rows.size), 0))
        csum = np.cumsum(col_gap)
        cols = csum - csum[seg_start] + col_gap[seg_start]
        bits = base[entry["name"]].bits.copy()
        bits[rows * entry["ncols"] + cols] = values.astype(bits.dtype)
        out[entry["name"]] = bits
    return out
