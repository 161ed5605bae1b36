"""Hostile patches: every corruption is a typed error, never a crash or a half-applied state."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from codec_strategies import copy_state, realistic_pair, states_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_node.codec.header import MAX_NUMEL, pack_header, unpack_header
from pulse_node.codec.patch import apply_patch, changed_positions, make_patch, read_header
from pulse_node.codec.state import TensorBits
from pulse_node.errors import BaseMismatchError, IntegrityError, PatchError, PulseError

BASE, NEW = realistic_pair(numel=5000, seed=3)
PATCHES = {mode: make_patch(BASE, NEW, mode=mode) for mode in ("compact", "overwrite")}
SNAPSHOT = copy_state(BASE)


def _rebuild(patch: bytes, **changes) -> bytes:
    header, start = unpack_header(patch)
    return pack_header(dataclasses.replace(header, **changes)) + patch[start:]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["compact", "overwrite"]), cut=st.integers(0, 10**9))
def test_truncated_patch_is_refused(mode, cut):
    patch = PATCHES[mode]
    with pytest.raises(PatchError):
        apply_patch(BASE, patch[: cut % len(patch)])
    assert states_equal(BASE, SNAPSHOT)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["compact", "overwrite"]), where=st.integers(0, 10**9), bit=st.integers(0, 7),
       verify=st.booleans())
def test_bit_flip_is_refused_or_harmless(mode, where, bit, verify):
    data = bytearray(PATCHES[mode])
    data[where % len(data)] ^= 1 << bit
    try:
        out = apply_patch(BASE, bytes(data), verify=verify)
    except PulseError:
        pass
    else:
        assert not verify or states_equal(out, NEW)  # verified output is always the true result
        assert all(out[k].shape == BASE[k].shape and out[k].dtype == BASE[k].dtype for k in BASE)
    assert states_equal(BASE, SNAPSHOT)


def test_payload_flip_is_an_integrity_error():
    patch = bytearray(PATCHES["compact"])
    patch[-3] ^= 0x10
    with pytest.raises(IntegrityError):
        apply_patch(BASE, bytes(patch))


def test_wrong_base_and_layout_are_base_mismatch():
    patch = PATCHES["compact"]
    with pytest.raises(BaseMismatchError, match="hash"):
        apply_patch(NEW, patch)
    with pytest.raises(BaseMismatchError, match="tensor set"):
        apply_patch({"w": BASE["w"]}, patch)
    reshaped = dict(BASE, w=TensorBits("BF16", (100, 50), BASE["w"].bits))
    with pytest.raises(BaseMismatchError, match="expects"):
        apply_patch(reshaped, patch)


def test_oversized_declarations_are_refused_before_allocation():
    patch = PATCHES["compact"]
    header, _ = unpack_header(patch)
    w = next(i for i, t in enumerate(header.tensors) if t.name == "w")
    huge = dataclasses.replace(header.tensors[w], shape=(MAX_NUMEL, 2))
    with pytest.raises(PatchError, match="cap"):
        read_header(_rebuild(patch, tensors=header.tensors[:w] + (huge,) + header.tensors[w + 1:]))
    too_many = dataclasses.replace(header.tensors[w], changed=header.tensors[w].numel + 1)
    with pytest.raises(PatchError, match="counts"):
        read_header(_rebuild(patch, tensors=header.tensors[:w] + (too_many,) + header.tensors[w + 1:]))
    with pytest.raises(PatchError, match="add up"):
        read_header(_rebuild(patch, payload_len=header.payload_len + 10**12))
    with pytest.raises(PatchError, match="truncated"):
        read_header(patch[:-1])
    bogus_len = patch[:8] + (2**31).to_bytes(4, "little") + patch[12:]
    with pytest.raises(PatchError, match="truncated"):
        read_header(bogus_len)


def test_lying_change_count_is_refused_with_digest_recomputed():
    """A consistent header (valid digest) that lies about counts still fails cleanly."""
    patch = PATCHES["compact"]
    header, _ = unpack_header(patch)
    w = next(i for i, t in enumerate(header.tensors) if t.name == "w")
    fewer = dataclasses.replace(header.tensors[w], changed=header.tensors[w].changed - 1)
    bad = _rebuild(patch, tensors=header.tensors[:w] + (fewer,) + header.tensors[w + 1:])
    with pytest.raises(PatchError):
        apply_patch(BASE, bad)
    with pytest.raises(PatchError):
        changed_positions(bad, BASE)
    assert states_equal(BASE, SNAPSHOT)


def test_garbage_and_wrong_version():
    for junk in (b"", b"PULSEPT", b"\x00" * 64, b"PULSEPT\x02" + b"\x00" * 8, np.random.bytes(500)):
        with pytest.raises(PatchError):
            apply_patch(BASE, junk)
