"""An inference node acts on no number a peer merely claims: a version is a target only once its
signed record is verified, every download is capped by a signed (or recomputed) size, and an
anchor is checked piece by piece so the peer that sent a bad piece, and only it, is blamed.

Peers sit on the in-memory hub under real libp2p peer ids (``testing/adversaries.py``), so a peer
announcing someone else's key is caught exactly as on the real network.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_chain_catchup_producer import CHAIN, STATES, fill
from test_chain_synth import TRAINER, states_equal

from pulse_node.chain.identity import Identity
from pulse_node.chain.record import encode_record, make_record
from pulse_node.config import NetConfig
from pulse_node.daemon.transport import Event
from pulse_node.errors import IntegrityError
from pulse_node.inference.anchor_load import load_anchor
from pulse_node.inference.syncer import VersionSync
from pulse_node.net.wire.protocol import kind_of
from pulse_node.net.wire.serving import store_resolver
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Lied
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.testing.adversaries import OVERSIZE_BYTES, LyingServer, announce, peer_id
from pulse_node.testing.faults import ForgedChain
from pulse_node.testing.memory import MemoryHub

EVE = Identity.generate()  # a peer with a fresh key: no member of the trainer set


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    store = fill(tmp_path_factory.mktemp("served") / "store", 24)
    store.close()
    return store.root


def _trust() -> PeerBook:
    return PeerBook(TrainerSet(run_id="run-s", keys=[TRAINER.public_key_hex]))


def _syncer(tmp_path: Path, hub: MemoryHub, *, at: int, **kw) -> VersionSync:
    me = Identity.generate()
    transport = hub.join(announce(hub, me, lambda request: None, role="inference").peer_id,
                         lambda request: None)
    return VersionSync(fill(tmp_path / "me", at, start=at), transport, _trust(), net=NetConfig(), **kw)


def _far_record(identity: Identity, version: int):
    """A well-formed record of ``version`` signed by ``identity`` (its parent need not exist)."""
    parent = dataclasses.replace(ForgedChain("run-s", identity).record(1), version=version - 1)
    return make_record(identity, run_id="run-s", version=version, parent=parent, state_hash="ab" * 32,
                       patch=b"p", anchor_version=0, is_anchor=False, codec="pulsesync/compact/1")


def test_claimed_versions_are_no_target_until_a_member_signed_record_is_verified(served, tmp_path) -> None:
    """Version 2,000,000 announced by a peer under the trusted trainer's key (not its own), by a
    stranger under its own key, and in a pushed head signed by the stranger move nothing; the real
    trainer's announced version does, once its record is fetched and verified. Nothing a node
    keeps grows with a claimed number."""
    hub = MemoryHub()
    stranger = Identity.generate()
    announce(hub, EVE, LyingServer(served, tmp_path / "thief", lies={}), role="trainer", version=2_000_000,
             node_key=TRAINER.public_key_hex)
    announce(hub, stranger, lambda request: None, role="trainer", version=2_000_000)
    announce(hub, TRAINER, store_resolver(served), role="trainer", version=16, lowest=1)
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    try:
        sync.take_events([Event("head", peer_id(stranger), encode_record(_far_record(stranger, 2_000_000)), 0)])
        applied = sync.step(list(hub.records.values()))
        assert [r.version for r in applied] == [15, 16] and sync.target() == 16
        assert len(sync.first_seen) <= sync.window + 1 and max(sync.hints.values()) == 16
        assert sync.book.strikes[peer_id(stranger)] == 1 and peer_id(TRAINER) not in sync.book.strikes
    finally:
        sync.close()


def test_every_download_is_capped_by_its_signed_size_and_the_liar_struck(served, tmp_path) -> None:
    """A peer holding genuine records serves oversized patches, catch-ups and records: each is
    refused before its body is read (``max_bytes`` from the signed record, or twice our dense
    size for a catch-up), the liar is struck, and the honest trainer's versions are applied."""
    hub = MemoryHub()
    liar = LyingServer(served, tmp_path / "liar", lies={"patch": "oversize", "catchup": "oversize"})
    announce(hub, EVE, liar, role="inference", version=24, lowest=1)  # inference peers are asked first
    announce(hub, TRAINER, store_resolver(served), role="trainer", version=24, lowest=1)
    sync = _syncer(tmp_path, hub, at=14)
    try:
        applied = []
        for _ in range(3):
            applied += sync.step(list(hub.records.values()))
        assert applied and applied[-1].version == 24 and states_equal(sync.state, STATES[24])
        assert sync.book.strikes[peer_id(EVE)] >= 1
        assert liar.served["patch"] + liar.served["catchup"] >= 1
        assert sync.transport.bytes_in < OVERSIZE_BYTES, "an oversized body was read"
    finally:
        sync.close()
    big_record = LyingServer(served, tmp_path / "rec", lies={"record": "oversize"})
    hub2 = MemoryHub()
    peer = announce(hub2, EVE, big_record, role="trainer", version=24)
    sync = _syncer(tmp_path / "2", hub2, at=14)
    try:
        got = sync.book.ask(peer.peer_id, lambda: sync.fetch.record(peer, 15))  # as every fetch is asked
        assert isinstance(got, Lied) and "signed record allows" in got.why
        assert sync.book.strikes[peer.peer_id] == 1
    finally:
        sync.close()


