"""A role survives what it did not expect (issue 34): an exception no check anticipated while
handling one peer's data refuses that data, strikes the sender, is logged once with the peer
named, and the node goes on; a boundary that keeps failing the same way backs off; the test
suite fails on any such exception it did not ask for (``peers/contain.py``,
``testing/contain_guard.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.config import InferenceConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus
from pulse_node.errors import IntegrityError
from pulse_node.net.wire.serving import store_resolver
from pulse_node.peers.contain import BACKOFF_S, BURST, Containment
from pulse_node.peers.outcomes import Unexpected
from pulse_node.testing.adversaries import announce, peer_id
from pulse_node.testing.failpoints import FailAt, InjectedBug
from pulse_node.testing.memory import MemoryHub


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    from test_chain_catchup_producer import fill

    store = fill(tmp_path_factory.mktemp("served") / "store", 15, start=14)  # version 14, and the patch to 15
    store.close()
    return store.root


def test_a_bug_in_a_fetched_patch_strikes_its_provider_and_the_node_takes_it_from_another(
        served, tmp_path, contained, caplog) -> None:
    from test_chain_synth import TRAINER
    from test_node_sync_bounds import _syncer

    hub = MemoryHub()
    trainer = announce(hub, TRAINER, store_resolver(served), role="trainer", version=15, lowest=14)
    relay = announce(hub, Identity.generate(), store_resolver(served), role="inference", version=15, lowest=14)
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    sync.failpoints = FailAt("received", error=InjectedBug)  # the first patch received hits "a bug"
    before = contained.total
    try:
        with caplog.at_level(logging.WARNING, logger="pulse.contain"):
            sync.step([trainer, relay])
        assert sync.record is not None and sync.record.version == 15, "the node did not go on"
        (struck,) = [p for p in (trainer.peer_id, relay.peer_id) if sync.book.strikes[p]]
        assert sync.book.strikes[struck] == 1 and contained.total == before + 1
        assert [r for r in caplog.records if struck[:16] in r.getMessage()], "the log does not name the peer"
    finally:
        sync.close()


def _context(tmp_path, hub: MemoryHub) -> RoleContext:
    cfg = InferenceConfig.model_validate({"data_dir": str(tmp_path / "me")})
    store = VersionStore(tmp_path / "me" / "store")
    return RoleContext(cfg=cfg, identity=Identity.generate(), store=store, transport=hub.join("me", store_resolver(store.root)),
                       status=NodeStatus(role="inference", peer_id="me", run_id=cfg.run_id))


def test_a_pushed_event_whose_handling_breaks_is_refused_and_the_next_one_handled(tmp_path, contained) -> None:
    hub, bad, good = MemoryHub(), Identity.generate(), Identity.generate()
    ctx = _context(tmp_path, hub)
    taken: list[str] = []

    def handle(sender: str, data: bytes) -> None:
        if data == b"boom":
            raise KeyError("a decoder nobody finished")
        if data == b"lie":
            raise IntegrityError("a typed refusal: the handler judged it")
        taken.append(sender)

    before = contained.total
    try:
        for ident, body in ((bad, b"boom"), (good, b"lie"), (good, b"fine")):
            hub.join(peer_id(ident), lambda request: None).push(
                hub.records["me"] if "me" in hub.records else _me(hub), "head", body, timeout=5.0)
        ctx.take_events({"head": handle}, wait_s=1.0)
        assert taken == [peer_id(good)], "the node did not go on past the broken input"
        assert ctx.book.strikes[peer_id(bad)] == 1 and not ctx.book.strikes[peer_id(good)]
        counters = ctx.status.snapshot().counters
        assert (counters.rejected, counters.unexpected) == (2, 1) and contained.total == before + 1
    finally:
        ctx.store.close()


def _me(hub: MemoryHub):
    from pulse_node.chain.peer import PeerStatus
    from pulse_node.testing.memory import announced

    return announced("me", PeerStatus(role="inference"))


def test_a_boundary_that_keeps_failing_the_same_way_backs_off_instead_of_striking_everyone(contained) -> None:
    now = [0.0]
    c = Containment(clock=lambda: now[0])

    def bug() -> None:
        raise ZeroDivisionError("the same bug, whoever sends")

    got = [c.run(f"peer-{i}", bug, what="pushed loco") for i in range(BURST)]
    assert all(isinstance(g, Unexpected) and g.struck for g in got)
    skipped = c.run("peer-x", lambda: "fine", what="pushed loco")
    assert isinstance(skipped, Unexpected) and not skipped.struck, "no back-off after a burst"
    assert c.run("peer-x", lambda: "fine", what="pushed head") == "fine", "another boundary backed off too"
    now[0] += BACKOFF_S
    assert c.run("peer-x", lambda: "fine", what="pushed loco") == "fine"
    for i in range(BURST):
        c.run(f"peer-{i}", bug, what="pushed loco")
    now[0] += BACKOFF_S  # the second burst backs off twice as long
    assert isinstance(c.run("peer-x", lambda: "fine", what="pushed loco"), Unexpected)
    now[0] += BACKOFF_S
    assert c.run("peer-x", lambda: "fine", what="pushed loco") == "fine"
    assert c.failures == 2 * BURST and c.skipped == 2


def test_the_suite_fails_on_a_contained_exception_it_did_not_ask_for(pytester, contained, monkeypatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the inner run needs none of them
    pytester.makepyfile(test_inner="""
        from pulse_node.peers.contain import Containment

        def _bug():
            raise RuntimeError("hidden by production")

        def test_hidden():
            Containment().run("peer", _bug, what="pushed head")

        def test_asked(contained):
            Containment().run("peer", _bug, what="pushed head")
    """)
    result = pytester.runpytest_inprocess("-p", "pulse_node.testing.contain_guard", "-q")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*1 unexpected exception(s) contained*hidden by production*"])
