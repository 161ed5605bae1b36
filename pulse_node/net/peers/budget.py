"""Per-peer budgets of the data plane: what one peer may hold of a node's streams, requests,
queued pushes and catch-up production, trainer-set members first.

Pure bookkeeping (no I/O, no trio or asyncio; a ``clock`` is injected), used by the wire worker
(``net/wire/worker.py``), the inbox of both push planes (``inbox.py``) and the p2pd push plane
(``net/dht/push.py``). Peers are the ids the transport authenticated; the member ids come from the
node's trust policy over the local RPC (``set_members``).

- **Streams** (``StreamPools``): two pools, one only members use (``member_streams``) and one for
  everyone (``other_streams``, members overflow into it); a non-member holds at most
  ``streams_per_peer`` at once. When the shared pool is full, a new stream evicts the slowest
  non-member stream past its grace period that moves less than ``EVICT_BELOW`` times the minimum
  rate (``Flow.rate``), so slow-drip streams cannot park there.
- **Deadline and minimum rate** (``Flow``): every stream ends by ``stream_deadline_s``; after
  ``grace_s`` it must have moved ``min_rate`` bytes per second of peer I/O (time this node spends
  working on the answer does not count), or it is cut with ``SlowPeer``.
- **Requests** (``TokenBucket``): ``requests_per_s`` with a burst of ``request_burst`` per
  non-member peer, ``member_factor`` times that for members.
- **Queued pushes** (``PushShares``): a non-member's pushes queued or in flight are at most
  ``push_tickets_per_peer`` events and ``push_bytes_per_peer`` bytes, and all non-members
  together at most ``other_push_fraction`` of the queue; a push is admitted against its sender's
  share before its body is read.
- **Catch-up production** (``CatchupBudget``): per peer per minute, ``catchups_per_min`` patches
  made for it (a cached or already-running pair costs nothing: identical requests share one
  production), ``member_factor`` times that for members.
- **Newcomers together** (issue 21): keys are free, so once the node has said which peers have
  standing (``Members.set_standing``: peers that delivered verified work, ``peers/standing.py``),
  peers with neither membership nor standing share fixed allotments *together*: at most
  ``newcomer_streams`` streams of the shared pool between them, one request bucket and one
  catch-up budget between them, so 1 or 1,000 fresh keys take the same from honest peers. A stream of a peer with
  standing may evict a newcomer's stream past its grace. Bulk reads (``trainer_state``,
  ``anchor``) of non-members are charged against ``bulk_bytes_per_peer`` per 10 minutes
  (``BulkBudget``; newcomers share one such budget too).
- **Muzzle** (``Muzzle``): a refusal costs this node little, but an attacker may ask again at
  once, as fast as its own CPU goes. Once newcomers together are refused ``muzzle_after`` times
  within a second, each newcomer refused ``muzzle_peer_min`` times in it waits ``muzzle_s``
  before this node accepts another stream of its connection (the wire worker's accept loop
  holds, so the muxer stops reading it and TCP stops its sender): the refusals fresh keys can
  cause per second are bounded by this node's numbers, not by their speed.

Every refusal is counted by reason (``Refusals``) and logged once per peer per interval.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from pydantic import Field

from pulse_node.configload import StrictModel
from pulse_node.errors import PeerUnavailable
from pulse_node.vocab import BudgetRefusal

log = logging.getLogger("pulse.budget")

Clock = Callable[[], float]
V = TypeVar("V")

#: refusal reasons, as counted in ``data_plane.refused``
REASONS: tuple[BudgetRefusal, ...] = tuple(BudgetRefusal)
#: the one budget key all newcomers (no membership, no standing) share
NEWCOMERS = "<newcomers>"
#: kinds whose reads are charged to the bulk budget of a non-member
BULK_KINDS = ("trainer_state", "anchor")
BULK_WINDOW_S = 600.0
EVICT_BELOW = 4.0  # times the minimum rate: a slower stream may be evicted when the shared pool is full
_PEERS_KEPT = 4096  # per-peer state of this many peers at most (oldest idle ones are forgotten)


class SlowPeer(PeerUnavailable):
    """A peer's stream was cut: past its overall deadline, or slower than the minimum rate."""


