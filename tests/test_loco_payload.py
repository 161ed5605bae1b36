"""PULSELoCo payload codec: exact round trip and refusal of hostile bytes (torch-free)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings, strategies as st

from pulse_node.errors import WireError
from pulse_node.loco import positions
from pulse_node.loco.payload import POSITION_CODERS, LocoPayload, decode_payload, encode_payload

SHAPES = {"emb": (50, 16), "head.bias": (7,), "head.weight": (7, 16)}
CAP = 1 << 20


def make_payload(seed: int = 0, density: float = 0.1) -> LocoPayload:
    rng = np.random.default_rng(seed)
    tensors, numel = {}, {}
    for name, shape in SHAPES.items():
        n = int(np.prod(shape))
        idx = np.flatnonzero(rng.random(n) < density).astype(np.int64)
        vals = (rng.standard_normal(idx.size) * 1e-4).astype(np.float32)
        tensors[name], numel[name] = (idx, vals), n
    special = np.array([0.0, -0.0, 1e-45, -3.4e38], dtype=np.float32)
    idx = np.arange(4, dtype=np.int64) * 2
    tensors["head.bias"], numel["head.bias"] = (idx, special), 7
    return LocoPayload(round=12, trainer_id="peer-b", base_hash=b"\x01" * 32, tensors=tensors, numel=numel)


@pytest.mark.parametrize("coder", sorted(POSITION_CODERS))
def test_round_trip_is_bit_exact(coder: str) -> None:
    p = make_payload()
    data = encode_payload(p, pos_coder=coder)
    assert msgpack.unpackb(data, raw=False)["pos_coder"] == coder
    q = decode_payload(data, shapes=SHAPES, max_bytes=CAP)
    assert (q.round, q.trainer_id, q.base_hash) == (p.round, p.trainer_id, p.base_hash)
    assert set(q.tensors) == {n for n, (i, _) in p.tensors.items() if i.size}
    for name, (idx, vals) in q.tensors.items():
        assert np.array_equal(idx, p.tensors[name][0])
        assert np.array_equal(vals.view(np.uint32), p.tensors[name][1].view(np.uint32))


def test_empty_and_dense_payloads_round_trip() -> None:
    empty = LocoPayload(0, "a", b"", {n: (np.zeros(0, np.int64), np.zeros(0, np.float32)) for n in SHAPES},
                        {n: int(np.prod(s)) for n, s in SHAPES.items()})
    assert decode_payload(encode_payload(empty), shapes=SHAPES, max_bytes=CAP).count == 0
    dense = make_payload(density=1.0)
    assert decode_payload(encode_payload(dense), shapes=SHAPES, max_bytes=CAP).count == dense.count


def test_positions_coder_round_trip_and_limits() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 10, 1000, 1 << 20):
        idx = np.flatnonzero(rng.random(n) < 0.05).astype(np.int64)
        assert np.array_equal(positions.decode_positions(positions.encode_positions(idx, n), n,
                                                         max_count=idx.size), idx)
    blob = positions.encode_positions(np.array([0, 5, 9]), 10)
    with pytest.raises(WireError):
        positions.decode_positions(blob, 9, max_count=3)  # index 9 outside 9 elements
    with pytest.raises(WireError):
        positions.decode_positions(blob, 10, max_count=2)  # more values than allowed


def mutate(field: str, value) -> bytes:
    msg = msgpack.unpackb(encode_payload(make_payload()), raw=False)
    msg[field] = value
    return msgpack.packb(msg, use_bin_type=True)


def tensors_with(record) -> list:
    msg = msgpack.unpackb(encode_payload(make_payload()), raw=False)
    return msg["tensors"][:1] + [record]


def bomb() -> bytes:
    return zstandard.ZstdCompressor().compress(b"\x00" * (1 << 22))


@pytest.mark.parametrize("data", [
    b"", b"\x00", b"\xc1", msgpack.packb([1, 2, 3]),
    mutate("v", 2), mutate("kind", "other"), mutate("round", -1), mutate("round", True),
    mutate("trainer", ""), mutate("trainer", "x" * 200), mutate("base", b"\x00" * 100),
    mutate("pos_coder", "nope"), mutate("val_coder", "f16"), mutate("tensors", {}),
    mutate("values", b"garbage"), mutate("values", bomb()),
    mutate("tensors", tensors_with(["nope", 1, b""])),
    mutate("tensors", tensors_with(["emb", 10_000, b""])),
    mutate("tensors", tensors_with(["emb", 1, positions.encode_positions(np.array([800]), 801)])),
    mutate("tensors", tensors_with(["emb", 1, bomb()])),
    mutate("tensors", tensors_with(["emb", 1, b"\x28\xb5\x2f\xfd junk"])),
], ids=lambda d: str(len(d)))
def test_hostile_payloads_are_refused(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_payload(data, shapes=SHAPES, max_bytes=CAP)


def test_extra_field_unsorted_and_nonfinite_are_refused() -> None:
    msg = msgpack.unpackb(encode_payload(make_payload()), raw=False)
    with pytest.raises(WireError):
        decode_payload(msgpack.packb({**msg, "extra": 1}), shapes=SHAPES, max_bytes=CAP)
    with pytest.raises(WireError):
        decode_payload(msgpack.packb({**msg, "tensors": msg["tensors"][::-1]}), shapes=SHAPES, max_bytes=CAP)
    p = make_payload()
    idx, vals = p.tensors["emb"]
    vals[0] = np.nan
    with pytest.raises(WireError):
        decode_payload(encode_payload(p), shapes=SHAPES, max_bytes=CAP)


def test_size_cap_is_checked_before_parsing() -> None:
    data = encode_payload(make_payload(density=1.0))
    with pytest.raises(WireError, match="exceeds the cap"):
        decode_payload(data, shapes=SHAPES, max_bytes=len(data) - 1)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2000))
def test_random_corruption_raises_only_wire_error(junk: bytes, at: int) -> None:
    data = bytearray(encode_payload(make_payload()))
    at %= len(data)
    data[at:at + len(junk)] = junk
    try:
        decode_payload(bytes(data), shapes=SHAPES, max_bytes=CAP)
    except WireError:
        pass


def test_payload_codec_and_config_import_without_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; import pulse_node.loco.payload, pulse_node.loco.config; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
