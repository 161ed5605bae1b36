"""Equivocation evidence: two conflicting statements signed by one trainer-set key.

A member signing two different version records for one version (two histories), or two
different round decisions for one round (``loco/equivocation.py``), has lied to someone: both
signed messages together prove it to anyone, without trusting whoever reports them. An
``Evidence`` is that pair. Every node that receives one checks it itself (``EvidenceBook.add``:
both signatures, the same signer, the same version or round, a real conflict) and from then on
refuses the key everywhere (``chain/trust.py``: its records, decisions, payloads, pushes and
fetches; it leaves the node's effective trainer set). Nothing about the reporter matters: an
evidence that does not check out is dropped and never acted on.

The book keeps at most one evidence per key (the first that checked), at most ``MAX_CONVICTED``
keys, each in ``<data_dir>/evidence/<key>.ev`` so a restart keeps them. Wire and file format:
a msgpack array ``[EVIDENCE_MAGIC, EVIDENCE_FORMAT, kind, first, second]`` of at most
``MAX_EVIDENCE_BYTES``; the key, the version or round and the conflict are recomputed from the
two messages, never read from the envelope.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import msgpack

from pulse_node.chain.identity import key_id_of
from pulse_node.chain.record import MAX_RECORD_BYTES, VersionRecord, decode_record, encode_record, verify_record
from pulse_node.errors import IntegrityError, WireError
from pulse_node.fsutil import write_atomic

log = logging.getLogger("pulse.evidence")

EVIDENCE_MAGIC = "pulse/equivocation"
EVIDENCE_FORMAT = 1
#: two signed messages (a round decision is at most 64 KiB) and the envelope
MAX_EVIDENCE_BYTES = 2 * (64 << 10) + 1024
#: keys a book convicts at most (the trainer set holds at most 256 members)
MAX_CONVICTED = 256
_KEY = re.compile(r"[0-9a-f]{64}")

#: "head": two records for one version; "decision": two round decisions for one round
EvidenceKind = Literal["head", "decision"]
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
        return msgpack.packb([EVIDENCE_MAGIC, EVIDENCE_FORMAT, self.kind, self.first, self.second],
                             use_bin_type=True)


def evidence_kind(kind: object) -> EvidenceKind:
    """``kind`` if it names a kind of evidence; ``WireError`` otherwise."""
    for known in EVIDENCE_KINDS:
        if kind == known:
            return known
    raise WireError(f"evidence of unknown kind {str(kind)[:32]!r}")


def decode_evidence(data: bytes) -> tuple[str, bytes, bytes]:
    """(kind, first, second) of hostile bytes; ``WireError`` if malformed. Nothing is verified here."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_EVIDENCE_BYTES:
        raise WireError(f"evidence must be bytes of at most {MAX_EVIDENCE_BYTES}")
    try:
        items = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, max_str_len=64,
                                max_bin_len=MAX_EVIDENCE_BYTES, max_array_len=8, max_map_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"evidence is not valid msgpack ({type(exc).__name__})") from None
    if not (isinstance(items, list) and len(items) == 5 and items[:2] == [EVIDENCE_MAGIC, EVIDENCE_FORMAT]):
        raise WireError("not equivocation evidence of a supported format")
    kind, first, second = items[2:]
    if not (isinstance(kind, str) and isinstance(first, bytes) and isinstance(second, bytes)):
        raise WireError("evidence fields are malformed")
    return kind, first, second


def heads_conflict(first: bytes, second: bytes, run_id: str) -> tuple[str, int]:
    """(signer, version) if both are records of ``run_id`` validly signed by one key for one
    version with different chain hashes; ``IntegrityError`` / ``WireError`` otherwise."""
    a, b = decode_record(first[:MAX_RECORD_BYTES + 1]), decode_record(second[:MAX_RECORD_BYTES + 1])
    if a.signer != b.signer or a.version != b.version:
        raise IntegrityError("the two records are not one key's records for one version")
    if a.chain_hash == b.chain_hash:
        raise IntegrityError(f"the two records of version {a.version} agree: no conflict")
    for r in (a, b):
        verify_record(r, run_id=run_id, trusted_signers={a.signer})
    return a.signer, a.version


def head_evidence(a: VersionRecord, b: VersionRecord) -> Evidence:
    """The evidence two verified conflicting records make (``VersionRecord``s, one signer)."""
    return Evidence("head", a.signer, a.version, encode_record(a), encode_record(b), found_at=time.time())


class EvidenceBook:
    """The keys this node convicted, each with the evidence it verified (kept on disk if ``directory``)."""

    def __init__(self, *, run_id: str, directory: Path | None = None,
                 checkers: Mapping[str, Checker] | None = None) -> None:
        self.run_id = run_id
        self.directory = Path(directory) if directory is not None else None
        self.checkers: dict[str, Checker] = {"head": heads_conflict, **(checkers or {})}
        self.convicted: dict[str, Evidence] = {}
        #: whose conviction counts (the trust policy sets: trainer-set members; fresh keys equivocating
        #: against themselves must not fill the book)
        self.admit: Callable[[str], bool] = lambda key: True
        #: told each new evidence this node verified (the role gossips it to its peers)
        self.on_new: Callable[[Evidence], None] | None = None
        self._load()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self.convicted

    def entries(self) -> list[Evidence]:
        return sorted(self.convicted.values(), key=lambda e: e.found_at)

    def add_bytes(self, data: bytes) -> Evidence | None:
        """Verify a received evidence and convict its key; the new ``Evidence``, or None if the key
        was convicted already. ``WireError`` / ``IntegrityError`` if it does not check out."""
        kind, first, second = decode_evidence(data)
        return self.add(kind, first, second)

    def add(self, kind: str, first: bytes, second: bytes) -> Evidence | None:
        """Verify two messages of ``kind`` conflict (see ``Checker``) and convict their signer."""
        checker = self.checkers.get(kind)
        if checker is None:
            raise WireError(f"evidence of unknown kind {kind[:32]!r}")
        key, at = checker(first, second, self.run_id)
        if not self.admit(key):
            raise IntegrityError(f"evidence against {key_id_of(key)}, not a trainer-set member")
        return self._convict(Evidence(evidence_kind(kind), key, at, first, second, found_at=time.time()))

    def _convict(self, ev: Evidence, *, persist: bool = True) -> Evidence | None:
        if ev.key in self.convicted or len(self.convicted) >= MAX_CONVICTED:
            return None
        self.convicted[ev.key] = ev
        log.warning("trainer key %s convicted of equivocation: two signed %ss for %d", key_id_of(ev.key),
                    ev.kind, ev.at)
        if persist and self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                write_atomic(self.directory / f"{ev.key}.ev", ev.encode())
            except OSError as exc:
                log.warning("cannot keep evidence against %s on disk: %s", key_id_of(ev.key), exc)
        if self.on_new is not None:
            self.on_new(ev)
        return ev

    def _load(self) -> None:
        """Re-check every evidence file of an earlier run of this node (a bad one is ignored)."""
        if self.directory is None or not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.ev"))[:MAX_CONVICTED]:
            try:
                kind, first, second = decode_evidence(path.read_bytes()[:MAX_EVIDENCE_BYTES + 1])
                key, at = self.checkers[kind](first, second, self.run_id)
                typed = evidence_kind(kind)
                when = path.stat().st_mtime
            except (KeyError, OSError, WireError, IntegrityError) as exc:
                log.warning("ignoring evidence file %s: %s", path, exc)
                continue
            if _KEY.fullmatch(key):
                self.convicted.setdefault(key, Evidence(typed, key, at, first, second, found_at=when))
