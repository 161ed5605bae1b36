"""The keys this node convicted of equivocation, each with the evidence it checked itself.

Every node that receives an evidence (``chain/evidence.py``: two conflicting messages signed by
one trainer-set key) checks it itself (``EvidenceBook.mark_evidence``: both signatures, the same
signer, the same version or round, a real conflict) and from then on the peer book refuses the
key everywhere: its records, decisions, payloads, pushes and fetches; it leaves the node's
effective trainer set. Nothing about the reporter matters but whether the evidence checks out.

At most one evidence per key (the first that checked), at most ``MAX_CONVICTED`` keys, each in
``<data_dir>/evidence/<key>.ev`` so a restart keeps them, re-checked on load by today's rules: a
file kept under an older rule that paired statements of two chains (``chain/evidence.py``)
convicts nobody any more. Only keys the book
says may be convicted count (``admit``: trainer-set members; with ``chain.open_trainers``, open
trainers too, up to a share of the book, past which their evidence is checked but not kept), so
fresh keys equivocating against themselves cannot fill it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pulse_node.chain.evidence import (
    MAX_EVIDENCE_BYTES,
    Checker,
    Evidence,
    decode_evidence,
    evidence_kind,
    heads_conflict,
)
from pulse_node.chain.identity import key_id_of
from pulse_node.errors import IntegrityError, WireError
from pulse_node.fsutil import write_atomic

log = logging.getLogger("pulse.evidence")

#: keys a book convicts at most (the trainer set holds at most 256 members)
MAX_CONVICTED = 256
_KEY = re.compile(r"[0-9a-f]{64}")


class EvidenceBook:
    """The keys this node convicted, each with the evidence it verified (kept on disk if ``directory``)."""

    def __init__(self, *, run_id: str, directory: Path | None = None, checkers: Mapping[str, Checker] | None = None,
                 admit: Callable[[str], bool | None] = lambda key: True) -> None:
        self.run_id = run_id
        self.directory = Path(directory) if directory is not None else None
        self.checkers: dict[str, Checker] = {"head": heads_conflict, **(checkers or {})}
        self.convicted: dict[str, Evidence] = {}
        self.admit = admit  # whose conviction counts (None: the evidence checks out, but is not kept)
        self._load()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self.convicted

    def entries(self) -> list[Evidence]:
        return sorted(self.convicted.values(), key=lambda e: e.found_at)

    def mark_evidence(self, data: bytes) -> Evidence | None:
        """Verify a received evidence and convict its key; the new ``Evidence``, or None if the key
        was convicted already. ``WireError`` / ``IntegrityError`` if it does not check out."""
        kind, first, second = decode_evidence(data)
        return self.mark_pair(kind, first, second)

    def mark_pair(self, kind: str, first: bytes, second: bytes) -> Evidence | None:
        """Verify two messages of ``kind`` conflict (see ``Checker``) and convict their signer."""
        checker = self.checkers.get(kind)
        if checker is None:
            raise WireError(f"evidence of unknown kind {kind[:32]!r}")
        key, at = checker(first, second, self.run_id)
        admitted = self.admit(key)
        if admitted is None:
            return None
        if not admitted:
            raise IntegrityError(f"evidence against {key_id_of(key)}, not a trainer-set member")
        return self._convict(Evidence(evidence_kind(kind), key, at, first, second, found_at=time.time()))

    def _convict(self, ev: Evidence) -> Evidence | None:
        if ev.key in self.convicted or len(self.convicted) >= MAX_CONVICTED:
            return None
        self.convicted[ev.key] = ev
        log.warning("trainer key %s convicted of equivocation: two signed %ss for %d", key_id_of(ev.key),
                    ev.kind, ev.at)
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                write_atomic(self.directory / f"{ev.key}.ev", ev.encode())
            except OSError as exc:
                log.warning("cannot keep evidence against %s on disk: %s", key_id_of(ev.key), exc)
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
