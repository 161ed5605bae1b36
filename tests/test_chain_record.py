"""Version records: encoding, signatures, chain hashes, parent links, hostile input."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_node.chain.anchor import AnchorManifest, anchor_manifest
from pulse_node.chain.identity import Identity
from pulse_node.chain.record import (
    MAX_RECORD_BYTES,
    RECORD_FORMAT,
    RECORD_MAGIC,
    VersionRecord,
    chain_hash,
    check_link,
    check_patch,
    decode_record,
    encode_record,
    genesis_parent_hash,
    make_record,
    signing_bytes,
    verify_record,
)
from pulse_node.codec.state import TensorBits
from pulse_node.errors import IntegrityError, WireError

TRAINER = Identity.generate()
OTHER = Identity.generate()
CODEC = "pulsesync/compact/1"
MANIFEST = anchor_manifest({"w": TensorBits("BF16", (3,), np.arange(3, dtype=np.uint16))})


def chain(n: int, ident: Identity = TRAINER, run_id: str = "run-a", anchor_every: int = 5
          ) -> list[VersionRecord]:
    records = [make_record(ident, run_id=run_id, version=0, parent=None, state_hash="00" * 32,
                           patch=None, anchor_version=0, is_anchor=True, codec=CODEC, anchor_manifest=MANIFEST)]
    for v in range(1, n + 1):
        anchor = v - v % anchor_every
        records.append(make_record(
            ident, run_id=run_id, version=v, parent=records[-1], state_hash=f"{v:064x}",
            patch=b"patch-%d" % v, anchor_version=anchor, is_anchor=anchor == v, codec=CODEC,
            anchor_manifest=MANIFEST if anchor == v else b""))
    return records


RECORDS = chain(8)
TRUSTED = {TRAINER.public_key_hex}


def test_round_trip_and_verify_whole_chain() -> None:
    parent = None
    for r in RECORDS:
        data = encode_record(r)
        assert len(data) < 600 + len(r.anchor_manifest)
        back = decode_record(data)
        assert back == r
        verify_record(back, run_id="run-a", trusted_signers=TRUSTED, parent=parent)
        parent = back
    assert RECORDS[0].parent_chain_hash == genesis_parent_hash("run-a", RECORDS[0].genesis_nonce)
    assert {r.epoch for r in RECORDS} == {RECORDS[0].chain_hash}
    assert RECORDS[3].chain_hash == chain_hash(
        parent_chain_hash=RECORDS[2].chain_hash, version=3,
        patch_digest=RECORDS[3].patch_digest, state_hash=RECORDS[3].state_hash)


def tampered_value(r: VersionRecord, name: str):
    """A different value for field ``name`` that still has a valid shape."""
    value = getattr(r, name)
    if isinstance(value, str) and name not in ("run_id", "codec", "signer"):
        return ("1" if value[:1] == "0" else "0") + value[1:]  # flip one hex digit
    return {
        "run_id": lambda: value + "x",
        "version": lambda: value + 1,
        "patch_bytes": lambda: value + 1,
        "anchor_version": lambda: value - 1 if value > 0 else value + 1,
        "is_anchor": lambda: not value,
        "codec": lambda: "pulsesync/overwrite/1",
        "created_at": lambda: value + 1.0,
        "signer": lambda: OTHER.public_key_hex,
        "signature": lambda: bytes([value[0] ^ 1]) + value[1:],
        "genesis_nonce": lambda: bytes([value[0] ^ 1]) + value[1:] if value else b"\x01" * 16,
        "anchor_manifest": lambda: (value[:-1] + bytes([value[-1] ^ 1])) if value else MANIFEST,
    }[name]()


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(VersionRecord)])
@pytest.mark.parametrize("index", [0, 3, 5])
def test_any_tampered_field_is_rejected(name: str, index: int) -> None:
    r = RECORDS[index]
    bad = dataclasses.replace(r, **{name: tampered_value(r, name)})
    assert bad != r
    with pytest.raises((IntegrityError, WireError)):
        decoded = decode_record(encode_record(bad))
        verify_record(decoded, run_id=r.run_id, trusted_signers=None)


def test_untrusted_or_resigned_record_is_rejected() -> None:
    own = chain(2, ident=OTHER)[2]
    verify_record(own, run_id="run-a", trusted_signers=None)
    with pytest.raises(IntegrityError, match="not a trusted"):
        verify_record(own, run_id="run-a", trusted_signers=TRUSTED)
    # a trusted signer's name on a record signed by someone else
    forged = dataclasses.replace(own, signer=TRAINER.public_key_hex)
    with pytest.raises(IntegrityError, match="bad signature"):
        verify_record(forged, run_id="run-a", trusted_signers=TRUSTED)


def test_a_record_of_another_run_is_refused_however_well_signed() -> None:
    other_run = chain(3, run_id="run-b")[3]
    verify_record(other_run, run_id="run-b", trusted_signers=TRUSTED)
    with pytest.raises(IntegrityError, match="run 'run-b', this is run 'run-a'"):
        verify_record(other_run, run_id="run-a", trusted_signers=TRUSTED)


def test_anchor_manifest_is_signed_bound_to_anchors_and_decoded_as_hostile_input() -> None:
    anchor = RECORDS[5]
    assert anchor.manifest() == AnchorManifest.decode(MANIFEST) and RECORDS[4].manifest() is None
    with pytest.raises(ValueError, match="unless the version is an anchor"):
        make_record(TRAINER, run_id="run-a", version=4, parent=RECORDS[3], state_hash="ab" * 32, patch=b"p",
                    anchor_version=0, is_anchor=False, codec=CODEC, anchor_manifest=MANIFEST)
    m = AnchorManifest.decode(MANIFEST)
    for bad in (b"\xc1", msgpack.packb([m.layout, m.data_bytes, m.chunk_bytes, m.chunks + b"x" * 32]),
                msgpack.packb([m.layout, 10**12, 1, m.chunks]), msgpack.packb([m.layout[:5], 1, 1, b""])):
        with pytest.raises(WireError):
            AnchorManifest.decode(bad)
        with pytest.raises(ValueError):
            make_record(TRAINER, run_id="run-a", version=0, parent=None, state_hash="00" * 32, patch=None,
                        anchor_version=0, is_anchor=True, codec=CODEC, anchor_manifest=bad)


def test_parent_links_are_checked() -> None:
    with pytest.raises(IntegrityError, match="expected v4"):
        verify_record(RECORDS[5], run_id="run-a", trusted_signers=TRUSTED, parent=RECORDS[3])
    other_run = chain(8, run_id="run-b")
    with pytest.raises(IntegrityError):
        verify_record(other_run[5], run_id="run-a", trusted_signers=TRUSTED, parent=RECORDS[4])
    # same version number, different history (a fork): parent hash does not match
    fork4 = make_record(TRAINER, run_id="run-a", version=4, parent=RECORDS[3],
                        state_hash="ab" * 32, patch=b"other", anchor_version=0, is_anchor=False,
                        codec=CODEC)
    with pytest.raises(IntegrityError, match="fork"):
        check_link(fork4, RECORDS[5])


def test_two_geneses_of_one_run_and_state_are_two_epochs() -> None:
    """A second run (same run id, keys and genesis state) starts another chain: its records differ
    from the first run's at every version, and a record naming another epoch than its parent's
    does not link, however well signed."""
    again = chain(3)
    assert again[0].epoch != RECORDS[0].epoch and again[0].genesis_nonce != RECORDS[0].genesis_nonce
    assert all(a.chain_hash != b.chain_hash for a, b in zip(again, RECORDS))
    bad = dataclasses.replace(again[1], epoch=RECORDS[0].epoch)
    resigned = dataclasses.replace(bad, signature=TRAINER.sign(signing_bytes(bad)))
    verify_record(resigned, run_id="run-a", trusted_signers=TRUSTED)  # alone it is a well-signed record
    with pytest.raises(IntegrityError, match="epoch"):
        verify_record(resigned, run_id="run-a", trusted_signers=TRUSTED, parent=again[0])
    for bad in (dataclasses.replace(again[0], genesis_nonce=b""), dataclasses.replace(again[1], genesis_nonce=b"\1" * 16)):
        with pytest.raises(WireError, match="genesis nonce"):
            decode_record(encode_record(dataclasses.replace(bad, signature=TRAINER.sign(signing_bytes(bad)))))


def test_anchor_version_must_follow_parent() -> None:
    wrong = make_record(TRAINER, run_id="run-a", version=7, parent=RECORDS[6],
                        state_hash="cd" * 32, patch=b"p", anchor_version=0, is_anchor=False,
                        codec=CODEC)
    with pytest.raises(IntegrityError, match="anchor_version"):
        verify_record(wrong, run_id="run-a", trusted_signers=TRUSTED, parent=RECORDS[6])


def test_patch_digest_and_length_are_checked() -> None:
    check_patch(RECORDS[2], b"patch-2")
    with pytest.raises(IntegrityError, match="digest"):
        check_patch(RECORDS[2], b"patch-3")
    with pytest.raises(IntegrityError, match="bytes"):
        check_patch(RECORDS[2], b"patch-22")


def test_make_record_refuses_inconsistent_arguments() -> None:
    with pytest.raises(ValueError):
        make_record(TRAINER, run_id="r", version=1, parent=None, state_hash="00" * 32,
                    patch=b"x", anchor_version=0, is_anchor=False, codec=CODEC)
    with pytest.raises(ValueError):
        make_record(TRAINER, run_id="r", version=0, parent=None, state_hash="00" * 32,
                    patch=None, anchor_version=0, is_anchor=False, codec=CODEC)
    with pytest.raises(ValueError):
        make_record(TRAINER, run_id="has space", version=0, parent=None, state_hash="00" * 32,
                    patch=None, anchor_version=0, is_anchor=True, codec=CODEC)


def test_decode_rejects_malformed_structures() -> None:
    good = msgpack.unpackb(encode_record(RECORDS[3]))
    cases = [
        b"",
        b"\xc1",
        msgpack.packb({"version": 3}),
        msgpack.packb(["other", RECORD_FORMAT, *good[2:]]),
        msgpack.packb([RECORD_MAGIC, RECORD_FORMAT + 1, *good[2:]]),
        msgpack.packb(good[:-1]),
        msgpack.packb([*good, 1]),
        msgpack.packb([*good[:3], "3", *good[4:]]),          # version as a string
        msgpack.packb([*good[:3], True, *good[4:]]),         # bool is not an int here
        msgpack.packb([*good[:3], -1, *good[4:]]),
        msgpack.packb([*good[:12], 1, *good[13:]]),          # is_anchor as int
        msgpack.packb([*good[:-1], "sig"]),                  # signature as str
        encode_record(RECORDS[3]) + b"\x00",                 # trailing bytes
        b"\x00" * (MAX_RECORD_BYTES + 1),
    ]
    for data in cases:
        with pytest.raises(WireError):
            decode_record(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_decode_of_random_bytes_only_raises_wire_error(data: bytes) -> None:
    try:
        decode_record(data)
    except WireError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 400), st.integers(0, 255))
def test_any_single_byte_corruption_is_detected(pos: int, xor: int) -> None:
    data = bytearray(encode_record(RECORDS[4]))
    pos %= len(data)
    data[pos] ^= xor or 1
    try:
        r = decode_record(bytes(data))
    except WireError:
        return
    with pytest.raises(IntegrityError):
        verify_record(r, run_id="run-a", trusted_signers=TRUSTED)
