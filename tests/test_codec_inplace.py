"""In-place apply: the same result as ``apply_patch`` in the state's own arrays, the undo log
restores the base exactly, and every failure (corrupt value stream, wrong result hash, wrong
base) leaves the previous version intact."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from codec_strategies import copy_state, mixed_pair, mutate, state_pairs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_node.codec.header import pack_header, unpack_header
from pulse_node.codec.inplace import apply_patch_inplace
from pulse_node.codec.patch import apply_patch, make_patch
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import bytes_digest, state_hash
from pulse_node.errors import BaseMismatchError, IntegrityError, PatchError

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(a: State, b: State) -> bool:
    return set(a) == set(b) and all(np.array_equal(a[k].bits, b[k].bits) for k in a)


@FAST
@given(state_pairs())
def test_inplace_equals_copying_apply_and_undo_restores(pair) -> None:
    base, new = pair
    for mode, context in (("compact", False), ("compact", True), ("overwrite", False)):
        patch = make_patch(base, new, mode=mode, position_context=context)
        state = copy_state(base)
        arrays = {k: t.bits for k, t in state.items()}
        changes = apply_patch_inplace(state, patch)
        assert _same(state, apply_patch(base, patch)) and _same(state, new)
        assert all(state[k].bits is arrays[k] for k in state)  # no new array: written in place
        assert changes.changed == sum(int((base[k].bits != new[k].bits).sum()) for k in base)
        changes.undo(state)
        assert _same(state, base)
        changes.redo(state)
        assert _same(state, new)


def test_corrupt_value_stream_leaves_the_base_intact() -> None:
    base, new = mixed_pair(tensors=4)
    patch = bytearray(make_patch(base, new))
    header, start = unpack_header(memoryview(bytes(patch)))
    victim = max((e for e in header.tensors if e.changed), key=lambda e: e.offset)  # the last one decoded
    at = start + victim.offset
    patch[at:at + victim.length] = b"\xc1" * victim.length  # never valid msgpack: the stream is refused
    state = copy_state(base)
    with pytest.raises(PatchError):
        apply_patch_inplace(state, bytes(patch), verify=False, base_hash=header.base_state_hash)
    assert _same(state, base)


def test_wrong_result_hash_rolls_every_tensor_back() -> None:
    base, new = mixed_pair(1, tensors=4)
    other = {k: TensorBits(t.dtype, t.shape, t.bits.copy()) for k, t in new.items()}
    other["w0"].bits[0] ^= 1  # a payload that decodes cleanly but not to the signed result
    forged = make_patch(base, other)
    header, start = unpack_header(memoryview(forged))
    relabelled = dataclasses.replace(header, result_state_hash=state_hash(new))
    patch = pack_header(relabelled) + forged[start:]
    assert bytes_digest(forged[start:]) == header.payload_digest
    state = copy_state(base)
    before = state_hash(state)
    with pytest.raises(IntegrityError):
        apply_patch_inplace(state, patch)
    assert _same(state, base) and state_hash(state) == before


def test_wrong_base_and_read_only_arrays_are_refused_untouched() -> None:
    base, new = mixed_pair(2, tensors=4)
    patch = make_patch(base, new)
    state = copy_state(new)
    with pytest.raises(BaseMismatchError):
        apply_patch_inplace(state, patch)
    assert _same(state, new)
    frozen = copy_state(base)
    for t in frozen.values():
        t.bits.flags.writeable = False
    with pytest.raises(PatchError, match="read-only"):
        apply_patch_inplace(frozen, patch)
    assert _same(frozen, base)


def test_a_kernel_failing_midway_restores_its_tensor() -> None:
    """The value kernel writes as it decodes; a stream that ends halfway (``TRUNCATED`` after
    thousands of writes) leaves the tensor's bits exactly as they were, and the old and new
    bits it kept are those of the elements it reached."""
    from pulse_node.codec.models import PatchModels
    from pulse_node.codec.patch import _decode_deltas, _decode_positions, _split_stream, parse_patch

    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint16)
    base = {"w": TensorBits("BF16", (1 << 16,), bits)}
    new = {"w": TensorBits("BF16", (1 << 16,), mutate("BF16", bits, 0.3, rng))}
    parsed = parse_patch(make_patch(base, new))
    entry = parsed.header.tensors[0]
    models = PatchModels({(t.coding, t.dtype, t.label): t.counts for t in parsed.header.tables})
    payload = memoryview(parsed.data)[parsed.start:]
    pos_blob, words, raw = _split_stream(payload[entry.offset:entry.offset + entry.length], "w")
    idx = _decode_positions(entry, base["w"].bits, pos_blob)
    assert len(raw) > 64
    cut = raw[: len(raw) // 2]
    part_written = base["w"].bits.copy()  # without the undo arrays (a copy being decoded): part-written
    with pytest.raises(PatchError, match="truncated"):
        _decode_deltas(entry, idx, words, cut, models, part_written)
    assert (part_written != base["w"].bits).sum() > 1000  # it failed midway, after many writes
    target = base["w"].bits.copy()
    old, got = np.zeros(idx.size, np.uint16), np.zeros(idx.size, np.uint16)
    with pytest.raises(PatchError, match="truncated"):
        _decode_deltas(entry, idx, words, cut, models, target, old=old, new=got)
    assert np.array_equal(target, base["w"].bits)
    reached = got != 0
    assert np.array_equal(old[reached], bits[idx[reached]]) and np.array_equal(got[reached], new["w"].bits[idx[reached]])
    with pytest.raises(PatchError, match="trailing"):  # a stream with bytes left over is undone too
        _decode_deltas(entry, idx, words, raw + b"\x00" * 8, models, target, old=old, new=got)
    assert np.array_equal(target, base["w"].bits)


def test_a_corrupt_value_stream_leaves_the_state_as_it_was() -> None:
    base, new = mixed_pair(3, tensors=4)
    raw = bytearray(make_patch(base, new))
    raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(64)  # the middle of some tensor's streams
    state = copy_state(base)
    with pytest.raises((PatchError, IntegrityError)):
        apply_patch_inplace(state, bytes(raw), verify=False)
    assert _same(state, base)


@FAST
@given(state_pairs(), st.integers(0, 2**32 - 1))
def test_composed_changes_equal_the_two_steps(p1, seed: int) -> None:
    base, mid = p1
    rng = np.random.default_rng(seed)
    end = {k: TensorBits(t.dtype, t.shape, mutate(t.dtype, t.bits, 0.3, rng) if t.numel else t.bits.copy())
           for k, t in mid.items()}
    state = copy_state(base)
    first = apply_patch_inplace(state, make_patch(base, mid))
    both = first.then(apply_patch_inplace(state, make_patch(mid, end)))
    assert _same(state, end) and both.base_hash == state_hash(base) and both.result_hash == state_hash(end)
    both.undo(state)
    assert _same(state, base)
    both.redo(state)
    assert _same(state, end)
