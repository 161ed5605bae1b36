"""Per-peer budgets on the real wire worker (``net/peers/budget.py``): three worker processes on
127.0.0.1 port 0 per test: a ``victim`` with small budgets, an ``attacker`` and an ``honest`` peer.
Waits are predicates with deadlines; every worker is stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import wait_for

from pulse_node.errors import NotFound, PeerBusy, PeerUnavailable
from pulse_node.net.peers.budget import BudgetConfig
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.client import WireClient, WireConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]  # worker processes


@contextmanager
def _trio(tmp: Path, budget: BudgetConfig, victim_store: Path | None = None) -> Iterator[tuple[WireClient, ...]]:
    """victim (with ``budget``), attacker, honest: started in parallel, stopped after."""
    stores = [victim_store or tmp / "victim", tmp / "attacker", tmp / "honest"]
    for s in stores:
        s.mkdir(parents=True, exist_ok=True)
    configs = [WireConfig(store=stores[0], budget=budget), WireConfig(store=stores[1]), WireConfig(store=stores[2])]
    with ThreadPoolExecutor(3) as pool:
        workers = list(pool.map(WireClient.start, configs))
    try:
        yield tuple(workers)
    finally:
        for w in workers:
            w.stop()


def test_slow_drip_streams_hold_only_their_share_and_honest_pushes_go_through(tmp_path: Path) -> None:
    budget = BudgetConfig(other_streams=6, streams_per_peer=4, grace_s=1.0, min_rate=256 * 1024,
                          request_burst=1000, requests_per_s=1000)
    with _trio(tmp_path, budget) as (victim, attacker, honest):
        addr = victim.info().listen_maddrs[0]
        # a push header declaring 16 MiB of rollouts, then nothing: a zero-rate drip
        drip = wp.PushRequest(v=wp.WIRE_VERSION, kind="rollouts", size=16 << 20).encode()
        stop, most_open = threading.Event(), [0]

        def attack() -> None:
            while not stop.is_set():
                attacker.probe(addr, "push", drip, timeout=8.0)

        def watch() -> None:
            while not stop.is_set():
                most_open[0] = max(most_open[0], victim.stats().streams_open["other"])
                time.sleep(0.05)

        with ThreadPoolExecutor(13) as pool:
            for _ in range(12):
                pool.submit(attack)
            pool.submit(watch)
            try:
                wait_for(lambda: victim.stats().refused.get("streams_peer", 0) >= 8, timeout=10,
                         what="the attacker's streams beyond its 4 refused")
                took = {}
                for kind, body in (("head", b"h" * 300), ("loco_decision", b"d" * 500), ("rollouts", b"r" * (1 << 20))):
                    t0 = time.monotonic()
                    honest.push(addr, kind, body, timeout=5.0)
                    took[kind] = time.monotonic() - t0
                wait_for(lambda: victim.stats().refused.get("slow", 0) >= 4, timeout=10,
                         what="the drips cut past their grace")
            finally:
                stop.set()
        got = [e.kind for e in victim.events(max_events=16, wait_s=1.0) if e.sender == honest.info().peer_id]
        refused = victim.stats().refused
    assert sorted(got) == ["head", "loco_decision", "rollouts"]
    assert max(took.values()) < 5.0, took
    assert most_open[0] <= 4 + 1, most_open  # the attacker's share, plus the honest push
    assert refused.get("streams_peer", 0) >= 8 and refused.get("slow", 0) >= 4, refused
    assert refused.get("push_share", 0) >= 1, refused  # 16 MiB declared three times fills its 48 MiB share


def test_a_full_shared_pool_evicts_the_slowest_drip_for_an_honest_push(tmp_path: Path) -> None:
    budget = BudgetConfig(other_streams=4, streams_per_peer=2, grace_s=1.0, min_rate=10.0, request_burst=1000,
                          requests_per_s=1000)  # a drip of a 30-byte header is cut only after ~4 s
    with _trio(tmp_path, budget) as (victim, attacker, honest):
        second = WireClient.start(WireConfig(store=tmp_path / "attacker"))
        try:
            addr = victim.info().listen_maddrs[0]
            drip = wp.PushRequest(v=wp.WIRE_VERSION, kind="rollouts", size=1 << 20).encode()
            with ThreadPoolExecutor(4) as pool:
                for w in (attacker, attacker, second, second):
                    pool.submit(w.probe, addr, "push", drip, timeout=5.0)
                wait_for(lambda: victim.stats().streams_open["other"] == 4, timeout=10, what="the pool full of drips")

                def pushed() -> bool:
                    try:
                        honest.push(addr, "head", b"h" * 200, timeout=3.0)
                        return True
                    except PeerUnavailable:  # within the drips' grace: refused, not evicted
                        return False

                wait_for(pushed, timeout=10, what="the honest push, evicting a drip")
                refused = victim.stats().refused
        finally:
            second.stop()
    assert refused.get("evicted", 0) >= 1 and refused.get("streams_pool", 0) >= 0, refused


def _head_flood(attacker: WireClient, addr: str, tmp: Path, n: int) -> tuple[dict[str, int], float]:
    """``n`` head-record requests one after another: how many were served, refused with ``busy``
    (after negotiation) and reset (before it); and the seconds they took."""
    outcomes = {"ok": 0, "busy": 0, "reset": 0}
    start = time.monotonic()
    for i in range(n):
        try:
            attacker.fetch(addr, wp.RecordRequest(version=None), tmp / f"a{i}", timeout=5.0)
            outcomes["ok"] += 1
        except PeerBusy:
            outcomes["busy"] += 1
        except PeerUnavailable:
            outcomes["reset"] += 1
    return outcomes, time.monotonic() - start


def test_a_request_flood_is_refused_by_the_token_bucket_and_counted(tmp_path: Path) -> None:
    rate, burst = 1.0, 10
    budget = BudgetConfig(requests_per_s=rate, request_burst=burst)
    with _trio(tmp_path, budget) as (victim, attacker, honest):
        addr = victim.info().listen_maddrs[0]
        victim.set_head(b"a signed head record")
        victim.set_members([honest.info().peer_id])
        outcomes, elapsed = _head_flood(attacker, addr, tmp_path, 60)
        for i in range(5):  # the member is served while the attacker is refused
            assert honest.fetch(addr, wp.RecordRequest(version=None), tmp_path / f"h{i}", timeout=5.0).bytes == 20
        stats = victim.stats()
    # the bucket's bound, however slow the machine made the flood: the burst, then `rate` per second
    assert burst <= outcomes["ok"] <= burst + rate * elapsed + 1, (outcomes, elapsed)
    assert outcomes["busy"] >= 60 - (burst + rate * elapsed + 1) and outcomes["busy"] >= 1, (outcomes, elapsed)
    assert outcomes["reset"] == 0  # not a newcomer (no standing named): refused after negotiation
    assert stats.refused["rate"] == outcomes["busy"] and stats.members == 1


def test_newcomers_over_their_rate_are_reset_before_negotiation(tmp_path: Path) -> None:
    """A fresh key's streams beyond the newcomers' bucket are reset by the muxer (no protocol
    negotiated, no ``busy`` written) and counted; a peer with standing is served meanwhile."""
    rate, burst = 1.0, 4
    budget = BudgetConfig(requests_per_s=rate, request_burst=burst, muzzle_s=0)  # the gate alone (no muzzle)
    with _trio(tmp_path, budget) as (victim, attacker, honest):
        addr = victim.info().listen_maddrs[0]
        victim.set_head(b"a signed head record")
        victim.set_standing([honest.info().peer_id])  # the attacker is now a newcomer
        outcomes, elapsed = _head_flood(attacker, addr, tmp_path, 40)
        for i in range(burst):  # its own bucket, untouched by the newcomers' flood
            assert honest.fetch(addr, wp.RecordRequest(version=None), tmp_path / f"h{i}", timeout=5.0).bytes == 20
        stats = victim.stats()
    # the bucket's bound; py-libp2p's identify stream on the new connection may take one token
    assert burst - 1 <= outcomes["ok"] <= burst + rate * elapsed + 1, (outcomes, elapsed)
    assert outcomes["busy"] == 0 and outcomes["reset"] == 40 - outcomes["ok"], outcomes
    assert stats.refused["rate"] == outcomes["reset"], (stats.refused, outcomes)


def test_a_newcomer_refused_too_fast_waits_instead_of_retrying_at_once(tmp_path: Path) -> None:
    """Past ``muzzle_after`` refusals within a second, the newcomer's next stream is neither
    served nor reset: it waits (its connection is not read) until its own timeout, and the
    muzzle is counted once; a peer with standing is served meanwhile."""
    budget = BudgetConfig(requests_per_s=0.5, request_burst=2, muzzle_after=6, muzzle_peer_min=6, muzzle_s=20.0)
    with _trio(tmp_path, budget) as (victim, attacker, honest):
        addr = victim.info().listen_maddrs[0]
        victim.set_head(b"a signed head record")
        victim.set_standing([honest.info().peer_id])
        for i in range(30):  # resets come back at once, until the muzzle
            if victim.stats().refused.get("muzzled"):
                break
            try:
                attacker.fetch(addr, wp.RecordRequest(version=None), tmp_path / f"a{i}", timeout=5.0)
            except PeerUnavailable:
                pass
        assert victim.stats().refused.get("muzzled") == 1
        start = time.monotonic()
        with pytest.raises(PeerUnavailable):
            attacker.fetch(addr, wp.RecordRequest(version=None), tmp_path / "held", timeout=1.5)
        waited = time.monotonic() - start
        assert honest.fetch(addr, wp.RecordRequest(version=None), tmp_path / "h", timeout=5.0).bytes == 20
        stats = victim.stats()
    assert waited >= 1.4, waited  # its own timeout, not a reset
    assert stats.refused["muzzled"] == 1 and stats.refused["rate"] >= 6, stats.refused


def _chain_store(root: Path) -> list:
    from test_chain_synth import adam_like_chain, build_chain, verified

    from pulse_node.chain.store import VersionStore

    states = adam_like_chain(5, 18)
    chain = build_chain(states, anchor_every=10)
    with VersionStore(root, trusted_signers=None) as store:
        for v, (record, patch) in enumerate(chain):
            if record.is_anchor:
                store.put_anchor(verified(record, state=states[v]))
            if patch is not None:
                store.put_patch(verified(record, patch))
    return chain


def test_catchups_for_many_pairs_are_refused_beyond_the_peers_budget_a_member_is_served(tmp_path: Path) -> None:
    from pulse_node.chain.catchup import check_catchup

    chain = _chain_store(tmp_path / "store")
    budget = BudgetConfig(catchups_per_min=2, member_factor=4)
    with _trio(tmp_path, budget, victim_store=tmp_path / "store") as (victim, attacker, honest):
        addr = victim.info().listen_maddrs[0]
        victim.set_members([honest.info().peer_id])
        made, refused = [], []
        for base in range(10, 17):
            try:
                attacker.fetch(addr, wp.CatchupRequest(base=base, target=17), tmp_path / f"a{base}", timeout=20.0)
                made.append(base)
            except NotFound as exc:  # not "busy": asking again would not help
                assert "catchup_budget" in str(exc), exc
                refused.append(base)
            except PeerBusy as exc:  # the one production at a time is still busy with another pair
                assert "making" in str(exc), exc
        attacker.fetch(addr, wp.CatchupRequest(base=made[0], target=17), tmp_path / "again", timeout=20.0)  # cached: free
        honest.fetch(addr, wp.CatchupRequest(base=3, target=17), tmp_path / "h.patch", timeout=20.0)
        check_catchup((tmp_path / "h.patch").read_bytes(), from_record=chain[3][0], to_record=chain[17][0])
        stats = victim.stats()
    assert len(made) <= 2 and len(refused) >= 5, (made, refused)
    assert stats.refused["catchup_budget"] >= 5


def test_a_refused_stream_gets_a_typed_busy_answer(tmp_path: Path) -> None:
    budget = BudgetConfig(requests_per_s=0.1, request_burst=1)
    with _trio(tmp_path, budget) as (victim, attacker, _):
        addr = victim.info().listen_maddrs[0]
        with pytest.raises(NotFound):
            attacker.fetch(addr, wp.PatchRequest(version=1), tmp_path / "p", timeout=5.0)
        with pytest.raises(PeerUnavailable, match="rate"):
            attacker.fetch(addr, wp.PatchRequest(version=1), tmp_path / "p", timeout=5.0)


def test_a_muzzled_peers_streams_wait_while_our_own_streams_to_it_proceed(tmp_path: Path) -> None:
    """Issue 34 item 4: while the attacker is muzzled, a dozen of its new streams wait (each
    until its own timeout: neither served nor reset), and this node's own fetches from the
    attacker, over the same connection, are answered at once. Before, the muzzle stopped reading
    the whole connection: past the muxer's queue of 10 new streams, our own fetch stalled too."""
    budget = BudgetConfig(requests_per_s=0.5, request_burst=2, muzzle_after=6, muzzle_peer_min=6, muzzle_s=30.0)
    with _trio(tmp_path, budget) as (victim, attacker, honest):
        addr, theirs = victim.info().listen_maddrs[0], attacker.info().listen_maddrs[0]
        victim.set_head(b"a signed head record")
        attacker.set_head(b"the attacker's head")
        victim.set_standing([honest.info().peer_id])
        for i in range(30):  # resets come back at once, until the muzzle
            if victim.stats().refused.get("muzzled"):
                break
            try:
                attacker.fetch(addr, wp.RecordRequest(version=None), tmp_path / f"a{i}", timeout=5.0)
            except PeerUnavailable:
                pass
        assert victim.stats().refused.get("muzzled") == 1

        def held(i: int) -> float:
            start = time.monotonic()
            with pytest.raises(PeerUnavailable):
                attacker.fetch(addr, wp.RecordRequest(version=None), tmp_path / f"held{i}", timeout=5.0)
            return time.monotonic() - start

        with ThreadPoolExecutor(14) as pool:
            waits = [pool.submit(held, i) for i in range(14)]
            ours = 0
            # our streams to it, while its streams wait: one every 0.2 s at most (its rate limit
            # would answer a tight loop "busy" after 50 requests in a second)
            while True:
                got = victim.fetch(theirs, wp.RecordRequest(version=None), tmp_path / f"ours{ours}", timeout=2.0)
                assert got.bytes == len(b"the attacker's head")
                ours += 1
                if wait(waits, timeout=0.2, return_when=FIRST_COMPLETED)[0]:
                    break
            assert all(w.result() >= 4.5 for w in waits), [round(w.result(), 1) for w in waits]
    assert ours >= 2
