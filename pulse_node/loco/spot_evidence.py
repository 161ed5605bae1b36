"""Spot-check evidence: a signed accusation and the exhibits that let anyone re-run it (torch-free).

When a drawn check fails on anything but a missing answer (``trainer/recompute.py``), the
verifier signs an ``Accusation``: who it accuses, of which round, step and leaves, for what
reason, the target's own signed commitment(s), and the BLAKE3 digest of every exhibit the
re-check needs (the target's opening and next-round opening, the drawn step's batches, the
BF16 patch to that step's weights, the target's payload). ``SpotEvidence`` carries the accusation
and the exhibits: inline up to ``MAX_INLINE_BYTES`` in all, the rest by digest only (the accuser
serves them; whoever re-checks fetches them and checks the digest). Every exhibit is either
signed by the target (commitments), verified against the target's signed roots (openings, the
patch's result hash), or named by digest in the target's signed commitment (batches, payload),
so the accuser cannot forge any of them; it can only choose to accuse.

Re-checking (``trainer/spot_evidence.py``) re-runs the same check. A confirmed mismatch convicts
the target; an accusation whose exhibits show an honest step (or do not match the target's
commitment) convicts the accuser, whose signature is on it: a false accusation costs the accuser.

Wire format (``EVIDENCE_FORMAT`` 1): msgpack ``[EVIDENCE_MAGIC, EVIDENCE_FORMAT, accusation,
[[digest, bytes], ...]]`` with ``accusation = [run_id, round, target, accuser, signer, step,
leaves, reason, keep, commitment, next_commitment, [[name, digest], ...], signature]`` (``keep``: the
share of the target's payload its round applied, 0 if left out).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import blake3
import msgpack

from pulse_node.chain.identity import Identity, verify_signature
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.commit import MAX_COMMIT_BYTES
from pulse_node.loco.opening import MAX_LEAVES
from pulse_node.loco.payload import MAX_TRAINER_ID
from pulse_node.vocab import is_run_id

EVIDENCE_MAGIC = "pulse/spot-evidence"
EVIDENCE_FORMAT = 2
MAX_EVIDENCE_BYTES = 96 << 20
MAX_INLINE_BYTES = 64 << 20
MAX_EXHIBITS = 80
REASONS = ("batch", "gradient", "weights", "payload", "link")
_SIGN_DOMAIN = b"pulse/spot-accusation/sign/1\0"


@dataclass(frozen=True)
class Accusation:
    """A verifier's signed claim that ``target``'s round ``round`` fails its check at ``step``/``leaves``."""

    run_id: str
    round: int
    target: str
    accuser: str
    signer: str
    step: int
    leaves: tuple[int, ...]
    reason: str
    keep: float
    commitment: bytes
    next_commitment: bytes
    exhibits: tuple[tuple[str, bytes], ...]  # (name, BLAKE3 digest): opening, next_opening, batch/<i>, patch, payload
    signature: bytes = b""

    def digest_of(self, name: str) -> bytes | None:
        return next((d for n, d in self.exhibits if n == name), None)


@dataclass
class SpotEvidence:
    accusation: Accusation
    exhibits: dict[bytes, bytes]  # digest -> bytes, for the exhibits carried inline


_FIELDS = tuple(f.name for f in fields(Accusation))


def _body(a: Accusation) -> list[Any]:
    return [a.run_id, a.round, a.target, a.accuser, a.signer, a.step, list(a.leaves), a.reason, a.keep,
            a.commitment, a.next_commitment, [[n, d] for n, d in a.exhibits]]


def signing_bytes(a: Accusation) -> bytes:
    return _SIGN_DOMAIN + msgpack.packb(_body(a), use_bin_type=True)


def sign_accusation(identity: Identity, a: Accusation) -> Accusation:
    unsigned = replace(a, signer=identity.public_key_hex, signature=b"")
    problem = next(_problems(unsigned, unsigned_ok=True), None)
    if problem:
        raise ValueError(f"invalid accusation: {problem}")
    return replace(unsigned, signature=identity.sign(signing_bytes(unsigned)))


def verify_accusation(a: Accusation, *, signer_key: str) -> None:
    """``IntegrityError`` unless ``a`` was signed by ``signer_key``."""
    if a.signer != signer_key.lower() or not verify_signature(a.signer, signing_bytes(a), a.signature):
        raise IntegrityError(f"accusation of {a.target[:12]} is not signed by the key of {a.accuser[:12]}")


def make_evidence(a: Accusation, exhibits: dict[str, bytes]) -> SpotEvidence:
    """The evidence for signed accusation ``a``: exhibits inline (largest last) up to ``MAX_INLINE_BYTES``."""
    inline, used = {}, 0
    for name, data in sorted(exhibits.items(), key=lambda kv: len(kv[1])):
        if a.digest_of(name) != blake3.blake3(data).digest():
            raise ValueError(f"exhibit {name!r} is not the one the accusation names")
        if used + len(data) <= MAX_INLINE_BYTES:
            inline[blake3.blake3(data).digest()], used = data, used + len(data)
    return SpotEvidence(a, inline)


def encode_evidence(ev: SpotEvidence) -> bytes:
    return msgpack.packb([EVIDENCE_MAGIC, EVIDENCE_FORMAT, [*_body(ev.accusation), ev.accusation.signature],
                          [[d, b] for d, b in ev.exhibits.items()]], use_bin_type=True)


def _accusation(raw: Any) -> Accusation:
    if not (isinstance(raw, list) and len(raw) == len(_FIELDS)):
        raise WireError("an accusation has the wrong number of fields")
    kinds = (str, int, str, str, str, int, list, str, float, bytes, bytes, list, bytes)
    if any(type(v) is not k for v, k in zip(raw, kinds)) or not all(type(i) is int for i in raw[6]):
        raise WireError("accusation fields have the wrong types")
    named = raw[11]
    if not all(isinstance(x, list) and len(x) == 2 and type(x[0]) is str and type(x[1]) is bytes for x in named):
        raise WireError("accusation exhibits must be [name, digest] pairs")
    a = Accusation(run_id=raw[0], round=raw[1], target=raw[2], accuser=raw[3], signer=raw[4], step=raw[5],
                   leaves=tuple(raw[6]), reason=raw[7], keep=raw[8], commitment=raw[9], next_commitment=raw[10],
                   exhibits=tuple((n, d) for n, d in named), signature=raw[12])
    problem = next(_problems(a, unsigned_ok=False), None)
    if problem:
        raise WireError(f"invalid accusation: {problem}")
    return a


def decode_evidence(data: bytes) -> SpotEvidence:
    """Parse hostile bytes; ``WireError`` if malformed or oversized. Signatures are not checked here."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) > MAX_EVIDENCE_BYTES:
        raise WireError(f"spot evidence must be bytes of at most {MAX_EVIDENCE_BYTES}")
    try:
        items = msgpack.unpackb(bytes(data), raw=False, use_list=True, max_str_len=256, max_map_len=0,
                                max_array_len=max(MAX_EXHIBITS, MAX_LEAVES, 16), max_ext_len=0,
                                max_bin_len=MAX_INLINE_BYTES)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"spot evidence is not valid msgpack ({type(exc).__name__})") from None
    if not (isinstance(items, list) and len(items) == 4 and items[:2] == [EVIDENCE_MAGIC, EVIDENCE_FORMAT]):
        raise WireError("not spot evidence of a supported format")
    a, raw = _accusation(items[2]), items[3]
    if not (isinstance(raw, list) and all(isinstance(x, list) and len(x) == 2 and type(x[0]) is bytes
                                          and type(x[1]) is bytes for x in raw)):
        raise WireError("spot evidence exhibits must be [digest, bytes] pairs")
    exhibits = {bytes(d): bytes(b) for d, b in raw}
    if any(blake3.blake3(b).digest() != d for d, b in exhibits.items()):
        raise WireError("a spot evidence exhibit does not match its digest")
    named = {d for _, d in a.exhibits}
    if set(exhibits) - named:
        raise WireError("spot evidence carries an exhibit its accusation does not name")
    return SpotEvidence(a, exhibits)


