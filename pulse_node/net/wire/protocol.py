"""Peer-to-peer data-plane messages: protocol ids, declared msgpack structs, size caps.

Every libp2p stream of the data plane carries one request and one response::

    request   = frame(RequestStruct) [+ body of PushRequest.size bytes, push only]
    response  = frame(Response)      [+ body of Response.size bytes when status == "ok"]
    frame(s)  = 4-byte big-endian length + msgpack map of exactly the struct's fields

The length of a frame is checked against the struct's cap before anything is read, and a
decoded map must carry exactly the declared fields with the declared types and bounds, so
a hostile peer can make us reject a request but never allocate or parse without limit.
Each struct carries ``v`` (the wire version, ``WIRE_VERSION``); the libp2p protocol ids are
versioned as well (``/pulse/<kind>/2.0.0``, ``kind`` a ``vocab.FetchKind`` or ``push``; push
kinds travel as ``vocab.PushKind`` strings). This module is pure (msgpack only) so the node
process can import it without trio or libp2p.

A fetch is asked for with its request struct from the start (``FetchRequest``: ``PatchRequest(
version=7)``, the wire version filled in): ``Transport.fetch`` takes it, the wire client hands
it to its worker as the frame body it will send (``body``), the worker decodes it with the same
checks as a peer's request. Its kind is its type (``kind_of``).
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Literal, TypeVar

import msgpack

from pulse_node.errors import UnsupportedVersion, WireError
from pulse_node.vocab import FETCH_KINDS, PUSH_KINDS, FetchKind, check_fetch_kind

WIRE_VERSION = 2
CHUNK = 256 * 1024  # body write size: 1.3-1.5x faster than 64 KiB (bench/dataplane.py); 4 MB writes stall
MAX_U64 = (1 << 63) - 1
_LEN = struct.Struct(">I")

#: what a libp2p stream of the data plane carries: one fetch kind, or a push
StreamKind = Literal[FetchKind, "push"]


def protocol_id(kind: str) -> str:
    """The libp2p protocol id of a stream kind: ``/pulse/<kind>/<WIRE_VERSION>.0.0``."""
    return f"/pulse/{kind}/{WIRE_VERSION}.0.0"


#: stream kinds -> libp2p protocol id
PROTOCOLS: dict[str, str] = {kind: protocol_id(kind) for kind in (*FETCH_KINDS, "push")}

#: largest body a server sends / a client accepts, per fetch kind
BODY_CAPS: dict[str, int] = {
    "record": 1 << 20,
    "patch": 8 << 30,
    "anchor": 64 << 20,  # one anchor chunk; whole anchors are fetched in chunks
    "catchup": 8 << 30,
    "trainer_state": 64 << 30,  # FP32 weights + momentum of a whole model
    "loco_payload": 1 << 30,  # one trainer's PULSELoCo payload of a recent round
    "loco_decision": 64 << 10,  # a signed round decision (loco/decision.py caps it the same)
    "loco_commit": 264 << 10,  # a signed round commitment (loco/roundcommit.py caps it at 257 KiB)
}

#: largest push body accepted per push kind (bounded by the local RPC frame, 64 MiB)
PUSH_CAPS: dict[str, int] = {
    "rollouts": 16 << 20,
    "loco": 48 << 20,
    "loco_commit": 264 << 10,  # a signed round commitment (loco/roundcommit.py caps it at 257 KiB)
    "head": 64 << 10,
    "loco_decision": 64 << 10,
    "evidence": 640 << 10,  # two conflicting signed messages (chain/evidence.py caps it at ~515 KiB)
    "spot_answer": 2 << 10,  # a target's signed answer receipt (loco/spot_answer.py caps it at 1 KiB; the answer is fetched)
    "spot_verdict": 2 << 10,  # a verifier's signed check verdict (loco/commitlist.py caps it at 1 KiB)
    "spot_evidence": 48 << 20,  # a failed check's evidence (loco/spot_evidence.py; larger exhibits by digest)
}
assert set(BODY_CAPS) == set(FETCH_KINDS) and set(PUSH_CAPS) == set(PUSH_KINDS)

REQUEST_CAP = 1024  # bytes of one request frame
RESPONSE_CAP = 4096  # bytes of one response frame

STATUSES = ("ok", "not_found", "bad_request", "busy", "too_large", "unsupported", "internal")


def _check(name: str, value: object, spec: tuple[str, int]) -> None:
    kind, bound = spec
    if kind == "int" and not (type(value) is int and 0 <= value <= bound):
        raise WireError(f"field {name!r} must be an integer in [0, {bound}]")
    if kind == "opt_int" and value is not None and not (type(value) is int and 0 <= value <= bound):
        raise WireError(f"field {name!r} must be null or an integer in [0, {bound}]")
    if kind == "str" and not (type(value) is str and len(value) <= bound):
        raise WireError(f"field {name!r} must be a string of at most {bound} characters")
    if kind == "bool" and type(value) is not bool:
        raise WireError(f"field {name!r} must be a boolean")


W = TypeVar("W", bound="WireStruct")


@dataclass(frozen=True)
class WireStruct:
    """Base: a frozen dataclass whose ``SPEC`` declares each field's type and bound."""

    v: int
    SPEC: ClassVar[dict[str, tuple[str, int]]] = {}
    CAP: ClassVar[int] = REQUEST_CAP

    def __post_init__(self) -> None:
        for f in fields(self):
            _check(f.name, getattr(self, f.name), self.SPEC[f.name])
        if self.v != WIRE_VERSION:
            raise UnsupportedVersion(f"unsupported wire version {self.v} (this peer speaks {WIRE_VERSION})")

    def body(self) -> bytes:
        """The msgpack map of the struct (a frame without its length prefix)."""
        body = msgpack.packb(asdict(self), use_bin_type=True)
        if len(body) > self.CAP:
            raise WireError(f"{type(self).__name__} of {len(body)} bytes exceeds {self.CAP}")
        return body

    def encode(self) -> bytes:
        """The framed struct: length prefix + msgpack map."""
        body = self.body()
        return _LEN.pack(len(body)) + body

    @classmethod
    def decode(cls: type[W], body: bytes) -> W:
        """Parse and validate a frame body; ``WireError`` on anything undeclared."""
        if len(body) > cls.CAP:
            raise WireError(f"{cls.__name__} of {len(body)} bytes exceeds {cls.CAP}")
        try:
            msg = msgpack.unpackb(body, raw=False, strict_map_key=True, max_bin_len=cls.CAP,
                                  max_str_len=cls.CAP, max_array_len=0, max_map_len=16)
        except Exception as exc:
            raise WireError(f"malformed {cls.__name__}: {type(exc).__name__}") from None
        if not isinstance(msg, dict):
            raise WireError(f"{cls.__name__} is not a map")
        if msg.get("v") != WIRE_VERSION:
            raise UnsupportedVersion(f"unsupported wire version {msg.get('v')!r} (this peer speaks {WIRE_VERSION})")
        want = set(cls.SPEC)
        if set(msg) != want:
            raise WireError(f"{cls.__name__} fields {sorted(map(str, msg))} != {sorted(want)}")
        try:
            return cls(**msg)
        except TypeError as exc:
            raise WireError(f"malformed {cls.__name__}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class RecordRequest(WireStruct):
    """The signed record of ``version``, or of the head when ``version`` is null."""

    v: int = WIRE_VERSION
    version: int | None
    SPEC: ClassVar = {"v": ("int", 255), "version": ("opt_int", MAX_U64)}


@dataclass(frozen=True, kw_only=True)
class PatchRequest(WireStruct):
    """The patch that produces ``version`` from its parent."""

    v: int = WIRE_VERSION
    version: int
    SPEC: ClassVar = {"v": ("int", 255), "version": ("int", MAX_U64)}


@dataclass(frozen=True, kw_only=True)
class AnchorRequest(WireStruct):
    """``length`` bytes at ``offset`` of the anchor (full state) of ``version``."""

    v: int = WIRE_VERSION
    version: int
    offset: int
    length: int
    SPEC: ClassVar = {"v": ("int", 255), "version": ("int", MAX_U64),
                      "offset": ("int", MAX_U64), "length": ("int", BODY_CAPS["anchor"])}


@dataclass(frozen=True, kw_only=True)
class CatchupRequest(WireStruct):
    """One patch from version ``base`` straight to version ``target`` (made on demand if needed)."""

    v: int = WIRE_VERSION
    base: int
    target: int
    SPEC: ClassVar = {"v": ("int", 255), "base": ("int", MAX_U64), "target": ("int", MAX_U64)}


@dataclass(frozen=True, kw_only=True)
class TrainerStateRequest(WireStruct):
    """A trainer's FP32 global weights + outer momentum (how trainers join and re-sync)."""

    v: int = WIRE_VERSION
    SPEC: ClassVar = {"v": ("int", 255)}


@dataclass(frozen=True, kw_only=True)
class LocoPayloadRequest(WireStruct):
    """The PULSELoCo payload of ``round`` whose BLAKE3 digest is ``digest`` (64 hex chars)."""

    v: int = WIRE_VERSION
    round: int
    digest: str
    SPEC: ClassVar = {"v": ("int", 255), "round": ("int", MAX_U64), "digest": ("str", 64)}


@dataclass(frozen=True, kw_only=True)
class LocoDecisionRequest(WireStruct):
    """The signed decision of PULSELoCo round ``round`` that the peer applied."""

    v: int = WIRE_VERSION
    round: int
    SPEC: ClassVar = {"v": ("int", 255), "round": ("int", MAX_U64)}


@dataclass(frozen=True, kw_only=True)
class LocoCommitRequest(WireStruct):
    """The signed round commitment of PULSELoCo round ``round`` whose BLAKE3 digest is ``digest``
    (64 hex chars), as a round decision names it (``trainer/decisions.py``)."""

    v: int = WIRE_VERSION
    round: int
    digest: str
    SPEC: ClassVar = {"v": ("int", 255), "round": ("int", MAX_U64), "digest": ("str", 64)}


@dataclass(frozen=True)
class PushRequest(WireStruct):
    """``size`` bytes of a push of ``kind`` (a ``vocab.PushKind``) follow this frame."""

    kind: str
    size: int
    SPEC: ClassVar = {"v": ("int", 255), "kind": ("str", 16), "size": ("int", max(PUSH_CAPS.values()))}


@dataclass(frozen=True)
class Response(WireStruct):
    """Answer to any request; ``size`` body bytes follow when ``status`` is ``ok``.

    ``total`` is the whole file's size (an anchor's size for a chunk request)."""

    status: str
    size: int
    total: int
    message: str
    SPEC: ClassVar = {"v": ("int", 255), "status": ("str", 16), "size": ("int", MAX_U64),
                      "total": ("int", MAX_U64), "message": ("str", 512)}
    CAP: ClassVar[int] = RESPONSE_CAP


def error_response(status: str, message: str) -> Response:
    return Response(v=WIRE_VERSION, status=status, size=0, total=0, message=message[:512])


REQUESTS: dict[str, type[WireStruct]] = {
    "record": RecordRequest,
    "patch": PatchRequest,
    "anchor": AnchorRequest,
    "catchup": CatchupRequest,
    "trainer_state": TrainerStateRequest,
    "loco_payload": LocoPayloadRequest,
    "loco_decision": LocoDecisionRequest,
    "loco_commit": LocoCommitRequest,
    "push": PushRequest,
}


def frame_length(header: bytes, cap: int) -> int:
    """The body length declared by a 4-byte frame header; ``WireError`` above ``cap``."""
    n: int = _LEN.unpack(header)[0]
    if n > cap:
        raise WireError(f"declared frame of {n} bytes exceeds {cap}")
    return n


#: what one peer may ask another for: one request struct per ``vocab.FetchKind``
FetchRequest = (RecordRequest | PatchRequest | AnchorRequest | CatchupRequest | TrainerStateRequest
                | LocoPayloadRequest | LocoDecisionRequest | LocoCommitRequest)
_FETCH_TYPES = (RecordRequest, PatchRequest, AnchorRequest, CatchupRequest, TrainerStateRequest,
                LocoPayloadRequest, LocoDecisionRequest, LocoCommitRequest)
_KIND_OF: dict[type[WireStruct], FetchKind] = {
    RecordRequest: "record", PatchRequest: "patch", AnchorRequest: "anchor", CatchupRequest: "catchup",
    TrainerStateRequest: "trainer_state", LocoPayloadRequest: "loco_payload", LocoDecisionRequest: "loco_decision",
    LocoCommitRequest: "loco_commit",
}
assert all(REQUESTS[kind] is cls for cls, kind in _KIND_OF.items()) and set(_KIND_OF.values()) == set(FETCH_KINDS)


def kind_of(request: object) -> FetchKind:
    """The fetch kind a request struct asks for; ``WireError`` for anything else."""
    kind = _KIND_OF.get(type(request)) if isinstance(request, WireStruct) else None
    if kind is None:
        raise WireError(f"{type(request).__name__} is not a fetch request (one of {', '.join(FETCH_KINDS)})")
    return kind


def params_of(request: FetchRequest) -> dict[str, int | str | None]:
    """A request's fields but the wire version: what a store's resolver (``chain/serving.py``) reads."""
    return {k: v for k, v in asdict(request).items() if k != "v"}


def decode_fetch(kind: str, body: bytes) -> FetchRequest:
    """The fetch request of ``kind`` in ``body`` (a frame body), checked as a peer's request is."""
    req = REQUESTS[check_fetch_kind(kind)].decode(body)
    if not isinstance(req, _FETCH_TYPES):  # unreachable: REQUESTS maps each fetch kind to its struct
        raise WireError(f"{type(req).__name__} is not a {kind} request")
    return req


def parse_digest(digest: str | None) -> str | None:
    """Normalise a caller's sha256 digest (``sha256:<hex>`` or bare hex) to lowercase hex."""
    if digest is None:
        return None
    hexpart = digest.split(":", 1)[1] if digest.startswith("sha256:") else digest
    if len(hexpart) != 64 or any(c not in "0123456789abcdefABCDEF" for c in hexpart):
        raise WireError(f"digest {digest!r} is not a sha256 hex digest")
    return hexpart.lower()
