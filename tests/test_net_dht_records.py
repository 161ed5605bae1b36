"""DHT record schemas and the signing validator, without a network (fast)."""

from __future__ import annotations

import dataclasses
import time

import msgpack
import pytest

from pulse_node.chain.identity import Identity
from pulse_node.errors import WireError
from pulse_node.net.dht_records import (
    MAX_TTL_S, HeadEntry, PeerRecord, PeerStatus, decode_dht_record, dht_key, encode_dht_record, validate_tree,
)

hivemind_dht = pytest.importorskip("hivemind.dht.routing")
from hivemind.dht.protocol import DHTProtocol  # noqa: E402
from hivemind.dht.routing import DHTID  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402

from pulse_node.net.dht_validator import (  # noqa: E402
    PulseRecordValidator, libp2p_private_key, peer_id_of, public_key_of, sign_envelope,
)

RUN = "unit"
SER = DHTProtocol.serializer


def peer_record(ident: Identity, **changes) -> dict:
    rec = PeerRecord(role="trainer", peer_id=peer_id_of(ident), session="ab" * 16, updated_at=time.time(),
                     version=7, wire_maddrs=["/ip4/127.0.0.1/tcp/5000"]).model_dump()
    rec.update(changes)
    return rec


def dht_record(owner_peer_id: str, value: dict, *, kind: str = "peers", run: str = RUN,
               ttl: float = 30.0) -> DHTRecord:
    key = DHTID.generate(source=dht_key(run, kind)).to_bytes()
    return DHTRecord(key, SER.dumps(owner_peer_id), SER.dumps(value), time.time() + ttl)


def signed(validator: PulseRecordValidator, record: DHTRecord) -> DHTRecord:
    return dataclasses.replace(record, value=validator.sign_value(record))


@pytest.fixture(scope="module")
def owner() -> tuple[Identity, PulseRecordValidator]:
    ident = Identity.generate()
    return ident, PulseRecordValidator(RUN, ident)


def test_peer_id_is_the_ed25519_key() -> None:
    ident = Identity.generate()
    pid = peer_id_of(ident)
    assert pid.startswith("12D3KooW")
    assert public_key_of(pid).hex() == ident.public_key_hex
    assert libp2p_private_key(ident)[4:36] == ident.private_bytes()
    with pytest.raises(WireError):
        public_key_of("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")  # an RSA (sha256) peer id


def test_own_signed_record_is_accepted_and_stripped(owner) -> None:
    ident, validator = owner
    value = peer_record(ident)
    rec = signed(validator, dht_record(peer_id_of(ident), value))
    assert validator.reject_reason(rec) is None
    assert SER.loads(validator.strip_value(rec)) == value


def test_unsigned_forged_and_tampered_records_are_rejected(owner) -> None:
    ident, validator = owner
    victim = peer_id_of(ident)
    attacker = Identity.generate()
    raw = dht_record(victim, peer_record(ident))
    assert "envelope" in validator.reject_reason(raw)  # unsigned
    forged = dataclasses.replace(raw, value=sign_envelope(raw, attacker))
    assert "signature does not verify" in validator.reject_reason(forged)
    good = signed(validator, raw)
    stretched = dataclasses.replace(good, expiration_time=good.expiration_time + 100)  # keep a dead peer alive
    assert "signature" in validator.reject_reason(stretched)
    body, sig = msgpack.unpackb(good.value, raw=False)[1:]
    tampered = dataclasses.replace(good, value=msgpack.packb(
        ["pulse-dht-sig-1", body.replace(b"trainer", b"inferen"), sig], use_bin_type=True))
    assert validator.reject_reason(tampered) is not None


@pytest.mark.parametrize("changes, expect", [
    ({"role": "admin"}, "role"),
    ({"version": 7.0}, "version"),            # no silent coercion
    ({"extra": 1}, "extra"),
    ({"wire_maddrs": ["/x"] * 9}, "wire_maddrs"),
    ({"counters": {"errors": -1}}, "counters.errors"),
    ({"software": "x" * 5000}, "exceeds"),     # size cap
    ({"updated_at": time.time() + 3600}, "future"),
])
def test_signed_but_schema_violating_records_are_rejected(changes, expect) -> None:
    ident = Identity.generate()
    validator = PulseRecordValidator(RUN, ident)
    rec = signed(validator, dht_record(peer_id_of(ident), peer_record(ident, **changes)))
    reason = validator.reject_reason(rec)
    assert reason is not None and expect in reason


def test_record_must_name_its_subkey_key_kind_and_run(owner) -> None:
    ident, validator = owner
    other = Identity.generate()
    wrong_body = signed(validator, dht_record(peer_id_of(ident), peer_record(other)))
    assert "stored under" in validator.reject_reason(wrong_body)
    other_run = signed(validator, dht_record(peer_id_of(ident), peer_record(ident), run="elsewhere"))
    assert "not a record kind" in validator.reject_reason(other_run)
    as_head = signed(validator, dht_record(peer_id_of(ident), peer_record(ident), kind="heads"))
    assert validator.reject_reason(as_head) is not None
    too_long = signed(validator, dht_record(peer_id_of(ident), peer_record(ident), ttl=MAX_TTL_S * 2))
    assert "exceeds" in validator.reject_reason(too_long)


def test_head_entries_validate_and_cap_the_record(owner) -> None:
    ident, validator = owner
    head = HeadEntry(peer_id=peer_id_of(ident), session="cd" * 16, version=3, record=b"r" * 100,
                     updated_at=time.time()).model_dump()
    assert validator.reject_reason(signed(validator, dht_record(peer_id_of(ident), head, kind="heads"))) is None
    with pytest.raises(WireError, match="record"):
        validate_tree(HeadEntry, {**head, "record": b"r" * 20000})


def test_encode_decode_round_trip_and_strictness() -> None:
    ident = Identity.generate()
    rec = PeerRecord(**PeerStatus(role="inference").model_dump(), peer_id=peer_id_of(ident),
                     session="00" * 16, updated_at=1.0)
    assert decode_dht_record("peers", encode_dht_record(rec)) == rec
    with pytest.raises(WireError):
        decode_dht_record("peers", b"\xc1not msgpack")
    with pytest.raises(WireError, match="not a map"):
        validate_tree(PeerRecord, [1, 2])
