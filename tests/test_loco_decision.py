"""Round decisions: exact round trip, signatures, and refusal of hostile bytes (torch-free)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_node.chain.identity import Identity
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.decision import (
    DECISION_FORMAT,
    DECISION_MAGIC,
    MAX_CONTRIBUTORS,
    MAX_DECISION_BYTES,
    RoundDecision,
    decode_decision,
    encode_decision,
    make_decision,
    payload_digest,
    verify_decision,
)

EPOCH = b"\x09" * 32
COORD = Identity.generate()
OTHER = Identity.generate()
CONTRIBUTORS = {"trainer-c": payload_digest(b"c"), "trainer-a": payload_digest(b"a"), "trainer-b": payload_digest(b"b")}
COMMITTED = {**{t: payload_digest(t.encode()) for t in CONTRIBUTORS}, "trainer-d": payload_digest(b"d")}


def decision(**changes) -> RoundDecision:
    args = dict(run_id="run-a", round=7, base=b"\x05" * 32, epoch=EPOCH, coordinator="trainer-a",
                contributors=CONTRIBUTORS, committed=COMMITTED)
    args.update(changes)
    return make_decision(COORD, **args)


GOOD = decision()


def test_every_contributor_is_named_among_the_commitments() -> None:
    assert GOOD.commitments == COMMITTED
    with pytest.raises(ValueError, match="among the commitments"):  # never signed
        decision(committed={"trainer-a": payload_digest(b"x")})


def test_round_trip_is_exact_and_sorted() -> None:
    data = encode_decision(GOOD)
    back = decode_decision(data)
    assert back == GOOD and encode_decision(back) == data
    assert back.trainer_ids == ["trainer-a", "trainer-b", "trainer-c"]
    verify_decision(back, signer_key=COORD.public_key_hex)


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(RoundDecision) if f.name != "signer"])
def test_any_tampered_field_fails_the_signature(name: str) -> None:
    value = getattr(GOOD, name)
    forged = {
        "run_id": lambda: "run-b", "round": lambda: 8, "base": lambda: b"\x06" * 32, "epoch": lambda: b"\x07" * 32,
        "coordinator": lambda: "trainer-b", "contributors": lambda: value[:2], "committed": lambda: (*value[:3], ("trainer-d", b"\x01" * 32)), "open": lambda: ("trainer-a",),
        "verdicts": lambda: (b"\x01" * 40,), "convicted": lambda: ("trainer-c",),
        "signature": lambda: bytes([value[0] ^ 1]) + value[1:],
    }[name]()
    bad = dataclasses.replace(GOOD, **{name: forged})
    with pytest.raises(IntegrityError):
        verify_decision(decode_decision(encode_decision(bad)), signer_key=COORD.public_key_hex)


def test_other_signer_is_rejected_even_when_self_consistent() -> None:
    resigned = make_decision(OTHER, run_id="run-a", round=7, base=b"\x05" * 32, epoch=EPOCH, coordinator="trainer-a",
                             contributors=CONTRIBUTORS)
    verify_decision(resigned, signer_key=OTHER.public_key_hex)
    with pytest.raises(IntegrityError):
        verify_decision(resigned, signer_key=COORD.public_key_hex)


def test_make_decision_refuses_invalid_arguments() -> None:
    for changes in ({"contributors": {}}, {"base": b"\x01" * 31}, {"epoch": b"\x01" * 31}, {"run_id": "has space"}, {"round": -1},
                    {"coordinator": ""}, {"contributors": {"x": b"\x00" * 31}},
                    {"contributors": {f"t{i}": b"\x00" * 32 for i in range(MAX_CONTRIBUTORS + 1)}}):
        with pytest.raises(ValueError):
            decision(**changes)


def test_decode_rejects_malformed_structures() -> None:
    good = msgpack.unpackb(encode_decision(GOOD))
    pairs = good[7]
    cases = [
        b"", b"\xc1", msgpack.packb({"round": 7}),
        msgpack.packb(["other", DECISION_FORMAT, *good[2:]]),
        msgpack.packb([DECISION_MAGIC, DECISION_FORMAT + 1, *good[2:]]),
        msgpack.packb(good[:-1]), msgpack.packb([*good, 1]),
        msgpack.packb([*good[:3], "7", *good[4:]]),  # round as a string
        msgpack.packb([*good[:3], True, *good[4:]]),  # bool is not an int here
        msgpack.packb([*good[:3], 2**64 - 1, *good[4:]]),
        msgpack.packb([*good[:7], pairs[::-1], *good[8:]]),  # unsorted contributors
        msgpack.packb([*good[:7], [pairs[0], pairs[0]], *good[8:]]),  # repeated contributor
        msgpack.packb([*good[:7], [[pairs[0][0], pairs[0][1][:31]]], *good[8:]]),  # short digest
        msgpack.packb([*good[:7], [[pairs[0][0]]], *good[8:]]),
        msgpack.packb([*good[:7], [], *good[8:]]),
        msgpack.packb([*good[:7], {"a": 1}, *good[8:]]),
        msgpack.packb([*good[:-1], "sig"]),
        msgpack.packb([*good[:7], [[f"t{i:04d}", b"\x00" * 32] for i in range(MAX_CONTRIBUTORS + 1)], *good[8:]]),
        encode_decision(GOOD) + b"\x00",  # trailing bytes
        b"\x00" * (MAX_DECISION_BYTES + 1),
    ]
    for data in cases:
        with pytest.raises(WireError):
            decode_decision(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_decode_of_random_bytes_only_raises_wire_error(data: bytes) -> None:
    try:
        decode_decision(data)
    except WireError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1000), st.binary(min_size=1, max_size=40))
def test_any_corruption_is_refused_or_fails_the_signature(pos: int, junk: bytes) -> None:
    data = bytearray(encode_decision(GOOD))
    pos %= len(data)
    data[pos:pos + len(junk)] = junk
    if bytes(data) == encode_decision(GOOD):
        return
    try:
        d = decode_decision(bytes(data))
    except WireError:
        return
    with pytest.raises(IntegrityError):
        verify_decision(d, signer_key=COORD.public_key_hex)


def test_decision_codec_imports_without_torch() -> None:
    import subprocess
    import sys

    code = "import sys; import pulse_node.loco.decision; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
