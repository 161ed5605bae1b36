"""What a DHT node stores of the peers dictionary (``net/dht/capped_storage.py``): preferred peers
always, at most ``cap`` others by a secret draw, so 1 or 1,000 fresh keys cost it the same."""

from __future__ import annotations

import time

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.net.dht.capped_storage import CappedStorage, NewcomerGate

KEY = DHTID.generate(source="pulse/test/peers")


def _ids(n: int) -> list[str]:
    return [peer_id_of_key(Identity.generate().public_key_hex) for _ in range(n)]


def _flood(storage: CappedStorage, ids: list[str], exp: float) -> list[bool]:
    return [storage.store_subkey(KEY, pid, b"record", exp) for pid in ids]


def _stored(storage: CappedStorage) -> set[str]:
    found = storage.get(KEY)
    return set() if found is None else {k for k, _ in found.value.items()}


def test_a_thousand_fresh_keys_are_stored_like_a_handful_and_preferred_peers_stay() -> None:
    gate = NewcomerGate(cap=8, salt=b"s" * 16, clock=lambda: 1000.0)
    members, standing, own = _ids(2), _ids(3), _ids(1)
    gate.members, gate.own = frozenset(members), frozenset(own)
    gate.prefer(standing)
    storage = CappedStorage(gate)
    exp = time.time() + 600
    assert all(_flood(storage, members + own, exp))
    sybils = _ids(1000)
    _flood(storage, sybils[:500], exp)
    assert all(_flood(storage, standing, exp))  # preferred ones are stored however full the share is
    _flood(storage, sybils[500:], exp)
    kept = _stored(storage)
    assert set(members + standing + own) <= kept
    newcomers = kept - set(members + standing + own)
    assert len(newcomers) == 8
    assert newcomers == set(sorted(sybils, key=gate.draw)[:8])  # the draw picks, not who came first
    assert gate.refused + gate.evicted >= 992
    assert all(_flood(storage, sorted(newcomers), exp + 1))  # a stored newcomer's refresh is accepted
    assert all(_flood(storage, members, exp + 1))


def test_the_draw_is_secret_and_turns_over() -> None:
    ids = _ids(200)
    now = [1000.0]
    a = NewcomerGate(cap=8, salt=b"a" * 16, clock=lambda: now[0], rotate_s=60)
    b = NewcomerGate(cap=8, salt=b"b" * 16, clock=lambda: now[0], rotate_s=60)
    first = sorted(ids, key=a.draw)[:8]
    assert first != sorted(ids, key=b.draw)[:8]  # another node keeps other newcomers
    now[0] += 60
    assert sorted(ids, key=a.draw)[:8] != first  # and every newcomer gets its turn


def test_a_whole_dictionary_cached_from_a_read_is_trimmed_to_the_share() -> None:
    gate = NewcomerGate(cap=4, salt=b"t" * 16, clock=lambda: 5.0)
    member = _ids(1)
    gate.members = frozenset(member)
    big = DictionaryDHTValue()
    exp = time.time() + 600
    sybils = _ids(300)
    for pid in sybils + member:
        big.store(pid, b"record", exp)
    storage = CappedStorage(gate)
    storage.store(KEY, big, exp)
    assert _stored(storage) == set(member) | set(sorted(sybils, key=gate.draw)[:4])


def test_storing_a_flood_costs_bounded_time() -> None:
    """Refusing a newcomer is a few hashes over the stored share, not work per stored record."""
    gate = NewcomerGate(cap=64)
    storage = CappedStorage(gate)
    sybils = _ids(2000)
    exp = time.time() + 600
    t0 = time.process_time()
    _flood(storage, sybils, exp)
    assert len(_stored(storage)) == 64
    assert time.process_time() - t0 < 5.0


def test_a_refused_newcomer_costs_one_hash_not_one_per_stored_record(monkeypatch) -> None:
    from pulse_node.net.dht import capped_storage

    calls = [0]
    real = capped_storage.hashlib.blake2b

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(capped_storage.hashlib, "blake2b", counted)
    gate = NewcomerGate(cap=32, clock=lambda: 100.0)
    storage = CappedStorage(gate)
    sybils = _ids(532)
    _flood(storage, sybils, time.time() + 600)
    assert len(_stored(storage)) == 32
    assert calls[0] <= len(sybils)  # each key drawn once in the epoch, however often it is compared


