"""File layout of a version store, and cheap structural checks of its files.

Shared by the writer (``VersionStore``) and by read-only readers in other processes (the
data plane serves these files as they are), so it has no state and opens nothing for writing.

    <root>/LOCK                      flock held by the single writer process
    <root>/records/<v>.rec           encoded VersionRecord (the READY marker of version v)
    <root>/patches/<v>.patch         codec patch turning version v-1 into v
    <root>/anchors/<v>.safetensors   full state of anchor version v (HF-compatible)
    <root>/current/<v>.safetensors   latest verified state (optional, fast restart)

``<v>`` is the plain decimal version. Temp files are ``.<name>.<pid>.tmp`` beside their target.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from pulse_node.chain.record import VersionRecord, decode_record, encode_record
from pulse_node.errors import StoreError, WireError

KINDS: dict[str, tuple[str, str]] = {
    "record": ("records", ".rec"),
    "patch": ("patches", ".patch"),
    "anchor": ("anchors", ".safetensors"),
    "current": ("current", ".safetensors"),
}
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


def read_safetensors_header(path: Path) -> dict:
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
        begin, end = info["data_offsets"]  # type: ignore[index]
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