class BudgetConfig(StrictModel):
    """Per-peer budgets of one node's data plane (``net.budget``); members are trainer-set members."""

    member_streams: int = Field(16, ge=1, le=2048, description="inbound stream slots only members use")
    other_streams: int = Field(16, ge=1, le=2048, description="inbound stream slots for every peer")
    streams_per_peer: int = Field(4, ge=1, description="open inbound streams of one non-member peer")
    stream_deadline_s: float = Field(600.0, gt=0, description="longest life of one inbound stream")
    min_rate: float = Field(256 * 1024, ge=0, description="bytes/s a stream must move after its grace, or it is cut")
    grace_s: float = Field(5.0, ge=0, description="seconds before the minimum rate applies")
    requests_per_s: float = Field(50.0, gt=0, description="inbound streams per second per non-member peer")
    request_burst: float = Field(100.0, ge=1, description="token bucket depth of a non-member peer")
    member_factor: float = Field(4.0, ge=1, description="members get this many times a non-member's rates")
    push_tickets_per_peer: int = Field(32, ge=1, description="queued or incoming pushes of one non-member")
    push_bytes_per_peer: int = Field(48 << 20, ge=1 << 16, description="bytes of those pushes")
    other_push_fraction: float = Field(0.5, gt=0, le=1, description="share of the push queue all non-members may hold")
    catchups_per_min: float = Field(2.0, ge=0, description="catch-up patches made per minute for one non-member")
    newcomer_streams: int = Field(4, ge=1, le=2048, description="shared-pool streams all peers without membership "
                                  "or standing hold together")
    bulk_bytes_per_peer: int = Field(4 << 30, ge=1 << 20, description="trainer_state and anchor bytes served to one "
                                     "non-member (newcomers: all together) per 10 minutes")
    log_interval_s: float = Field(60.0, gt=0, description="a peer's refusals are logged at most once per interval")
    muzzle_after: int = Field(20, ge=1, description="refusals of newcomers (together) within a second past which "
                              "each newcomer refused is not read for muzzle_s")
    muzzle_peer_min: int = Field(5, ge=1, description="refusals of one newcomer within that second before it "
                                 "is muzzled (an honest one is refused once or twice)")
    muzzle_s: float = Field(5.0, ge=0, le=600, description="seconds a muzzled newcomer's next stream waits "
                            "(0: never muzzle)")


class Refusals:
    """Refusals counted by reason; logged at most once per (peer, reason) per interval; each one
    told to the ``muzzle`` (when set), which may muzzle the peer (counted as ``muzzled``)."""

    def __init__(self, *, interval: float = 60.0, clock: Clock = time.monotonic, muzzle: Muzzle | None = None) -> None:
        self.by_reason: Counter[BudgetRefusal] = Counter()
        self.interval, self.clock, self.muzzle = interval, clock, muzzle
        self._logged: OrderedDict[tuple[str, BudgetRefusal], float] = OrderedDict()

    def add(self, peer: str, reason: BudgetRefusal, detail: str = "") -> None:
        self._count(peer, reason, detail)
        if self.muzzle is not None and reason is not BudgetRefusal.EVICTED and self.muzzle.refused(peer):
            self._count(peer, BudgetRefusal.MUZZLED, f"newcomers refused {self.muzzle.cfg.muzzle_after}+ times "
                        f"within a second: its next streams wait {self.muzzle.cfg.muzzle_s:g}s")

    def _count(self, peer: str, reason: BudgetRefusal, detail: str) -> None:
        self.by_reason[reason] += 1
        now, key = self.clock(), (peer, reason)
        if now - self._logged.get(key, float("-inf")) >= self.interval:
            self._logged[key] = now
            self._logged.move_to_end(key)
            while len(self._logged) > _PEERS_KEPT:
                self._logged.popitem(last=False)
            log.warning("refused peer %s: %s%s (%d refusals so far for this reason)", peer[-12:], reason,
                        f" ({detail})" if detail else "", self.by_reason[reason])


class Muzzle:
    """Newcomers refused faster than ``muzzle_after`` times a second, together (1 or 1,000 fresh
    keys alike): each one refused at least ``muzzle_peer_min`` times in that second waits
    ``muzzle_s`` before this node accepts another stream of its (``wait_s``). An honest newcomer
    refused once or twice while an attacker drains the newcomers' allotment is not held (it may
    be the one fetching from this node). State of ``_PEERS_KEPT`` peers at most."""

    def __init__(self, cfg: BudgetConfig, members: Members, *, clock: Clock = time.monotonic) -> None:
        self.cfg, self.members, self.clock = cfg, members, clock
        self._second, self._count = float("-inf"), 0  # newcomers' refusals in the second that started then
        self._by_peer: OrderedDict[str, int] = OrderedDict()  # each newcomer's refusals in that second
        self._until: OrderedDict[str, float] = OrderedDict()

    def refused(self, peer: str) -> bool:
        """Count a refusal of ``peer``; True when it starts ``peer``'s muzzle (members and peers
        with standing are never muzzled)."""
        if not self.cfg.muzzle_s or not self.members.newcomer(peer):
            return False
        now = self.clock()
        if now - self._second >= 1.0:
            self._second, self._count = now, 0
            self._by_peer.clear()
        self._count += 1
        mine = self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
        _keep_last(self._by_peer)
        if self._count < self.cfg.muzzle_after or mine < self.cfg.muzzle_peer_min or self.wait_s(peer) > 0:
            return False
        self._until[peer] = now + self.cfg.muzzle_s
        _keep_last(self._until)
        return True

    def wait_s(self, peer: str) -> float:
        """Seconds before this node accepts another stream of ``peer``'s (0: none)."""
        until = self._until.get(peer)
        if until is None:
            return 0.0
        left = until - self.clock()
        if left > 0:
            return left
        del self._until[peer]
        return 0.0


