"""The patch file header: a declared, versioned msgpack struct, validated before any use.

File layout::

    b"PULSEPT" | u8 format version | u32 LE header length | header (msgpack map) | payload

The header map has fixed keys (see ``PatchHeader.to_wire``); tensors and value tables are
fixed-length arrays. ``unpack_header`` checks every field's type and range, the caps on
declared sizes, and that per-tensor payload ranges tile the payload exactly, so nothing
downstream allocates from an unchecked number.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

import msgpack

from pulse_node.codec.state import DTYPES
from pulse_node.codec.statehash import HASH_ALGO, is_hex_digest
from pulse_node.errors import PatchError

MAGIC = b"PULSEPT"
FORMAT_VERSION = 3
_PREFIX = struct.Struct("<7sBI")
MAX_HEADER_BYTES = 64 << 20
MAX_TENSORS = 1 << 20
MAX_NUMEL = 1 << 40
MAX_NDIM = 16
MAX_TABLE_SYMBOLS = 4096
MODES = ("overwrite", "compact")
Mode = Literal["overwrite", "compact"]


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the patch: identity, change count, payload range, coding choices."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    changed: int
    offset: int
    length: int
    threshold: int  # exponent below which elements form their own position classes (0 = none)
    value_coding: int  # values.PLANES or values.DELTA

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ValueTable:
    """Symbol frequencies of one value model, keyed by (coding, dtype, label)."""

    coding: int
    dtype: str
    label: int
    counts: tuple[int, ...]


@dataclass(frozen=True)
class PatchHeader:
    version: int
    mode: Mode
    hash_algo: str
    base_state_hash: str
    result_state_hash: str
    payload_digest: str
    payload_len: int
    tensors: tuple[TensorEntry, ...]
    tables: tuple[ValueTable, ...]

    def to_wire(self) -> dict[str, object]:
        return {
            "format": "pulse-patch", "version": self.version, "mode": self.mode,
            "hash_algo": self.hash_algo, "base_state_hash": self.base_state_hash,
            "result_state_hash": self.result_state_hash, "payload_digest": self.payload_digest,
            "payload_len": self.payload_len,
            "tensors": [[t.name, t.dtype, list(t.shape), t.changed, t.offset, t.length, t.threshold,
                         t.value_coding] for t in self.tensors],
            "tables": [[v.coding, v.dtype, v.label, list(v.counts)] for v in self.tables],
        }


def pack_header(header: PatchHeader) -> bytes:
    body = msgpack.packb(header.to_wire(), use_bin_type=True)
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(body)) + body


def _is_int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _tensor_entry(raw: object) -> TensorEntry:
    if not isinstance(raw, list) or len(raw) != 8:
        raise PatchError("malformed tensor entry in patch header")
    name, dtype, shape, changed, offset, length, threshold, coding = raw
    if not isinstance(name, str) or not name or not isinstance(dtype, str) or dtype not in DTYPES:
        raise PatchError(f"bad tensor name or dtype in patch header: {str(name)[:80]!r} {str(dtype)[:16]!r}")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_int(d, 0, MAX_NUMEL) for d in shape):
        raise PatchError(f"tensor {name!r}: bad shape in patch header")
    entry = TensorEntry(name, dtype, tuple(shape), 0, 0, 0, 0, 0)
    if entry.numel > MAX_NUMEL:
        raise PatchError(f"tensor {name!r}: declared size {entry.numel} exceeds the cap {MAX_NUMEL}")
    if not (_is_int(changed, 0, entry.numel) and _is_int(offset, 0, MAX_NUMEL * 8)
            and _is_int(length, 0, MAX_NUMEL * 8) and _is_int(threshold, 0, 255) and _is_int(coding, 0, 1)):
        raise PatchError(f"tensor {name!r}: bad counts or offsets in patch header")
    return TensorEntry(name, dtype, tuple(shape), changed, offset, length, threshold, coding)


def _value_table(raw: object) -> ValueTable:
    if not isinstance(raw, list) or len(raw) != 4:
        raise PatchError("malformed value table in patch header")
    coding, dtype, label, counts = raw
    if not (_is_int(coding, 0, 1) and isinstance(dtype, str) and dtype in DTYPES and _is_int(label, 0, 255) and isinstance(counts, list)
            and 0 < len(counts) <= MAX_TABLE_SYMBOLS and all(_is_int(c, 0, MAX_NUMEL) for c in counts)
            and sum(counts) > 0):
        raise PatchError("bad value table in patch header")
    return ValueTable(coding, dtype, label, tuple(counts))


def _check_layout(tensors: list[TensorEntry], payload_len: int) -> None:
    names = [t.name for t in tensors]
    if names != sorted(set(names)):
        raise PatchError("patch header tensor names must be unique and sorted")
    pos = 0
    for t in tensors:
        if t.offset != pos or (t.changed == 0) != (t.length == 0):
            raise PatchError(f"tensor {t.name!r}: payload range does not tile the payload")
        pos += t.length
    if pos != payload_len:
        raise PatchError("patch header payload ranges do not add up to the payload length")


def unpack_header(patch: bytes | memoryview) -> tuple[PatchHeader, int]:
    """Parse and validate the header; returns it and the payload's start offset."""
    if len(patch) < _PREFIX.size:
        raise PatchError("not a patch: file is too short")
    magic, version, hlen = _PREFIX.unpack_from(patch, 0)
    if magic != MAGIC:
        raise PatchError("not a patch: bad magic bytes")
    if version != FORMAT_VERSION:
        raise PatchError(f"unsupported patch format version {version} (this build reads {FORMAT_VERSION})")
    if hlen > MAX_HEADER_BYTES or _PREFIX.size + hlen > len(patch):
        raise PatchError("patch is truncated (header runs past the end of the file)")
    try:
        wire = msgpack.unpackb(bytes(patch[_PREFIX.size:_PREFIX.size + hlen]), raw=False, strict_map_key=True,
                               max_array_len=MAX_TENSORS, max_map_len=64, max_str_len=1 << 16,
                               max_bin_len=0, max_ext_len=0)
    except Exception as exc:
        raise PatchError(f"corrupt patch header: {exc}") from None
    return _from_wire(wire), _PREFIX.size + hlen


