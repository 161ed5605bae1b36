"""Per-peer budgets (``net/peers/budget.py``): pure bookkeeping with a fake clock."""

from __future__ import annotations

from typing import ClassVar

import pytest

from pulse_node.net.local.inbox import Inbox
from pulse_node.net.peers.budget import (
    BudgetConfig,
    CatchupBudget,
    Members,
    Muzzle,
    PushShares,
    Refusals,
    Refused,
    StreamPools,
    TokenBucket,
)
from pulse_node.vocab import BudgetRefusal, Event


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _pools(**kw: object) -> tuple[StreamPools, Members, Refusals, Clock]:
    clock, members = Clock(), Members(["m1"])
    refusals = Refusals(clock=clock)
    return StreamPools(BudgetConfig(**kw), members, refusals, clock=clock), members, refusals, clock


def test_a_non_member_holds_at_most_its_streams_and_members_have_their_own_pool() -> None:
    pools, _, refusals, _ = _pools(member_streams=2, other_streams=4, streams_per_peer=2)
    flows = [pools.open("x"), pools.open("x")]
    with pytest.raises(Refused) as exc:
        pools.open("x")
    assert exc.value.reason == "streams_peer"
    pools.open("y"), pools.open("y")
    with pytest.raises(Refused):
        pools.open("z")  # shared pool full, nobody past grace to evict
    assert pools.open("m1").member and pools.open("m1").member
    with pytest.raises(Refused):
        pools.open("m1")  # members overflow into the shared pool, which is full
    pools.close(flows[0])
    assert pools.open("m1").member  # the freed shared slot
    pools.close(flows[1])
    assert pools.open("z").peer == "z"
    assert refusals.by_reason["streams_peer"] == 1 and refusals.by_reason["streams_pool"] == 2


def test_full_shared_pool_evicts_the_slowest_non_member_past_grace() -> None:
    pools, _, refusals, clock = _pools(other_streams=2, streams_per_peer=2, grace_s=1.0, min_rate=1000)
    slow, fast = pools.open("s"), pools.open("f")
    cut = []
    slow.on_cut = lambda: cut.append("slow")
    fast.on_cut = lambda: cut.append("fast")
    clock.t += 2.0
    slow.add(10)
    fast.add(10 << 20)
    new = pools.open("n")
    assert cut == ["slow"] and slow.cut == "evicted" and new.peer == "n"
    assert refusals.by_reason["evicted"] == 1
    pools.close(slow)  # closing an evicted flow later changes nothing
    assert pools.by_peer["s"] == 0 and len(pools.other_pool) == 2
    clock.t += 2.0
    new.add(10 << 20)
    with pytest.raises(Refused):  # both streams are healthy (above 4x the minimum rate): nobody is cut
        pools.open("late")
    assert cut == ["slow"]


def test_time_left_follows_the_minimum_rate_and_the_deadline() -> None:
    pools, _, _, clock = _pools(min_rate=1000, grace_s=5.0, stream_deadline_s=60.0)
    flow = pools.open("x")
    assert flow.time_left() == pytest.approx(5.0)
    flow.add(3000)  # three more seconds earned
    assert flow.time_left() == pytest.approx(8.0)
    flow.own_s = 2.0  # our own work does not count against the peer
    assert flow.time_left() == pytest.approx(10.0)
    clock.t += 11.0
    assert flow.time_left() < 0 and flow.why() == "slow"
    flow.add(10 ** 9)
    clock.t += 50.0
    assert flow.time_left() <= 0 and flow.why() == "deadline"


def test_a_request_flood_is_refused_by_the_token_bucket_members_get_more() -> None:
    pools, _, refusals, clock = _pools(requests_per_s=10, request_burst=5, member_factor=4, streams_per_peer=100,
                                       other_streams=1000, member_streams=1000)
    ok = 0
    for _ in range(50):
        try:
            pools.close(pools.open("x"))
            ok += 1
        except Refused as exc:
            assert exc.reason == "rate"
    assert ok == 5 and refusals.by_reason["rate"] == 45
    member_ok = 0
    for _ in range(50):
        try:
            pools.close(pools.open("m1"))
            member_ok += 1
        except Refused:
            pass
    assert member_ok == 20  # burst 5 x member_factor 4
    clock.t += 1.0
    pools.close(pools.open("x"))  # refilled


