"""Records that peers publish in the swarm's DHT: declared, versioned, size-capped schemas.

Two DHT keys per run, each a dictionary whose subkeys are the publishers' peer ids:

- ``pulse/<run>/peers``: one ``PeerRecord`` per live peer (role, addresses, head version,
  what it serves, counters). The node supplies a ``PeerStatus``; the DHT worker adds the fields
  it owns (peer id, DHT addresses, session nonce, time) and keeps the record alive.
- ``pulse/<run>/heads``: one ``HeadEntry`` per publisher: the newest version it holds and the
  chain's signed version record for it (opaque bytes here; the chain layer verifies them).

Every record is a msgpack map with an explicit schema version ``v``; decoding is strict (no
type coercion, unknown fields rejected) so a peer cannot smuggle data past the schema.
This module is pure (pydantic + msgpack): the node imports it without hivemind.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgpack
import pydantic
from pydantic import Field, StringConstraints

from pulse_node.errors import WireError
from pulse_node.vocab import RUN_ID_RULE, is_run_id

SCHEMA_VERSION = 1
#: encoded size caps (bytes, before the signature envelope)
MAX_PEER_RECORD_BYTES = 4096
MAX_HEAD_ENTRY_BYTES = 16384
MAX_HEAD_RECORD_BYTES = 12288
#: records live between these bounds; nodes refresh every ttl/3
MIN_TTL_S = 1.0
MAX_TTL_S = 600.0
#: how far in the future a peer's clock may be before its records are refused
CLOCK_SLACK_S = 30.0

KEY_KINDS = ("peers", "heads")
ROLES = ("bootstrap", "trainer", "inference")

_PEER_ID_RE = r"^[1-9A-HJ-NP-Za-km-z]{40,64}$"
_MAX_INT = 2**63 - 1

PeerId = Annotated[str, StringConstraints(pattern=_PEER_ID_RE)]
Maddr = Annotated[str, StringConstraints(min_length=4, max_length=256, pattern=r"^/")]
HexHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,128}$")]
Count = Annotated[int, Field(ge=0, le=_MAX_INT)]
Version = Annotated[int, Field(ge=0, le=_MAX_INT)]
Time = Annotated[float, Field(ge=0.0, le=1e11)]


class _Record(pydantic.BaseModel):
    """Strict, frozen, closed: what a peer sent is exactly what validated."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid", frozen=True)


class Serves(_Record):
    """Versions a peer can serve: a contiguous range of patches plus full checkpoints."""

    lowest: Version | None = None
    highest: Version | None = None
    anchors: list[Version] = Field(default_factory=list, max_length=64)


class PeerCounters(_Record):
    """Traffic counters a peer advertises in its record (for dashboards; never trusted)."""

    bytes_in: Count = 0
    bytes_out: Count = 0
    patches_applied: Count = 0
    rollouts_sent: Count = 0
    errors: Count = 0


class PeerStatus(_Record):
    """The part of a peer record the node decides (everything but identity and liveness)."""

    role: Literal["bootstrap", "trainer", "inference"]
    wire_maddrs: list[Maddr] = Field(default_factory=list, max_length=8)
    version: Version | None = None
    chain_hash: HexHash | None = None
    state_hash: HexHash | None = None
    serves: Serves = Field(default_factory=Serves)
    counters: PeerCounters = Field(default_factory=PeerCounters)
    metrics_url: Annotated[str, StringConstraints(max_length=256)] | None = None
    node_key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    software: Annotated[str, StringConstraints(max_length=64)] = ""


class PeerRecord(PeerStatus):
    """What the DHT holds under ``pulse/<run>/peers`` for one peer (subkey = ``peer_id``)."""

    v: Literal[1] = SCHEMA_VERSION
    peer_id: PeerId
    dht_maddrs: list[Maddr] = Field(default_factory=list, max_length=8)
    session: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    updated_at: Time
    leaving: bool = False


class HeadEntry(_Record):
    """What the DHT holds under ``pulse/<run>/heads`` for one publisher (subkey = ``peer_id``)."""

    v: Literal[1] = SCHEMA_VERSION
    peer_id: PeerId
    session: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    version: Version
    record: Annotated[bytes, Field(max_length=MAX_HEAD_RECORD_BYTES)]
    updated_at: Time


R = TypeVar("R", bound=_Record)
MODEL_OF_KIND: dict[str, type[_Record]] = {"peers": PeerRecord, "heads": HeadEntry}
MAX_BYTES_OF_KIND = {"peers": MAX_PEER_RECORD_BYTES, "heads": MAX_HEAD_ENTRY_BYTES}


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


def encode_dht_record(record: _Record) -> bytes:
    """The msgpack bytes of a record (what is signed and stored)."""
    return msgpack.packb(record.model_dump(mode="python"), use_bin_type=True)


def decode_dht_record(kind: str, data: bytes) -> _Record:
    """Bytes -> validated record of ``kind``; ``WireError`` naming the first problem."""
    cap = MAX_BYTES_OF_KIND[kind]
    if len(data) > cap:
        raise WireError(f"{kind} record of {len(data)} bytes exceeds {cap}")
    try:
        tree = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"{kind} record is not msgpack ({exc})") from None
    return validate_tree(MODEL_OF_KIND[kind], tree)


def validate_tree(model: type[R], tree: Any) -> R:
    """A decoded msgpack tree -> ``model``; ``WireError`` naming the first bad field."""
    if not isinstance(tree, dict):
        raise WireError(f"{model.__name__} is not a map")
    try:
        return model.model_validate(tree)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "record"
        raise WireError(f"{model.__name__}.{loc}: {first['msg']}") from None


class DhtInfo(_Record):
    """What the worker reports about itself (``info`` RPC)."""

    peer_id: PeerId
    visible_maddrs: list[str]
    session: str
    run_id: str
    client_mode: bool
    routing_table_size: Count
    #: set when another live process publishes under this node's peer id (copied identity)
    duplicate: str | None = None
