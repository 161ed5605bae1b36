"""The robust rule's inner loops: every payload's squared distance from the centre, one tensor at a time.

``loco/aggregate.py`` weighs a round's payloads by their distances from a centre
``v = c0 * m + sum_i b_i * p_i`` (``m`` the outer momentum, ``p_i`` sparse payloads). As NumPy
passes that is a dozen small calls and temporaries per tensor and payload (52 tensors x 6
payloads x 2 iterations on the tiny model: ~20 ms a round, most of it call overhead); compiled,
a tensor takes one sweep to start the centre, one pass over each payload's entries to move it,
one sweep for its norm and one pass over each payload's entries for the distances, reading the
payloads' own arrays (no copy of them) and a float64 scratch of the largest tensor (as before).

Determinism: every trainer must get the same distances bit for bit. The loops use only float64
``+``, ``-`` and ``*`` in a fixed sequential order (no reductions a compiler may reorder: numba
compiles without ``fastmath``, so LLVM neither reassociates nor fuses a multiply and an add), so
each compiled kernel and its pure-Python body (``.py_func``, the fallback without numba) give the
same bits (tests/test_loco_clip_kernel.py).
"""

from __future__ import annotations

import numpy as np

from pulse_node.codec.kernels import jit_or_python


def _centre_start(m: np.ndarray, c0: float, numel: int, v: np.ndarray) -> None:
    """``v[:numel] = c0 * m`` in float64 (``m`` FP32; empty: 0)."""
    if m.size:
        for j in range(numel):
            v[j] = np.float64(m[j]) * c0
    else:
        for j in range(numel):
            v[j] = 0.0


def _centre_add(pos: np.ndarray, vals: np.ndarray, b: float, numel: int, v: np.ndarray) -> bool:
    """``v[pos] += b * vals`` (positions unique); False for a position outside the tensor (the
    caller raises; ``v`` is then undefined)."""
    for k in range(pos.size):
        at = pos[k]
        if at < 0 or at >= numel:
            return False
        v[at] += np.float64(vals[k]) * b
    return True


def _sum_squares(v: np.ndarray, numel: int) -> float:
    """``sum(v[:numel] ** 2)``, sequentially."""
    vv = 0.0
    for j in range(numel):
        vv += v[j] * v[j]
    return vv


def _distance_part(pos: np.ndarray, vals: np.ndarray, numel: int, v: np.ndarray) -> float:
    """``||p - v||^2 - ||v||^2`` over one tensor, ``p`` the payload's entries (``pos``, FP32
    ``vals``): the sum over its entries of ``(p - v)^2 - v^2``; NaN for a position outside the
    tensor (the caller raises)."""
    s = 0.0
    for k in range(pos.size):
        at = pos[k]
        if at < 0 or at >= numel:
            return np.nan
        x = v[at]
        d = np.float64(vals[k]) - x
        s += d * d - x * x
    return s


centre_start = jit_or_python(_centre_start)
centre_add = jit_or_python(_centre_add)
sum_squares = jit_or_python(_sum_squares)
distance_part = jit_or_python(_distance_part)


def warm() -> None:
    """Compile (or load from numba's cache) the kernels for the types the rule passes."""
    f32, i64, f64 = np.zeros(2, np.float32), np.arange(2, dtype=np.int64), np.zeros(2)
    centre_start(f32, 0.5, 2, f64)
    centre_add(i64, f32, 0.5, 2, f64)
    sum_squares(f64, 2)
    distance_part(i64, f32, 2, f64)
