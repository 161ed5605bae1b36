"""On-disk version store: anchors, patches and signed records of one run, crash-safe.

Layout (one store root per run; see ``pulse_node.chain.layout``):

    <root>/LOCK                      flock held by the single writer process
    <root>/records/<v>.rec           encoded VersionRecord: the READY marker of version v
    <root>/patches/<v>.patch         codec patch turning version v-1 into v
    <root>/anchors/<v>.safetensors   full state of anchor v; HF-compatible safetensors whose
                                     metadata carries the record (``pulse.record``, hex)
    <root>/current/<v>.safetensors   latest verified state for fast restart (optional)
    <root>/catchup/<a>-<b>.patch     cached catch-up patches (``catchup_producer``), bounded and
                                     pruned with the versions by ``retain``

Rules:

- Every file is written atomically (temp file, fsync, rename), data first and the record
  LAST, so a version exists only once all its data is complete. Deleting goes the other way:
  record first, then data.
- Writes take only a ``VerifiedVersion`` (``chain/verified.py``): signature, chain hash, patch
  digest, the header's result hash and a full state's hash were checked once, at the trust gate
  or by the publisher, and are not redone here. What only the store knows is checked before
  anything is written: its trusted signers, the links to the stored parent and child, a fork
  against a stored version, the header's base against the stored parent's state hash; bad input
  raises a typed error and leaves the store unchanged.
- Opening a writer runs ``recover()``: temp files, data without a record, records that do
  not decode or verify, and files whose size does not match what they declare are removed
  (``store_scan.py`` says which), so after a kill -9 at any point the store reopens at the
  last verified version by itself.
- ``head()`` is the highest version reachable from a stored full state (anchor or current)
  through present patches whose records link; ``load_state`` replays and verifies each state
  hash, and drops (and routes around) a stored file that fails its hash.
- Readers in other processes use ``VersionStore(root, readonly=True)`` or just
  ``store_path``; they never modify files and never take the lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Collection
from pathlib import Path

from pulse_node.chain.layout import (
    CATCHUP_DIR,
    CATCHUP_KEEP_BYTES,
    CATCHUP_KEEP_FILES,
    KINDS,
    is_temp,
    prune_catchups,
    remove_quietly,
    state_metadata,
    store_path,
)
from pulse_node.chain.record import VersionRecord, check_link, check_patch, encode_record
from pulse_node.chain.store_scan import DATA_KINDS, listdir, scan_store
from pulse_node.chain.verified import VerifiedVersion
from pulse_node.codec.header import PatchHeader
from pulse_node.codec.inplace import apply_patch_inplace
from pulse_node.codec.patch import apply_patch, parse_patch
from pulse_node.codec.state import State, load_safetensors, save_safetensors_atomic
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import GapError, IntegrityError, PatchError, StoreError
from pulse_node.fsutil import write_atomic

log = logging.getLogger(__name__)


class VersionStore:
    """Versions of one run on disk. Single writer per root (enforced with ``flock``)."""

    def __init__(self, root: Path, *, trusted_signers: Collection[str] | None = None,
                 readonly: bool = False) -> None:
        self.root = Path(root)
        self.trusted = None if trusted_signers is None else frozenset(trusted_signers)
        self.readonly = readonly
        self._lock_fd: int | None = None
        self._records: dict[int, VersionRecord] = {}
        self._files: dict[str, set[int]] = {kind: set() for kind in DATA_KINDS}
        if readonly:
            if not self.root.is_dir():
                raise StoreError(f"{self.root}: version store does not exist")
            self._scan()
        else:
            self._lock()
            self.recover()

    # ----------------------------------------------------------------- lifecycle
    def _lock(self) -> None:
        for folder, _ in KINDS.values():
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"{self.root}: another process has this version store open "
                             "for writing") from None
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def __enter__(self) -> VersionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_writer(self) -> None:
        if self.readonly or self._lock_fd is None:
            raise StoreError(f"{self.root}: store is read-only or closed")

    # ----------------------------------------------------------------- recovery
    def recover(self) -> list[Path]:
        """Remove leftovers of interrupted writes and invalid files; returns what was removed."""
        self._require_writer()
        folders = [folder for folder, _ in KINDS.values()] + [CATCHUP_DIR]
        removed = [p for folder in folders for p in listdir(self.root / folder)
                   if is_temp(p) and remove_quietly(p)]
        removed += self._scan(repair=True)
        for p in removed:
            log.warning("version store recovery removed %s", p)
        return removed

    def refresh(self) -> None:
        """Re-read the directory (readers in other processes)."""
        self._scan()

    def _scan(self, *, repair: bool = False) -> list[Path]:
        """Rebuild the index from disk; with ``repair`` delete what is provably garbage."""
        scan = scan_store(self.root, trusted=self.trusted)
        self._records, self._files = scan.records, scan.files
        if not repair:
            return []
        return [p for p in scan.bad if remove_quietly(p)]

    # ----------------------------------------------------------------- queries
    def path_of(self, kind: str, version: int) -> Path:
        """Path of file ``kind`` ("record", "patch", "anchor", "current") of ``version``."""
        return store_path(self.root, kind, version)

    def record(self, version: int) -> VersionRecord | None:
        return self._records.get(version)

    def versions(self) -> list[int]:
        """Versions with a valid record, ascending."""
        return sorted(self._records)

    def anchors(self) -> list[int]:
        return sorted(self._files["anchor"])

    def has_patch(self, version: int) -> bool:
        return version in self._files["patch"]

    def current_version(self) -> int | None:
        return max(self._files["current"], default=None)

    def head(self) -> VersionRecord | None:
        """Highest version whose chain is complete from a stored full state (None if empty)."""
        reachable = self._reachable()
        return self._records[max(reachable)] if reachable else None

    def can_load(self, version: int) -> bool:
        """``version`` has a record and a complete stored path (cheap: no file is read)."""
        return version in self._records and self._plan_or_none(version) is not None

    def lowest_served(self) -> int | None:
        """Lowest v such that the patches v..head are all stored (head itself if none is)."""
        head = self.head()
        if head is None:
            return None
        v = head.version
        while self._links(v):
            v -= 1
        return min(v + 1, head.version)

    def _is_start(self, v: int) -> bool:
        return v in self._files["anchor"] or v in self._files["current"]

    def _links(self, v: int) -> bool:
        """Version v follows v-1 through a stored patch and linked records."""
        parent, child = self._records.get(v - 1), self._records.get(v)
        if parent is None or child is None or v not in self._files["patch"]:
            return False
        try:
            check_link(parent, child)
        except IntegrityError:
            return False
        return True

    def _reachable(self) -> set[int]:
        reachable: set[int] = set()
        for v in sorted(self._records):
            if self._is_start(v) or (v - 1 in reachable and self._links(v)):
                reachable.add(v)
        return reachable

    # ----------------------------------------------------------------- reads
    def patch_bytes(self, version: int) -> bytes:
        """The stored patch of ``version``, digest-checked (a corrupt file is dropped)."""
        r = self._need_record(version)
        if version not in self._files["patch"]:
            raise StoreError(f"no patch stored for v{version}")
        data = self._read(self.path_of("patch", version))
        try:
            check_patch(r, data)
        except IntegrityError:
            self._drop("patch", version)
            raise
        return data

    def anchor_state(self, version: int) -> State:
        """The stored anchor state of ``version``, hash-checked against its record."""
        return self._full_state("anchor", version)

    def _full_state(self, kind: str, version: int) -> State:
        r = self._need_record(version)
        if version not in self._files[kind]:
            raise StoreError(f"no {kind} state stored for v{version}")
        path = self.path_of(kind, version)
        try:
            state = load_safetensors(path)
            got = state_hash(state)
        except PatchError as exc:
            self._drop(kind, version)
            raise IntegrityError(f"{path}: unreadable ({exc}); removed") from None
        if got != r.state_hash:
            self._drop(kind, version)
            raise IntegrityError(f"{path}: state hash {got[:16]} != record {r.state_hash[:16]}; "
                                 "removed")
        return state

    def load_head(self) -> tuple[VersionRecord, State] | None:
        """The newest version that rebuilds from the stored files, with its state (None if none).

        ``load_state`` drops each stored file that fails verification, which lowers the head: a
        corrupt file costs the versions above it, never the node's start.
        """
        while (head := self.head()) is not None:
            try:
                return head, self.load_state(head.version)
            except (IntegrityError, GapError) as exc:
                if (self.head() or head).version >= head.version:
                    raise  # nothing was dropped: trying again would fail the same way
                log.error("stored head v%d cannot be rebuilt (%s); falling back", head.version, exc)
        return None

    def load_state(self, version: int) -> State:
        """Rebuild ``version``: nearest stored full state <= version, then verified patches.

        A stored file that fails its hash is dropped and another path is tried; ``GapError``
        if no complete path exists, ``IntegrityError`` only if the last path fails too.
        """
        self._need_record(version)
        for _ in range(len(self._records) + 2):  # every failed attempt drops one file
            start = self._plan(version)
            try:
                return self._replay(start, version)
            except IntegrityError as exc:
                log.error("v%d: %s; trying another path", version, exc)
                if self._plan_or_none(version) is None:
                    raise
        raise IntegrityError(f"cannot rebuild v{version}: every stored path fails verification")

    def _plan(self, version: int) -> int:
        """Highest start (anchor/current) from which ``version`` is reachable, or GapError."""
        v = version
        while not self._is_start(v):
            if not self._links(v):
                raise GapError(f"cannot rebuild v{version}: v{v} has no stored patch linked to "
                               f"v{v - 1} and no full state")
            v -= 1
        return v

    def _plan_or_none(self, version: int) -> int | None:
        try:
            return self._plan(version)
        except GapError:
            return None

    def _replay(self, start: int, version: int) -> State:
        kind = "anchor" if start in self._files["anchor"] else "current"
        return self.advance(self._full_state(kind, start), start, version, inplace=True)  # ours alone

    def advance(self, state: State, start: int, version: int, *, inplace: bool = False) -> State:
        """Apply the stored patches ``start+1..version`` to ``state``, verifying each result.

        ``state`` must be the verified state of ``start`` (hash equal to its record's). A patch
        that does not reproduce its record is dropped and ``IntegrityError`` raised. ``inplace``:
        patch ``state``'s own arrays (the caller hands them over; no array per version), else
        ``state`` is left as it was.
        """
        for v in range(start + 1, version + 1):
            data = self.patch_bytes(v)
            parent = self._records.get(v - 1)
            try:
                patch = parse_patch(data)  # once: the apply takes it parsed
                self._check_header(patch.header, self._records[v], parent)
                base_hash = parent.state_hash if parent else None
                if inplace:
                    apply_patch_inplace(state, patch, verify=True, base_hash=base_hash)
                else:
                    state = apply_patch(state, patch, verify=True, base_hash=base_hash)
            except (PatchError, IntegrityError) as exc:  # BaseMismatchError included
                self._drop("patch", v)
                raise IntegrityError(f"patch v{v} does not reproduce its record: {exc}") from None
        return state

    def _need_record(self, version: int) -> VersionRecord:
        r = self._records.get(version)
        if r is None:
            raise StoreError(f"no record stored for v{version}")
        return r

    @staticmethod
    def _read(path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise StoreError(f"{path}: cannot read ({exc.strerror})") from None

    @staticmethod
    def _check_header(header: PatchHeader, r: VersionRecord, parent: VersionRecord | None) -> None:
        """The codec header must name the record's state and (if known) the parent's."""
        base_hash, result_hash = header.base_state_hash, header.result_state_hash
        if result_hash != r.state_hash:
            raise IntegrityError(f"patch for {r.short()} produces a different state than the "
                                 "record says")
        if parent is not None and base_hash != parent.state_hash:
            raise IntegrityError(f"patch for {r.short()} expects a base other than "
                                 f"{parent.short()}")

    # ----------------------------------------------------------------- retention
    def retain(self, keep_versions: int, keep_anchors: int, *, keep_catchups: int = CATCHUP_KEEP_FILES,
               keep_catchup_bytes: int = CATCHUP_KEEP_BYTES) -> list[Path]:
        """Delete old versions, never a link a kept chain needs. Returns the removed files.

        Kept: the newest ``keep_versions`` versions up to the head, every patch and record from
        the anchor that the oldest of them is rebuilt from, every anchor at or after that one,
        the newest ``keep_anchors`` anchors (with their records), and all versions above the head.
        Cached catch-up patches are kept only while their target's record is, newest targets
        first, within ``keep_catchups`` files and ``keep_catchup_bytes``.
        """
        self._require_writer()
        if keep_versions < 1 or keep_anchors < 0:
            raise StoreError("retain needs keep_versions >= 1 and keep_anchors >= 0")
        head = self.head()
        if head is None:
            return []
        low = max(0, head.version - keep_versions + 1)
        while self._plan_or_none(low) is None:  # versions no stored path rebuilds anyway
            low += 1
        base = self._chain_base(low)
        anchors = set(self.anchors()[len(self.anchors()) - keep_anchors:] if keep_anchors else [])
        anchors |= {a for a in self._files["anchor"] if a >= base}
        removed: list[Path] = []
        for v in sorted(set(self._records) | set().union(*self._files.values())):
            if v > base:
                continue
            if v not in anchors and v != base:
                removed += self._delete_version(v)
            elif v in self._files["patch"]:
                removed += self._delete_file("patch", v)
        return removed + prune_catchups(self.root, keep_files=keep_catchups, keep_bytes=keep_catchup_bytes,
                                        targets=set(self._records))

    def _chain_base(self, low: int) -> int:
        """Start of the chain that rebuilds ``low``: an anchor if one is reachable, else current."""
        v = low
        while v not in self._files["anchor"] and self._links(v):
            v -= 1
        return v if v in self._files["anchor"] else self._plan(low)

    def discard_from(self, version: int) -> list[Path]:
        """Forget every version >= ``version`` (newest first): how a trainer leaves a fork.

        Crash-safe like retention: each record goes before its data, so an interrupted discard
        leaves a shorter valid chain.
        """
        self._require_writer()
        doomed = sorted({v for v in self._records if v >= version}
                        | {v for kind in DATA_KINDS for v in self._files[kind] if v >= version}, reverse=True)
        removed = [p for v in doomed for p in self._delete_version(v)]
        return removed + prune_catchups(self.root, keep_files=CATCHUP_KEEP_FILES, keep_bytes=CATCHUP_KEEP_BYTES,
                                        targets=set(self._records))

    def _delete_version(self, v: int) -> list[Path]:
        removed = []
        if v in self._records:  # record first: the version stops being READY before data goes
            del self._records[v]
            if remove_quietly(self.path_of("record", v)):
                removed.append(self.path_of("record", v))
        for kind in DATA_KINDS:
            if v in self._files[kind]:
                removed += self._delete_file(kind, v)
        return removed

    def _delete_file(self, kind: str, v: int) -> list[Path]:
        self._files[kind].discard(v)
        path = self.path_of(kind, v)
        return [path] if remove_quietly(path) else []

    # ----------------------------------------------------------------- writes
    def put_patch(self, version: VerifiedVersion) -> None:
        """Store the patch of ``version`` (and its record). Idempotent."""
        self._require_writer()
        if version.patch is None:
            raise StoreError(f"{version.short()} carries no patch")
        record = version.record
        self._admit(record)
        self._check_header(version.patch.header, record, self._records.get(record.version - 1))
        v = record.version
        if v not in self._files["patch"]:
            write_atomic(self.path_of("patch", v), version.patch.data)
        self._commit(record, "patch")

    def put_anchor(self, version: VerifiedVersion) -> None:
        """Store the full state of anchor ``version`` (and its record). Idempotent."""
        self._require_writer()
        if not version.record.is_anchor:
            raise StoreError(f"{version.short()} is not an anchor version")
        self._admit(version.record)
        self._write_full_state("anchor", version)

    def put_current(self, version: VerifiedVersion) -> None:
        """Save ``version``'s state as the latest verified state, replacing the previous one.

        The record may be new (a node that caught up to a non-anchor version with a catch-up
        patch has no patch of it); it is checked like any other record.
        """
        self._require_writer()
        self._admit(version.record)
        self._write_full_state("current", version)
        for old in sorted(self._files["current"] - {version.version}):
            self._files["current"].discard(old)
            remove_quietly(self.path_of("current", old))

    def _write_full_state(self, kind: str, version: VerifiedVersion) -> None:
        """Write a state whose hash the ``VerifiedVersion`` vouches for (not hashed again)."""
        if version.state is None:
            raise StoreError(f"{version.short()} carries no state to store as {kind}")
        v = version.version
        if v not in self._files[kind]:
            save_safetensors_atomic(version.state, self.path_of(kind, v), state_metadata(version.record))
        self._commit(version.record, kind)

    def _admit(self, record: VersionRecord) -> None:
        """The checks a verified record must pass against what is stored; raises, writes nothing.

        Signature, chain hash and run were checked where the ``VerifiedVersion`` was made."""
        if self.trusted is not None and record.signer not in self.trusted:
            raise IntegrityError(f"record {record.short()}: signer is not a trusted trainer key")
        parent = self._records.get(record.version - 1)
        if parent is not None:
            check_link(parent, record)
        v = record.version
        existing, child = self._records.get(v), self._records.get(v + 1)
        if existing is not None and (existing.chain_hash, existing.anchor_version) != (
                record.chain_hash, record.anchor_version):
            raise IntegrityError(f"{record.short()} conflicts with stored {existing.short()} (fork)")
        if child is not None:
            check_link(record, child)

    def _commit(self, record: VersionRecord, kind: str) -> None:
        """Write the record last (READY marker) and index the data file."""
        v = record.version
        if v not in self._records:
            write_atomic(self.path_of("record", v), encode_record(record))
            self._records[v] = record
        self._files[kind].add(v)

    def _drop(self, kind: str, version: int) -> None:
        """Forget and delete a data file that failed verification (writer only)."""
        self._files[kind].discard(version)
        if not self.readonly:
            remove_quietly(self.path_of(kind, version))
            log.error("removed corrupt %s of v%d", kind, version)

