"""PULSELoCo payload codec: exact round trip and refusal of hostile bytes (torch-free)."""

from __future__ import annotations

import itertools

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_node.errors import WireError
from pulse_node.loco import basecoder
from pulse_node.loco.bounded_zstd import bounded_decompress
from pulse_node.loco.payload import (
    POS_CODER_BASE,
    POSITION_CODERS,
    VAL_CODER_BASE,
    VALUE_CODERS,
    LocoPayload,
    decode_payload,
    encode_payload,
)

SHAPES = {"emb": (50, 16), "head.bias": (7,), "head.weight": (7, 16)}
CAP = 1 << 20
CODERS = list(itertools.product(sorted(POSITION_CODERS), VALUE_CODERS))


def make_base(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = {n: (rng.standard_normal(s) * 0.02).astype(np.float32) for n, s in SHAPES.items()}
    base["head.bias"][:4] = np.array([0.0, -0.0, 1e-40, 1.5], dtype=np.float32)  # zero, subnormal, large
    return base


def gated_values(w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Values like the BF16 gate sends: past the rounding boundary of w, multiples of w's ulp."""
    ulp = np.spacing(np.abs(w)).astype(np.float64)
    steps = rng.integers(1 << 15, 1 << 17, w.size) * rng.choice([-1, 1], w.size)
    return (steps * ulp).astype(np.float32)


def make_payload(seed: int = 0, density: float = 0.1, base: dict | None = None) -> LocoPayload:
    rng = np.random.default_rng(seed)
    base = base or make_base(seed)
    tensors, numel = {}, {}
    for name, shape in SHAPES.items():
        n = int(np.prod(shape))
        idx = np.flatnonzero(rng.random(n) < density).astype(np.int64)
        vals = gated_values(base[name].reshape(-1)[idx], rng)
        vals[::3] = (rng.standard_normal(vals[::3].size) * 1e-4).astype(np.float32)  # arbitrary values too
        tensors[name], numel[name] = (idx, vals), n
    special = np.array([0.0, -0.0, 1e-45, -3.4e38], dtype=np.float32)
    idx = np.arange(4, dtype=np.int64) * 2
    tensors["head.bias"], numel["head.bias"] = (idx, special), 7
    return LocoPayload(round=12, trainer_id="peer-b", base_hash=b"\x01" * 32, tensors=tensors, numel=numel)


def assert_same(p: LocoPayload, q: LocoPayload) -> None:
    assert (q.round, q.trainer_id, q.base_hash) == (p.round, p.trainer_id, p.base_hash)
    assert set(q.tensors) == {n for n, (i, _) in p.tensors.items() if i.size}
    for name, (idx, vals) in q.tensors.items():
        assert np.array_equal(idx, p.tensors[name][0])
        assert np.array_equal(vals.view(np.uint32), p.tensors[name][1].view(np.uint32))


@pytest.mark.parametrize("pos_coder,val_coder", CODERS)
def test_round_trip_is_bit_exact(pos_coder: str, val_coder: str) -> None:
    p, base = make_payload(), make_base()
    data = encode_payload(p, pos_coder=pos_coder, val_coder=val_coder, base=base)
    msg = msgpack.unpackb(data, raw=False)
    assert (msg["pos_coder"], msg["val_coder"], msg["v"]) == (pos_coder, val_coder, 2)
    assert_same(p, decode_payload(data, shapes=SHAPES, max_bytes=CAP, base=base))


def test_base_coders_are_the_default_with_a_base_and_smaller() -> None:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal(50_000) * 0.02).astype(np.float32)
    idx = np.flatnonzero(rng.random(w.size) < 0.05)
    p = LocoPayload(3, "a", b"", {"w": (idx, gated_values(w[idx], rng))}, {"w": w.size})
    plain, with_base = encode_payload(p), encode_payload(p, base={"w": w})
    msg = msgpack.unpackb(with_base, raw=False)
    assert (msg["pos_coder"], msg["val_coder"]) == (POS_CODER_BASE, VAL_CODER_BASE)
    assert msgpack.unpackb(plain, raw=False)["val_coder"] != VAL_CODER_BASE
    assert len(with_base) < len(plain)
    for data, base in ((plain, None), (with_base, {"w": w})):
        assert_same(p, decode_payload(data, shapes={"w": w.shape}, max_bytes=CAP, base=base))


def test_empty_and_dense_payloads_round_trip() -> None:
    empty = LocoPayload(0, "a", b"", {n: (np.zeros(0, np.int64), np.zeros(0, np.float32)) for n in SHAPES},
                        {n: int(np.prod(s)) for n, s in SHAPES.items()})
    for base in (None, make_base()):
        assert decode_payload(encode_payload(empty, base=base), shapes=SHAPES, max_bytes=CAP, base=base).count == 0
        dense = make_payload(density=1.0)
        got = decode_payload(encode_payload(dense, base=base), shapes=SHAPES, max_bytes=CAP, base=base)
        assert_same(dense, got)


FLOATS = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.floats(min_value=-0.125, max_value=0.125, width=32),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.4e38, -3.4e38, 1.0, 0.02]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(FLOATS, FLOATS, st.integers(-3, 20), st.booleans()), min_size=1, max_size=60),
       st.booleans())
