"""Reading a version store directory back: which records are valid, which data files match them.

``VersionStore`` rebuilds its index with ``scan_store`` when it opens (and readers in other
processes on ``refresh``); ``bad`` lists what is provably garbage, which the writer deletes
(``recover``): records that do not decode, verify or sit under another version's name, data
files without a valid record or that do not match theirs, and every saved current state but the
newest. Records of an untrusted signer are neither used nor deleted. The checks are cheap
(sizes, embedded records); full hashes are checked when a file is loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from pulse_node.chain.layout import KINDS, embedded_record, parse_version, store_path
from pulse_node.chain.record import VersionRecord, decode_record, verify_record
from pulse_node.errors import PulseError, StoreError

log = logging.getLogger("pulse_node.chain.store")

#: kinds of data file a version may have besides its record
DATA_KINDS = ("patch", "anchor", "current")


@dataclass
class StoreScan:
    """What a store directory holds that can be used, and what should go."""

    records: dict[int, VersionRecord] = field(default_factory=dict)
    files: dict[str, set[int]] = field(default_factory=lambda: {kind: set() for kind in DATA_KINDS})
    bad: list[Path] = field(default_factory=list)


def scan_store(root: Path, *, trusted: frozenset[str] | None) -> StoreScan:
    """Index the store at ``root``: valid records by version, matching data files by kind."""
    scan = StoreScan()
    untrusted: set[int] = set()
    scan.records = _scan_records(root, trusted, scan.bad, untrusted)
    for kind in DATA_KINDS:
        scan.files[kind] = _scan_data(root, kind, scan.records, scan.bad, skip=untrusted)
    currents = sorted(scan.files["current"])  # only the newest saved state is kept
    scan.bad += [store_path(root, "current", v) for v in currents[:-1]]
    scan.files["current"] = set(currents[-1:])
    return scan


def listdir(folder: Path) -> list[Path]:
    """The files of ``folder``, sorted ([] if it does not exist)."""
    try:
        return sorted(folder.iterdir())
    except FileNotFoundError:
        return []


def _scan_records(root: Path, trusted: frozenset[str] | None, bad: list[Path],
                  untrusted: set[int]) -> dict[int, VersionRecord]:
    """Valid records by version; invalid ones go to ``bad``, untrusted ones are left alone."""
    records: dict[int, VersionRecord] = {}
    for path in listdir(root / "records"):
        v = parse_version(path, ".rec")
        if v is None:
            continue
        try:
            r = decode_record(path.read_bytes())
            verify_record(r, run_id=None, trusted_signers=None)  # its own files; runs are checked on admission
            if r.version != v:
                raise StoreError(f"{path}: holds the record of v{r.version}")
        except (PulseError, OSError) as exc:
            log.warning("ignoring invalid record %s: %s", path, exc)
            bad.append(path)
            continue
        if trusted is None or r.signer in trusted:
            records[v] = r
        else:
            log.warning("ignoring %s: signer is not trusted", path)
            untrusted.add(v)
    return records


def _scan_data(root: Path, kind: str, records: dict[int, VersionRecord], bad: list[Path], *,
               skip: set[int]) -> set[int]:
    folder, suffix = KINDS[kind]
    present: set[int] = set()
    for path in listdir(root / folder):
        v = parse_version(path, suffix)
        if v is None or v in skip:
            continue
        r = records.get(v)
        problem = "no valid record" if r is None else data_problem(kind, path, r)
        if problem:
            log.warning("ignoring %s: %s", path, problem)
            bad.append(path)
        else:
            present.add(v)
    return present


def data_problem(kind: str, path: Path, r: VersionRecord) -> str | None:
    """Cheap structural check of a data file against its record (full hashes on load)."""
    if kind == "patch":
        size = path.stat().st_size
        return None if size == r.patch_bytes else f"{size} bytes, record says {r.patch_bytes}"
    if kind == "anchor" and not r.is_anchor:
        return "record is not an anchor"
    try:
        carried = embedded_record(path)
    except StoreError as exc:
        return str(exc)
    return None if carried.chain_hash == r.chain_hash else "carries another version's record"
