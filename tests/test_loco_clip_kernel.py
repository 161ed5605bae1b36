"""The robust rule's compiled distances (loco/clip_kernel.py): the same bits as its Python body and
the distances the definition gives."""

from __future__ import annotations

import numpy as np
import pytest

from pulse_node.loco.clip_kernel import OUT_OF_RANGE, squared_distances


def _case(seed: int, numel: int = 3000, n: int = 5) -> tuple:
    rng = np.random.default_rng(seed)
    m = (rng.standard_normal(numel) * 1e-3).astype(np.float32)
    pos, vals, seg = [], [], [0]
    for _ in range(n):
        idx = np.flatnonzero(rng.random(numel) < rng.uniform(0.05, 0.9)).astype(np.int64)
        pos.append(idx)
        vals.append((rng.standard_normal(idx.size) * 10.0 ** rng.integers(-7, -2, idx.size)).astype(np.float32))
        seg.append(seg[-1] + idx.size)
    return m, rng.uniform(0, 0.5), rng.uniform(0, 0.3, n), np.concatenate(pos), np.concatenate(vals), np.array(seg)


@pytest.mark.parametrize("seed", range(4))
def test_compiled_kernel_gives_its_python_body_bit_for_bit(seed: int) -> None:
    m, c0, b, pos, vals, seg = _case(seed)
    outs = []
    for f in (squared_distances, getattr(squared_distances, "py_func", squared_distances)):
        out = np.zeros(b.size)
        assert f(m, c0, b, pos, vals, seg, m.size, np.empty(m.size), out) == 0
        outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()


def test_distances_are_the_definition() -> None:
    m, c0, b, pos, vals, seg = _case(9)
    out = np.zeros(b.size)
    squared_distances(m, c0, b, pos, vals, seg, m.size, np.empty(m.size), out)
    dense = np.zeros((b.size, m.size))
    for i in range(b.size):
        dense[i, pos[seg[i]:seg[i + 1]]] = vals[seg[i]:seg[i + 1]]
    v = c0 * m.astype(np.float64) + b @ dense
    want = ((dense - v) ** 2).sum(axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-9)


def test_a_position_outside_the_tensor_is_refused() -> None:
    m, c0, b, pos, vals, seg = _case(1, numel=100, n=2)
    pos = pos.copy()
    pos[-1] = 100
    assert squared_distances(m, c0, b, pos, vals, seg, 100, np.empty(100), np.zeros(2)) == OUT_OF_RANGE
