"""Who may write what in the DHT: Ed25519 signatures bound to peer ids, plus the record schemas.

Every DHT node of a run uses an Ed25519 libp2p identity, so its peer id (``12D3KooW...``) *is*
its public key (an identity multihash of the protobuf-encoded key). A record stored under
subkey ``<peer id>`` must carry a signature by that key over a ``DhtClaim`` (key, subkey, value,
expiration), made and checked by the signed-statement envelope (``chain/statement.py``) like every
other signed statement, so only the owner can write or refresh it, nobody can extend its lifetime, and the peer id
needs no separate registration. ``PulseRecordValidator`` plugs into hivemind's
``RecordValidatorBase``: every node checks every record it stores, serves or receives.

Checks, in order: known key of this run; subkey is an Ed25519 peer id; signature envelope is
well formed and verifies; expiration is no more than ``MAX_TTL_S`` (+ clock slack) ahead;
the body decodes strictly into the schema of its key and names the same peer id; a peer
record's ``node_key`` must be the key its peer id encodes and each of its addresses must end in
``/p2p/<its peer id>`` (``PeerRecord``), so a record can claim no one else's key or address.
Every DHT read validates every record of the answer again (hivemind checks each response), so a
record that passed is remembered (``ACCEPTED_KEPT``, by a digest of key, subkey, signed value
and expiration): a flood of records costs each node one check per record version, not one per
read. Only acceptance is remembered: the time-dependent checks can only turn a refusal into an
acceptance later, never the reverse.
We do not use hivemind's ``SchemaValidator`` (it needs pydantic.v1 models and detects coercion by
re-comparing values); strict pydantic v2 models in ``net/dht/records.py`` do the same job.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from pulse_node.chain.identity import Identity, key_of_peer_id, peer_id_of_key
from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.statement import Statement
from pulse_node.errors import WireError
from pulse_node.net.dht.records import (
    CLOCK_SLACK_S,
    KEY_KINDS,
    MAX_PEER_RECORD_BYTES,
    MAX_TTL_S,
    decode_dht_record,
    dht_key,
)

log = logging.getLogger(__name__)

_PB_ED25519_PRIV = b"\x08\x01\x12\x40"
_ENVELOPE_TAG = "pulse-dht-sig-2"
#: records remembered as accepted, at most
ACCEPTED_KEPT = 16384


def peer_id_of(identity: Identity) -> str:
    """The libp2p peer id (base58) of an Ed25519 identity."""
    return peer_id_of_key(identity.public_key_hex)


def public_key_of(peer_id: str) -> bytes:
    """The raw Ed25519 public key inside a peer id; ``WireError`` for any other kind of id."""
    return bytes.fromhex(key_of_peer_id(peer_id))


def libp2p_private_key(identity: Identity) -> bytes:
    """The identity as a serialized libp2p PrivateKey protobuf (what ``p2pd -id`` reads)."""
    raw = identity.private_bytes() + bytes.fromhex(identity.public_key_hex)
    return _PB_ED25519_PRIV + raw


@dataclass(frozen=True)
class DhtClaim:
    """What the owner of a DHT record signs: ``value`` under (``key``, ``subkey``) until ``expiration``.
    Only the signature travels (hivemind carries the rest); the claim is never decoded."""

    key: bytes
    subkey: bytes
    value: bytes
    expiration: float


DHT_CLAIMS = Statement(DhtClaim, magic="pulse/dht-record", format=1, max_bytes=MAX_PEER_RECORD_BYTES + 512,
                       signatures=())


def claim_of(record: DHTRecord) -> DhtClaim:
    """The claim a record's signature covers (``record.value`` here is the unsigned value)."""
    return DhtClaim(record.key, record.subkey, record.value, float(record.expiration_time))


def sign_envelope(record: DHTRecord, identity: Identity) -> bytes:
    return msgpack.packb([_ENVELOPE_TAG, record.value, DHT_CLAIMS.signature_of(identity, claim_of(record))],
                         use_bin_type=True)


