"""Property tests: patches round-trip bit-exactly in both modes and never touch the base."""

from __future__ import annotations

import numpy as np
import pytest
from codec_strategies import copy_state, realistic_pair, state_pairs, states_equal
from hypothesis import HealthCheck, given, settings

from pulse_node.codec.patch import apply_patch, changed_positions, make_patch, patch_stats, read_header
from pulse_node.codec.state import TensorBits
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import BaseMismatchError, PatchError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(state_pairs())
def test_round_trip_both_modes(pair):
    base, new = pair
    snapshot = copy_state(base)
    for mode in ("compact", "overwrite"):
        patch = make_patch(base, new, mode=mode)
        out = apply_patch(base, patch)
        assert states_equal(out, new)
        assert states_equal(base, snapshot)
        header = read_header(patch)
        assert header.mode == mode
        assert header.base_state_hash == state_hash(base) and header.result_state_hash == state_hash(new)
        expect = {k: np.flatnonzero(base[k].bits != new[k].bits) for k in base}
        got = changed_positions(patch, base)
        assert set(got) == {k for k, v in expect.items() if v.size}
        assert all(np.array_equal(got[k], expect[k]) for k in got)
        assert patch_stats(patch).changed == sum(v.size for v in expect.values())


def test_unchanged_tensors_are_shared_and_changed_ones_are_new():
    base, new = realistic_pair()
    patch = make_patch(base, new)
    out = apply_patch(base, patch)
    assert out["bias"] is base["bias"]
    assert out["w"].bits is not base["w"].bits
    assert states_equal(out, new)


def test_compact_is_smaller_than_overwrite_and_context_is_opt_in():
    base, new = realistic_pair(numel=200_000)
    compact, overwrite = make_patch(base, new, mode="compact"), make_patch(base, new, mode="overwrite")
    with_context = make_patch(base, new, mode="compact", position_context=True)
    assert len(with_context) < len(compact) < len(overwrite)
    assert all(t.threshold == 0 for t in read_header(compact).tensors)
    assert any(t.threshold > 0 for t in read_header(with_context).tensors)
    assert patch_stats(compact).bytes_per_changed < 1.5
    assert states_equal(apply_patch(base, with_context), new) and states_equal(apply_patch(base, compact), new)


def test_overwrite_is_idempotent_and_any_base_is_opt_in():
    base, new = realistic_pair()
    patch = make_patch(base, new, mode="overwrite")
    with pytest.raises(BaseMismatchError):
        apply_patch(new, patch)
    again = apply_patch(new, patch, allow_any_base=True)
    assert states_equal(again, new)


def test_compact_refuses_other_base_even_when_asked():
    base, new = realistic_pair()
    patch = make_patch(base, new, mode="compact")
    with pytest.raises(BaseMismatchError):
        apply_patch(new, patch)
    with pytest.raises(BaseMismatchError):
        apply_patch(new, patch, allow_any_base=True)


def test_make_patch_requires_same_layout():
    base, new = realistic_pair()
    with pytest.raises(PatchError, match="tensor sets"):
        make_patch(base, {"w": new["w"]})
    other = dict(new, bias=TensorBits("F32", (2, 2), new["bias"].bits))
    with pytest.raises(PatchError, match="dtype/shape"):
        make_patch(base, other)
    with pytest.raises(PatchError, match="mode"):
        make_patch(base, new, mode="dense")  # type: ignore[arg-type]


def test_identical_states_give_an_empty_patch():
    base, _ = realistic_pair()
    patch = make_patch(base, base)
    stats = patch_stats(patch)
    assert stats.changed == 0 and stats.bytes_per_changed == 0.0
    assert states_equal(apply_patch(base, patch), base)


@pytest.mark.parametrize("dtype", ["F64", "I64", "I32", "I16", "I8", "U8", "BOOL"])
def test_other_dtypes_round_trip(dtype):
    from pulse_node.codec.state import DTYPES

    rng = np.random.default_rng(7)
    view = DTYPES[dtype]
    hi = 2 if dtype == "BOOL" else np.iinfo(view).max
    bits = rng.integers(0, hi, 500, dtype=np.uint64, endpoint=dtype != "BOOL").astype(view)
    new_bits = bits.copy()
    sel = rng.random(500) < 0.1
    new_bits[sel] = (1 - bits[sel]) if dtype == "BOOL" else bits[sel] + view.type(3)
    base, new = {"x": TensorBits(dtype, (20, 25), bits)}, {"x": TensorBits(dtype, (20, 25), new_bits)}
    for mode in ("compact", "overwrite"):
        assert states_equal(apply_patch(base, make_patch(base, new, mode=mode)), new)


def test_known_base_hash_is_checked_without_verify():
    base, new = realistic_pair()
    patch = make_patch(base, new)
    assert states_equal(apply_patch(base, patch, verify=False, base_hash=state_hash(base)), new)
    with pytest.raises(BaseMismatchError):
        apply_patch(new, patch, verify=False, base_hash=state_hash(new))
