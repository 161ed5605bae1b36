"""The reference codec (grail v3.1) the publisher measures against: its patch is exact (decoded by
the bench's decoder back to the new bits) and its size is what the publisher records."""

from __future__ import annotations

import numpy as np

from bench.ref_codec_v31 import decode_apply
from pulse_node.codec.reference_size import encode_reference, reference_size
from pulse_node.codec.state import TensorBits


def _state(rng: np.random.Generator) -> dict[str, TensorBits]:
    shapes = {"emb": (300, 64), "norm": (64,), "conv": (8, 4, 70), "scalar": ()}
    return {k: TensorBits("BF16", s, rng.integers(0, 1 << 16, int(np.prod(s, dtype=np.int64)), dtype=np.uint16))
            for k, s in shapes.items()}


def test_reference_patch_is_exact_and_its_size_is_recorded() -> None:
    rng = np.random.default_rng(0)
    base = _state(rng)
    new = {}
    for name, t in base.items():
        bits = t.bits.copy()
        hit = rng.random(bits.size) < 0.01
        bits[hit] ^= 1  # one ulp-ish change on 1% of the entries
        new[name] = TensorBits("BF16", t.shape, bits)
    patch = encode_reference(base, new)
    decoded = decode_apply(base, patch)
    for name in base:
        want = new[name].bits
        got = decoded.get(name, base[name].bits)
        assert np.array_equal(got, want), name
    changed = sum(int((base[k].bits != new[k].bits).sum()) for k in base)
    assert reference_size(base, new) == len(patch) and len(patch) < 6 * changed  # below idx32 + bf16
    assert decode_apply(base, encode_reference(base, base)) == {}
