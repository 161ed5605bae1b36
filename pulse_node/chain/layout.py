"""File layout of a version store, and cheap structural checks of its files.

Shared by the writer (``VersionStore``) and by read-only readers in other processes (the
data plane serves these files as they are), so it has no state and opens nothing for writing.

    <root>/LOCK                      flock held by the single writer process
    <root>/records/<v>.rec           encoded VersionRecord (the READY marker of version v)
    <root>/patches/<v>.patch         codec patch turning version v-1 into v
    <root>/anchors/<v>.safetensors   full state of anchor version v (HF-compatible)
    <root>/current/<v>.safetensors   latest verified state (optional, fast restart)
    <root>/catchup/<a>-<b>.patch     cached catch-up patch a -> b (``catchup_producer``); may
                                     vanish at any time (bounded cache, pruned by retention)

``<v>`` is the plain decimal version. Temp files are ``.<name>.<pid>.<random>.tmp`` beside their
target (``fsutil.atomic_writer``).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Collection
from pathlib import Path

from pulse_node.chain.record import VersionRecord, decode_record, encode_record
from pulse_node.errors import StoreError, WireError

KINDS: dict[str, tuple[str, str]] = {
    "record": ("records", ".rec"),
    "patch": ("patches", ".patch"),
    "anchor": ("anchors", ".safetensors"),
    "current": ("current", ".safetensors"),
}
CATCHUP_DIR = "catchup"
CATCHUP_KEEP_FILES = 16  # cached catch-up patches per store (newest targets kept) ...
CATCHUP_KEEP_BYTES = 512 << 20  # ... and their bytes (a 33.7M-parameter k=32 catch-up is ~5.5 MB)
RECORD_METADATA_KEY = "pulse.record"
_MAX_HEADER = 100 * 1024 * 1024


def store_path(root: Path, kind: str, version: int) -> Path:
    """Where file ``kind`` of ``version`` lives under ``root`` (it may not exist)."""
    if kind not in KINDS:
        raise StoreError(f"unknown store file kind {kind!r} (one of {', '.join(KINDS)})")
    if version < 0:
        raise StoreError(f"version must be >= 0, got {version}")
    folder, suffix = KINDS[kind]
    return Path(root) / folder / f"{version}{suffix}"


def parse_version(path: Path, suffix: str) -> int | None:
    """``12`` for ``12.rec`` (canonical decimal only), else None."""
    name = path.name
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if not stem.isdigit() or str(int(stem)) != stem:
        return None
    return int(stem)


def catchup_path(root: Path, base: int, target: int) -> Path:
    """Where the cached catch-up patch ``base -> target`` lives under ``root`` (may not exist)."""
    if not 0 <= base < target:
        raise StoreError(f"catch-up must go forward, got v{base} -> v{target}")
    return Path(root) / CATCHUP_DIR / f"{base}-{target}.patch"


def parse_catchup(path: Path) -> tuple[int, int] | None:
    """``(3, 12)`` for ``3-12.patch`` (canonical decimals, base < target), else None."""
    stem = path.name[:-len(".patch")] if path.name.endswith(".patch") else ""
    a, sep, b = stem.partition("-")
    if not sep or not all(x.isdigit() and str(int(x)) == x for x in (a, b)) or int(a) >= int(b):
        return None
    return int(a), int(b)


def prune_catchups(root: Path, *, keep_files: int, keep_bytes: int,
                   targets: Collection[int] | None = None) -> list[Path]:
    """Bound the catch-up cache: drop leftovers and files whose target is not in ``targets``
    (when given), then keep the newest files (highest target, then base) within
    ``keep_files`` and ``keep_bytes``. Returns what was removed; safe against concurrent writers.
    """
    folder = Path(root) / CATCHUP_DIR
    try:
        paths = list(folder.iterdir())
    except FileNotFoundError:
        return []
    removed, kept = [], []
    for p in paths:
        key = parse_catchup(p)
        if key is None or (targets is not None and key[1] not in targets):
            if not is_temp(p) and remove_quietly(p):  # temp files belong to a writer at work
                removed.append(p)
        else:
            kept.append((key[1], key[0], p))
    total = 0
    for i, (_, _, p) in enumerate(sorted(kept, reverse=True)):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            continue
        if (i >= keep_files or total > keep_bytes) and remove_quietly(p):
            removed.append(p)
    return removed


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(".tmp")


def state_metadata(record: VersionRecord) -> dict[str, str]:
    """Safetensors metadata for a stored full state: the record, plus readable copies."""
    return {
        "format": "pt",  # transformers refuses safetensors files without it
        RECORD_METADATA_KEY: encode_record(record).hex(),
        "pulse.run_id": record.run_id,
        "pulse.version": str(record.version),
        "pulse.state_hash": record.state_hash,
        "pulse.chain_hash": record.chain_hash,
        "pulse.signer": record.signer,
    }


def read_safetensors_header(path: Path) -> dict[str, object]:
    """Parse a safetensors header and check the file is exactly as long as it declares.

    Cheap (reads the header only); catches truncated and over-long files. ``StoreError``.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise StoreError(f"{path}: truncated safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise StoreError(f"{path}: truncated or corrupt safetensors header")
            header = json.loads(fh.read(n))
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError):
        raise StoreError(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise StoreError(f"{path}: safetensors header is not an object")
    ends = [_tensor_end(path, k, v) for k, v in header.items() if k != "__metadata__"]
    if 8 + n + max(ends, default=0) != size:
        raise StoreError(f"{path}: file size {size} does not match its header (truncated?)")
    return header


def _tensor_end(path: Path, name: str, info: object) -> int:
    try:
        if not isinstance(info, dict):
            raise TypeError
        begin, end = info["data_offsets"]
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise TypeError
    except (TypeError, KeyError, ValueError):
        raise StoreError(f"{path}: bad data_offsets for tensor {name!r}") from None
    return end


def embedded_record(path: Path) -> VersionRecord:
    """The record a stored full-state file carries in its metadata (structural check too)."""
    meta = read_safetensors_header(path).get("__metadata__") or {}
    raw = meta.get(RECORD_METADATA_KEY) if isinstance(meta, dict) else None
    if not isinstance(raw, str):
        raise StoreError(f"{path}: no {RECORD_METADATA_KEY} in safetensors metadata")
    try:
        return decode_record(bytes.fromhex(raw))
    except (ValueError, WireError) as exc:
        raise StoreError(f"{path}: embedded record is invalid ({exc})") from None


def remove_quietly(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
