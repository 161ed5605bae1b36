"""Hypothesis strategies for codec tests: states with special values and realistic updates."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from pulse_node.codec.state import DTYPES, State, TensorBits

SPECIALS = {
    "BF16": [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x0001, 0x8001, 0x7F7F],
    "F16": [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF, 0x0001, 0x8001, 0x7BFF],
    "F32": [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 1, 0x80000001],
}
SHAPES = [(), (0,), (3, 0), (1,), (7,), (5, 3), (2, 3, 4), (300,), (40, 33)]


def realistic_bits(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Weights ~ N(0, 0.02) with a log-normal spread, as raw bits of ``dtype``."""
    w = rng.normal(0, 0.02, n) * np.exp(rng.normal(0, 1.0, n))
    if dtype == "F32":
        return w.astype(np.float32).view(np.uint32)
    if dtype == "F16":
        return w.astype(np.float16).view(np.uint16)
    return (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def mutate(dtype: str, bits: np.ndarray, density: float, rng: np.random.Generator) -> np.ndarray:
    """Change about ``density`` of the elements: small ulp steps, random bits and special values."""
    new = bits.copy()
    mask = rng.random(bits.size) < density
    idx = np.flatnonzero(mask)
    kind = rng.integers(0, 3, idx.size)
    step = rng.integers(1, 4, idx.size) * rng.choice([-1, 1], idx.size)
    new[idx[kind == 0]] = (bits[idx[kind == 0]].astype(np.int64) + step[kind == 0]).astype(bits.dtype)
    new[idx[kind == 1]] = rng.integers(0, np.iinfo(bits.dtype).max, int((kind == 1).sum()),
                                       dtype=np.uint64, endpoint=True).astype(bits.dtype)
    sp = np.array(SPECIALS[dtype], dtype=bits.dtype)
    new[idx[kind == 2]] = rng.choice(sp, int((kind == 2).sum()))
    return new


@st.composite
def state_pairs(draw, max_tensors: int = 4) -> tuple[State, State]:
    """(base, new) with equal layouts; mixed dtypes, shapes (0-d, empty), specials, densities 0..1."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n_tensors = draw(st.integers(1, max_tensors))
    base: State = {}
    new: State = {}
    for i in range(n_tensors):
        dtype = draw(st.sampled_from(["BF16", "F16", "F32"]))
        shape = draw(st.sampled_from(SHAPES))
        n = int(np.prod(shape, dtype=np.int64))
        bits = realistic_bits(dtype, n, rng)
        if n and draw(st.booleans()):
            sp = np.array(SPECIALS[dtype], dtype=DTYPES[dtype])
            bits[rng.random(n) < 0.2] = rng.choice(sp)
        density = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]))
        base[f"t{i}"] = TensorBits(dtype, shape, bits)
        new[f"t{i}"] = TensorBits(dtype, shape, mutate(dtype, bits, density, rng))
    return base, new


def mixed_pair(seed: int = 0, density: float = 0.05, *, tensors: int = 4) -> tuple[State, State]:
    """``tensors`` BF16 [64, 50] tensors and one F32 [300], realistic bits, ``density`` of them changed."""
    rng = np.random.default_rng(seed)
    base = {f"w{i}": TensorBits("BF16", (64, 50), realistic_bits("BF16", 3200, rng)) for i in range(tensors)}
    base["f"] = TensorBits("F32", (300,), realistic_bits("F32", 300, rng))
    new = {k: TensorBits(t.dtype, t.shape, mutate(t.dtype, t.bits, density, rng)) for k, t in base.items()}
    return base, new


def copy_state(state: State) -> State:
    return {k: t.copy() for k, t in state.items()}


def states_equal(a: State, b: State) -> bool:
    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k].bits, b[k].bits) for k in a)


def realistic_pair(numel: int = 20000, seed: int = 0) -> tuple[State, State]:
    """A larger BF16 pair whose changes concentrate on small weights (exercises the context model)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, numel) * np.exp(rng.normal(0, 1.0, numel))
    step = 5e-6 * rng.choice([-1.0, 1.0], numel)
    base = (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    upd = ((w + step).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = {"w": TensorBits("BF16", (numel // 100, 100), base), "bias": TensorBits("F32", (4,), np.arange(4, dtype=np.uint32))}
    n = {"w": TensorBits("BF16", (numel // 100, 100), upd), "bias": TensorBits("F32", (4,), np.arange(4, dtype=np.uint32))}
    return b, n