def _keep_last(d: OrderedDict[str, V]) -> None:
    while len(d) > _PEERS_KEPT:
        d.popitem(last=False)


class TokenBucket:
    """``rate`` tokens per second up to ``burst``."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float, n: float = 1.0) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < n:
            return False
        self.tokens -= n
        return True

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.at) * self.rate >= self.burst


class Members:
    """The trainer-set members' peer ids, and the peers with standing, as the node last said
    (``set_members``, ``set_standing``). Until the node names peers with standing, nobody is a
    newcomer (every non-member has its own shares, as before standing existed)."""

    def __init__(self, ids: Iterable[str] = (), *, standing: Iterable[str] | None = None) -> None:
        self.ids: frozenset[str] = frozenset(ids)
        self.standing: frozenset[str] | None = None if standing is None else frozenset(standing)

    def set(self, ids: Iterable[str]) -> None:
        self.ids = frozenset(ids)

    def set_standing(self, ids: Iterable[str]) -> None:
        self.standing = frozenset(ids)

    def newcomer(self, peer: str) -> bool:
        """Neither a member nor a peer with standing (only once the node named the latter)."""
        return self.standing is not None and peer not in self.ids and peer not in self.standing

    def budget_key(self, peer: str) -> str:
        """Whose budget a request of ``peer`` is charged to: its own, or the newcomers' one."""
        return NEWCOMERS if self.newcomer(peer) else peer

    def __contains__(self, peer: object) -> bool:
        return peer in self.ids


@dataclass(eq=False)
class Flow:
    """One inbound stream's budget: bytes moved, time spent on our side, when it must end."""

    peer: str
    member: bool
    started: float
    deadline: float
    min_rate: float
    grace: float
    clock: Clock
    moved: int = 0
    own_s: float = 0.0  # time this node spent making the answer (not the peer's fault)
    cut: BudgetRefusal | Literal[""] = ""  # why it was evicted, once it was
    newcomer: bool = False  # neither member nor with standing: holds one of the newcomers' slots
    on_cut: Callable[[], None] | None = field(default=None, repr=False)

    def add(self, n: int) -> None:
        self.moved += n

    def time_left(self) -> float:
        """Seconds the next read or write may take before the deadline or the minimum rate is missed."""
        now = self.clock()
        left = self.deadline - now
        if self.min_rate > 0:
            left = min(left, self.started + self.own_s + self.grace + self.moved / self.min_rate - now)
        return left

    def limit(self, idle: float, peer: str, *, slack: float = 0.0) -> float:
        """``idle`` or the time left if shorter; ``SlowPeer`` when no more than ``slack`` is left."""
        left = self.time_left()
        if left <= slack:
            where = "past its deadline" if self.why() is BudgetRefusal.DEADLINE else "below the minimum rate"
            raise SlowPeer(f"peer {peer}: stream {where} ({self.moved} bytes moved)")
        return min(idle, left)

    def why(self) -> BudgetRefusal:
        """``DEADLINE`` or ``SLOW``: which limit ``time_left`` ran into."""
        return BudgetRefusal.DEADLINE if self.clock() >= self.deadline - 1e-3 else BudgetRefusal.SLOW

    def rate(self) -> float:
        """Bytes per second of peer I/O so far (infinite within the grace period)."""
        spent = self.clock() - self.started - self.own_s
        return float("inf") if spent <= self.grace else self.moved / spent

    def evict(self, reason: BudgetRefusal = BudgetRefusal.EVICTED) -> None:
        self.cut = reason
        if self.on_cut is not None:
            self.on_cut()


