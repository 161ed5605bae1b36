"""Rollout wire format: round trip, and hostile bytes always end in a typed WireError."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_node.errors import WireError
from pulse_node.rl.rollout import WIRE_VERSION, Rollout, decode_rollouts, encode_rollouts


def sample_rollouts(n: int = 3) -> list[Rollout]:
    return [Rollout(prompt_ids=[1, 5 + i, 7], completion_ids=[9, 2], logprobs=[-0.5, -0.125],
                    reward=float(i % 2), version=4 + i, problem_id=f"p{i}", group_id="g0",
                    finished=bool(i % 2), batch=3, sample=i) for i in range(n)]


def test_round_trip() -> None:
    rs = sample_rollouts()
    for r in rs:
        r.local = True
    back = decode_rollouts(encode_rollouts(rs))
    assert back == rs and [(r.batch, r.sample) for r in back] == [(3, 0), (3, 1), (3, 2)]
    assert not any(r.local for r in back)  # a decoded rollout is never the node's own
    assert decode_rollouts(encode_rollouts([])) == []
    item = msgpack.unpackb(encode_rollouts(rs[:1]))["rollouts"][0]
    assert set(item) == {"p", "c", "l", "r", "v", "pid", "g", "f", "b", "i"}  # wire 1's fields keep their names


def _body(**changes) -> bytes:
    item = msgpack.unpackb(encode_rollouts(sample_rollouts(1)))["rollouts"][0]
    item.update(changes)
    return msgpack.packb({"wire": WIRE_VERSION, "precision": "fp32", "rollouts": [item]}, use_bin_type=True)


@pytest.mark.parametrize("data", [
    b"", b"\xc1", b"\x92\x01", msgpack.packb({"wire": 1, "rollouts": []}),
    msgpack.packb({"wire": 3, "rollouts": []}), msgpack.packb({"wire": 4, "precision": "fp32", "rollouts": []}),
    msgpack.packb({"wire": 3, "precision": "fp8", "rollouts": []}), msgpack.packb({"wire": 2, "precision": "fp32", "rollouts": []}),
    msgpack.packb({"wire": 2}), msgpack.packb({"wire": 2, "rollouts": {}}),
    msgpack.packb({"wire": 2, "rollouts": [1]}),
    _body(r=math.nan), _body(r=1), _body(v=-1), _body(v=True), _body(f=1),
    _body(l=b"\x00\x00\x00\x00"), _body(c=b"\x01\x00\x00"), _body(c=b""),
    _body(l=msgpack.packb(1.0)), _body(pid=""), _body(pid=7), _body(g="x" * 300),
    _body(c=b"\xff\xff\xff\xff\x01\x00\x00\x00", l=b"\x00\x00\x00\xbf\x00\x00\x00\xbf"),
    _body(extra=1), _body(b=-1), _body(b=1 << 20), _body(b=True), _body(i=-1), _body(i=1.0), _body(l=b"\x00\x00\xc0\x7f\x00\x00\x00\xbf"), _body(l=b"\x00\x00\x80\x3f\x00\x00\x00\xbf"),
])
def test_malformed_messages_raise_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_rollouts(data)


def test_a_batch_declares_its_precision_and_wire_2_reads_as_fp32() -> None:
    rs = sample_rollouts(2)
    for r in rs:
        r.precision = "bf16"
    assert [r.precision for r in decode_rollouts(encode_rollouts(rs))] == ["bf16", "bf16"]
    item = msgpack.unpackb(encode_rollouts(rs))["rollouts"][0]
    old = decode_rollouts(msgpack.packb({"wire": 2, "rollouts": [item]}, use_bin_type=True))
    assert old[0].precision == "fp32"
    rs[1].precision = "fp32"
    with pytest.raises(ValueError, match="one precision"):
        encode_rollouts(rs)


def test_size_cap_and_truncation() -> None:
    blob = encode_rollouts(sample_rollouts(50))
    with pytest.raises(WireError, match="cap"):
        decode_rollouts(blob, max_bytes=len(blob) - 1)
    for cut in range(1, len(blob), 97):
        with pytest.raises(WireError):
            decode_rollouts(blob[:cut])


def test_encode_rejects_inconsistent_rollout() -> None:
    r = sample_rollouts(1)[0]
    r.logprobs = [-1.0]
    with pytest.raises(ValueError):
        encode_rollouts([r])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    try:
        decode_rollouts(data)
    except WireError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2000), st.integers(0, 255))
def test_bit_flips_of_valid_message(pos: int, value: int) -> None:
    blob = bytearray(encode_rollouts(sample_rollouts(4)))
    blob[pos % len(blob)] = value
    try:
        out = decode_rollouts(bytes(blob))
    except WireError:
        return
    for r in out:
        assert len(r.logprobs) == len(r.completion_ids) and all(math.isfinite(x) for x in r.logprobs)
