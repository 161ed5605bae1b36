"""The robust rule's inner loop: every payload's squared distance from the centre, one tensor at a time.

``loco/aggregate.py`` weighs a round's payloads by their distances from a centre
``v = c0 * m + sum_i b_i * p_i`` (``m`` the outer momentum, ``p_i`` sparse payloads). As NumPy
passes that is a dozen small calls per tensor and payload (52 tensors x 6 payloads x 2 iterations
on the tiny model: ~35 ms a round, most of it call overhead); compiled it is one call per tensor
and iteration, each one sweep over the tensor and one over each payload's entries.

Determinism: every trainer must get the same distances bit for bit. The loops below use only
float64 ``+``, ``-`` and ``*`` in a fixed sequential order (no reductions a compiler may reorder:
numba compiles without ``fastmath``, so LLVM neither reassociates nor fuses a multiply and an add),
so the compiled kernel and its pure-Python body (``squared_distances.py_func``, the fallback
without numba) give the same bits (tests/test_loco_clip_kernel.py).
"""

from __future__ import annotations

import numpy as np

from pulse_node.codec.kernels import jit_or_python

#: status of a payload position outside its tensor (the caller raises)
OUT_OF_RANGE = -1


def _squared_distances(m: np.ndarray, c0: float, b: np.ndarray, pos: np.ndarray, vals: np.ndarray,
                       seg: np.ndarray, numel: int, v: np.ndarray, out: np.ndarray) -> int:
    """``out[i] = ||p_i - v||^2`` over one tensor of ``numel`` entries, where payload ``i``'s
    entries are ``pos[seg[i]:seg[i + 1]]`` (unique, in ``[0, numel)``) with FP32 values ``vals``
    and ``v = c0 * m + sum_i b[i] * p_i`` (``m`` FP32, empty for 0) is built in ``v`` (float64
    scratch of at least ``numel``). Returns 0, or ``OUT_OF_RANGE`` (``out`` then undefined)."""
    n = b.size
    if m.size:
        for j in range(numel):
            v[j] = np.float64(m[j]) * c0
    else:
        for j in range(numel):
            v[j] = 0.0
    for i in range(n):
        bi = b[i]
        if bi != 0.0:
            for k in range(seg[i], seg[i + 1]):
                at = pos[k]
                if at < 0 or at >= numel:
                    return OUT_OF_RANGE
                v[at] += np.float64(vals[k]) * bi
    vv = 0.0
    for j in range(numel):
        vv += v[j] * v[j]
    for i in range(n):
        s = 0.0
        for k in range(seg[i], seg[i + 1]):
            at = pos[k]
            if at < 0 or at >= numel:
                return OUT_OF_RANGE
            x = v[at]
            d = np.float64(vals[k]) - x
            s += d * d - x * x  # ||p - v||^2 = ||v||^2 + sum over p's entries of (p - v)^2 - v^2
        out[i] = vv + s
    return 0


squared_distances = jit_or_python(_squared_distances)


def warm() -> None:
    """Compile (or load from numba's cache) the kernel for the types the rule passes."""
    f32, i64 = np.zeros(2, np.float32), np.arange(2, dtype=np.int64)
    squared_distances(f32, 0.5, np.ones(1), i64, f32, np.array([0, 2], np.int64), 2, np.zeros(2), np.zeros(1))