class Refused(PeerUnavailable):
    """A peer asked for more than its budget; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: BudgetRefusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StreamPools:
    """Inbound streams by pool and by peer, request buckets, eviction of the slowest non-member."""

    def __init__(self, cfg: BudgetConfig, members: Members, refusals: Refusals, *, clock: Clock = time.monotonic) -> None:
        self.cfg, self.members, self.refusals, self.clock = cfg, members, refusals, clock
        self.member_pool: set[Flow] = set()
        self.other_pool: set[Flow] = set()
        self.by_peer: Counter[str] = Counter()
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        #: newcomers' streams were admitted before negotiation (``admit``, the wire's ``StreamGate``)
        self.gated = False

    def admit(self, peer: str) -> bool:
        """Before protocol negotiation: a newcomer's stream is refused (and counted) when ``open``
        would refuse it on the streams already open (its own, or all newcomers' slots busy), else
        takes its token from the newcomers' bucket (refused when it is empty); anyone else
        passes (its bucket is taken in ``open``, which answers it with a typed ``busy``)."""
        if not self.members.newcomer(peer):
            return True
        refusal = self._streams_refusal(peer, newcomer=True)
        if refusal is None and self._bucket(peer, False).take(self.clock()):
            return True
        reason, detail = refusal or (BudgetRefusal.RATE, f"newcomers over {self._rate(False):g} streams/s")
        self.refusals.add(peer, reason, f"{detail}, reset before negotiation")
        return False

    def _streams_refusal(self, peer: str, *, newcomer: bool) -> tuple[BudgetRefusal, str] | None:
        """Why a new stream of non-member ``peer`` is refused on the streams already open, if it is."""
        if self.by_peer[peer] >= self.cfg.streams_per_peer:
            return BudgetRefusal.STREAMS_PEER, f"{self.by_peer[peer]} streams open already"
        if newcomer and sum(f.newcomer for f in self.other_pool) >= self.cfg.newcomer_streams:
            return BudgetRefusal.STREAMS_NEWCOMERS, (f"all {self.cfg.newcomer_streams} streams of peers without "
                                                     "standing busy")
        return None

    def open(self, peer: str) -> Flow:
        """A flow for a new stream from ``peer``, or ``Refused`` (counted) when over its budget."""
        member = peer in self.members
        try:
            return self._open(peer, member)
        except Refused as exc:
            self.refusals.add(peer, exc.reason, str(exc))
            raise

    def _open(self, peer: str, member: bool) -> Flow:
        newcomer = self.members.newcomer(peer)
        charged = self.gated and newcomer  # its token was taken before negotiation
        if not charged and not self._bucket(peer, member).take(self.clock()):
            raise Refused(BudgetRefusal.RATE, f"more than {self._rate(member):g} requests/s")
        refusal = None if member else self._streams_refusal(peer, newcomer=newcomer)
        if refusal is not None:
            raise Refused(*refusal)
        if member and len(self.member_pool) < self.cfg.member_streams:
            pool = self.member_pool
        elif len(self.other_pool) < self.cfg.other_streams or self._evict_slowest(peer, newcomer=newcomer):
            pool = self.other_pool
        else:
            raise Refused(BudgetRefusal.STREAMS_POOL, f"all {self.cfg.other_streams} shared streams busy")
        now = self.clock()
        flow = Flow(peer, member, now, now + self.cfg.stream_deadline_s, self.cfg.min_rate, self.cfg.grace_s,
                    self.clock, newcomer=newcomer)
        pool.add(flow)
        self.by_peer[peer] += 1
        return flow

    def close(self, flow: Flow) -> None:
        for pool in (self.member_pool, self.other_pool):
            if flow in pool:
                pool.discard(flow)
                self.by_peer[flow.peer] -= 1
                if self.by_peer[flow.peer] <= 0:
                    del self.by_peer[flow.peer]

    def _evict_slowest(self, peer: str, *, newcomer: bool = False) -> bool:
        """Cut the slowest non-member stream past its grace and below ``EVICT_BELOW`` times the
        minimum rate (a healthy transfer is never cut for a newcomer), not the requester's own;
        for a requester with standing, a newcomer's stream past its grace at any rate. True if
        one was."""
        floor = EVICT_BELOW * self.cfg.min_rate
        victims = [f for f in self.other_pool if not f.member and not f.cut and f.peer != peer and
                   (f.rate() < floor or (not newcomer and f.newcomer and f.rate() != float("inf")))]
        if not victims:
            return False
        victim = min(victims, key=Flow.rate)
        self.refusals.add(victim.peer, BudgetRefusal.EVICTED, f"slowest stream ({victim.rate():.0f} B/s)")
        self.close(victim)  # its slot is free now
        victim.evict()
        return True

    def _rate(self, member: bool) -> float:
        return self.cfg.requests_per_s * (self.cfg.member_factor if member else 1.0)

    def _bucket(self, peer: str, member: bool) -> TokenBucket:
        """The request bucket of ``peer``; all newcomers draw from one bucket together."""
        now = self.clock()
        peer = self.members.budget_key(peer)
        bucket = self._buckets.get(peer)
        if bucket is None:
            factor = self.cfg.member_factor if member else 1.0
            bucket = self._buckets[peer] = TokenBucket(self._rate(member), self.cfg.request_burst * factor, now)
            while len(self._buckets) > _PEERS_KEPT:
                oldest, b = next(iter(self._buckets.items()))
                if not b.full(now):
                    break  # a peer still paying for a burst is kept
                del self._buckets[oldest]
        self._buckets.move_to_end(peer)
        return bucket

    def open_count(self) -> dict[str, int]:
        return {"member": len(self.member_pool), "other": len(self.other_pool)}


class PushShares:
    """Queued (or incoming) pushes per sender; a non-member's stay within its own share."""

    def __init__(self, cfg: BudgetConfig, members: Members, *, max_events: int, max_bytes: int) -> None:
        self.cfg, self.members = cfg, members
        self.other_events = max(1, int(max_events * cfg.other_push_fraction))
        self.other_bytes = max(1, int(max_bytes * cfg.other_push_fraction))
        self.count: Counter[str] = Counter()
        self.nbytes: Counter[str] = Counter()
        self._others = [0, 0]  # events, bytes of all non-members

    def admit(self, peer: str, n: int) -> BudgetRefusal | Literal[""]:
        """"" if ``peer`` may queue one more push of ``n`` bytes (then it is counted), else the reason."""
        member = peer in self.members
        if not member:
            if self.count[peer] + 1 > self.cfg.push_tickets_per_peer or \
                    self.nbytes[peer] + n > self.cfg.push_bytes_per_peer:
                return BudgetRefusal.PUSH_SHARE
            if self._others[0] + 1 > self.other_events or self._others[1] + n > self.other_bytes:
                return BudgetRefusal.PUSH_POOL
            self._others[0] += 1
            self._others[1] += n
        self.count[peer] += 1
        self.nbytes[peer] += n
        return ""

    def release(self, peer: str, n: int) -> None:
        if peer not in self.count:
            return
        self.count[peer] -= 1
        self.nbytes[peer] -= n
        if peer not in self.members:
            self._others[0] -= 1
            self._others[1] -= n
        if self.count[peer] <= 0:
            del self.count[peer], self.nbytes[peer]


class CatchupBudget:
    """Catch-up patches made per requesting peer per minute (a sliding window)."""

    def __init__(self, cfg: BudgetConfig, members: Members, *, clock: Clock = time.monotonic) -> None:
        self.cfg, self.members, self.clock = cfg, members, clock
        self._made: OrderedDict[str, list[float]] = OrderedDict()

    def allow(self, peer: str) -> bool:
        """Whether a new production may start for ``peer`` (then it is charged)."""
        now = self.clock()
        limit = self.cfg.catchups_per_min * (self.cfg.member_factor if peer in self.members else 1.0)
        peer = self.members.budget_key(peer)  # newcomers share one budget
        times = [t for t in self._made.get(peer, []) if now - t < 60.0]
        if len(times) + 1 > limit:
            self._made[peer] = times
            return False
        times.append(now)
        self._made[peer] = times
        self._made.move_to_end(peer)
        while len(self._made) > _PEERS_KEPT:
            self._made.popitem(last=False)
        return True


class BulkBudget:
    """Bytes of bulk reads (``BULK_KINDS``) served per non-member per ``BULK_WINDOW_S``; all
    newcomers share one budget. Members are not charged."""

    def __init__(self, cfg: BudgetConfig, members: Members, *, clock: Clock = time.monotonic) -> None:
        self.cfg, self.members, self.clock = cfg, members, clock
        self._spent: OrderedDict[str, list[tuple[float, int]]] = OrderedDict()

    def allow(self, peer: str, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be served to ``peer`` now (then they are charged)."""
        if peer in self.members:
            return True
        key, now = self.members.budget_key(peer), self.clock()
        spent = [(t, n) for t, n in self._spent.get(key, []) if now - t < BULK_WINDOW_S]
        if sum(n for _, n in spent) + nbytes > self.cfg.bulk_bytes_per_peer:
            self._spent[key] = spent
            return False
        spent.append((now, nbytes))
        self._spent[key] = spent
        self._spent.move_to_end(key)
        while len(self._spent) > _PEERS_KEPT:
            self._spent.popitem(last=False)
        return True