def test_token_bucket_refills() -> None:
    b = TokenBucket(2.0, 2.0, 0.0)
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    assert b.take(0.5) and not b.take(0.5)
    assert b.full(10.0)


def test_push_shares_keep_one_sender_to_its_own_share() -> None:
    cfg = BudgetConfig(push_tickets_per_peer=2, push_bytes_per_peer=1 << 20, other_push_fraction=0.5)
    members = Members(["m"])
    inbox = Inbox(max_events=10, max_bytes=8 << 20, shares=PushShares(cfg, members, max_events=10, max_bytes=8 << 20))
    assert inbox.admit(100, peer="x") == "" and inbox.admit(100, peer="x") == ""
    assert inbox.admit(100, peer="x") == "push_share"
    assert inbox.admit(2 << 20, peer="y") == "push_share"  # declared size beyond its share: never reserved
    for p in "abc":
        assert inbox.admit(100, peer=p) == ""
    assert inbox.admit(100, peer="d") == "push_pool"  # non-members hold half of the queue's events
    for _ in range(5):
        assert inbox.admit(1 << 20, peer="m") == ""  # members are not bound by a share
    inbox.release(100, peer="x")
    assert inbox.admit(100, peer="x") == ""
    inbox.put(Event("rollouts", "a", b"z" * 100, 0.0))
    [taken] = inbox.take_ready(1)
    assert taken.event.sender == "a" and inbox.admit(100, peer="d") == ""


def test_catchup_budget_per_peer_per_minute() -> None:
    clock = Clock()
    budget = CatchupBudget(BudgetConfig(catchups_per_min=2, member_factor=3), Members(["m"]), clock=clock)
    assert [budget.allow("x") for _ in range(3)] == [True, True, False]
    assert sum(budget.allow("m") for _ in range(10)) == 6
    clock.t += 61
    assert budget.allow("x")


def test_refusals_are_logged_once_per_peer_and_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    refusals = Refusals(interval=60.0, clock=clock)
    with caplog.at_level("WARNING", logger="pulse.budget"):
        for _ in range(100):
            refusals.add("peerA", "rate")
        clock.t += 61
        refusals.add("peerA", "rate")
    assert refusals.by_reason["rate"] == 101
    assert len([r for r in caplog.records if "peerA" in r.getMessage()]) == 2


def test_p2pd_push_plane_admits_streams_as_the_wire_does_members_first_one_per_non_member() -> None:
    """The push plane has no admission of its own: its ``StreamPools`` (the wire worker's
    mechanism) with ``MAX_INBOUND`` streams, of which non-members hold ``OTHER_INBOUND``, one each."""
    from pulse_node.net.dht import push as dht_push

    clock = Clock()
    plane = dht_push.PushPlane(p2p=None)
    pools = plane.pools = StreamPools(plane.pools.cfg, plane.members, plane.refusals, clock=clock)
    plane.members.set(["m"])
    x = pools.open("x")
    with pytest.raises(Refused) as one_each:
        pools.open("x")
    y = pools.open("y")
    with pytest.raises(Refused) as pool_full:
        pools.open("z")  # both non-member slots held, within their grace: nobody is evicted
    members = [pools.open("m") for _ in range(dht_push.MAX_INBOUND - dht_push.OTHER_INBOUND)]
    with pytest.raises(Refused):
        pools.open("m")  # members use every stream, and no more
    assert (one_each.value.reason, pool_full.value.reason) == (BudgetRefusal.STREAMS_PEER, BudgetRefusal.STREAMS_POOL)
    clock.t += dht_push.HEADER_TIMEOUT_S + 1  # past its grace having moved nothing: a slow drip
    assert pools.open("z") and BudgetRefusal.EVICTED in (x.cut, y.cut)
    for f in members:
        pools.close(f)
    assert plane.inbox.shares is not None and plane.stats().refused == {
        BudgetRefusal.STREAMS_PEER: 1, BudgetRefusal.STREAMS_POOL: 2, BudgetRefusal.EVICTED: 1}


