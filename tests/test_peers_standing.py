"""Standing is earned, never claimed: views, push targets and fetch providers are ordered by what
this node saw peers do, and 1 or 1,000 fresh keys cost honest nodes the same (issue 21)."""

from __future__ import annotations

import threading
import time

from helpers import wait_for

from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.daemon.fanout import Fanout
from pulse_node.errors import PeerUnavailable
from pulse_node.peers.standing import FETCH_UNKNOWN, PUSH_UNKNOWN, VIEW_UNKNOWN, Standing
from pulse_node.testing.memory import announced


def peer(pid: str, *, role: str = "inference", version: int | None = 5) -> PeerRecord:
    return announced(pid, PeerStatus(role=role, version=version, wire_maddrs=[f"/ip4/127.0.0.1/tcp/1/p2p/{pid}"]))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def honest_standing(clock: Clock) -> Standing:
    s = Standing(clock=clock, salt=b"node-secret")
    s.mark_members({"trainer-a", "trainer-b"})
    s.mark_delivered("inf-good", 3)
    s.mark_accepted("inf-busy", 2)
    return s


HONEST = [peer("trainer-a", role="trainer"), peer("trainer-b", role="trainer"), peer("inf-good"), peer("inf-busy")]


def test_one_or_a_thousand_fresh_keys_give_the_same_view_and_providers() -> None:
    """Members, then peers with standing, then a fixed number of newcomers: the honest part of
    the view and of the provider order is identical with 1 and with 1,000 fresh keys, and so is
    the number of newcomers tried."""
    clock = Clock()
    outcomes = []
    for n in (1, 1000):
        s = honest_standing(clock)
        fresh = [peer(f"sybil-{i}", version=10**12) for i in range(n)]
        view = s.order(fresh + HONEST, quota=VIEW_UNKNOWN)
        prov = s.providers(fresh + HONEST)
        push = s.order(fresh + HONEST, quota=PUSH_UNKNOWN)
        assert [p.peer_id for p in view[:4]] == ["trainer-a", "trainer-b", "inf-good", "inf-busy"]
        assert [p.peer_id for p in prov[:3]] == ["inf-good", "trainer-a", "trainer-b"]  # delivered, then members
        outcomes.append((len(view) - 4, len(prov) - 4, len(push) - 4))
    assert outcomes[0] == (1, 1, 1)
    assert outcomes[1] == (VIEW_UNKNOWN, FETCH_UNKNOWN, PUSH_UNKNOWN)


def test_what_a_peer_claims_earns_nothing() -> None:
    """A record's version, role or time seen alone gives no standing; verified work does."""
    clock = Clock()
    s = Standing(clock=clock)
    s.mark_seen(["sybil", "worker"])
    s.mark_relayed("sybil")  # relaying a signed head is cheap: not standing by itself
    clock.t += 10_000
    assert not s.known("sybil") and not s.known("worker")
    s.mark_delivered("worker")
    assert s.known("worker") and s.score("worker") > s.score("sybil")
    assert s.known_ids() == ["worker"]


def test_failures_demote_and_strikes_stick() -> None:
    clock = Clock()
    s = Standing(clock=clock, salt=b"x")
    s.mark_delivered("flaky")
    for _ in range(3):
        s.mark_failure("flaky")
    assert not s.known("flaky")
    s.mark_delivered("flaky")  # a delivery ends the streak
    assert s.known("flaky")
    s.mark_failure("dead")  # tried once and timed out: behind every untried newcomer
    order = s.order([peer("dead"), *[peer(f"new-{i}") for i in range(5)]], quota=5)
    assert "dead" not in [p.peer_id for p in order]
    s.mark_delivered("liar", 5)
    s.mark_strike("liar")
    s.mark_strike("liar")
    assert not s.known("liar")


def test_the_draw_of_newcomers_turns_over() -> None:
    """Every newcomer gets its turn: the draw changes each ``rotate_s``, and cannot be ground."""
    clock = Clock()
    s = Standing(clock=clock, rotate_s=30.0, salt=b"k")
    fresh = [peer(f"n{i}") for i in range(100)]
    seen: set[str] = set()
    for _ in range(60):
        seen |= {p.peer_id for p in s.order(fresh, quota=4)}
        clock.t += 30.0
    assert len(seen) > 50


def test_remembered_peers_are_bounded_and_earnings_kept() -> None:
    s = Standing(clock=Clock(), max_peers=100)
    s.mark_delivered("worker")
    s.mark_seen(f"s{i}" for i in range(1000))
    assert len(s.marks) <= 100 and s.known("worker")


def test_a_silent_newcomer_never_delays_the_next_head_to_known_peers() -> None:
    """Pushes to newcomers run on their own lane: while a fresh key's silent address holds its
    push for the whole timeout, each new head still reaches the known peers at once (with one
    lane every head waited for it, and inference nodes fell 2-3 versions behind in a flood)."""
    t = SlowTransport()
    fan = Fanout(t, timeout=30.0, known=lambda pid: not pid.startswith("dead"))
    try:
        for v in (b"v1", b"v2", b"v3"):
            fan.submit("head", v, [peer("dead-1"), peer("ok"), peer("ok-2")])
            wait_for(lambda v=v: ("ok", v) in t.got and ("ok-2", v) in t.got, timeout=10, what=f"{v!r} to the known peers")
        assert not fan.idle()  # the newcomer's first push still hangs
        t.release.set()
        wait_for(fan.idle, timeout=10, what="the fan-out idle")
        assert fan.counts["pushed"] == 6 and fan.counts["failed"] >= 1
    finally:
        t.release.set()
        fan.close()


class SlowTransport:
    """Pushes to ``dead`` peers hang until released; the rest are recorded."""

    peer_id = "me"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.got: list[tuple[str, bytes]] = []

    def push(self, peer: PeerRecord, kind: str, data: bytes, *, timeout: float) -> None:
        if peer.peer_id.startswith("dead"):
            self.release.wait(timeout)
            raise PeerUnavailable(f"{peer.peer_id} never answered")
        self.got.append((peer.peer_id, data))


def test_background_pushes_never_block_and_newer_heads_replace_waiting_ones() -> None:
    t = SlowTransport()
    failed: list[str] = []
    fan = Fanout(t, timeout=30.0, on_error=lambda p, exc: failed.append(p.peer_id))
    try:
        t0 = time.monotonic()
        fan.submit("head", b"v1", [peer("dead-1"), peer("ok")])
        wait_for(lambda: ("ok", b"v1") in t.got, timeout=10, what="v1 pushed to ok")
        fan.submit("head", b"v2", [peer("dead-1"), peer("ok")])  # v1's push to dead-1 still hangs
        fan.submit("head", b"v3", [peer("ok")])
        assert time.monotonic() - t0 < 5.0 and not fan.idle()  # submitting never waits on a peer
        t.release.set()
        wait_for(fan.idle, timeout=10, what="the fan-out idle")
        assert [d for p, d in t.got if p == "ok"] == [b"v1", b"v3"]  # v2 was superseded while v1 was out
        assert fan.counts["superseded"] == 1 and failed == ["dead-1"]
    finally:
        t.release.set()
        fan.close()