def test_base_value_coder_round_trips_any_values(rows: list, threshold: bool) -> None:
    """Arbitrary (base, value) pairs, and values built to sit just past the base's BF16 boundary."""
    w = np.array([r[0] for r in rows], dtype=np.float32)
    raw = np.array([r[1] for r in rows], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        gated = (np.spacing(np.abs(w)) * np.array([(1 << 15) + (1 << max(r[2], 0)) for r in rows], np.float64)
                 * np.array([1 if r[3] else -1 for r in rows])).astype(np.float32)
    vals = np.where(np.isfinite(gated) & (np.arange(len(rows)) % 2 == 0), gated, raw).astype(np.float32)
    blob = basecoder.encode_values_ctx(vals, w.view(np.uint32), threshold=threshold)
    back = basecoder.decode_values_ctx(blob, w.view(np.uint32))
    assert np.array_equal(back.view(np.uint32), vals.view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_payload_round_trip_random_sparsity(seed: int, density: float) -> None:
    rng = np.random.default_rng(seed)
    p, base = make_payload(seed=int(rng.integers(1 << 30)), density=density), make_base(seed % 7)
    assert_same(p, decode_payload(encode_payload(p, base=base), shapes=SHAPES, max_bytes=CAP, base=base))


def test_bounded_decompress_needs_a_declared_size_within_the_cap() -> None:
    data = bytes(range(256)) * 4
    frame = zstandard.ZstdCompressor().compress(data)
    assert bounded_decompress(frame, limit=len(data), what="t") == data and bounded_decompress(b"", limit=0, what="t") == b""
    streamed = zstandard.ZstdCompressor().compressobj()
    undeclared = streamed.compress(data) + streamed.flush()
    for blob, why in ((frame, "more than the cap"), (undeclared, "does not declare"),
                      (frame + frame, "corrupt"), (b"junk", "not a zstd frame")):
        with pytest.raises(WireError, match=why):
            bounded_decompress(blob, limit=len(data) - (why == "more than the cap"), what="t")


def test_only_the_shared_position_coders_are_accepted() -> None:
    """The varint fallback coder ("loco-varint-zstd") was never chosen and is gone from the format."""
    assert set(POSITION_CODERS) == {"codec.positions", POS_CODER_BASE}
    with pytest.raises(WireError, match="unknown position coder"):
        decode_payload(mutate("pos_coder", "loco-varint-zstd"), shapes=SHAPES, max_bytes=CAP)


def mutate(field: str, value, *, base: bool = False) -> bytes:
    msg = msgpack.unpackb(encode_payload(make_payload(), base=make_base() if base else None), raw=False)
    msg[field] = value
    return msgpack.packb(msg, use_bin_type=True)


def tensors_with(record) -> list:
    msg = msgpack.unpackb(encode_payload(make_payload()), raw=False)
    return msg["tensors"][:1] + [record]


def bomb() -> bytes:
    return zstandard.ZstdCompressor().compress(b"\x00" * (1 << 22))


def value_blob(**changes) -> bytes:
    """The base-coded value stream of ``make_payload`` with some of its fields replaced."""
    msg = msgpack.unpackb(encode_payload(make_payload(), base=make_base()), raw=False)
    body = msgpack.unpackb(msg["values"], raw=False)
    names = ["format", "delta", "threshold", "dist", "lens", "rans", "raw"]
    for k, v in changes.items():
        body[names.index(k)] = v
    msg["values"] = msgpack.packb(body, use_bin_type=True)
    return msgpack.packb(msg, use_bin_type=True)


HOSTILE = [
    b"", b"\x00", b"\xc1", msgpack.packb([1, 2, 3]),
    mutate("v", 1), mutate("v", 3), mutate("kind", "other"), mutate("round", -1), mutate("round", True),
    mutate("trainer", ""), mutate("trainer", "x" * 200), mutate("base", b"\x00" * 100),
    mutate("pos_coder", "nope"), mutate("val_coder", "f16"), mutate("tensors", {}),
    mutate("values", b"garbage"), mutate("values", bomb()), mutate("positions", b"junk"),
    mutate("positions", bomb()), mutate("positions", b""),
    mutate("tensors", tensors_with(["nope", 1])),
    mutate("tensors", tensors_with(["emb", 10_000])),
    mutate("tensors", tensors_with(["emb", 1, b""])),
    mutate("tensors", tensors_with(["head.bias", True])),
    mutate("tensors", [["emb", 1]]),  # counts disagree with the position stream
    mutate("tensors", []),  # data without tensors
    mutate("values", b"garbage", base=True), mutate("values", bomb(), base=True),
    mutate("positions", b"\x93\x01\x02", base=True),
    value_blob(format=basecoder.VALUES_FORMAT - 1), value_blob(format=basecoder.VALUES_FORMAT + 1), value_blob(delta=9), value_blob(delta=True), value_blob(threshold=1),
    value_blob(dist=b"\x00" * 16), value_blob(dist=b"\x00" * 3), value_blob(lens=bomb()),
    value_blob(lens=zstandard.ZstdCompressor().compress(b"\x7f" * 4)), value_blob(lens=b"junk"),
    value_blob(rans=b"\x01\x02\x03"), value_blob(rans=b""), value_blob(raw=b""), value_blob(raw=b"\xff" * 4096),
]


@pytest.mark.parametrize("data", HOSTILE, ids=lambda d: str(len(d)))
def test_hostile_payloads_are_refused(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_payload(data, shapes=SHAPES, max_bytes=CAP, base=make_base())


def test_base_coded_payload_without_base_is_refused() -> None:
    data = encode_payload(make_payload(), base=make_base())
    with pytest.raises(WireError, match="base"):
        decode_payload(data, shapes=SHAPES, max_bytes=CAP)
    with pytest.raises(ValueError):
        encode_payload(make_payload(), val_coder=VAL_CODER_BASE)


def test_extra_field_unsorted_and_nonfinite_are_refused() -> None:
    msg = msgpack.unpackb(encode_payload(make_payload()), raw=False)
    with pytest.raises(WireError):
        decode_payload(msgpack.packb({**msg, "extra": 1}), shapes=SHAPES, max_bytes=CAP)
    with pytest.raises(WireError):
        decode_payload(msgpack.packb({**msg, "tensors": msg["tensors"][::-1]}), shapes=SHAPES, max_bytes=CAP)
    for base in (None, make_base()):
        p = make_payload()
        _idx, vals = p.tensors["emb"]
        vals[0] = np.nan
        with pytest.raises(WireError):
            decode_payload(encode_payload(p, base=base), shapes=SHAPES, max_bytes=CAP, base=base)


def test_size_cap_is_checked_before_parsing() -> None:
    data = encode_payload(make_payload(density=1.0))
    with pytest.raises(WireError, match="exceeds the cap"):
        decode_payload(data, shapes=SHAPES, max_bytes=len(data) - 1)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2000), st.booleans())
def test_random_corruption_raises_only_wire_error(junk: bytes, at: int, with_base: bool) -> None:
    base = make_base() if with_base else None
    data = bytearray(encode_payload(make_payload(), base=base))
    at %= len(data)
    data[at:at + len(junk)] = junk
    try:
        decode_payload(bytes(data), shapes=SHAPES, max_bytes=CAP, base=base)
    except WireError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 4000), st.sampled_from(["positions", "values"]))
