"""Equivocation evidence, the statement: two conflicting messages signed by one trainer-set key.

A member signing two different version records on one parent (two histories forking from one
chain), two different round decisions for one round on one base, or two different round
commitments for one round on one base (``loco/equivocation.py``), has lied to someone: both signed messages together prove it to anyone, without trusting whoever
reports them. Only statements **on one chain** count: records with the same parent chain hash
and the same epoch, decisions and commitments of the same epoch and base. A trainer that restarts with a fresh
store (a new epoch), resumes alone from its store or re-syncs to the majority's state signs
version and round numbers again on another parent or base, which convicts nobody. An
``Evidence`` is that pair; a ``Checker`` per kind recomputes (signer, version or round) from the
two messages and raises unless they really conflict. Who is convicted, and what that means for
the peers, is the peer book's (``peers/evidence.py``).

Wire and file format: the statement envelope (``chain/statement.py``, unsigned: the two messages
are) of a ``Conflict`` ``(kind, first, second)``, at most ``MAX_EVIDENCE_BYTES``; the key, the
version or round and the conflict are recomputed from the two messages, never read from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import Field

from pulse_node.chain.record import MAX_RECORD_BYTES, VersionRecord, decode_record, encode_record, verify_record
from pulse_node.chain.statement import Statement
from pulse_node.errors import IntegrityError, WireError

EVIDENCE_MAGIC = "pulse/equivocation"
EVIDENCE_FORMAT = 1
#: two signed messages (a round commitment, the largest, is at most 257 KiB: ``loco/roundcommit.py``) and the envelope
MAX_EVIDENCE_BYTES = 2 * ((256 << 10) + 1024) + 1024

#: "head": two records for one version; "decision" / "commitment": two round decisions / commitments for one round
EvidenceKind = Literal["head", "decision", "commitment"]
EVIDENCE_KINDS: tuple[EvidenceKind, ...] = get_args(EvidenceKind)

#: checks two messages of one kind conflict: returns (signer key, version or round), else raises
Checker = Callable[[bytes, bytes, str], tuple[str, int]]


@dataclass(frozen=True)
class Evidence:
    """Two conflicting messages signed by ``key`` about version / round ``at``."""

    kind: EvidenceKind
    key: str
    at: int
    first: bytes
    second: bytes
    found_at: float = 0.0  # when this node verified it (wall clock; not part of the wire form)

    def encode(self) -> bytes:
        return encode_evidence(self.kind, self.first, self.second)


Message = Annotated[bytes, Field(max_length=MAX_EVIDENCE_BYTES)]


@dataclass(frozen=True)
class Conflict:
    """The wire form of evidence: two conflicting signed messages of ``kind``."""

    kind: Annotated[str, Field(max_length=64)]
    first: Message
    second: Message


CONFLICTS = Statement(Conflict, magic=EVIDENCE_MAGIC, format=EVIDENCE_FORMAT, max_bytes=MAX_EVIDENCE_BYTES,
                      max_str=64, max_bin=MAX_EVIDENCE_BYTES, max_array=8, signatures=())


def encode_evidence(kind: EvidenceKind, first: bytes, second: bytes) -> bytes:
    """The wire and file form of evidence of ``kind``: the two conflicting signed messages."""
    return CONFLICTS.encode(Conflict(kind, first, second))


def evidence_kind(kind: object) -> EvidenceKind:
    """``kind`` if it names a kind of evidence; ``WireError`` otherwise."""
    for known in EVIDENCE_KINDS:
        if kind == known:
            return known
    raise WireError(f"evidence of unknown kind {str(kind)[:32]!r}")


def decode_evidence(data: bytes) -> tuple[str, bytes, bytes]:
    """(kind, first, second) of hostile bytes; ``WireError`` if malformed. Nothing is verified here."""
    c = CONFLICTS.decode(data)
    return c.kind, c.first, c.second


def heads_conflict(first: bytes, second: bytes, run_id: str) -> tuple[str, int]:
    """(signer, version) if both are records of ``run_id`` validly signed by one key on one chain
    (same version, parent chain hash and epoch) with different chain hashes; ``IntegrityError`` /
    ``WireError`` otherwise."""
    a, b = decode_record(first[:MAX_RECORD_BYTES + 1]), decode_record(second[:MAX_RECORD_BYTES + 1])
    if a.signer != b.signer or a.version != b.version:
        raise IntegrityError("the two records are not one key's records for one version")
    if not one_chain(a, b):
        raise IntegrityError(f"the two records of version {a.version} extend other parents or epochs "
                             "(a restart, a resume or a re-sync): no conflict")
    if a.chain_hash == b.chain_hash:
        raise IntegrityError(f"the two records of version {a.version} agree: no conflict")
    for r in (a, b):
        verify_record(r, run_id=run_id, trusted_signers={a.signer})
    return a.signer, a.version


def one_chain(a: VersionRecord, b: VersionRecord) -> bool:
    """Whether ``a`` and ``b`` extend one chain: the same parent chain hash in the same epoch."""
    return a.parent_chain_hash == b.parent_chain_hash and a.epoch == b.epoch


def head_evidence(a: VersionRecord, b: VersionRecord) -> Evidence:
    """The evidence two verified conflicting records make (``VersionRecord``s, one signer)."""
    return Evidence("head", a.signer, a.version, encode_record(a), encode_record(b), found_at=time.time())
