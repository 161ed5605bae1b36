"""Round decisions: the signed list of payloads that make up one PULSELoCo round (torch-free).

The coordinator of round ``r`` (see ``trainer/agreement.py``) lists the payloads it holds, each as
(trainer id, BLAKE3 digest of the encoded payload bytes), and signs the list with its Ed25519
node key. Every trainer then averages exactly those payloads, so all end the round
bit-identical.

Wire format (``DECISION_FORMAT`` 2): a msgpack array
``[DECISION_MAGIC, DECISION_FORMAT, run_id, round, base, epoch, coordinator, contributors, signer,
signature]`` with ``contributors = [[trainer_id, digest], ...]`` sorted by the trainer ids'
UTF-8 bytes without repeats (1..``MAX_CONTRIBUTORS`` entries), ``base`` the 32-byte outer
state hash the round starts from and ``epoch`` the 32-byte chain hash of the genesis of the
chain the round extends (``chain/record.py``): a decision is taken only in its own epoch, so one
signed in an earlier run (same run id, same keys, same genesis state) means nothing in a later one. The signed message is the same array without the signature,
behind a domain tag. ``decode_decision`` treats its input as hostile: the size cap is checked
before parsing, msgpack limits bound every allocation, and anything undeclared raises
``WireError``; ``verify_decision`` checks signer and signature (``IntegrityError``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import blake3
import msgpack

from pulse_node.chain.identity import Identity, verify_signature
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.payload import MAX_TRAINER_ID
from pulse_node.vocab import RUN_ID_RULE, is_run_id

DECISION_MAGIC = "pulseloco/decision"
DECISION_FORMAT = 2
MAX_CONTRIBUTORS = 256
MAX_DECISION_BYTES = 64 << 10
DIGEST_LEN = 32
_SIGN_DOMAIN = b"pulseloco/decision/sign/1\0"
_MAX_ROUND = 2**63 - 1
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RoundDecision:
    """Which payloads round ``round`` averages, signed by the trainer that decided it."""

    run_id: str
    round: int
    base: bytes
    epoch: bytes
    coordinator: str
    contributors: tuple[tuple[str, bytes], ...]
    signer: str
    signature: bytes

    @property
    def trainer_ids(self) -> list[str]:
        return [tid for tid, _ in self.contributors]


_FIELDS = tuple(f.name for f in fields(RoundDecision))


def payload_digest(data: bytes) -> bytes:
    """The digest a decision names a payload by: BLAKE3 of its encoded bytes (32 bytes)."""
    return blake3.blake3(data).digest()


def _body(d: RoundDecision) -> list[Any]:
    return [DECISION_MAGIC, DECISION_FORMAT, d.run_id, d.round, d.base, d.epoch, d.coordinator,
            [[tid, digest] for tid, digest in d.contributors], d.signer]


def signing_bytes(d: RoundDecision) -> bytes:
    """The exact bytes the coordinator signs: every field but the signature, domain-tagged."""
    return _SIGN_DOMAIN + msgpack.packb(_body(d), use_bin_type=True)


def make_decision(identity: Identity, *, run_id: str, round: int, base: bytes, epoch: bytes, coordinator: str,
                  contributors: Mapping[str, bytes]) -> RoundDecision:
    """Build and sign the decision of ``round`` (contributors: trainer id -> payload digest) in
    ``epoch`` (the genesis chain hash, raw bytes)."""
    ordered = tuple(sorted(((t, bytes(g)) for t, g in contributors.items()), key=lambda c: c[0].encode()))
    unsigned = RoundDecision(run_id=run_id, round=round, base=bytes(base), epoch=bytes(epoch), coordinator=coordinator,
                             contributors=ordered, signer=identity.public_key_hex, signature=b"")
    problem = next(_problems(unsigned, unsigned_ok=True), None)
    if problem:
        raise ValueError(f"invalid round decision: {problem}")
    return RoundDecision(**{**{f: getattr(unsigned, f) for f in _FIELDS},
                            "signature": identity.sign(signing_bytes(unsigned))})


def encode_decision(d: RoundDecision) -> bytes:
    """The decision's wire bytes (msgpack array, see the module docstring)."""
    return msgpack.packb([*_body(d), d.signature], use_bin_type=True)


