"""DHT record schemas and the signing validator, without a network (fast): every claim of a record
(its key, its addresses) is bound to the peer id that signed it, and what a node reads is bounded."""

from __future__ import annotations

import dataclasses
import time

import msgpack
import pytest

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.errors import WireError
from pulse_node.net.dht.records import (
    MAX_PEERS_READ,
    MAX_TTL_S,
    address_range,
    decode_dht_record,
    dht_key,
    encode_dht_record,
    select_peer_records,
    validate_tree,
)

hivemind_dht = pytest.importorskip("hivemind.dht.routing")
from hivemind.dht.protocol import DHTProtocol  # noqa: E402
from hivemind.dht.routing import DHTID  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402

from pulse_node.net.dht.validator import (  # noqa: E402
    PulseRecordValidator,
    libp2p_private_key,
    peer_id_of,
    public_key_of,
    sign_envelope,
)

RUN = "unit"
SER = DHTProtocol.serializer


def peer_record(ident: Identity, **changes) -> dict:
    pid = peer_id_of(ident)
    rec = PeerRecord(role="trainer", peer_id=pid, session="ab" * 16, updated_at=time.time(), version=7,
                     wire_maddrs=[f"/ip4/127.0.0.1/tcp/5000/p2p/{pid}"], node_key=ident.public_key_hex).model_dump()
    rec.update(changes)
    return rec


def dht_record(owner_peer_id: str, value: dict, *, kind: str = "peers", run: str = RUN,
               ttl: float = 30.0) -> DHTRecord:
    source = dht_key(run, kind) if kind == "peers" else f"pulse/{run}/{kind}"  # e.g. the retired "heads"
    key = DHTID.generate(source=source).to_bytes()
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
    ({"software": "x" * 9000}, "exceeds"),     # size cap
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
    assert "not a record kind" in validator.reject_reason(as_head)  # the unused heads key is gone
    too_long = signed(validator, dht_record(peer_id_of(ident), peer_record(ident), ttl=MAX_TTL_S * 2))
    assert "exceeds" in validator.reject_reason(too_long)


def test_a_record_claims_no_other_key_and_no_other_peers_address(owner) -> None:
    """A peer record signed by its owner still may not announce a trusted trainer's key, nor send
    peers to someone else's data plane: both are bound to the peer id that signed it."""
    ident, validator = owner
    pid, trainer = peer_id_of(ident), Identity.generate()
    stolen_key = signed(validator, dht_record(pid, peer_record(ident, node_key=trainer.public_key_hex)))
    assert "node_key" in validator.reject_reason(stolen_key)
    elsewhere = f"/ip4/10.0.0.9/tcp/5000/p2p/{peer_id_of(trainer)}"
    for field in ("wire_maddrs", "dht_maddrs"):
        foreign = signed(validator, dht_record(pid, peer_record(ident, **{field: [elsewhere]})))
        assert "own peer id" in validator.reject_reason(foreign), field
    bare = signed(validator, dht_record(pid, peer_record(ident, wire_maddrs=["/ip4/10.0.0.9/tcp/5000"])))
    assert "own peer id" in validator.reject_reason(bare)
    with pytest.raises(WireError, match="node_key"):  # the node re-checks every record it reads
        validate_tree(PeerRecord, peer_record(ident, node_key=trainer.public_key_hex))


def test_a_sybil_flood_leaves_a_bounded_read_with_the_trusted_trainers_in_it() -> None:
    trainer = Identity.generate()
    sybils = [PeerRecord(role="trainer", peer_id=peer_id_of(Identity.generate()), session="ab" * 16,
                         updated_at=1000.0 + i) for i in range(MAX_PEERS_READ + 50)]
    honest = PeerRecord(role="trainer", peer_id=peer_id_of(trainer), session="cd" * 16, updated_at=1.0)
    picked = select_peer_records([*sybils, honest], prefer=[honest.peer_id])
    assert len(picked) == MAX_PEERS_READ and picked[0] == honest


def _rec(ident: Identity, *, updated_at: float, version: int | None = None, host: str = "127.0.0.1") -> PeerRecord:
    pid = peer_id_of(ident)
    return PeerRecord(role="inference", peer_id=pid, session="ab" * 16, updated_at=updated_at, version=version,
                      wire_maddrs=[f"/ip4/{host}/tcp/4000/p2p/{pid}"])


def test_a_records_stated_time_or_version_orders_nothing() -> None:
    """Records announcing the future and attractive versions do not sort before the others:
    which non-preferred records are read is the reader's draw (its salt), the same whatever the
    records say about themselves."""
    idents = [Identity.generate() for _ in range(40)]
    plain = [_rec(i, updated_at=100.0) for i in idents]
    bragging = [_rec(i, updated_at=1e10, version=10**12) for i in idents]
    salt = b"reader-secret"
    a = [r.peer_id for r in select_peer_records(plain, limit=10, salt=salt)]
    b = [r.peer_id for r in select_peer_records(bragging, limit=10, salt=salt)]
    assert a == b
    assert a != [r.peer_id for r in select_peer_records(plain, limit=10, salt=b"another reader")]


