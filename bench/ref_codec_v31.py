"""The reference system's patch codec "v3.1" (Covenant's grail), for comparison: encoder and decoder.

The encoder lives in the package (``pulse_node/codec/reference_size.py``: the trainer records
the reference codec's size of every version it publishes); this module adds the decoder, which
only the benchmarks need (bench/codec.py measures bytes per change, speed and the round trip).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import zstandard

from pulse_node.codec.reference_size import encode_reference as encode  # noqa: F401 (bench/codec.py uses it)
from pulse_node.codec.state import State


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
