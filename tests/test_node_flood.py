"""Floods of free identities (issue 21, items 1 and 4): fresh keys announcing attractive versions
and anchors at addresses that never answer are tried last and a fixed number at a time, so an
inference node syncs from the trainer set as fast with 500 of them as with one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from test_chain_catchup_producer import fill
from test_chain_synth import TRAINER
from test_node_sync_bounds import _syncer

from pulse_node.chain.peer import PeerStatus, Serves
from pulse_node.errors import PeerUnavailable
from pulse_node.net.wire.serving import store_resolver
from pulse_node.peers.standing import FETCH_UNKNOWN
from pulse_node.testing.adversaries import announce, peer_id
from pulse_node.testing.memory import MemoryHub


class Silent:
    """A provider at an address that never answers: every request fails (counted)."""

    def __init__(self) -> None:
        self.asked = 0
        self.lock = threading.Lock()

    def __call__(self, request: object) -> None:
        with self.lock:
            self.asked += 1
        raise PeerUnavailable("no answer")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    store = fill(tmp_path_factory.mktemp("served") / "store", 12)
    store.close()
    return store.root


def _flood(hub: MemoryHub, silent: Silent, n: int, **serves) -> None:
    for i in range(n):
        hub.join(f"sybil-{i:04d}", silent).publish(PeerStatus(role="inference", version=10**6,
                                                              serves=Serves(lowest=0, highest=10**6, **serves)))


@pytest.mark.parametrize("n", [1, 500])
def test_fresh_keys_with_attractive_versions_cost_no_fetch_while_the_trainer_serves(served, tmp_path, n) -> None:
    hub, silent = MemoryHub(), Silent()
    announce(hub, TRAINER, store_resolver(served), role="trainer", version=12, lowest=1)
    _flood(hub, silent, n)
    sync = _syncer(tmp_path, hub, at=4, catchup_min_gap=0)
    try:
        for _ in range(4):
            peers = list(hub.records.values())
            sync.step(peers)
            assert len(sync.providers(12, peers, rank=0)) <= 1 + FETCH_UNKNOWN  # the trainer, a few newcomers
        assert sync.record is not None and sync.record.version == 12
        assert silent.asked == 0
        assert sync.providers(12, list(hub.records.values()), rank=0)[0].peer_id == peer_id(TRAINER)
    finally:
        sync.close()


def test_a_provider_that_fails_is_demoted_behind_untried_newcomers(served, tmp_path) -> None:
    """Without the trainer, at most ``FETCH_UNKNOWN`` silent newcomers are tried per version
    and pass, each failure demotes its peer, and 500 of them cost what 2 do."""
    hub, silent = MemoryHub(), Silent()
    _flood(hub, silent, 500)
    sync = _syncer(tmp_path, hub, at=4, catchup_min_gap=0)
    try:
        sync.head = sync.record  # pretend a verified target exists one ahead
        peers = list(hub.records.values())
        got = sync._fetch_version(5, sync.providers(5, peers, rank=0))
        assert got is None and silent.asked == FETCH_UNKNOWN
        failed = {p for p, m in sync.book.standing.marks.items() if m.fail_streak}
        assert len(failed) == FETCH_UNKNOWN
        assert not failed & {p.peer_id for p in sync.providers(5, peers, rank=0)}  # the next tries are others
    finally:
        sync.close()


def test_fake_anchors_do_not_use_up_a_fresh_nodes_tries(served, tmp_path) -> None:
    """Fresh keys announcing anchors cost at most ``FETCH_UNKNOWN`` tries of an anchor
    recovery; the trainer's anchor is tried first."""
    hub, silent = MemoryHub(), Silent()
    _flood(hub, silent, 200, anchors=[10, 11, 12])
    announce(hub, TRAINER, store_resolver(served), role="trainer", version=12, lowest=1, anchors=(10,))
    sync = _syncer(tmp_path, hub, at=4, catchup_min_gap=0)
    try:
        offers_tried = []
        real = sync.fetch.record

        def spy(peer, version):
            offers_tried.append(peer.peer_id)
            return real(peer, version)

        sync.fetch.record = spy  # type: ignore[method-assign]
        sync.recovery.recover_from_anchor(list(hub.records.values()), 12)
        assert offers_tried[0] == peer_id(TRAINER)
        assert sum(p.startswith("sybil") for p in offers_tried) <= FETCH_UNKNOWN
    finally:
        sync.close()


@pytest.mark.parametrize("n", [1, 1000])
def test_a_nodes_view_holds_the_same_honest_peers_with_one_or_a_thousand_fresh_keys(tmp_path, n) -> None:
    """``RoleContext.peers``: members, peers with standing, then a fixed number of newcomers;
    what a record says of itself (version, role) moves nobody in."""
    from pulse_node.chain.identity import Identity
    from pulse_node.chain.store import VersionStore
    from pulse_node.config import InferenceConfig
    from pulse_node.daemon.context import RoleContext
    from pulse_node.daemon.status import NodeStatus
    from pulse_node.peers.outcomes import Delivered
    from pulse_node.peers.standing import VIEW_UNKNOWN

    hub, me, trainer = MemoryHub(), Identity.generate(), Identity.generate()
    for pid, role in ((peer_id(trainer), "trainer"), ("worker", "inference")):
        hub.join(pid, lambda request: None).publish(PeerStatus(role=role, version=3))
    _flood(hub, Silent(), n)
    store = VersionStore(tmp_path / "store")
    cfg = InferenceConfig.model_validate({"data_dir": str(tmp_path), "chain": {"trusted_trainers": [trainer.public_key_hex]}})
    ctx = RoleContext(cfg=cfg, identity=me, store=store,
                      status=NodeStatus(role="inference", peer_id=peer_id(me), run_id="r"),
                      transport=hub.join(peer_id(me), lambda request: None))
    try:
        ctx.book.judge("worker", Delivered())
        view = [p.peer_id for p in ctx.peers()]
        assert view[:2] == [peer_id(trainer), "worker"] and len(view) - 2 == min(n, VIEW_UNKNOWN)
        assert ctx.transport.view.members == {peer_id(trainer)} and ctx.transport.view.standing == ("worker",)
        assert ctx.standing_report().found == n + 2
    finally:
        ctx.close()
        store.close()