def test_the_node_tells_the_workers_its_peer_view_once_per_change(tmp_path) -> None:
    """One typed call (``Transport.set_view``) carries the book's members and peers with
    standing to the workers, and only when they changed."""
    from pulse_node.chain.identity import Identity, peer_id_of_key
    from pulse_node.chain.store import VersionStore
    from pulse_node.config import InferenceConfig
    from pulse_node.daemon.context import RoleContext
    from pulse_node.daemon.status import NodeStatus
    from pulse_node.peers.outcomes import Delivered
    from pulse_node.peers.view import PeerView
    from pulse_node.testing.memory import MemoryHub, MemoryTransport

    class Counting(MemoryTransport):
        told: ClassVar[list[PeerView]] = []

        def set_view(self, view: PeerView) -> None:
            self.told.append(view)

    key, hub = Identity.generate().public_key_hex, MemoryHub()
    hub.join("worker", lambda request: None)
    transport = Counting(hub, "me")
    hub.join("me", lambda request: None)
    cfg = InferenceConfig.model_validate({"data_dir": str(tmp_path), "chain": {"trusted_trainers": [key]}})
    store = VersionStore(tmp_path / "store")
    ctx = RoleContext(cfg=cfg, identity=Identity.generate(), store=store, transport=transport,
                      status=NodeStatus(role="inference", peer_id="me", run_id="r"))
    try:
        ctx.peers()
        ctx.peers()
        assert transport.told == [PeerView(members=frozenset({peer_id_of_key(key)}))]
        ctx.book.judge("worker", Delivered())
        ctx.peers()
        ctx.peers()
        assert transport.told[1:] == [PeerView(members=frozenset({peer_id_of_key(key)}), standing=("worker",))]
    finally:
        ctx.close()
        store.close()


def test_refusals_are_declared_in_the_status_model() -> None:
    from pulse_node.daemon.status_model import DataPlane

    plane = DataPlane.model_validate({"refused": {"rate": 3, "slow": 1}})
    assert plane.refused == {"rate": 3, "slow": 1} and DataPlane().refused == {}


def test_newcomers_share_their_streams_together_and_peers_with_standing_keep_theirs() -> None:
    """Once the node names its peers with standing, 1 or 1,000 fresh keys hold at most
    ``newcomer_streams`` streams between them; a peer with standing still opens its own."""
    for keys in (1, 1000):
        pools, members, refusals, _clock = _pools(other_streams=16, streams_per_peer=4, newcomer_streams=4,
                                                 grace_s=1.0, min_rate=1000)
        members.set_standing(["worker"])
        opened = 0
        for i in range(keys * 4):
            try:
                pools.open(f"sybil-{i % keys}")
                opened += 1
            except Refused as exc:
                assert exc.reason in ("streams_newcomers", "streams_peer", "rate")  # rate: one bucket together
        assert opened == 4 and (keys == 1 or refusals.by_reason["streams_newcomers"] > 0)
        assert all(pools.open("worker").peer == "worker" for _ in range(4))


def test_a_peer_with_standing_evicts_a_newcomers_stream_past_grace() -> None:
    pools, members, _refusals, clock = _pools(other_streams=2, streams_per_peer=2, newcomer_streams=2, grace_s=1.0,
                                             min_rate=1000)
    members.set_standing(["worker"])
    hogs = [pools.open("sybil-a"), pools.open("sybil-b")]
    cut = []
    for h in hogs:
        h.on_cut = lambda h=h: cut.append(h.peer)
        h.add(10 << 20)  # fast enough never to be cut for being slow
    with pytest.raises(Refused):
        pools.open("worker")  # within their grace: not cut
    clock.t += 2.0
    for h in hogs:
        h.add(10 << 20)
    assert pools.open("worker").peer == "worker" and len(cut) == 1
    with pytest.raises(Refused):
        pools.open("sybil-c")  # a newcomer never evicts a healthy stream


