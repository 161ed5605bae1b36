"""The robust rule's compiled distances (loco/clip_kernel.py): the same bits as their Python bodies
and the distances the definition gives."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from pulse_node.loco import clip_kernel as K


def _case(seed: int, numel: int = 3000, n: int = 5) -> tuple:
    rng = np.random.default_rng(seed)
    m = (rng.standard_normal(numel) * 1e-3).astype(np.float32)
    payloads = []
    for _ in range(n):
        idx = np.flatnonzero(rng.random(numel) < rng.uniform(0.05, 0.9)).astype(np.int64)
        payloads.append((idx, (rng.standard_normal(idx.size) * 10.0 ** rng.integers(-7, -2, idx.size)).astype(np.float32)))
    return m, rng.uniform(0, 0.5), rng.uniform(0, 0.3, n), payloads


def _py(f: Callable) -> Callable:
    return getattr(f, "py_func", f)


def _distances(m, c0, b, payloads, *, compiled: bool) -> np.ndarray:
    """``||p_i - v||^2`` the way ``loco/aggregate.py`` calls the kernels (compiled, or their bodies)."""
    f = (lambda g: g) if compiled else _py
    v = np.empty(m.size)
    f(K.centre_start)(m, c0, m.size, v)
    for bi, (idx, vals) in zip(b, payloads):
        assert f(K.centre_add)(idx, vals, float(bi), m.size, v)
    vv = f(K.sum_squares)(v, m.size)
    return np.array([vv + f(K.distance_part)(idx, vals, m.size, v) for idx, vals in payloads])


@pytest.mark.parametrize("seed", range(4))
def test_compiled_kernels_give_their_python_bodies_bit_for_bit(seed: int) -> None:
    m, c0, b, payloads = _case(seed)
    assert _distances(m, c0, b, payloads, compiled=True).tobytes() == \
        _distances(m, c0, b, payloads, compiled=False).tobytes()


def test_distances_are_the_definition() -> None:
    m, c0, b, payloads = _case(9)
    dense = np.zeros((b.size, m.size))
    for i, (idx, vals) in enumerate(payloads):
        dense[i, idx] = vals
    v = c0 * m.astype(np.float64) + b @ dense
    np.testing.assert_allclose(_distances(m, c0, b, payloads, compiled=True), ((dense - v) ** 2).sum(axis=1), rtol=1e-9)


def test_a_position_outside_the_tensor_is_refused() -> None:
    _, _, _, payloads = _case(1, numel=100, n=1)
    idx = payloads[0][0].copy()
    idx[-1] = 100
    v = np.zeros(100)
    assert not K.centre_add(idx, payloads[0][1], 0.5, 100, v)
    assert np.isnan(K.distance_part(idx, payloads[0][1], 100, v))