def test_a_bad_anchor_piece_blames_exactly_the_peer_that_sent_it(served, tmp_path) -> None:
    hub = MemoryHub()
    rec = CHAIN[20][0]
    honest = announce(hub, TRAINER, store_resolver(served), role="trainer", version=24, anchors=(20,))
    chunk_liar = announce(hub, EVE, LyingServer(served, tmp_path / "c", lies={"anchor": "bad_chunk"}),
                          role="inference", version=24, anchors=(20,))
    header_liar_id = Identity.generate()
    header_liar = announce(hub, header_liar_id, LyingServer(served, tmp_path / "h", lies={"anchor": "bad_header"}),
                           role="inference", version=24, anchors=(20,))
    me = hub.join("me", lambda request: None)
    book = _trust()
    # the honest peer serves the header; the data piece is asked of the chunk liar first
    loaded = load_anchor(me, book, rec, honest, [honest, chunk_liar], tmp_path, timeout=30)
    assert loaded.record == rec and loaded.state is not None and states_equal(loaded.state, STATES[20])
    assert dict(book.strikes) == {chunk_liar.peer_id: 1}
    got = book.ask(header_liar.peer_id,  # the primary's bad header is its lie, judged by whoever asked it
                   lambda: load_anchor(me, book, rec, header_liar, [header_liar, honest], tmp_path, timeout=30))
    assert isinstance(got, Lied) and "header" in got.why
    assert book.strikes[header_liar.peer_id] == 1 and honest.peer_id not in book.strikes
    unbound = CHAIN[10][0].__class__(**{**CHAIN[10][0].__dict__, "anchor_manifest": b""})
    before = me.bytes_in
    with pytest.raises(IntegrityError, match="no manifest"):
        load_anchor(me, book, unbound, honest, [honest], tmp_path, timeout=30)
    assert me.bytes_in == before, "an anchor without a signed size was downloaded"


def test_a_holder_answering_with_a_forged_or_no_record_is_struck_a_silent_one_is_not(served, tmp_path) -> None:
    """Every holder of an anchor is asked for its record of the version before it serves pieces:
    a record no member signed, or bytes that are no record, strike it (it announced the anchor
    and lied); a holder that does not have it is only not asked."""
    hub = MemoryHub()
    rec = CHAIN[20][0]
    honest = announce(hub, TRAINER, store_resolver(served), role="trainer", version=24, anchors=(20,))
    forged_file, junk_file = tmp_path / "forged.record", tmp_path / "junk.record"
    forged_file.write_bytes(encode_record(ForgedChain("run-s", EVE).record(20)))
    junk_file.write_bytes(b"\x93junk")
    honest_store = store_resolver(served)
    forger = announce(hub, EVE, lambda r: forged_file if kind_of(r) == "record" else honest_store(r),
                      role="inference", version=24, anchors=(20,))
    junker = announce(hub, Identity.generate(), lambda r: junk_file if kind_of(r) == "record" else None,
                      role="inference", version=24, anchors=(20,))
    silent = announce(hub, Identity.generate(), lambda request: None, role="inference", version=24, anchors=(20,))
    me = hub.join("me", lambda request: None)
    book = _trust()
    got = load_anchor(me, book, rec, honest, [honest, forger, junker, silent], tmp_path, timeout=30)
    assert got.state is not None and states_equal(got.state, STATES[20])
    assert dict(book.strikes) == {forger.peer_id: 1, junker.peer_id: 1}