def test_the_preferred_order_is_kept_and_ranges_take_turns() -> None:
    """``prefer`` is the node's ranking (kept as given); after it, one record per address range
    in turn, so one /24 full of fresh keys does not fill the read."""
    pref = [_rec(Identity.generate(), updated_at=1.0, host="10.0.0.1") for _ in range(3)]
    flood = [_rec(Identity.generate(), updated_at=2.0, host="10.9.9.9") for _ in range(50)]
    other = _rec(Identity.generate(), updated_at=1.0, host="192.168.5.5")
    picked = select_peer_records([*flood, other, *pref], prefer=[r.peer_id for r in reversed(pref)], limit=6)
    assert picked[:3] == list(reversed(pref)) and other in picked[3:5]
    assert address_range(other.wire_maddrs) == "ip4/192.168.5" and address_range(["/dns4/x.example/tcp/1"]) == "dns4/x.example"
    assert address_range(None) == address_range([7]) == ""


def test_encode_decode_round_trip_and_strictness() -> None:
    ident = Identity.generate()
    rec = PeerRecord(**PeerStatus(role="inference", admission=b"a" * 100).model_dump(), peer_id=peer_id_of(ident),
                     session="00" * 16, updated_at=1.0)
    assert decode_dht_record("peers", encode_dht_record(rec)) == rec
    with pytest.raises(WireError):
        decode_dht_record("peers", b"\xc1not msgpack")
    with pytest.raises(WireError, match="not a map"):
        validate_tree(PeerRecord, [1, 2])


def test_a_flood_of_records_cannot_blind_the_worker() -> None:
    """17,000 maximal records (76 MB, past the 64 MiB RPC frame) under fresh keys: the worker still
    answers, with at most MAX_PEERS_READ records, the trusted trainer's first."""
    import asyncio
    import os

    from pulse_node.chain.identity import peer_id_of_key
    from pulse_node.net.dht.config import DhtConfig
    from pulse_node.net.dht.worker import DhtWorker
    from pulse_node.net.local import ipc

    def record(pid: str, updated_at: float) -> dict:
        m = f"/ip4/198.51.100.1/tcp/1/{'x' * 170}/p2p/{pid}"
        return PeerRecord(role="trainer", peer_id=pid, session="ab" * 16, updated_at=updated_at,
                          wire_maddrs=[m] * 8, dht_maddrs=[m] * 8).model_dump()

    sybils = [peer_id_of_key(os.urandom(32).hex()) for _ in range(17_000)]
    trainer = peer_id_of_key(Identity.generate().public_key_hex)
    entries = [(p, record(p, 2000.0 + i), 1e12) for i, p in enumerate(sybils)] + [(trainer, record(trainer, 1.0), 1e12)]

    from pulse_node.net.dht import worker as dht_worker_mod

    class Flooded(DhtWorker):
        async def read(self, kind: str) -> list:
            return entries

    worker = Flooded(DhtConfig(run_id=RUN), None, None, "me")
    out = [r.model_dump() for r in asyncio.run(worker.peers(prefer=[trainer]))]
    assert len(out) == MAX_PEERS_READ and out[0]["peer_id"] == trainer
    assert len(ipc.encode_frame({"id": 1, "ok": True, "result": out})) < ipc.MAX_FRAME
    validated = []
    real = dht_worker_mod.validate_tree
    dht_worker_mod.validate_tree = lambda model, tree: validated.append(1) or real(model, tree)
    try:
        few = asyncio.run(worker.peers(prefer=[trainer], limit=10))
    finally:
        dht_worker_mod.validate_tree = real
    assert len(few) == 10 and few[0].peer_id == trainer and len(validated) == 10  # chosen first, then checked


def test_an_accepted_record_is_checked_once_and_a_changed_one_again(owner, monkeypatch) -> None:
    """Every DHT read re-validates every record of the answer; a record that passed is
    remembered by its exact bytes, so a flood is checked once per record, and any change to the
    bytes (a forged signature, another expiration) is checked in full again."""
    ident, validator = owner
    rec = signed(validator, dht_record(peer_id_of(ident), peer_record(ident)))
    calls = []
    real = validator.reject_reason
    monkeypatch.setattr(validator, "reject_reason", lambda r, **kw: calls.append(1) or real(r, **kw))
    assert validator.validate(rec) and validator.validate(rec) and len(calls) == 1
    forged = dataclasses.replace(rec, value=rec.value[:-1] + bytes([rec.value[-1] ^ 1]))
    assert not validator.validate(forged) and not validator.validate(forged) and len(calls) == 3
    later = dataclasses.replace(rec, expiration_time=rec.expiration_time + 1)
    assert not validator.validate(later)  # the signature covers the expiration