def test_newcomers_share_one_catchup_budget_and_bulk_reads_are_budgeted() -> None:
    from pulse_node.net.peers.budget import BulkBudget

    clock = Clock()
    members = Members(["m"], standing=["worker"])
    cfg = BudgetConfig(catchups_per_min=2, bulk_bytes_per_peer=10 << 20)
    catchups = CatchupBudget(cfg, members, clock=clock)
    assert [catchups.allow(f"sybil-{i}") for i in range(5)] == [True, True, False, False, False]
    assert catchups.allow("worker") and catchups.allow("m")
    bulk = BulkBudget(cfg, members, clock=clock)
    assert bulk.allow("sybil-1", 6 << 20) and not bulk.allow("sybil-2", 6 << 20)  # one budget together
    assert bulk.allow("worker", 6 << 20) and bulk.allow("m", 1 << 30)
    clock.t += 601
    assert bulk.allow("sybil-2", 6 << 20)  # the window moved on


def test_newcomers_draw_requests_from_one_bucket() -> None:
    """A thousand fresh keys get the request rate of one newcomer together; a peer with standing
    keeps its own bucket."""
    pools, members, _refusals, _clock = _pools(requests_per_s=1.0, request_burst=5, newcomer_streams=2048,
                                             other_streams=2048)
    members.set_standing(["worker"])
    opened = 0
    for i in range(1000):
        try:
            pools.open(f"sybil-{i}")
            opened += 1
        except Refused as exc:
            assert exc.reason == "rate"
    assert opened == 5 and all(pools.open("worker").peer == "worker" for _ in range(4))


def test_newcomers_are_admitted_before_negotiation_from_their_one_bucket() -> None:
    """The wire's gate (``StreamGate``) asks ``admit`` before py-libp2p negotiates a stream: a
    thousand fresh keys get the newcomers' burst together, each refusal counted; members and peers
    with standing always pass; a newcomer stream admitted there is not charged again in ``open``."""
    pools, members, refusals, clock = _pools(requests_per_s=1.0, request_burst=5, newcomer_streams=2048,
                                             other_streams=2048, streams_per_peer=2048)
    pools.gated = True
    members.set_standing(["worker"])
    admitted = [f"sybil-{i}" for i in range(1000) if pools.admit(f"sybil-{i}")]
    assert admitted == [f"sybil-{i}" for i in range(5)] and refusals.by_reason["rate"] == 995
    assert all(pools.admit("worker") and pools.admit("m1") for _ in range(50))
    assert all(pools.open(peer).newcomer for peer in admitted)  # the bucket is empty: charged once, before
    clock.t += 1.0
    assert pools.admit("sybil-1000") and not pools.admit("sybil-1001")  # one token a second, for all of them


def test_a_newcomer_is_refused_before_negotiation_when_its_streams_or_the_newcomers_slots_are_full() -> None:
    """What ``open`` would refuse on the streams already open is refused in ``admit`` already
    (a bare reset instead of a negotiated ``busy``), without taking a token; a peer with standing
    is still answered by ``open``."""
    pools, members, refusals, _ = _pools(requests_per_s=1000.0, request_burst=1000, newcomer_streams=3,
                                         streams_per_peer=2, other_streams=64)
    pools.gated = True
    members.set_standing(["worker"])
    held = [pools.open("sybil-a") for _ in range(2) if pools.admit("sybil-a")]
    assert len(held) == 2 and not pools.admit("sybil-a")  # its own two streams
    assert refusals.by_reason["streams_peer"] == 1
    held.append(pools.open("sybil-b") if pools.admit("sybil-b") else None)
    assert all(held) and not pools.admit("sybil-c")  # all three newcomers' slots busy
    assert refusals.by_reason["streams_newcomers"] == 1
    assert pools.admit("worker") and pools.open("worker").peer == "worker"
    pools.close(held[0])
    assert pools.admit("sybil-c")  # a slot freed


