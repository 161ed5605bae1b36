"""Records that peers publish in the swarm's DHT: where they live, how they are encoded, how many are read.

One DHT key per run, ``pulse/<run>/peers``, a dictionary whose subkeys are the publishers' peer
ids, holding one ``PeerRecord`` per live peer (the one peer type, declared in ``chain/peer.py``:
role, addresses, head version, what it serves, counters, and a trainer's admission to the
trainer set). The node supplies a ``PeerStatus``; the DHT worker adds the fields it owns (peer
id, DHT addresses, session nonce, time) and keeps the record alive. (A second key, ``heads``, was written but never read, and is gone: head
versions travel in the peer record, and signed head records in ``head`` pushes.)

Every claim in a record is bound to its publisher: the record is signed by the key its peer id
encodes (``net/dht/validator.py``), its ``node_key`` must be that same key, and every address it
announces must end in ``/p2p/<its peer id>`` (``PeerRecord`` checks both wherever a record is
validated: in every DHT node, in the worker that reads records, in the node). What a record
says beyond that (versions, roles) is a hint, never trusted by itself.

Every record is a msgpack map with an explicit schema version ``v``; decoding is strict (no
type coercion, unknown fields rejected) so a peer cannot smuggle data past the schema. A node
reads at most ``MAX_PEERS_READ`` records (``select_peer_records``: the preferred peer ids first,
in the node's order, then others in a draw of its own, never by what a record says about its
time or version), so a flood of Sybil records cannot exceed the worker's RPC frame and blind it.
This module is pure (pydantic + msgpack): the node imports it without hivemind.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgpack
import pydantic

from pulse_node.chain.peer import Count, PeerId, PeerRecord, Strict
from pulse_node.errors import WireError
from pulse_node.vocab import RUN_ID_RULE, is_run_id

#: encoded size cap of a peer record (bytes, before the signature envelope)
MAX_PEER_RECORD_BYTES = 8192
#: peer records a node reads per lookup, at most (x MAX_PEER_RECORD_BYTES: 4 MiB, under the RPC frame)
MAX_PEERS_READ = 512
#: records live between these bounds; nodes refresh every ttl/3
MIN_TTL_S = 1.0
MAX_TTL_S = 600.0
#: how far in the future a peer's clock may be before its records are refused
CLOCK_SLACK_S = 30.0

KEY_KINDS = ("peers",)


R = TypeVar("R", bound=Strict)
E = TypeVar("E")  # a record, or a raw DHT entry the worker has not validated yet
#: records of peers without standing a node asks its DHT worker for, beyond its preferred ones
NEWCOMERS_READ = 64
MODEL_OF_KIND: dict[str, type[Strict]] = {"peers": PeerRecord}
MAX_BYTES_OF_KIND = {"peers": MAX_PEER_RECORD_BYTES}


def dht_key(run_id: str, kind: str) -> str:
    """The raw DHT key of one record kind in one run."""
    if kind not in KEY_KINDS:
        raise ValueError(f"unknown record kind {kind!r}")
    return f"pulse/{check_run_id(run_id)}/{kind}"


def check_run_id(run_id: str) -> str:
    """``run_id`` if valid (``vocab.RUN_ID_RULE``), else ``WireError``."""
    if not is_run_id(run_id):
        raise WireError(f"run id {run_id!r} must be {RUN_ID_RULE}")
    return run_id


def encode_dht_record(record: Strict) -> bytes:
    """The msgpack bytes of a record (what is signed and stored)."""
    return msgpack.packb(record.model_dump(mode="python"), use_bin_type=True)


def decode_dht_record(kind: str, data: bytes) -> Strict:
    """Bytes -> validated record of ``kind``; ``WireError`` naming the first problem."""
    cap = MAX_BYTES_OF_KIND[kind]
    if len(data) > cap:
        raise WireError(f"{kind} record of {len(data)} bytes exceeds {cap}")
    try:
        tree = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"{kind} record is not msgpack ({exc})") from None
    return validate_tree(MODEL_OF_KIND[kind], tree)


def select_peer_records(records: list[PeerRecord], *, prefer: Sequence[str] = (), limit: int = MAX_PEERS_READ,
                        salt: bytes = b"") -> list[PeerRecord]:
    """``select_entries`` of validated records (their peer id and first data-plane address)."""
    return select_entries(records, prefer=prefer, limit=limit, salt=salt, id_of=lambda r: r.peer_id,
                          range_of=lambda r: address_range(r.wire_maddrs))


def select_entries(records: list[E], *, prefer: Sequence[str] = (), limit: int = MAX_PEERS_READ,
                   salt: bytes = b"", id_of: Callable[[E], str], range_of: Callable[[E], str]) -> list[E]:
    """At most ``limit`` records: those of ``prefer`` first, in its order (the node's ranking:
    trainer-set members, then peers with standing, ``peers/standing.py``), then the others one per
    address range in turn, each range in an order drawn from ``salt`` (a secret of this node).

    Anyone can publish records under fresh keys, and a record's ``updated_at`` and version are
    what its publisher says (one announcing the future would sort first): neither orders
    anything here, so a flood cannot push the preferred peers out, and which newcomers are read
    is this node's draw, not the flooder's choice. ``id_of`` and ``range_of`` read a record's
    peer id and address range (the DHT worker selects raw entries before it validates them)."""
    rank = {pid: i for i, pid in enumerate(prefer)}
    chosen = sorted((r for r in records if id_of(r) in rank), key=lambda r: rank[id_of(r)])
    ranges: dict[str, list[E]] = {}
    for r in sorted((r for r in records if id_of(r) not in rank), key=lambda r: _draw(id_of(r), salt)):
        ranges.setdefault(range_of(r), []).append(r)
    queues = sorted(ranges.values(), key=lambda q: _draw(id_of(q[0]), salt))
    depth = 0
    while len(chosen) < limit and any(len(q) > depth for q in queues):
        chosen.extend(q[depth] for q in queues if len(q) > depth)
        depth += 1
    return chosen[:limit]


def address_range(wire_maddrs: object) -> str:
    """The network the first of a record's data-plane addresses is in: an IPv4 /24, an IPv6 /48,
    a DNS name ("" when there is none, or it is not a list of strings: any raw value is safe)."""
    first = wire_maddrs[0] if isinstance(wire_maddrs, list) and wire_maddrs else None
    parts = first.split("/") if isinstance(first, str) else []
    if len(parts) < 3:
        return ""
    proto, host = parts[1], parts[2]
    if proto == "ip4":
        return "ip4/" + ".".join(host.split(".")[:3])
    if proto == "ip6":
        return "ip6/" + ":".join(host.split(":")[:3])
    return f"{proto}/{host}"


def _draw(peer_id: str, salt: bytes) -> bytes:
    return hashlib.blake2b(peer_id.encode(), key=salt[:64], digest_size=8).digest()


def validate_tree(model: type[R], tree: object) -> R:
    """A decoded msgpack tree -> ``model``; ``WireError`` naming the first bad field."""
    if not isinstance(tree, dict):
        raise WireError(f"{model.__name__} is not a map")
    try:
        return model.model_validate(tree)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "record"
        raise WireError(f"{model.__name__}.{loc}: {first['msg']}") from None


class DhtInfo(Strict):
    """What the worker reports about itself (``info`` RPC)."""

    peer_id: PeerId
    visible_maddrs: list[str]
    session: str
    run_id: str
    client_mode: bool
    routing_table_size: Count
    #: set when another live process publishes under this node's peer id (copied identity)
    duplicate: str | None = None