def _unpack(data: bytes) -> list[Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("round decision must be bytes")
    if len(data) > MAX_DECISION_BYTES:
        raise WireError(f"round decision is {len(data)} bytes, limit {MAX_DECISION_BYTES}")
    try:
        items = msgpack.unpackb(bytes(data), raw=False, use_list=True, strict_map_key=True,
                                max_str_len=MAX_TRAINER_ID, max_bin_len=64,
                                max_array_len=MAX_CONTRIBUTORS, max_map_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"round decision is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(items, list) or len(items) < 2 or items[0] != DECISION_MAGIC:
        raise WireError("not a round decision")
    if items[1] != DECISION_FORMAT:
        raise WireError(f"round decision format {items[1]!r} is not supported (want {DECISION_FORMAT})")
    if len(items) != 2 + len(_FIELDS):
        raise WireError(f"round decision has {len(items) - 2} fields, expected {len(_FIELDS)}")
    return items[2:]


def _contributors(raw: Any) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(raw, list):
        raise WireError("round decision contributors must be a list")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is str and type(item[1]) is bytes):
            raise WireError("round decision contributor must be [trainer id, digest]")
        out.append((item[0], item[1]))
    return tuple(out)


def decode_decision(data: bytes) -> RoundDecision:
    """Parse hostile bytes into a decision. ``WireError`` if malformed; no signature check here."""
    run_id, rnd, base, epoch, coordinator, contributors, signer, signature = _unpack(data)
    types = ((run_id, str), (rnd, int), (base, bytes), (epoch, bytes), (coordinator, str), (signer, str),
             (signature, bytes))
    if any(type(value) is not want for value, want in types):
        raise WireError("round decision fields have the wrong types")
    d = RoundDecision(run_id=run_id, round=rnd, base=base, epoch=epoch, coordinator=coordinator,
                      contributors=_contributors(contributors), signer=signer, signature=signature)
    problem = next(_problems(d, unsigned_ok=False), None)
    if problem:
        raise WireError(f"invalid round decision for round {rnd}: {problem}")
    return d


def _problems(d: RoundDecision, *, unsigned_ok: bool) -> Iterator[str]:
    if not is_run_id(d.run_id):
        yield f"run_id must be {RUN_ID_RULE}"
    if not 0 <= d.round <= _MAX_ROUND:
        yield "round must be a non-negative 63-bit integer"
    if len(d.base) != DIGEST_LEN:
        yield f"base must be a {DIGEST_LEN}-byte state hash"
    if len(d.epoch) != DIGEST_LEN:
        yield f"epoch must be a {DIGEST_LEN}-byte chain hash"
    if not 0 < len(d.coordinator) <= MAX_TRAINER_ID:
        yield f"coordinator must be a trainer id of 1..{MAX_TRAINER_ID} characters"
    yield from _contributor_problems(d.contributors)
    if not _HEX64.fullmatch(d.signer):
        yield "signer must be 64 lowercase hex characters"
    if not (unsigned_ok and d.signature == b"") and len(d.signature) != 64:
        yield "signature must be 64 bytes"


def _contributor_problems(contributors: tuple[tuple[str, bytes], ...]) -> Iterator[str]:
    if not 0 < len(contributors) <= MAX_CONTRIBUTORS:
        yield f"a decision names 1..{MAX_CONTRIBUTORS} contributors"
    keys = [tid.encode() for tid, _ in contributors]
    if any(not 0 < len(tid) <= MAX_TRAINER_ID for tid, _ in contributors):
        yield f"contributor ids must have 1..{MAX_TRAINER_ID} characters"
    if any(a >= b for a, b in zip(keys, keys[1:])):
        yield "contributors must be sorted by trainer id without repeats"
    if any(len(digest) != DIGEST_LEN for _, digest in contributors):
        yield f"contributor digests must be {DIGEST_LEN} bytes"


def verify_decision(d: RoundDecision, *, signer_key: str) -> None:
    """``IntegrityError`` unless ``d`` was signed by ``signer_key`` (public key hex)."""
    if d.signer != signer_key.lower():
        raise IntegrityError(f"round {d.round} decision is not signed by the key of {d.coordinator[:12]}")
    if not verify_signature(d.signer, signing_bytes(d), d.signature):
        raise IntegrityError(f"round {d.round} decision from {d.coordinator[:12]}: bad signature")
