"""The wire worker's RPC as types: one request per ``@rpc`` handler of ``wire.worker.WireService``,
and the replies the node reads (``WireInfo``, ``FetchResult``, ``AnchorResult``, ``Pushed``,
``WireStats``, ``inbox.Queued``).

Each request's fields are that handler's keyword arguments and its ``Request[R]`` the reply
(``rpc_api.py``; ``tests/test_net_rpc_api.py`` checks them against the handlers). ``WireClient``
sends these; nothing here imports trio or libp2p.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pulse_node.net.local.inbox import Queued
from pulse_node.net.local.rpc_api import Pushed, Request
from pulse_node.net.wire import protocol as wp
from pulse_node.vocab import BudgetRefusal, FetchKind, PushKind

R = TypeVar("R")


@dataclass(frozen=True)
class WireInfo:
    peer_id: str
    listen_maddrs: list[str]


@dataclass(frozen=True)
class FetchResult:
    bytes: int
    seconds: float
    peer: str
    total: int = 0  # size of the whole file (for an anchor chunk: the anchor's size)


@dataclass(frozen=True)
class AnchorResult:
    bytes: int
    seconds: float
    fetched: int  # bytes moved in this call (the rest was resumed from a partial download)
    resumed: int
    failed_providers: list[str]
    errors: dict[str, str]
    bad_providers: list[str] = field(default_factory=list)  # sent a piece failing its signed digest: a lie
    complete: bool = True  # False (with ``error``) only for a download of signed pieces that did not finish
    error: str = ""


@dataclass(frozen=True)
class WireStats:
    """The wire worker's counters: bytes per stream kind and per peer, errors and requests by
    kind, the inbound push queue, refusals by reason, open streams by pool."""

    bytes_in: dict[str, int]
    bytes_out: dict[str, int]
    peers: dict[str, dict[str, int]]
    errors: dict[str, int]
    requests: dict[str, int]
    events_queued: int
    events_rejected: int
    refused: dict[BudgetRefusal, int]
    streams_open: dict[str, int]
    members: int
    connected_peers: list[str]


class WireRequest(Request[R], Generic[R]):
    """Base of the wire worker's requests (what ``WireClient`` may send)."""


class Info(WireRequest[WireInfo]):
    """This node's data-plane peer id and listen addresses."""


class SetHead(WireRequest[bool]):
    record: bytes


class SetMembers(WireRequest[int]):
    peer_ids: list[str]


class SetStanding(WireRequest[int]):
    """Non-members with standing (``peers/standing.py``); the others share the newcomers' budgets."""

    peer_ids: list[str]


class Fetch(WireRequest[FetchResult]):
    """One file from ``peer``: ``request`` is the body of the request frame to send (a
    ``protocol.FetchRequest`` of ``kind``, ``body()``), decoded and checked again by the worker."""

    peer: str
    kind: FetchKind
    request: bytes
    dest: str
    timeout: float
    expected_digest: str | None = None
    max_bytes: int | None = None


class FetchAnchor(WireRequest[AnchorResult]):
    peers: list[str]
    version: int
    size: int
    dest: str
    timeout: float
    digest: str | None = None
    chunk: int = 4 << 20
    per_peer: int = 2
    pieces: list[list[int | str]] | None = None  # (offset, length, BLAKE3 hex) of each signed piece


class Push(WireRequest[Pushed]):
    peer: str
    kind: PushKind
    data: bytes
    timeout: float


class Events(WireRequest[list[Queued]]):
    max_events: int = 64
    wait_s: float = 0.0


class Stats(WireRequest[WireStats]):
    pass


class Probe(WireRequest[bytes]):
    peer: str
    kind: wp.StreamKind
    raw: bytes
    timeout: float
