"""The compiled codec kernels against their numpy twins (the format's reference)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_node.codec import entropy as E
from pulse_node.codec import fused as F
from pulse_node.codec import kernels as K
from pulse_node.codec import rans
from pulse_node.codec import values as V
from pulse_node.codec.patch import apply_patch, make_patch
from pulse_node.codec.state import TensorBits
from pulse_node.errors import PatchError

pytestmark = pytest.mark.skipif(not K.AVAILABLE, reason="numba is not installed")

SETTINGS = settings(max_examples=60, deadline=None)
_ints = st.integers(0, 2**52 - 1) | st.integers(0, 300)
_widths = st.lists(st.integers(0, 62), min_size=0, max_size=200)


@SETTINGS
@given(st.lists(_ints, max_size=300))
def test_gap_bins_match_numpy(values):
    v = np.array(values, np.int64)
    for got, want in zip(E.gap_bins(v), E.gap_bins_np(v)):
        assert np.array_equal(got, want)


@SETTINGS
@given(_widths, st.randoms(use_true_random=False))
def test_bit_fields_match_numpy(widths, rnd):
    w = np.array(widths, np.int64)
    v = np.array([rnd.getrandbits(x) if x else 0 for x in widths], np.int64)
    writer = E.BitWriter()
    writer.write(v, w)
    data = writer.getvalue()
    assert data == E.pack_fields_np(v, w)
    assert np.array_equal(E.BitReader(data).read(w), v)
    assert np.array_equal(E.BitReader(data)._read_np(w), v)


def _uniform_model() -> rans.Model:
    return rans.model(np.ones(E.MAX_BINS))


def _streams(sym: np.ndarray, nextra: np.ndarray, extra: np.ndarray) -> tuple[rans.Decoder, F.RawBits]:
    writer = E.BitWriter()
    writer.write(extra, nextra)
    return rans.Decoder(rans.encode([(sym, _uniform_model())])), F.RawBits(writer.getvalue())


@SETTINGS
@given(st.lists(_ints, min_size=1, max_size=300))
def test_fused_ranks_match_numpy(values):
    v = np.array(values, np.int64)
    sym, nextra, extra = E.gap_bins(v)
    want = np.cumsum(E.gap_unbins_np(sym, E.BitReader(_raw(nextra, extra))) + 1) - 1
    dec, raw = _streams(sym, nextra, extra)
    got = F.decode_ranks(dec, raw, v.size, _uniform_model(), int(want[-1]) + 1, *E.bin_bounds(E.MAX_BINS))
    assert np.array_equal(got, want) and dec.is_empty() and raw.remaining_bytes() == 0


def _raw(nextra: np.ndarray, extra: np.ndarray) -> bytes:
    writer = E.BitWriter()
    writer.write(extra, nextra)
    return writer.getvalue()


def test_truncated_and_out_of_range_are_typed_errors():
    v = np.array([1000, 5, 70000], np.int64)
    sym, nextra, extra = E.gap_bins(v)
    bounds = E.bin_bounds(E.MAX_BINS)
    dec, _ = _streams(sym, nextra, extra)
    with pytest.raises(PatchError, match="truncated"):
        F.decode_ranks(dec, F.RawBits(_raw(nextra, extra)[:1]), 3, _uniform_model(), 10**6, *bounds)
    dec, raw = _streams(sym, nextra, extra)
    with pytest.raises(PatchError, match="outside its tensor"):
        F.decode_ranks(dec, raw, 3, _uniform_model(), 71_000, *bounds)
    with pytest.raises(PatchError, match="truncated"):
        E.BitReader(_raw(nextra, extra)[:1]).read(nextra)
    with pytest.raises(PatchError, match="out of range"):
        E.BitReader(_raw(nextra, extra)).read(np.array([63], np.int64))


@SETTINGS
@given(st.lists(st.integers(0, 255), max_size=400))
def test_label_order_matches_numpy(labels):
    lab = np.array(labels, np.uint8)
    order, groups = E.group_by_label(lab)
    order_np, groups_np = E.group_by_label_np(lab)
    assert np.array_equal(order, order_np) and groups == groups_np


@SETTINGS
@given(st.sampled_from(["BF16", "F16", "F32", "I32", "I16", "U8", "I8"]), st.integers(0, 2**31),
       st.integers(1, 200))
def test_deltas_match_numpy(dtype, seed, n):
    np_dtype = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32, "I32": np.uint32, "I16": np.uint16,
                "U8": np.uint8, "I8": np.uint8}[dtype]
    rng = np.random.default_rng(seed)
    top = np.iinfo(np_dtype).max
    old = rng.integers(0, top, n, dtype=np_dtype, endpoint=True)
    step = rng.integers(1, 4, n).astype(np_dtype)
    new = np.where(rng.random(n) < 0.5, old + step, rng.integers(0, top, n, dtype=np_dtype, endpoint=True))
    keep = new != old
    old, new = old[keep], new[keep]
    for got, want in zip(V.delta_symbols(dtype, old, new), V.delta_symbols_np(dtype, old, new)):
        assert np.array_equal(got, want)
    sym, nextra, extra = V.delta_symbols_np(dtype, old, new)
    zm1 = E.gap_unbins_np(sym, E.BitReader(_raw(nextra, extra)))
    assert np.array_equal(V.apply_delta(dtype, old, zm1), new)
    dec, raw = _streams(sym, nextra, extra)
    bits = old.copy()
    kind, mant, emask = V.label_layout(dtype)
    F.decode_deltas_into(dec, raw, np.zeros(256, np.int64), rans.stack([_uniform_model()]), np.arange(old.size),
                         bits, kind, mant, emask, *E.bin_bounds(E.MAX_BINS))
    assert np.array_equal(bits, new) and dec.is_empty() and raw.remaining_bytes() == 0


@pytest.mark.parametrize("n", [0, 1, K.PREFETCH_AHEAD - 1, K.PREFETCH_AHEAD, K.PREFETCH_AHEAD + 1, 700])
@pytest.mark.parametrize("at", [np.uint32, np.int64])
def test_sparse_writes_asking_ahead_for_their_lines_write_exactly_the_changes(n, at):
    """The prefetch ahead of each write changes no result, up to the last change and past it."""
    rng = np.random.default_rng(n)
    numel = 40 * n + 3
    idx = np.sort(rng.choice(numel, n, replace=False)).astype(at)
    old = rng.integers(0, 1 << 16, numel, dtype=np.uint16)
    new = old[idx] + rng.integers(1, 3, n).astype(np.uint16)
    words = np.full(numel, 7, np.uint32)
    K.scatter_shifted(words, idx, new, 16)
    want = np.full(numel, 7, np.uint32)
    want[idx] = new.astype(np.uint32) << 16
    assert np.array_equal(words, want)
    # the value kernel, writing the state, the undo arrays and a live parameter in one pass
    sym, nextra, extra = V.delta_symbols("BF16", old[idx], new)
    dec, raw = _streams(sym, nextra, extra)
    bits, live = old.copy(), np.full(numel, 7, np.uint32)
    before, after = np.empty(n, np.uint16), np.empty(n, np.uint16)
    kind, mant, emask = V.label_layout("BF16")
    F.decode_deltas_into(dec, raw, np.zeros(256, np.int64), rans.stack([_uniform_model()]), idx, bits, kind,
                         mant, emask, *E.bin_bounds(E.MAX_BINS), old=before, new=after, live=(live, 16))
    moved = old.copy()
    moved[idx] = new
    assert np.array_equal(bits, moved) and np.array_equal(live, want)
    assert np.array_equal(before, old[idx]) and np.array_equal(after, new)


def test_whole_codec_is_identical_without_numba(monkeypatch):
    """The numpy fallback writes byte-identical patches and applies the kernels' patches."""
    rng = np.random.default_rng(7)
    w = (rng.normal(0, 0.02, 50_000).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    moved = w.copy()
    hit = rng.random(w.size) < 0.02
    moved[hit] += rng.integers(1, 3, hit.sum()).astype(np.uint16)
    base = {"w": TensorBits("BF16", (50_000,), w), "b": TensorBits("F32", (7,), np.arange(7, dtype=np.uint32))}
    new = {"w": TensorBits("BF16", (50_000,), moved), "b": base["b"]}
    compiled = make_patch(base, new)
    monkeypatch.setattr(K, "AVAILABLE", False)
    assert make_patch(base, new) == compiled
    assert np.array_equal(apply_patch(base, compiled)["w"].bits, moved)


@SETTINGS
@given(st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64]), st.integers(0, 2**31), st.integers(1, 300))
def test_fused_planes_match_numpy(np_dtype, seed, n):
    rng = np.random.default_rng(seed)
    new = rng.integers(0, np.iinfo(np_dtype).max, n, dtype=np_dtype, endpoint=True)
    planes = V.plane_symbols(new)
    models = [rans.model(np.bincount(p, minlength=256).astype(float), leaky=False) for p in planes]
    dec = rans.Decoder(rans.encode(list(zip(planes, models))))
    bits = np.zeros(2 * n, np_dtype)
    idx = np.arange(0, 2 * n, 2)
    F.decode_planes_into(dec, rans.stack(models), idx, bits)
    assert np.array_equal(bits[idx], V.planes_to_bits(planes, np.dtype(np_dtype))) and dec.is_empty()
    assert not bits[1::2].any()


@pytest.mark.skipif(not K.AVAILABLE, reason="numba not installed")
def test_an_edited_kernel_module_clears_every_cached_kernel(tmp_path):
    """numba only notices edits to a kernel's own file: an edit to any kernel module must drop
    the cached kernels of all of them, and an unchanged tree must keep them."""
    from pulse_node.codec.warmup import KERNEL_MODULES, clear_stale_cache

    for m in KERNEL_MODULES:
        (tmp_path / f"{m}.py").write_text(f"# {m}\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()

    def compiled() -> list[Path]:
        files = [cache / f"{m}.k-1.py312.nbi" for m in KERNEL_MODULES] + [cache / "rans.k-1.py312.1.nbc"]
        for f in files:
            f.write_bytes(b"compiled")
        return files

    files = compiled()
    assert clear_stale_cache(tmp_path) and not any(f.exists() for f in files)  # no stamp yet
    files = compiled()
    assert not clear_stale_cache(tmp_path) and all(f.exists() for f in files)  # sources unchanged
    (tmp_path / "entropy.py").write_text("# entropy, edited\n")  # a helper the others inline
    assert clear_stale_cache(tmp_path) and not any(f.exists() for f in files)