def _muzzled(**kw: object) -> tuple[Refusals, Muzzle, Members, Clock]:
    clock, members = Clock(), Members(["m1"])
    members.set_standing(["worker"])
    muzzle = Muzzle(BudgetConfig(**kw), members, clock=clock)
    return Refusals(clock=clock, muzzle=muzzle), muzzle, members, clock


def test_a_newcomer_refused_too_fast_is_muzzled_once_for_muzzle_s() -> None:
    """``muzzle_after`` refusals within a second muzzle a newcomer (counted once); its streams
    wait ``muzzle_s``; afterwards it starts from zero."""
    refusals, muzzle, _, clock = _muzzled(muzzle_after=20, muzzle_peer_min=5, muzzle_s=5.0)
    for _ in range(19):
        refusals.add("sybil", BudgetRefusal.RATE)
    assert muzzle.wait_s("sybil") == 0.0 and refusals.by_reason[BudgetRefusal.MUZZLED] == 0
    refusals.add("sybil", BudgetRefusal.STREAMS_NEWCOMERS)
    assert muzzle.wait_s("sybil") == 5.0 and refusals.by_reason[BudgetRefusal.MUZZLED] == 1
    for _ in range(30):  # refusals of streams already accepted: no second muzzle while held
        refusals.add("sybil", BudgetRefusal.CATCHUP_BUDGET)
    assert refusals.by_reason[BudgetRefusal.MUZZLED] == 1
    clock.t += 2.0
    assert muzzle.wait_s("sybil") == 3.0 and muzzle.wait_s("other-sybil") == 0.0
    clock.t += 3.0
    assert muzzle.wait_s("sybil") == 0.0
    refusals.add("sybil", BudgetRefusal.RATE)
    assert muzzle.wait_s("sybil") == 0.0


def test_keys_are_counted_together_and_a_newcomer_refused_once_or_twice_is_not_held() -> None:
    """4 keys refused in turn within a second: each is muzzled once the newcomers' count and its
    own are both reached, so spreading the requests over a few keys gains nothing; an honest
    newcomer refused twice in that second (its fetch caught in the flood) is not held."""
    refusals, muzzle, _, clock = _muzzled(muzzle_after=20, muzzle_peer_min=5, muzzle_s=5.0)
    for i in range(40):
        refusals.add(f"sybil-{i % 4}", BudgetRefusal.CATCHUP_BUDGET)
        if i in (10, 30):
            refusals.add("honest-newcomer", BudgetRefusal.STREAMS_NEWCOMERS)
        clock.t += 0.01
    assert all(muzzle.wait_s(f"sybil-{k}") > 0 for k in range(4))
    assert muzzle.wait_s("honest-newcomer") == 0.0 and refusals.by_reason[BudgetRefusal.MUZZLED] == 4
    for i in range(1000):  # 1,000 keys refused once each: none has reached its own minimum
        refusals.add(f"key-{i}", BudgetRefusal.RATE)
    assert not any(muzzle.wait_s(f"key-{i}") for i in range(1000))


def test_refusals_spread_out_members_standing_and_evictions_never_muzzle() -> None:
    refusals, muzzle, _, clock = _muzzled(muzzle_after=5, muzzle_peer_min=1, muzzle_s=5.0)
    for _ in range(20):  # four a second
        refusals.add("slow-sybil", BudgetRefusal.RATE)
        clock.t += 0.25
    for peer in ("m1", "worker"):
        for _ in range(50):
            refusals.add(peer, BudgetRefusal.RATE)
    for _ in range(50):
        refusals.add("evicted-newcomer", BudgetRefusal.EVICTED)
    assert all(muzzle.wait_s(p) == 0.0 for p in ("slow-sybil", "m1", "worker", "evicted-newcomer"))
    off, off_muzzle, _, _ = _muzzled(muzzle_after=1, muzzle_peer_min=1, muzzle_s=0.0)
    for _ in range(10):
        off.add("sybil", BudgetRefusal.RATE)
    assert off_muzzle.wait_s("sybil") == 0.0 and off.by_reason[BudgetRefusal.MUZZLED] == 0


