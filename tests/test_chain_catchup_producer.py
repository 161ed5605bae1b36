"""Catch-up production on demand: exact bytes, fail-fast refusals, one at a time, bounded cache,
pruning with the store's retention, serving through the in-memory transport, and a syncer that
recovers k versions with one catch-up patch (or falls back to patches when nobody can make it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from helpers import wait_for
from test_chain_synth import TRAINER, adam_like_chain, build_chain, states_equal, verified

from pulse_node.chain.catchup import check_catchup
from pulse_node.chain.catchup_producer import CatchupProducer
from pulse_node.chain.layout import catchup_path, prune_catchups
from pulse_node.chain.peer import PeerRecord, PeerStatus, Serves
from pulse_node.chain.store import VersionStore
from pulse_node.codec.patch import apply_patch, make_patch
from pulse_node.config import NetConfig
from pulse_node.errors import BusyError, GapError, WireError
from pulse_node.inference.syncer import VersionSync
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.protocol import CatchupRequest
from pulse_node.net.wire.serving import resolve, store_resolver
from pulse_node.peers.book import PeerBook
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.testing.memory import MemoryHub, announced

STATES = adam_like_chain(5, 24)
CHAIN = build_chain(STATES, anchor_every=10)


def fill(root: Path, upto: int, start: int = 0) -> VersionStore:
    """A writer store holding versions ``start..upto`` (``start`` as an anchor or current)."""
    store = VersionStore(root, trusted_signers={TRAINER.public_key_hex})
    for v in range(start, upto + 1):
        record, patch = CHAIN[v]
        if v == start and not record.is_anchor:
            store.put_current(verified(record, state=STATES[v]))
        if record.is_anchor:
            store.put_anchor(verified(record, state=STATES[v]))
        if patch is not None and v > start:
            store.put_patch(verified(record, patch))
    return store


@pytest.fixture
def served(tmp_path: Path):
    store = fill(tmp_path / "store", 24)
    yield tmp_path / "store"
    store.close()


def test_makes_an_exact_catchup_bound_to_both_records_and_caches_it(served: Path) -> None:
    producer = CatchupProducer(served, wait_s=60)
    path = producer.request(3, 17)
    patch = path.read_bytes()
    check_catchup(patch, from_record=CHAIN[3][0], to_record=CHAIN[17][0])
    assert states_equal(apply_patch(STATES[3], patch, verify=True), STATES[17])
    assert producer.request(3, 17) == path and producer.made == 1  # served from the cache
    # the next head is built from the cached target state (one patch), bytes still exact
    patch = producer.request(5, 18).read_bytes()
    assert states_equal(apply_patch(STATES[5], patch, verify=True), STATES[18])


def test_requests_it_cannot_serve_fail_fast_and_write_nothing(served: Path) -> None:
    producer = CatchupProducer(served, max_gap=20, wait_s=60)
    for base, target, why in [(10, 25, "does not hold v25"), (0, 21, "spans 21 versions")]:
        t0 = time.monotonic()
        with pytest.raises(GapError, match=why):
            producer.request(base, target)
        assert time.monotonic() - t0 < 1.0
    late = fill(served.parent / "from15", 24, start=15)  # a node that holds v15.. only
    with pytest.raises(GapError, match="cannot rebuild base v12"):
        CatchupProducer(late.root, wait_s=60).request(12, 20)
    late.close()
    assert not list(served.glob("catchup/*")) and not list(late.root.glob("catchup/*"))


class GatedProducer(CatchupProducer):
    """Makes a catch-up only once the test opens the gate (so 'still making' is deterministic)."""

    def __init__(self, root: Path, **kw) -> None:
        super().__init__(root, **kw)
        self.gate = threading.Event()

    def _make(self, base: int, target: int) -> bytes:
        assert self.gate.wait(30)
        return super()._make(base, target)


def test_one_at_a_time_busy_until_made_then_served(served: Path) -> None:
    producer = GatedProducer(served, wait_s=0.05)
    with pytest.raises(BusyError, match="still making catch-up v3 -> v17"):
        producer.request(3, 17)
    with pytest.raises(BusyError, match="making catch-up v3 -> v17"):
        producer.request(4, 17)  # another pair waits for its turn: refused at once
    producer.gate.set()
    wait_for(lambda: catchup_path(served, 3, 17).exists(), timeout=30, what="the catch-up file")
    assert producer.request(3, 17) == catchup_path(served, 3, 17)
    producer.wait_s = 30.0
    assert producer.request(4, 17).exists()  # the producer is free again


def test_cache_is_bounded_and_pruned_with_the_store(tmp_path: Path) -> None:
    store = fill(tmp_path / "s", 24)
    producer = CatchupProducer(store.root, wait_s=60)
    for base, target in [(2, 12), (3, 14), (4, 19), (5, 24)]:
        producer.request(base, target)
    (store.root / "catchup" / ".5-24.patch.1.2.tmp").write_bytes(b"partial")
    removed = prune_catchups(store.root, keep_files=3, keep_bytes=1 << 30)
    assert [p.name for p in removed] == ["2-12.patch"]  # oldest target goes first; temp files stay
    sizes = {p.name: p.stat().st_size for p in (store.root / "catchup").glob("*.patch")}
    prune_catchups(store.root, keep_files=3, keep_bytes=sizes["5-24.patch"] + sizes["4-19.patch"])
    assert sorted(p.name for p in (store.root / "catchup").glob("*.patch")) == ["4-19.patch", "5-24.patch"]
    store.retain(keep_versions=3, keep_anchors=0)  # keeps 20..24 (from anchor v20): v19 goes
    assert sorted(p.name for p in (store.root / "catchup").glob("*.patch")) == ["5-24.patch"]
    store.discard_from(23)  # a fork: a catch-up to a discarded version goes with it
    assert not list((store.root / "catchup").glob("*.patch"))
    store.close()
    VersionStore(store.root, trusted_signers=None).close()  # reopening recovers: temp files removed
    assert not list((store.root / "catchup").iterdir())


def test_lowest_served_is_where_the_patches_to_the_head_start(tmp_path: Path) -> None:
    store = fill(tmp_path / "s", 24)
    assert store.lowest_served() == 1
    store.retain(keep_versions=3, keep_anchors=1)
    assert store.lowest_served() == 21  # the anchor v20's own patch is gone
    store.close()
    caught = fill(tmp_path / "c", 18, start=18)  # caught up to v18 with a catch-up: no patch of v18
    assert caught.lowest_served() == 18
    caught.close()


def test_memory_transport_serves_made_catchups_and_says_why_not(served: Path, tmp_path: Path) -> None:
    assert resolve(served, CatchupRequest(base=3, target=17)) == catchup_path(served, 3, 17)
    assert resolve(served, CatchupRequest(base=17, target=3)) is None
    hub = MemoryHub()
    hub.join("server", store_resolver(served, producer=CatchupProducer(served, wait_s=60)))
    client = hub.join("client", lambda request: None)
    server = announced("server", PeerStatus(role="inference"))
    size = client.fetch(server, wp.CatchupRequest(base=3, target=17), tmp_path / "got", timeout=5)
    assert size == catchup_path(served, 3, 17).stat().st_size
    with pytest.raises(WireError, match="cannot rebuild base|does not hold v30"):
        client.fetch(server, wp.CatchupRequest(base=3, target=30), tmp_path / "got", timeout=5)


# ---- the requesting side -------------------------------------------------------------------

def _syncer(tmp_path: Path, hub: MemoryHub, *, at: int, **kw) -> VersionSync:
    store = fill(tmp_path / "lagging", at, start=at)
    transport = hub.join("lagging", lambda request: None)
    return VersionSync(store, transport, _trust(), net=NetConfig(), **kw)


def _trust() -> PeerBook:
    return PeerBook(TrainerSet(run_id="run-s", keys=[TRAINER.public_key_hex]))


def _serve(hub: MemoryHub, root: Path, producer: CatchupProducer | None, version: int) -> PeerRecord:
    hub.join("holder", store_resolver(root, producer=producer))
    return announced("holder", PeerStatus(role="inference", version=version,
                                         serves=Serves(lowest=1, highest=version, anchors=[0, 10, 20]),
                                         node_key=TRAINER.public_key_hex))


def _trainer(version: int) -> PeerRecord:
    return announced("trainer", PeerStatus(role="trainer", version=version, node_key=TRAINER.public_key_hex))


def test_syncer_k_behind_recovers_with_one_catchup_patch(served: Path, tmp_path: Path) -> None:
    hub = MemoryHub()
    peers = [_serve(hub, served, CatchupProducer(served, wait_s=60), 24), _trainer(24)]
    sync = _syncer(tmp_path, hub, at=14)
    applied = sync.step(peers)
    assert [r.version for r in applied] == [24] and sync.counters.catchups == 1
    assert states_equal(sync.state, STATES[24]) and sync.store.head().version == 24
    summed = sum(r.patch_bytes for r, _ in CHAIN[15:25])
    assert sync.counters.catchup_bytes_total < 0.6 * summed, (sync.counters.catchup_bytes_total, summed)
    assert sync.counters.patch_bytes_total == 0
    sync.close()


def test_syncer_waits_for_a_busy_producer_then_uses_its_catchup(served: Path, tmp_path: Path) -> None:
    hub = MemoryHub()
    producer = GatedProducer(served, wait_s=0.01)
    peers = [_serve(hub, served, producer, 24), _trainer(24)]
    sync = _syncer(tmp_path, hub, at=14)
    assert sync.step(peers) == [] and sync.counters.patch_bytes_total == 0  # busy: no patches fetched
    producer.gate.set()
    wait_for(lambda: catchup_path(served, 14, 24).exists(), timeout=30, what="the catch-up file")
    assert [r.version for r in sync.step(peers)] == [24] and sync.counters.catchups == 1
    sync.close()


def test_syncer_falls_back_to_patches_when_nobody_makes_catchups(served: Path, tmp_path: Path) -> None:
    hub = MemoryHub()
    peers = [_serve(hub, served, None, 24), _trainer(24)]  # an old peer: serves files, makes none
    sync = _syncer(tmp_path, hub, at=14)
    applied = sync.step(peers)
    assert [r.version for r in applied] == list(range(15, 25)) and sync.counters.catchups == 0
    assert states_equal(sync.state, STATES[24])
    sync.close()


def test_syncer_rejects_a_lying_catchup_and_recovers_with_patches(served: Path, tmp_path: Path) -> None:
    """A cached file whose header names the right hashes but whose bytes make v23, not v24."""
    forged = make_patch(STATES[14], STATES[23], base_hash=CHAIN[14][0].state_hash, new_hash=CHAIN[24][0].state_hash)
    catchup_path(served, 14, 24).parent.mkdir(parents=True, exist_ok=True)
    catchup_path(served, 14, 24).write_bytes(forged)
    hub = MemoryHub()
    peers = [_serve(hub, served, CatchupProducer(served, wait_s=60), 24), _trainer(24)]
    sync = _syncer(tmp_path, hub, at=14)
    applied = sync.step(peers)
    assert sync.counters.catchups == 0 and sync.book.strikes["holder"] == 1
    assert [r.version for r in applied] == list(range(15, 25)) and states_equal(sync.state, STATES[24])
    sync.close()


def test_syncer_keeps_its_version_rather_than_reload_an_older_anchor(served: Path, tmp_path: Path) -> None:
    """One pass that fails on a version only a pushed head announced (the DHT lags behind): the
    quick gap recovery must not move the node back to an older anchor (a full download for
    nothing); only a long stall may (the way off a fork)."""
    from pulse_node.chain.record import encode_record
    from pulse_node.daemon.transport import Event
    from pulse_node.testing.faults import FaultRates, FaultyTransport

    hub = MemoryHub()
    peers = [_serve(hub, served, None, 14), _trainer(14)]  # the DHT still says 14 ...
    patches_lost = FaultyTransport(hub.join("lagging", lambda request: None),
                                   FaultRates(drop=1.0, only_kinds=("patch",)), seed=0)
    sync = VersionSync(fill(tmp_path / "lagging", 14, start=14), patches_lost,
                       _trust(), net=NetConfig())
    sync.take_events([Event("head", "holder", encode_record(CHAIN[15][0]), 0.0)])  # ... a push says 15
    assert sync.step(peers) == [] and sync.counters.gaps == 1
    assert sync.record.version == 14 and sync.counters.anchor_loads == 0
    sync.close()
