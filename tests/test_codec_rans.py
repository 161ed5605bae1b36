"""The codec's own rANS coder: exact round trips, deterministic models, hostile streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_node.codec import rans
from pulse_node.errors import PatchError

SETTINGS = settings(max_examples=80, deadline=None)

_table = st.lists(st.integers(0, 10_000) | st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=256).filter(
    lambda t: sum(t) > 0)


def _symbols(table: list[float], n: int, rng: np.random.Generator) -> np.ndarray:
    f = np.array(table, float)
    return rng.choice(f.size, n, p=f / f.sum())


@SETTINGS
@given(st.lists(st.tuples(_table, st.integers(0, 400)), min_size=1, max_size=5), st.integers(0, 2**32 - 1))
def test_segments_round_trip(segments, seed):
    rng = np.random.default_rng(seed)
    coded = [(_symbols(t, n, rng), rans.model(np.array(t, float), leaky=False)) for t, n in segments]
    data = rans.encode(coded)
    dec = rans.Decoder(data)
    for sym, m in coded:
        assert np.array_equal(dec.decode(sym.size, m), sym)
    assert dec.is_empty()


@SETTINGS
@given(_table, st.booleans())
def test_models_are_exact_and_match_the_python_build(table, leaky):
    f = np.array(table, float)
    m = rans.model(f, leaky=leaky)
    q = m.freq[:m.n].astype(np.int64)
    assert q.sum() == rans.M
    assert (q[f > 0] >= 1).all() and (not leaky or (q >= 1).all()) and (leaky or (q[f == 0] == 0).all())
    assert np.array_equal(np.repeat(np.arange(m.n), q), m.slots)
    freq, cum, slots = np.zeros(256, np.uint64), np.zeros(256, np.uint64), np.empty(rans.M, np.uint8)
    assert rans._build(f, leaky, freq, cum, slots) == 0  # the plain-Python fallback
    assert np.array_equal(freq, m.freq) and np.array_equal(cum, m.cum) and np.array_equal(slots, m.slots)


def test_python_encoder_writes_the_same_stream():
    rng = np.random.default_rng(3)
    m = rans.model(np.array([50.0, 30, 15, 4, 1]))
    syms = _symbols([50, 30, 15, 4, 1], 3000, rng).astype(np.int64)
    rows = np.zeros(syms.size, np.int64)
    freq, cum, n = m.freq[None], m.cum[None], np.array([m.n])
    out_c, out_p = np.empty(syms.size + 4, np.uint32), np.empty(syms.size + 4, np.uint32)
    k = rans.encode_kernel(syms, rows, freq, cum, n, out_c)
    assert rans._encode(syms, rows, freq, cum, n, out_p) == k
    assert np.array_equal(out_c[:k], out_p[:k])


def test_size_is_near_the_entropy():
    rng = np.random.default_rng(0)
    p = np.array([0.45, 0.4, 0.08, 0.04, 0.02, 0.01])
    syms = rng.choice(p.size, 200_000, p=p)
    bits = 8 * len(rans.encode([(syms, rans.model(p))]))
    assert bits <= 1.005 * syms.size * -(p * np.log2(p)).sum() + 128


def test_bad_tables_and_symbols_are_refused():
    for bad in ([], [0.0, 0.0], [-1.0, 2.0], [np.inf, 1.0], [np.nan], [1.0] * 257):
        with pytest.raises(PatchError):
            rans.model(np.array(bad, float))
    m = rans.model(np.array([1.0, 0.0, 1.0]), leaky=False)
    for sym in ([1], [3], [-1]):
        with pytest.raises(PatchError):
            rans.encode([(np.array(sym), m)])


def test_hostile_streams_raise_typed_errors():
    m = rans.model(np.array([5.0, 3.0, 1.0]))
    good = rans.encode([(np.arange(600) % 3, m)])
    with pytest.raises(PatchError, match="partial word"):
        rans.Decoder(good[:-1])
    with pytest.raises(PatchError):
        rans.Decoder(good[:4])
    with pytest.raises(PatchError, match="initial state"):
        rans.Decoder(b"\x00" * 8 + good[8:])
    with pytest.raises(PatchError, match="truncated"):
        rans.Decoder(good[:24]).decode(600, m)
    dec = rans.Decoder(good)
    dec.decode(599, m)
    assert not dec.is_empty()  # one symbol left: trailing data is detectable


@SETTINGS
@given(st.binary(max_size=256), st.integers(0, 2000))
def test_random_bytes_never_crash(data, count):
    m = rans.model(np.array([7.0, 1.0, 1.0, 1.0]))
    try:
        dec = rans.Decoder(data)
        out = dec.decode(count, m)
    except PatchError:
        return
    assert out.size == count and ((out >= 0) & (out < m.n)).all()
