"""Hostile peers: a peer serving forged versions is rejected, counted and then ignored.

One honest trainer and one inference node that trusts only that trainer's key run on the
in-memory transport next to a rogue peer that claims to hold a far newer version and serves
records signed by its own key, and garbage patches. The inference node must follow the honest chain
only, count the rejections, and stop asking the rogue.
"""

from __future__ import annotations

import pytest
from helpers import node_version, read_status, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.record import encode_record
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.testing.faults import ForgedChain, start_forging_peer
from pulse_node.vocab import DEFAULT_RUN_ID


@pytest.mark.slow
def test_forged_versions_are_rejected_and_rogue_ignored(inprocess_swarm, node_cfg, tmp_path):
    trainer_dir = tmp_path / "t1"
    key = Identity.load_or_create(trainer_dir / "identity.key").public_key_hex
    start_forging_peer(inprocess_swarm.hub, tmp_path / "rogue", run_id=DEFAULT_RUN_ID)
    t1 = inprocess_swarm.start("trainer-a", node_cfg(TrainerConfig, "t1"))
    i1 = inprocess_swarm.start("infer-a", node_cfg(InferenceConfig, "i1", chain={"trusted_trainers": [key]}))
    wait_for(lambda: node_version(i1) >= 3, timeout=240, what="inference node at version 3")
    applied = read_status(i1).history
    published = lambda: {h.version: h.state_hash for h in read_status(t1).history}  # noqa: E731
    wait_for(lambda: {h.version for h in applied} <= set(published()), timeout=10, what="trainer status")
    trainer = published()
    assert applied and all(trainer[h.version] == h.state_hash for h in applied)
    assert max(h.version for h in applied) < 1000
    # The rogue is a peer without standing: it is asked only where members cannot serve
    # (peers/standing.py), so whether it is asked for a file depends on timing. What it pushes
    # is always looked at: each forged head it pushes is rejected and strikes it, the third bans it.
    rogue, forged = inprocess_swarm.hub.join("rogue", lambda request: None), ForgedChain(DEFAULT_RUN_ID)
    me = next(p for p in inprocess_swarm.hub.records.values() if p.role == "inference" and p.peer_id != "rogue")
    for n in range(1, 4):
        rogue.push(me, "head", encode_record(forged.record(5000 + n)), timeout=5)
        wait_for(lambda n=n: read_status(i1).inference.strikes.get("rogue", 0) >= n, timeout=60, what=f"strike {n} of the rogue")
    status = read_status(i1)
    assert status.inference.bans.get("rogue", 0) >= 1 and status.counters.rejected >= 3 and node_version(i1) < 1000


def test_forged_head_announcement_is_no_hint_and_strikes_its_sender(tmp_path):
    from pulse_node.chain.record import encode_record
    from pulse_node.chain.store import VersionStore
    from pulse_node.config import NetConfig
    from pulse_node.daemon.transport import Event
    from pulse_node.inference.syncer import VersionSync
    from pulse_node.peers.book import PeerBook
    from pulse_node.peers.trainerset import TrainerSet
    from pulse_node.testing.faults import ForgedChain
    from pulse_node.testing.memory import MemoryHub

    trainer = Identity.generate()
    honest, forged = ForgedChain("run", trainer), ForgedChain("run")  # signed by the trainer / by nobody trusted
    store = VersionStore(tmp_path / "store")
    sync = VersionSync(store, MemoryHub().join("me", lambda request: None),
                       PeerBook(TrainerSet(run_id="run", keys=[trainer.public_key_hex])), net=NetConfig())
    try:
        sync.take_events([Event("head", "rogue", encode_record(forged.record(50)), 0.0),
                          Event("head", "peer", encode_record(honest.record(7)), 0.0)])
        sync.step([])
        assert sync.hints == {"peer": 7} and sync.target() == 7  # the forged v50 is no target
        assert sync.book.strikes["rogue"] == 1 and "peer" not in sync.book.strikes
    finally:
        sync.close()
        store.close()


def test_bans_end_and_grow_so_a_flaky_honest_peer_comes_back():
    """``max_strikes`` lies ban a sender for ``ban_s``; each further ban doubles, capped."""
    from pulse_node.peers.book import PeerBook
    from pulse_node.peers.outcomes import Lied
    from pulse_node.peers.strikes import Strikes
    from pulse_node.peers.trainerset import TrainerSet

    now = [1000.0]
    book = PeerBook(TrainerSet(run_id="r"), strikes=Strikes(max_strikes=3, ban_s=60.0, max_ban_s=200.0,
                                                            clock=lambda: now[0]))
    for _ in range(2):
        book.judge("peer", Lied())
    assert not book.ignored("peer")
    book.judge("peer", Lied())
    assert book.ignored("peer") and book.bans["peer"] == 1
    now[0] += 61
    assert not book.ignored("peer"), "a served ban must end"
    for expected_ban in (120.0, 200.0, 200.0):  # doubled, then capped
        for _ in range(3):
            book.judge("peer", Lied())
        now[0] += expected_ban - 1
        assert book.ignored("peer")
        now[0] += 2
        assert not book.ignored("peer")
    assert book.strikes["peer"] == 12 and book.rejected == 12 and not book.ignored("other")


@pytest.mark.slow
def test_an_admitted_trainer_is_followed_by_nodes_that_trust_only_the_admitting_key(inprocess_swarm, node_cfg, tmp_path):
    """The operator's key A (offline here) signs trainer B into the set; an inference node that
    is configured with A's key alone learns B's admission from B's discovery record, verifies it
    against A, and follows B's chain; its status says it is keyed, not open."""
    from pulse_node.chain.admission import Admission

    operator = Identity.generate()
    b_key = Identity.load_or_create(tmp_path / "tb" / "identity.key").public_key_hex
    admission = tmp_path / "admission.bin"
    admission.write_bytes(Admission(DEFAULT_RUN_ID, b_key).endorse(operator).encode())
    keys = {"trusted_trainers": [operator.public_key_hex]}
    tb = inprocess_swarm.start("trainer-b", node_cfg(TrainerConfig, "tb", chain={**keys, "admission_file": str(admission)}))
    i1 = inprocess_swarm.start("infer-a", node_cfg(InferenceConfig, "i1", chain=keys))
    wait_for(lambda: node_version(i1) >= 2, timeout=240, what="the inference node at version 2")
    held = {h.version: h.state_hash for h in read_status(i1).history}
    # the trainer's status file is written every 0.5 s: it may not name the newest version yet
    wait_for(lambda: set(held) <= {h.version for h in read_status(tb).history}, timeout=30, what="the trainer's status")
    published = {h.version: h.state_hash for h in read_status(tb).history}
    assert all(published[v] == h for v, h in held.items())
    assert read_status(i1).trust_mode == "keys" and not read_status(i1).counters.rejected
