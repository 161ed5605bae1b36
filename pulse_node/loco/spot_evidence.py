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

Wire format: the signed-statement envelope (``chain/statement.py``) of the ``Accusation``
(``ACCUSATION_FORMAT`` 2; ``keep``: the share of the target's payload its round applied, 0 if left
out), carried as bytes in the unsigned envelope of the evidence
(``EVIDENCE_FORMAT`` 2): ``[accusation bytes, [[digest, bytes], ...]]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

import blake3
from pydantic import Field

from pulse_node.chain.identity import Identity
from pulse_node.chain.statement import Digest32, Finite, Hex64, RunId, Signature, Statement
from pulse_node.errors import WireError
from pulse_node.loco.commit import MAX_COMMIT_BYTES
from pulse_node.loco.opening import MAX_LEAVES
from pulse_node.loco.payload import MAX_TRAINER_ID

ACCUSATION_MAGIC = "pulse/spot-accusation"
ACCUSATION_FORMAT = 2
EVIDENCE_MAGIC = "pulse/spot-evidence"
EVIDENCE_FORMAT = 2
MAX_ACCUSATION_BYTES = 2 * MAX_COMMIT_BYTES + (16 << 10)
MAX_EVIDENCE_BYTES = 96 << 20
MAX_INLINE_BYTES = 64 << 20
MAX_EXHIBITS = 80
REASONS = ("batch", "gradient", "weights", "payload", "link")

PeerId = Annotated[str, Field(min_length=1, max_length=MAX_TRAINER_ID)]


@dataclass(frozen=True)
class Accusation:
    """A verifier's signed claim that ``target``'s round ``round`` fails its check at ``step``/``leaves``."""

    run_id: RunId
    round: Annotated[int, Field(ge=0, lt=2**63)]
    target: PeerId
    accuser: PeerId
    signer: Hex64
    step: Annotated[int, Field(ge=0, lt=2**31)]
    leaves: Annotated[tuple[Annotated[int, Field(ge=0, lt=2**63)], ...], Field(min_length=1, max_length=MAX_LEAVES)]
    reason: Annotated[str, Field(max_length=16)]
    keep: Annotated[Finite, Field(le=1.0)]
    commitment: Annotated[bytes, Field(min_length=1, max_length=MAX_COMMIT_BYTES)]
    next_commitment: Annotated[bytes, Field(max_length=MAX_COMMIT_BYTES)]
    #: (name, BLAKE3 digest): opening, next_opening, batch/<i>, patch, payload
    exhibits: Annotated[tuple[tuple[Annotated[str, Field(max_length=64)], Digest32], ...],
                        Field(max_length=MAX_EXHIBITS)]
    signature: Signature = b""

    def digest_of(self, name: str) -> bytes | None:
        return next((d for n, d in self.exhibits if n == name), None)


def _rules(a: Accusation) -> Iterator[str]:
    if a.target == a.accuser:
        yield "target and accuser must be two peer ids"
    if list(a.leaves) != sorted(set(a.leaves)):
        yield f"leaves must be 1..{MAX_LEAVES} distinct non-negative indices, sorted"
    if a.reason not in REASONS:
        yield f"reason must be one of {REASONS}"
    names = [n for n, _ in a.exhibits]
    if len(set(names)) != len(names):
        yield f"at most {MAX_EXHIBITS} distinct exhibits, each named by a 32-byte digest"


ACCUSATIONS = Statement(Accusation, magic=ACCUSATION_MAGIC, format=ACCUSATION_FORMAT,
                        max_bytes=MAX_ACCUSATION_BYTES, max_str=256, max_bin=MAX_COMMIT_BYTES,
                        max_array=max(MAX_EXHIBITS, MAX_LEAVES, 16), rules=_rules)


@dataclass
class SpotEvidence:
    accusation: Accusation
    exhibits: dict[bytes, bytes]  # digest -> bytes, for the exhibits carried inline


@dataclass(frozen=True)
class _Carried:
    """The wire form of ``SpotEvidence``: the encoded accusation and the exhibits carried inline."""

    accusation: Annotated[bytes, Field(max_length=MAX_ACCUSATION_BYTES)]
    exhibits: Annotated[tuple[tuple[Digest32, Annotated[bytes, Field(max_length=MAX_INLINE_BYTES)]], ...],
                        Field(max_length=MAX_EXHIBITS)]


CARRIED = Statement(_Carried, magic=EVIDENCE_MAGIC, format=EVIDENCE_FORMAT, max_bytes=MAX_EVIDENCE_BYTES,
                    max_str=64, max_bin=MAX_INLINE_BYTES, max_array=max(MAX_EXHIBITS, 16), signatures=())


def signing_bytes(a: Accusation) -> bytes:
    return ACCUSATIONS.signing_bytes(a)


def sign_accusation(identity: Identity, a: Accusation) -> Accusation:
    return ACCUSATIONS.seal(identity, a)


def verify_accusation(a: Accusation, *, signer_key: str) -> None:
    """``IntegrityError`` unless ``a`` was signed by ``signer_key``."""
    ACCUSATIONS.verify(a, signer_key=signer_key, tag=f"accusation of {a.target[:12]} by {a.accuser[:12]}")


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
    return CARRIED.encode(_Carried(ACCUSATIONS.encode(ev.accusation), tuple(ev.exhibits.items())))


def decode_evidence(data: bytes) -> SpotEvidence:
    """Parse hostile bytes; ``WireError`` if malformed or oversized. Signatures are not checked here."""
    carried = CARRIED.decode(data)
    a = ACCUSATIONS.decode(carried.accusation)
    exhibits = dict(carried.exhibits)
    if any(blake3.blake3(b).digest() != d for d, b in exhibits.items()):
        raise WireError("a spot evidence exhibit does not match its digest")
    named = {d for _, d in a.exhibits}
    if set(exhibits) - named:
        raise WireError("spot evidence carries an exhibit its accusation does not name")
    return SpotEvidence(a, exhibits)
