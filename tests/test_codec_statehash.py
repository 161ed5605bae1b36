"""State hash: canonical (order-free) and sensitive to every bit, name, dtype and shape."""

from __future__ import annotations

import numpy as np
import pytest

from pulse_node.codec.state import TensorBits
from pulse_node.codec.statehash import flat_state_hash, is_hex_digest, state_hash


def _state():
    return {"a": TensorBits("BF16", (2, 2), np.array([0, 0x8000, 1, 2], np.uint16)),
            "b": TensorBits("F32", (), np.array([7], np.uint32)),
            "c": TensorBits("F16", (0,), np.zeros(0, np.uint16))}


def test_hash_is_canonical_and_sensitive():
    s = _state()
    h = state_hash(s)
    assert is_hex_digest(h)
    assert state_hash(dict(reversed(list(s.items())))) == h
    flipped = dict(s, a=TensorBits("BF16", (2, 2), np.array([0x8000, 0x8000, 1, 2], np.uint16)))
    reshaped = dict(s, a=TensorBits("BF16", (4,), s["a"].bits))
    retyped = dict(s, a=TensorBits("F16", (2, 2), s["a"].bits))
    renamed = {"x": s["a"], "b": s["b"], "c": s["c"]}
    strided = dict(s, a=TensorBits("BF16", (2, 2), np.array([0, 9, 0x8000, 9, 1, 9, 2, 9], np.uint16)[::2]))
    assert len({h, state_hash(flipped), state_hash(reshaped), state_hash(retyped), state_hash(renamed)}) == 5
    assert state_hash(strided) == h


def test_a_flat_state_hashes_as_the_state_of_its_slices():
    shapes = {"b": (3,), "a": (2, 2), "e": (0,)}
    flat = np.arange(7, dtype=np.uint16)  # sorted names: a = [0:4], b = [4:7], e empty
    state = {"a": TensorBits("BF16", (2, 2), flat[:4]), "b": TensorBits("BF16", (3,), flat[4:]),
             "e": TensorBits("BF16", (0,), flat[7:])}
    assert flat_state_hash("BF16", shapes, flat) == state_hash(state)
    assert flat_state_hash("BF16", shapes, flat[::-1].copy()) != state_hash(state)
    with pytest.raises(ValueError):
        flat_state_hash("BF16", shapes, flat[:6])