def _from_wire(wire: object) -> PatchHeader:
    keys = {"format", "version", "mode", "hash_algo", "base_state_hash", "result_state_hash", "payload_digest",
            "payload_len", "tensors", "tables"}
    if not isinstance(wire, dict) or set(wire) != keys or wire["format"] != "pulse-patch":
        raise PatchError("corrupt patch header: unexpected fields")
    if wire["version"] != FORMAT_VERSION or wire["mode"] not in MODES or wire["hash_algo"] != HASH_ALGO:
        raise PatchError(f"unsupported patch: version {wire['version']!r}, mode {wire['mode']!r}, "
                         f"hash {wire['hash_algo']!r}")
    if not all(is_hex_digest(wire[k]) for k in ("base_state_hash", "result_state_hash", "payload_digest")):
        raise PatchError("corrupt patch header: bad digest fields")
    if not _is_int(wire["payload_len"], 0, MAX_NUMEL * 8) or not isinstance(wire["tensors"], list) \
            or not isinstance(wire["tables"], list) or len(wire["tensors"]) > MAX_TENSORS:
        raise PatchError("corrupt patch header: bad payload length or lists")
    tensors = [_tensor_entry(t) for t in wire["tensors"]]
    _check_layout(tensors, wire["payload_len"])
    tables = tuple(_value_table(v) for v in wire["tables"])
    if len({(v.coding, v.dtype, v.label) for v in tables}) != len(tables):
        raise PatchError("corrupt patch header: duplicate value tables")
    return PatchHeader(FORMAT_VERSION, wire["mode"], HASH_ALGO, wire["base_state_hash"], wire["result_state_hash"],
                       wire["payload_digest"], wire["payload_len"], tuple(tensors), tables)
