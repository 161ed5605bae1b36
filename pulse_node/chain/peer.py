"""A peer as the swarm announces it: the one peer type every layer uses.

``PeerStatus`` is the part of a peer's announcement its node decides (role, data-plane
addresses, head version, what it serves, counters, its key and a trainer's admission);
``PeerRecord`` is the whole announcement, that status plus the fields its DHT worker owns (peer
id, DHT addresses, session nonce, time). Discovery hands every layer ``PeerRecord``s: the roles
(whom to fetch from, push to, wait for), the peer book and its trainer set (``peers/book.py``,
``peers/trainerset.py``: who is a member, which admissions are carried), the transports. The DHT
stores them (``net/dht/records.py``: keys, encoding, the bounded read).

Every claim in a record is bound to its publisher: the record is signed by the key its peer id
encodes (``net/dht/validator.py``), its ``node_key`` must be that same key, and every address it
announces must end in ``/p2p/<its peer id>`` (``PeerRecord`` checks both wherever a record is
validated). What a record says beyond that (versions, roles) is a hint, never trusted by itself.
Decoding is strict (no type coercion, unknown fields rejected), so a peer cannot smuggle data
past the schema. Pure (pydantic): importable without hivemind.
"""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
from pydantic import Field, StringConstraints

from pulse_node.chain.identity import key_of_peer_id
from pulse_node.errors import WireError

SCHEMA_VERSION: Literal[1] = 1
#: a trainer's admission to the trainer set (``chain/admission.py``), as carried in its record
MAX_ADMISSION_BYTES = 4096
#: a peer's ``head`` / ``lowest`` when it holds / serves no version
NO_VERSION = -1

Role = Literal["bootstrap", "trainer", "inference"]
ROLES: tuple[Role, ...] = ("bootstrap", "trainer", "inference")

_PEER_ID_RE = r"^[1-9A-HJ-NP-Za-km-z]{40,64}$"
_MAX_INT = 2**63 - 1

PeerId = Annotated[str, StringConstraints(pattern=_PEER_ID_RE)]
Maddr = Annotated[str, StringConstraints(min_length=4, max_length=256, pattern=r"^/")]
HexHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,128}$")]
Count = Annotated[int, Field(ge=0, le=_MAX_INT)]
Version = Annotated[int, Field(ge=0, le=_MAX_INT)]
Time = Annotated[float, Field(ge=0.0, le=1e11)]


class Strict(pydantic.BaseModel):
    """Strict, frozen, closed: what a peer sent is exactly what validated."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid", frozen=True)


class Serves(Strict):
    """Versions a peer can serve: a contiguous range of patches plus full checkpoints."""

    lowest: Version | None = None
    highest: Version | None = None
    anchors: list[Version] = Field(default_factory=list, max_length=64)


class PeerCounters(Strict):
    """Traffic counters a peer advertises in its record (for dashboards; never trusted)."""

    bytes_in: Count = 0
    bytes_out: Count = 0
    patches_applied: Count = 0
    rollouts_sent: Count = 0
    errors: Count = 0


class PeerStatus(Strict):
    """The part of a peer record the node decides (everything but identity and liveness): what
    ``Transport.publish`` takes."""

    role: Role
    wire_maddrs: list[Maddr] = Field(default_factory=list, max_length=8)
    version: Version | None = None
    chain_hash: HexHash | None = None
    state_hash: HexHash | None = None
    serves: Serves = Field(default_factory=Serves)
    counters: PeerCounters = Field(default_factory=PeerCounters)
    metrics_url: Annotated[str, StringConstraints(max_length=256)] | None = None
    node_key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    software: Annotated[str, StringConstraints(max_length=64)] = ""
    admission: Annotated[bytes, Field(max_length=MAX_ADMISSION_BYTES)] | None = None


class PeerRecord(PeerStatus):
    """A peer: what the DHT holds under ``pulse/<run>/peers`` for it (subkey = ``peer_id``), and
    what ``Transport.peers()`` returns. The properties read it with the roles' conventions:
    versions as ints (``NO_VERSION`` for none), the first data-plane address."""

    v: Literal[1] = SCHEMA_VERSION
    peer_id: PeerId
    dht_maddrs: list[Maddr] = Field(default_factory=list, max_length=8)
    session: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    updated_at: Time
    leaving: bool = False

    @pydantic.model_validator(mode="after")
    def _claims_bound_to_peer_id(self) -> PeerRecord:
        """The announced key is the one the peer id encodes; every address names this peer."""
        try:
            key = key_of_peer_id(self.peer_id)
        except WireError as exc:
            raise ValueError(str(exc)) from None
        if self.node_key is not None and self.node_key != key:
            raise ValueError("node_key is not the key its peer id encodes")
        suffix = f"/p2p/{self.peer_id}"
        for m in (*self.wire_maddrs, *self.dht_maddrs):
            if not m.endswith(suffix):
                raise ValueError(f"address {m[:80]!r} does not end in /p2p/<its own peer id>")
        return self

    @property
    def address(self) -> str:
        """The data-plane multiaddr to fetch from and push to ("" when it announces none)."""
        return self.wire_maddrs[0] if self.wire_maddrs else ""

    @property
    def head(self) -> int:
        """The newest version it announces holding (``NO_VERSION`` for none)."""
        return NO_VERSION if self.version is None else self.version

    @property
    def lowest(self) -> int:
        """The lowest version whose patch it serves (patches from there to ``head``)."""
        return NO_VERSION if self.serves.lowest is None else self.serves.lowest

    @property
    def anchors(self) -> list[int]:
        """The anchor versions (full checkpoints) it serves."""
        return list(self.serves.anchors)