def open_envelope(value: bytes) -> tuple[bytes, bytes]:
    """Signed value -> (unsigned value, signature); ``WireError`` if malformed."""
    if len(value) > MAX_PEER_RECORD_BYTES + 128:
        raise WireError(f"signed value of {len(value)} bytes exceeds the size cap")
    try:
        tag, inner, sig = msgpack.unpackb(value, raw=False)
    except Exception:
        raise WireError("value is not a signature envelope") from None
    if tag != _ENVELOPE_TAG or not isinstance(inner, bytes) or not isinstance(sig, bytes) or len(sig) != 64:
        raise WireError("value is not a signature envelope")
    return inner, sig


class PulseRecordValidator(RecordValidatorBase):  # type: ignore[misc]  # hivemind ships no types
    """Signs this node's records and admits only signed, schema-valid records of one run."""

    def __init__(self, run_id: str, identity: Identity) -> None:
        self._identity = identity
        self._own_subkey = DHTProtocol.serializer.dumps(peer_id_of(identity))
        self._kinds = {DHTID.generate(source=dht_key(run_id, k)).to_bytes(): k for k in KEY_KINDS}
        self._accepted: OrderedDict[bytes, None] = OrderedDict()
        #: a cheap refusal asked before any other check (the DHT worker's storage cap)
        self.precheck: Callable[[DHTRecord], bool] | None = None

    def validate(self, record: DHTRecord) -> bool:
        digest = hashlib.blake2b(b"".join((struct.pack(">dII", record.expiration_time, len(record.key),
                                                       len(record.subkey)), record.key, record.subkey,
                                           record.value)), digest_size=16).digest()
        if digest in self._accepted:
            self._accepted.move_to_end(digest)
            return True
        if self.precheck is not None and self.precheck(record):
            return False
        reason = self.reject_reason(record)
        if reason is not None:
            log.debug("rejected DHT record: %s", reason)
            return False
        self._accepted[digest] = None
        if len(self._accepted) > ACCEPTED_KEPT:
            self._accepted.popitem(last=False)
        return True

    def reject_reason(self, record: DHTRecord, *, now: float | None = None) -> str | None:
        """Why ``record`` is refused, or None if it is acceptable."""
        kind = self._kinds.get(record.key)
        if kind is None:
            return "key is not a record kind of this run"
        if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
            return "records must be stored under a peer-id subkey"
        now = time.time() if now is None else now
        if record.expiration_time > now + MAX_TTL_S + CLOCK_SLACK_S:
            return f"expiration {record.expiration_time - now:.0f}s ahead exceeds the {MAX_TTL_S:.0f}s limit"
        try:
            peer_id = DHTProtocol.serializer.loads(record.subkey)
        except Exception:
            return "subkey is not msgpack"
        if not isinstance(peer_id, str):
            return "subkey is not a peer id string"
        try:
            body = decode_dht_record(kind, self._check_signature(record, peer_id))
        except WireError as exc:
            return str(exc)
        if not isinstance(body, PeerRecord):
            return f"{kind} records carry no peer id"
        if body.peer_id != peer_id:
            return f"record names peer {body.peer_id} but is stored under {peer_id}"
        if body.updated_at > now + CLOCK_SLACK_S or body.updated_at > record.expiration_time:
            return "updated_at is in the future or after the record's expiration"
        return None

    @staticmethod
    def _check_signature(record: DHTRecord, peer_id: str) -> bytes:
        """Verify the envelope's signature; return the unsigned value (the encoded record)."""
        inner, sig = open_envelope(record.value)
        claim = DhtClaim(record.key, record.subkey, inner, float(record.expiration_time))
        if not DHT_CLAIMS.signed_by(claim, key_of_peer_id(peer_id), sig):
            raise WireError(f"signature does not verify for {peer_id}")
        return inner

    def sign_value(self, record: DHTRecord) -> bytes:
        if record.subkey != self._own_subkey:
            value: bytes = record.value  # not ours to sign: it will fail validation everywhere
            return value
        return sign_envelope(record, self._identity)

    def strip_value(self, record: DHTRecord) -> bytes:
        value: bytes = record.value
        try:
            return open_envelope(value)[0]
        except WireError:
            return value

    @property
    def priority(self) -> int:
        return 10

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False