def test_a_provider_answering_with_bytes_that_are_no_record_is_struck(served, tmp_path) -> None:
    hub = MemoryHub()
    junk_file = tmp_path / "junk.record"
    junk_file.write_bytes(b"\x93junk")
    junker = announce(hub, EVE, lambda r: junk_file, role="inference", version=24, lowest=0)
    sync = _syncer(tmp_path, hub, at=5)
    try:
        got = sync.book.ask(junker.peer_id, lambda: sync.fetch.record(junker, 6))
        assert isinstance(got, Lied) and "version 6" in got.why
        assert dict(sync.book.strikes) == {junker.peer_id: 1}
    finally:
        sync.close()


def test_banned_peers_provide_no_anchor_pieces(served, tmp_path) -> None:
    hub = MemoryHub()
    announce(hub, TRAINER, store_resolver(served), role="trainer", version=24, lowest=21, anchors=(20,))
    liar = LyingServer(served, tmp_path / "liar", lies={"anchor": "bad_chunk"})
    rogue = announce(hub, EVE, liar, role="inference", version=24, lowest=21, anchors=(20,))
    me = Identity.generate()
    transport = hub.join(announce(hub, me, lambda request: None, role="inference").peer_id,
                         lambda request: None)
    from pulse_node.chain.store import VersionStore

    sync = VersionSync(VersionStore(tmp_path / "fresh", trusted_signers={TRAINER.public_key_hex}), transport,
                       _trust(), net=NetConfig())
    try:
        for _ in range(3):
            sync.book.judge(rogue.peer_id, Lied())
        assert sync.book.ignored(rogue.peer_id)
        sync.step(list(hub.records.values()))
        assert sync.counters.anchor_loads == 1 and sync.record.version == 24
        assert liar.served == {}, "a banned peer was asked for anchor pieces"
    finally:
        sync.close()


def test_a_store_of_another_run_is_refused_with_a_clear_error(tmp_path) -> None:
    from pulse_node.errors import ConfigError

    store = fill(tmp_path / "other", 3)  # versions of run "run-s"
    with pytest.raises(ConfigError, match="holds versions of run 'run-s', not 'run-x'"):
        VersionSync(store, MemoryHub().join("me", lambda request: None),
                    PeerBook(TrainerSet(run_id="run-x", keys=[TRAINER.public_key_hex])), net=NetConfig())
    store.close()


def test_a_verified_pushed_head_is_used_not_fetched_again(served, tmp_path) -> None:
    """The record a trainer pushed (and the node verified) is the one its version is fetched
    with: from that trainer only the patch is asked for, not the record once more."""
    hub, asked = MemoryHub(), {"record": 0, "patch": 0}
    serve = store_resolver(served)

    def counting(request):
        kind = type(request).__name__.removesuffix("Request").lower()
        asked[kind] = asked.get(kind, 0) + 1
        return serve(request)

    announce(hub, TRAINER, counting, role="trainer", version=14, lowest=1)  # its record does not say 15 yet
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    try:
        sync.take_events([Event("head", peer_id(TRAINER), encode_record(CHAIN[15][0]), 0.0)])
        applied = sync.step(list(hub.records.values()))
        assert [r.version for r in applied] == [15] and states_equal(sync.state, STATES[15])
        assert asked["record"] == 0 and asked["patch"] == 1
    finally:
        sync.close()