def test_a_muzzled_peers_new_streams_are_parked_while_its_connection_is_read() -> None:
    """``hold_accepts`` (trio's mock clock, moved by hand once every task is blocked): a muzzled
    peer's new stream is taken from the muxer at once (the connection is read: this node's own
    streams on it go on) and handed on only when the muzzle ends; past ``HELD_STREAMS`` parked the
    next is not taken (its connection waits); a connection closed meanwhile ends the loop at once;
    another peer's streams pass untouched."""
    trio = pytest.importorskip("trio")
    from trio.testing import MockClock, wait_all_tasks_blocked

    from pulse_node.net.wire.held import HELD_STREAMS, hold_accepts

    class Muxed:
        """A muxer's queue of new streams, as yamux's: ``accept_stream`` takes the next one."""

        def __init__(self, peer: str) -> None:
            self.peer_id = peer
            self.event_closed = trio.Event()
            self.send, self.recv = trio.open_memory_channel(100)
            self.taken: list[str] = []

        async def accept_stream(self) -> str:
            try:
                stream = await self.recv.receive()
            except trio.EndOfChannel:  # yamux: the connection closed
                raise ConnectionError("closed") from None
            self.taken.append(stream)
            return stream

    async def main(clock: MockClock) -> None:
        _, muzzle, _, _ = _muzzled(muzzle_after=1, muzzle_peer_min=1, muzzle_s=5.0)
        muzzle.clock = trio.current_time  # the muzzle reads trio's (mock) clock
        held, other = Muxed("sybil"), Muxed("honest")
        hold_accepts(held, muzzle)
        hold_accepts(other, muzzle)
        muzzle.refused("sybil")  # held from t = 0 to 5
        other.send.send_nowait("ok")
        assert await other.accept_stream() == "ok"
        handed: list[tuple[str, float]] = []

        ended: list[float] = []

        async def loop(muxed: Muxed) -> None:  # py-libp2p's accept loop of one connection
            try:
                while True:
                    handed.append((await muxed.accept_stream(), trio.current_time()))
            except ConnectionError:
                ended.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop, held)
            for i in range(HELD_STREAMS + 3):
                held.send.send_nowait(f"s{i}")
            await wait_all_tasks_blocked()
            assert held.taken == [f"s{i}" for i in range(HELD_STREAMS)] and handed == []
            clock.jump(5.0)
            await wait_all_tasks_blocked()
            assert [s for s, _ in handed] == [f"s{i}" for i in range(HELD_STREAMS + 3)]
            assert {t for _, t in handed} == {5.0}
            muzzle.refused("sybil")  # held again from t = 5 to 10; its connection closes at 7
            held.send.send_nowait("late")
            await wait_all_tasks_blocked()
            assert handed[-1][0] != "late" and held.taken[-1] == "late"
            clock.jump(2.0)
            held.event_closed.set()
            held.send.close()
            await wait_all_tasks_blocked()
            assert ended == [7.0] and handed[-1][0] != "late"  # the loop learns at once, not at 10

    clock = MockClock()
    trio.run(main, clock, clock=clock)


def test_a_muxer_shared_by_two_connections_is_held_by_one_wrap() -> None:
    from pulse_node.net.wire.held import hold_accepts

    class Muxed:
        peer_id = "sybil"

        async def accept_stream(self) -> str:
            return "stream"

    muxed = Muxed()
    _, muzzle, _, _ = _muzzled()
    hold_accepts(muxed, muzzle)
    wrapped = muxed.accept_stream
    hold_accepts(muxed, muzzle)
    assert muxed.accept_stream is wrapped