def test_corrupted_base_streams_raise_only_wire_error(junk: bytes, at: int, field: str) -> None:
    """Corruption inside the base-coded position and value streams (not just the envelope)."""
    base = make_base()
    msg = msgpack.unpackb(encode_payload(make_payload(), base=base), raw=False)
    blob = bytearray(msg[field])
    at %= max(len(blob), 1)
    blob[at:at + len(junk)] = junk
    msg[field] = bytes(blob)
    try:
        decode_payload(msgpack.packb(msg, use_bin_type=True), shapes=SHAPES, max_bytes=CAP, base=base)
    except WireError:
        pass


def test_payload_codec_and_config_import_without_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; import pulse_node.loco.payload, pulse_node.loco.config, pulse_node.loco.basecoder; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_position_labels_in_slices_equal_the_whole_array_formula(monkeypatch) -> None:
    """Labels computed slice by slice in uint32 (1 B per weight) are the int64 formula's, across
    slice edges and on every kind of bit pattern (zeros, denormals, inf/nan, random words)."""
    rng = np.random.default_rng(7)
    normal = (rng.standard_normal(5000) * 10.0 ** rng.integers(-40, 38, 5000)).astype(np.float32).view(np.uint32)
    special = np.array([0, 0x80000000, 1, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x00008000], np.uint32)
    w = np.concatenate([normal, rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32), special])
    ew, _, dz = basecoder._base_fields(w)
    expected = (np.clip(ew - 96, 0, 63) * 4 + np.minimum(np.minimum(dz, 0x10000 - dz) >> 13, 3)).astype(np.uint8)
    monkeypatch.setattr(basecoder, "LABEL_SLICE", 999)  # many slices, uneven last one
    assert np.array_equal(basecoder.position_labels(w), expected)
