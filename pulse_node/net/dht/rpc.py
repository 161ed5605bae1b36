"""The DHT worker's RPC as types: one request per ``@rpc`` handler of ``dht.worker.DhtWorker``.

Each request's fields are that handler's keyword arguments and its ``Request[R]`` the reply
(``rpc_api.py``; ``tests/test_net_rpc_api.py`` checks them against the handlers). ``DhtClient``
sends these; nothing here imports hivemind.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import pydantic

from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.net.dht.records import DhtInfo
from pulse_node.net.local.inbox import Queued
from pulse_node.net.local.rpc_api import Pushed, Request
from pulse_node.vocab import BudgetRefusal, PushKind

R = TypeVar("R")

class DhtRequest(Request[R], Generic[R]):
    """Base of the DHT worker's requests (what ``DhtClient`` may send)."""


class Info(DhtRequest[DhtInfo]):
    """This DHT node: peer id, visible addresses, session, run."""


class PublishPeer(DhtRequest[bool]):
    status: PeerStatus
    ttl_s: float


class Peers(DhtRequest[list[PeerRecord]]):
    """Live peer records (validated by the worker, and again as the reply arrives)."""

    prefer: list[str] | None = None
    limit: int | None = None


class Push(DhtRequest[Pushed]):
    peer_id: str
    maddrs: list[str]
    kind: PushKind
    data: bytes
    timeout: float


class PushFile(DhtRequest[Pushed]):
    peer_id: str
    maddrs: list[str]
    kind: PushKind
    path: str
    size: int
    timeout: float


class Events(DhtRequest[list[Queued]]):
    """Received pushes: each its event, or (spooled) the event without its body, and the body's file."""

    max_events: int = 64
    wait_s: float = 0.0


class SetMembers(DhtRequest[int]):
    peer_ids: list[str]


class SetPushCap(DhtRequest[int]):
    """Lower the push plane's cap for ``kind``; the reply is the cap now in force."""

    kind: str
    cap: int


class PushPlaneStats(pydantic.BaseModel):
    """The p2pd push plane's counters (``push_stats``): bytes per kind, errors, the inbound queue,
    refusals by reason, the caps in force, the spool directory."""

    bytes_in: dict[str, int]
    bytes_out: dict[str, int]
    errors: dict[str, int]
    events_queued: int
    events_rejected: int
    refused: dict[BudgetRefusal, int]
    caps: dict[PushKind, int]
    spool: str | None


class PushStats(DhtRequest[PushPlaneStats]):
    pass


class Probe(DhtRequest[bytes]):
    peer_id: str
    raw: bytes
    maddrs: list[str]
    timeout: float