def _problems(a: Accusation, *, unsigned_ok: bool) -> Iterator[str]:
    if not is_run_id(a.run_id) or not 0 <= a.round < 2**63 or not 0 <= a.step < 2**31:
        yield "run id, round or step out of range"
    if not (0 < len(a.target) <= MAX_TRAINER_ID and 0 < len(a.accuser) <= MAX_TRAINER_ID) or a.target == a.accuser:
        yield "target and accuser must be two peer ids"
    if len(a.signer) != 64 or any(ch not in "0123456789abcdef" for ch in a.signer):
        yield "signer must be 64 lowercase hex characters"
    if not 0 < len(a.leaves) <= MAX_LEAVES or list(a.leaves) != sorted(set(a.leaves)) or min(a.leaves) < 0:
        yield f"leaves must be 1..{MAX_LEAVES} distinct non-negative indices, sorted"
    if a.reason not in REASONS:
        yield f"reason must be one of {REASONS}"
    if not 0.0 <= a.keep <= 1.0:
        yield "keep must be a share in [0, 1]"
    if not 0 < len(a.commitment) <= MAX_COMMIT_BYTES or len(a.next_commitment) > MAX_COMMIT_BYTES:
        yield "the target's commitment (and at most one next commitment) must be carried"
    names = [n for n, _ in a.exhibits]
    if len(names) > MAX_EXHIBITS or len(set(names)) != len(names) or any(len(d) != 32 for _, d in a.exhibits):
        yield f"at most {MAX_EXHIBITS} distinct exhibits, each named by a 32-byte digest"
    if not (unsigned_ok and a.signature == b"") and len(a.signature) != 64:
        yield "signature must be 64 bytes"
