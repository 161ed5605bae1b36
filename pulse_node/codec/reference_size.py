"""The reference system's patch codec ("v3.1", Covenant's grail): its bytes for the same change.

The trainer's publisher records, per version, how large the reference codec's patch for the
same BF16 change would be, so the dashboard and the swarm summary can show our patch size
against it (not only against a dense BF16 copy). Written from the description in
``shared/reference/PULSE.md`` (not from its source), so details are our reading of it:

- per changed tensor (sorted by name): flat changed indices of the 2-D view (1-D tensors are
  one row; N-D tensors are ``(shape[0], rest)``), in (row, col) order;
- row gaps (difference to the previous change's row) and column gaps (difference to the
  previous column in the same row; the column itself at the first change of a row), each
  array downcast to the smallest unsigned type that fits (uint8 / uint16, else int32);
- values: the raw new BF16 bits (uint16);
- a JSON header with per-tensor dtypes/offsets, then all arrays; everything in one zstd
  level-1 frame.

``bench/ref_codec_v31.py`` holds the matching decoder (the round-trip check of the bench).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import zstandard

from pulse_node.codec.state import State


def _ncols(shape: tuple[int, ...]) -> int:
    """Columns of the 2-D view: 1-D tensors are one row, N-D tensors ``(shape[0], rest)``."""
    if len(shape) <= 1:
        return int(shape[0]) if shape else 1
    return int(np.prod(shape[1:], dtype=np.int64))


def _downcast(a: np.ndarray) -> np.ndarray:
    top = int(a.max()) if a.size else 0
    if top < 1 << 8:
        return a.astype(np.uint8)
    if top < 1 << 16:
        return a.astype(np.uint16)
    return a.astype(np.int32)


def _tensor_arrays(old_bits: np.ndarray, new_bits: np.ndarray, ncols: int) -> list[np.ndarray] | None:
    """Row gaps, column gaps and new values of one tensor's changes; None if it did not change."""
    idx = np.flatnonzero(old_bits != new_bits)  # ascending: already in (row, col) order
    if not idx.size:
        return None
    rows, cols = np.divmod(idx, ncols)
    new_row = np.ones(rows.size, bool)
    new_row[1:] = rows[1:] != rows[:-1]
    col_gap = np.where(new_row, cols, cols - np.concatenate([[0], cols[:-1]]))
    return [_downcast(np.diff(rows, prepend=0)), _downcast(col_gap), new_bits[idx]]


def encode_reference(base: State, new: State) -> bytes:
    """The reference codec's patch ``base -> new`` (both states with the same tensors)."""
    meta: list[dict[str, object]] = []
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(base):
        arrays = _tensor_arrays(base[name].bits, new[name].bits, _ncols(base[name].shape))
        if arrays is None:
            continue
        spans: list[list[str | int]] = []
        entry = {"name": name, "n": int(arrays[2].size), "ncols": _ncols(base[name].shape), "arrays": spans}
        for arr in arrays:
            spans.append([arr.dtype.str, offset, arr.nbytes])
            blobs.append(arr.tobytes())
            offset += arr.nbytes
        meta.append(entry)
    header = json.dumps({"version": "3.1", "tensors": meta}).encode()
    raw = struct.pack("<I", len(header)) + header + b"".join(blobs)
    return zstandard.ZstdCompressor(level=1).compress(raw)


def reference_size(base: State, new: State) -> int:
    """Bytes of the reference codec's patch for the change ``base -> new``."""
    return len(encode_reference(base, new))