def test_a_newcomer_the_gate_would_refuse_is_refused_before_its_signature_is_checked(monkeypatch) -> None:
    """With the newcomers' share full, a record whose draw loses is refused by the validator for
    the price of a hash: no Ed25519 verification (a 1,000-key flood cost every DHT worker one per
    record). A winner, a member and a stored newcomer's refresh are still checked in full."""
    import dataclasses
    from types import SimpleNamespace

    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.validation import DHTRecord

    from pulse_node.chain.peer import PeerRecord
    from pulse_node.net.dht.capped_storage import refuse_before_signature
    from pulse_node.net.dht.records import dht_key
    from pulse_node.net.dht.validator import PulseRecordValidator, peer_id_of

    run = "unit"
    key = DHTID.generate(source=dht_key(run, "peers"))
    gate = NewcomerGate(cap=4, salt=b"k" * 16, clock=lambda: 500.0)
    storage, cache = CappedStorage(gate), CappedStorage(gate)
    idents = [Identity.generate() for _ in range(40)]
    member = Identity.generate()
    gate.members = frozenset({peer_id_of(member)})
    me = PulseRecordValidator(run, Identity.generate())
    me.precheck = refuse_before_signature(SimpleNamespace(protocol=SimpleNamespace(storage=storage, cache=cache)), gate)
    checked: list[str] = []
    real = PulseRecordValidator._check_signature
    monkeypatch.setattr(PulseRecordValidator, "_check_signature",
                        staticmethod(lambda rec, pid: checked.append(pid) or real(rec, pid)))

    def record(ident: Identity) -> DHTRecord:
        pid = peer_id_of(ident)
        body = PeerRecord(role="inference", peer_id=pid, session="ab" * 16, updated_at=time.time(), version=1,
                          wire_maddrs=[f"/ip4/127.0.0.1/tcp/5000/p2p/{pid}"], node_key=ident.public_key_hex)
        raw = DHTRecord(key.to_bytes(), DHTProtocol.serializer.dumps(pid),
                        DHTProtocol.serializer.dumps(body.model_dump()), time.time() + 30)
        return dataclasses.replace(raw, value=PulseRecordValidator(run, ident).sign_value(raw))

    by_draw = sorted(idents, key=lambda i: gate.draw(peer_id_of(i)))
    stored, winner, losers = by_draw[:3] + [by_draw[4]], by_draw[3], by_draw[5:]
    for ident in stored:  # the share fills
        assert me.validate(record(ident))
        assert storage.store_subkey(key, peer_id_of(ident), b"v", time.time() + 30)
    checked.clear()
    assert not any(me.validate(record(i)) for i in losers)  # worse than every stored newcomer
    assert checked == [] and gate.refused == len(losers)
    assert me.validate(record(winner)) and me.validate(record(member))  # these are checked in full
    assert me.validate(record(stored[0]))  # and a stored newcomer's refresh
    assert checked == [peer_id_of(winner), peer_id_of(member), peer_id_of(stored[0])]


def test_a_replica_answer_keeps_members_records_beside_a_newcomer_this_node_would_not_store() -> None:
    """Issue 34 item 2: one replica's answer (a dictionary) holding a member's record is valid;
    adding a validly signed newcomer this node would not store (its share is full and the draw
    loses) made hivemind refuse the whole answer, the member's record with it. Now the newcomer
    alone is dropped from the answer. A store of such a dictionary keeps the member's too."""
    from types import SimpleNamespace

    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.validation import CompositeValidator, DHTRecord

    from pulse_node.chain.peer import PeerRecord
    from pulse_node.net.dht.capped_storage import cap_node_storage, refuse_before_signature
    from pulse_node.net.dht.records import dht_key
    from pulse_node.net.dht.validator import PulseRecordValidator, peer_id_of

    run = "unit"
    key = DHTID.generate(source=dht_key(run, "peers"))
    gate = NewcomerGate(cap=2, salt=b"r" * 16, clock=lambda: 700.0)
    member, *others = [Identity.generate() for _ in range(12)]
    gate.members = frozenset({peer_id_of(member)})
    proto = DHTProtocol(_initialized_with_create=True)  # this node's protocol, as hivemind makes it
    validator = PulseRecordValidator(run, Identity.generate())
    proto.record_validator = CompositeValidator([validator])
    proto.storage, proto.cache = CappedStorage(gate), CappedStorage(gate)
    node = SimpleNamespace(protocol=proto)
    cap_node_storage(node, gate)  # what the DHT worker does to its node
    validator.precheck = refuse_before_signature(node, gate)
    exp = time.time() + 30

    def signed(ident: Identity) -> tuple[str, bytes]:
        pid = peer_id_of(ident)
        body = PeerRecord(role="inference", peer_id=pid, session="cd" * 16, updated_at=time.time(), version=1,
                          wire_maddrs=[f"/ip4/127.0.0.1/tcp/5000/p2p/{pid}"], node_key=ident.public_key_hex)
        raw = DHTRecord(key.to_bytes(), DHTProtocol.serializer.dumps(pid),
                        DHTProtocol.serializer.dumps(body.model_dump()), exp)
        return pid, PulseRecordValidator(run, ident).sign_value(raw)

    by_draw = sorted(others, key=lambda i: gate.draw(peer_id_of(i)))
    for ident in by_draw[:2]:  # the newcomers' share fills with the best draws
        assert proto.storage.store_subkey(key, *signed(ident), exp)
    answer = DictionaryDHTValue()
    answer.store(*signed(member), exp)
    assert proto._validate_dictionary(key.to_bytes(), answer)
    newcomer = by_draw[-1]  # validly signed; its draw loses to every stored newcomer
    answer.store(*signed(newcomer), exp)
    assert proto._validate_dictionary(key.to_bytes(), answer)  # the answer stands ...
    assert {k for k, _ in answer.items()} == {peer_id_of(member)}  # ... without the newcomer
    forged = DictionaryDHTValue()
    forged.store(peer_id_of(others[0]), signed(member)[1], exp)  # a member's value under another key
    forged.store(*signed(member), exp)
    assert proto._validate_dictionary(key.to_bytes(), forged)
    assert {k for k, _ in forged.items()} == {peer_id_of(member)}
