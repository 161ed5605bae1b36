"""Position coder: exact round trip with and without context, bounds on hostile streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_node.codec.entropy import BitReader, BitWriter, gap_bins, gap_unbins_np
from pulse_node.codec.positions import Classes, decode_positions, encode_positions, index_dtype
from pulse_node.errors import PatchError


def _round_trip(idx, numel, context=None):
    data = encode_positions(idx, numel, context=context)
    out = decode_positions(data, numel, context=context, max_count=numel)
    assert out.dtype == np.int64
    assert np.array_equal(out, idx)
    return data


@settings(max_examples=40, deadline=None)
@given(numel=st.integers(1, 5000), density=st.floats(0, 1), seed=st.integers(0, 2**32 - 1),
       use_context=st.booleans())
def test_positions_decode_straight_into_the_index_dtype(numel, density, seed, use_context):
    """What a patch keeps (4 bytes per change below 2**32 elements) equals the int64 decode."""
    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(rng.random(numel) < density)
    context = rng.integers(0, 3, numel).astype(np.uint8) if use_context else None
    data = encode_positions(idx, numel, context=context)
    out = decode_positions(data, numel, context=context, max_count=numel, dtype=index_dtype(numel))
    assert out.dtype == np.uint32 and np.array_equal(out, idx)


def test_index_dtype_holds_every_position():
    assert index_dtype(1 << 32) == np.uint32 and index_dtype((1 << 32) + 1) == np.int64
    data = encode_positions(np.array([3, 999]), 1000)
    with pytest.raises(ValueError, match="cannot hold"):
        decode_positions(data, 1000, max_count=2, dtype=np.dtype(np.uint8))


@settings(max_examples=120, deadline=None)
@given(numel=st.integers(0, 5000), density=st.floats(0, 1), seed=st.integers(0, 2**32 - 1),
       n_labels=st.integers(1, 6), use_context=st.booleans())
def test_round_trip(numel, density, seed, n_labels, use_context):
    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(rng.random(numel) < density)
    context = rng.integers(0, n_labels, numel).astype(np.uint8) if use_context else None
    _round_trip(idx, numel, context)


@pytest.mark.parametrize("numel", [0, 1, 2, 17, 1000])
def test_empty_and_full(numel):
    ctx = (np.arange(numel) % 3).astype(np.uint8)
    for context in (None, ctx):
        _round_trip(np.zeros(0, np.int64), numel, context)
        _round_trip(np.arange(numel, dtype=np.int64), numel, context)


def test_context_makes_skewed_sets_smaller():
    rng = np.random.default_rng(1)
    numel = 200_000
    ctx = (rng.random(numel) < 0.1).astype(np.uint8)  # class 1 changes 30%, class 0 changes 0.3%
    idx = np.flatnonzero(rng.random(numel) < np.where(ctx == 1, 0.3, 0.003))
    plain = _round_trip(idx, numel)
    conditioned = _round_trip(idx, numel, ctx)
    assert len(conditioned) < 0.8 * len(plain)


def test_large_gaps_and_prebuilt_classes():
    numel = 2**40
    idx = np.array([0, 5, 2**33, 2**40 - 1], dtype=np.int64)
    _round_trip(idx, numel)
    classes = Classes(1000, np.array([3, 10, 500]), np.array([1, 2, 1], np.uint8), 0)
    data = encode_positions(np.array([3, 4, 500]), 1000, classes=classes)
    assert np.array_equal(decode_positions(data, 1000, classes=classes, max_count=3), [3, 4, 500])


def test_hostile_streams():
    data = encode_positions(np.arange(0, 1000, 7), 1000)
    with pytest.raises(PatchError, match="declares"):
        decode_positions(data, 1000, max_count=10)
    with pytest.raises(PatchError, match="elements"):
        decode_positions(data, 999, max_count=1000)
    for cut in range(0, len(data), 3):
        with pytest.raises(PatchError):
            decode_positions(data[:cut], 1000, max_count=1000)
    with pytest.raises(PatchError):
        encode_positions(np.array([3, 2]), 10)
    with pytest.raises(PatchError):
        encode_positions(np.array([10]), 10)


def test_gap_bins_and_raw_bits_round_trip():
    v = np.array([0, 1, 15, 16, 17, 31, 32, 33, 999, 2**40 + 5, 2**52 - 1], dtype=np.int64)
    sym, nextra, extra = gap_bins(v)
    w = BitWriter()
    w.write(extra, nextra)
    assert np.array_equal(gap_unbins_np(sym, BitReader(w.getvalue())), v)
