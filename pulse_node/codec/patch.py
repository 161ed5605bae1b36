"""PULSESync patches: lossless sparse difference between two versions of a model state.

``make_patch(base, new)`` diffs every tensor bitwise (integer views, so -0/+0, NaN payloads,
inf and subnormals are carried) and writes, per tensor, the changed positions and values:

- ``compact`` (default): values as exact integer differences of order-preserving keys (mostly
  +-1 ulp) coded with the base's exponent as context; positions as binned gaps, optionally
  (``position_context``) with the base's exponent classes as context. Only valid on the exact
  base: ``apply_patch`` refuses any base whose state hash differs from the header's (with
  ``verify=False`` only if a ``base_hash`` is passed; otherwise the caller vouches for the base).
- ``overwrite``: positions without context and the new bits themselves (idempotent, the
  reference system's choice). The header still names the base; ``apply_patch`` refuses a
  different base unless ``allow_any_base=True`` (then it writes the new bits wherever the
  patch says and skips the result-hash check, since the result is a different state).

Both versions must have the same tensor names, dtypes and shapes (``PatchError`` otherwise).

``apply_patch`` returns a NEW state and never mutates ``base``; tensors the patch does not
change are the SAME ``TensorBits`` objects as in ``base`` (their arrays are shared), so treat
states as immutable. Every failure is typed: ``BaseMismatchError`` (wrong base hash, tensor
set, dtype or shape), ``PatchError`` (corrupt, truncated, oversized), ``IntegrityError``
(payload digest or result hash). The new arrays are built first and returned only when every
tensor decoded (and, with ``verify``, all hashes matched): a failure never leaves a partial state.
With ``verify=False`` nothing is hashed: a corrupt payload is still refused when it is malformed,
but one that decodes cleanly yields a wrong state, so only skip verification for trusted bytes.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping

import msgpack
import numpy as np

from pulse_node.codec import values as V
from pulse_node.codec.context import position_classes, choose_threshold, supports_context
from pulse_node.codec.entropy import AnsDecoder, BitReader, BitWriter, ans_encode, categorical, gap_unbins, \
    group_by_label, n_gap_bins
from pulse_node.codec.header import (FORMAT_VERSION, MODES, Mode, PatchHeader, TensorEntry, ValueTable,
                                     pack_header, unpack_header)
from pulse_node.codec.positions import decode_positions, encode_positions
from pulse_node.codec.state import DTYPES, State, TensorBits
from pulse_node.codec.statehash import HASH_ALGO, bytes_digest, state_hash
from pulse_node.errors import BaseMismatchError, IntegrityError, PatchError

__all__ = ["Mode", "PatchHeader", "PatchStats", "make_patch", "apply_patch", "read_header", "patch_stats",
           "changed_positions"]


@dataclass(frozen=True)
class PatchStats:
    """Size summary of a patch (from its header alone)."""

    mode: str
    tensors: int
    changed_tensors: int
    changed: int
    numel: int
    density: float
    bytes: int
    bytes_per_changed: float  # 0.0 for a patch without changes
    ratio_vs_dense_bf16: float


@dataclass
class _Pending:
    """One changed tensor between the two encoding passes."""

    name: str
    tb: TensorBits
    idx: np.ndarray
    threshold: int
    coding: int
    pos_blob: bytes
    keys: list[tuple[int, str, int]]  # value-model key per symbol segment
    symbols: list[np.ndarray]
    extra: tuple[np.ndarray, np.ndarray] | None


def _check_same_layout(base: Mapping[str, TensorBits], new: Mapping[str, TensorBits]) -> None:
    if set(base) != set(new):
        diff = sorted(set(base) ^ set(new))
        raise PatchError(f"versions have different tensor sets (e.g. {diff[:3]}); a patch needs the same tensors")
    for name, t in base.items():
        if (t.dtype, t.shape) != (new[name].dtype, new[name].shape):
            raise PatchError(f"tensor {name!r} changed dtype/shape: {t.dtype}{list(t.shape)} -> "
                             f"{new[name].dtype}{list(new[name].shape)}")


def _prepare(name: str, old: TensorBits, new: TensorBits, idx: np.ndarray, mode: Mode, context: bool) -> _Pending:
    if mode == "overwrite" or old.bits.itemsize == 8:
        vals = new.bits[idx]
        keys = [(V.PLANES, old.dtype, j) for j in range(old.bits.itemsize)]
        pos = encode_positions(idx, old.numel)
        return _Pending(name, old, idx, 0, V.PLANES, pos, keys, V.plane_symbols(vals), None)
    labels = V.exponent_labels(old.dtype, old.bits[idx])
    threshold = choose_threshold(old.dtype, old.bits, labels) if context else 0
    pos = encode_positions(idx, old.numel, classes=position_classes(old.dtype, old.bits, threshold))
    sym, nextra, extra = V.delta_symbols(old.dtype, old.bits[idx], new.bits[idx])
    order, groups = group_by_label(labels)
    keys = [(V.DELTA, old.dtype, label) for label, _, _ in groups]
    symbols = [sym[order[s:e]] for _, s, e in groups]
    return _Pending(name, old, idx, threshold, V.DELTA, pos, keys, symbols, (extra, nextra))


def _build_tables(pending: list[_Pending]) -> dict[tuple[int, str, int], np.ndarray]:
    """Symbol counts per value model over the whole patch (the header carries them)."""
    parts: dict[tuple[int, str, int], list[np.ndarray]] = {}
    for p in pending:
        for key, sym in zip(p.keys, p.symbols):
            parts.setdefault(key, []).append(np.bincount(sym, minlength=256 if key[0] == V.PLANES else 1))
    tables = {}
    for key, counts in parts.items():
        total = np.zeros(max(c.size for c in counts), np.int64)
        for c in counts:
            total[:c.size] += c
        tables[key] = total
    return tables


def _encode_tensor(p: _Pending, models: Mapping[tuple[int, str, int], object]) -> bytes:
    words = ans_encode([(s, models[k]) for k, s in zip(p.keys, p.symbols)])
    raw = BitWriter()
    if p.extra is not None:
        raw.write(*p.extra)
    return msgpack.packb([p.pos_blob, words, raw.getvalue()], use_bin_type=True)


def make_patch(base: State, new: State, *, mode: Mode = "compact", base_hash: str | None = None,
               new_hash: str | None = None, position_context: bool = False) -> bytes:
    """Patch that turns ``base`` into ``new`` (bit-exact). Hashes may be passed if known.

    ``position_context`` (compact mode): code positions with the base's exponent classes as
    context. About 20% smaller patches, but encoder and every receiver pay an extra pass over
    each changed tensor's base (see bench/RESULTS.md), so it is for slow links.
    """
    if mode not in MODES:
        raise PatchError(f"unknown patch mode {mode!r} (expected one of {', '.join(MODES)})")
    _check_same_layout(base, new)
    def prepare(name: str):
        idx = np.flatnonzero(base[name].bits != new[name].bits)
        return _prepare(name, base[name], new[name], idx, mode, position_context) if idx.size else None

    pending = [p for p in _map(prepare, sorted(base)) if p is not None]
    tables = _build_tables(pending)
    models = {k: categorical(c.astype(np.float64)) for k, c in tables.items()}
    streams = dict(zip([p.name for p in pending], _map(lambda p: _encode_tensor(p, models), pending)))
    by_name = {p.name: p for p in pending}
    entries, offset = [], 0
    for name in sorted(base):
        t, p, blob = base[name], by_name.get(name), streams.get(name, b"")
        entries.append(TensorEntry(name, t.dtype, t.shape, 0 if p is None else int(p.idx.size), offset,
                                   len(blob), 0 if p is None else p.threshold, V.PLANES if p is None else p.coding))
        offset += len(blob)
    payload = b"".join(streams.get(name, b"") for name in sorted(base))
    header = PatchHeader(FORMAT_VERSION, mode, HASH_ALGO, base_hash or state_hash(base),
                         new_hash or state_hash(new), bytes_digest(payload), len(payload), tuple(entries),
                         tuple(ValueTable(k[0], k[1], k[2], tuple(int(x) for x in c))
                               for k, c in sorted(tables.items())))
    return pack_header(header) + payload


def read_header(patch: bytes) -> PatchHeader:
    """The validated header of a whole patch (``PatchError`` if malformed or truncated).

    Checks structure, caps and the payload length; not the payload digest (``apply_patch``).
    """
    header, start = unpack_header(memoryview(patch))
    _payload(patch, header, start, verify=False)
    return header


def patch_stats(patch: bytes) -> PatchStats:
    """Tensors, changed elements, density and size figures of a patch."""
    header = read_header(patch)
    changed = sum(t.changed for t in header.tensors)
    numel = sum(t.numel for t in header.tensors)
    return PatchStats(
        mode=header.mode, tensors=len(header.tensors),
        changed_tensors=sum(1 for t in header.tensors if t.changed), changed=changed, numel=numel,
        density=changed / numel if numel else 0.0, bytes=len(patch),
        bytes_per_changed=len(patch) / changed if changed else 0.0,
        ratio_vs_dense_bf16=2 * numel / len(patch) if patch else 0.0)


def _check_base(header: PatchHeader, base: Mapping[str, TensorBits]) -> None:
    names = [t.name for t in header.tensors]
    if sorted(base) != names:
        missing = sorted(set(names) ^ set(base))
        raise BaseMismatchError(f"base has a different tensor set than the patch (e.g. {missing[:3]})")
    for t in header.tensors:
        b = base[t.name]
        if (b.dtype, b.shape) != (t.dtype, t.shape):
            raise BaseMismatchError(f"tensor {t.name!r}: base is {b.dtype}{list(b.shape)}, patch expects "
                                    f"{t.dtype}{list(t.shape)}")


def _split_stream(blob: memoryview, name: str) -> tuple[bytes, bytes, bytes]:
    try:
        parts = msgpack.unpackb(bytes(blob), raw=False, max_array_len=3, max_map_len=0, max_str_len=0,
                                max_bin_len=len(blob))
    except Exception as exc:
        raise PatchError(f"tensor {name!r}: corrupt stream ({exc})") from None
    if not isinstance(parts, list) or len(parts) != 3 or not all(isinstance(x, bytes) for x in parts):
        raise PatchError(f"tensor {name!r}: corrupt stream")
    return parts[0], parts[1], parts[2]


def _decode_positions(entry: TensorEntry, base_bits: np.ndarray, pos_blob: bytes) -> np.ndarray:
    if entry.threshold and (not supports_context(entry.dtype) or entry.value_coding != V.DELTA
                            or entry.threshold > 1 << (V.FLOAT_LAYOUT[entry.dtype][0] - 1
                                                       - V.FLOAT_LAYOUT[entry.dtype][1])):
        raise PatchError(f"tensor {entry.name!r}: invalid position context threshold {entry.threshold}")
    classes = position_classes(entry.dtype, base_bits, entry.threshold)
    idx = decode_positions(pos_blob, entry.numel, max_count=entry.changed, classes=classes)
    if idx.size != entry.changed:
        raise PatchError(f"tensor {entry.name!r}: header declares {entry.changed} changes, stream has {idx.size}")
    return idx


class _Models(dict):
    """Value models of one patch, built from the header's tables on first use (thread-safe)."""

    def __init__(self, tables: Mapping[tuple[int, str, int], ValueTable]) -> None:
        super().__init__()
        self.tables = tables
        self._lock = threading.Lock()

    def get_model(self, key: tuple[int, str, int], name: str) -> object:
        with self._lock:
            if key not in self:
                self[key] = categorical(_table(self.tables, key, name))
            return self[key]


def _table(tables: Mapping[tuple[int, str, int], ValueTable], key: tuple[int, str, int], name: str) -> np.ndarray:
    table = tables.get(key)
    if table is None:
        raise PatchError(f"tensor {name!r}: patch lacks value table {key}")
    limit = 256 if key[0] == V.PLANES else n_gap_bins(1 << (8 * DTYPES[key[1]].itemsize))
    if len(table.counts) > limit:
        raise PatchError(f"tensor {name!r}: value table {key} has {len(table.counts)} symbols (limit {limit})")
    return np.asarray(table.counts, dtype=np.float64)


def _decode_values(entry: TensorEntry, old: np.ndarray, words: bytes, raw_bytes: bytes,
                   models: _Models, labels: np.ndarray | None) -> np.ndarray:
    """New bits (planes) or ``zigzag(delta) - 1`` (delta) of the changed elements."""
    dec, raw = AnsDecoder(words), BitReader(raw_bytes)
    if entry.value_coding == V.PLANES:
        planes = [dec.decode(old.size, models.get_model((V.PLANES, entry.dtype, j), entry.name))
                  for j in range(old.dtype.itemsize)]
        out = V.planes_to_bits(planes, old.dtype)
    else:
        if old.dtype.itemsize == 8:
            raise PatchError(f"tensor {entry.name!r}: delta coding is not defined for 8-byte dtypes")
        sym = np.zeros(old.size, np.int64)
        order, groups = group_by_label(labels)
        for label, s, e in groups:
            sym[order[s:e]] = dec.decode(e - s, models.get_model((V.DELTA, entry.dtype, label), entry.name))
        out = gap_unbins(sym, raw)
    if not dec.is_empty() or raw.remaining_bytes() > 0:
        raise PatchError(f"tensor {entry.name!r}: value stream has trailing data")
    return out


def _decode_tensor(entry: TensorEntry, base: TensorBits, blob: memoryview,
                   models: _Models) -> tuple[np.ndarray, np.ndarray]:
    """Changed positions and their decoded values (see ``_decode_values``)."""
    pos_blob, words, raw = _split_stream(blob, entry.name)
    idx = _decode_positions(entry, base.bits, pos_blob)
    old = base.bits[idx]
    labels = V.exponent_labels(entry.dtype, old) if entry.value_coding == V.DELTA else None
    return idx, _decode_values(entry, old, words, raw, models, labels)


def _payload(patch: bytes, header: PatchHeader, start: int, verify: bool) -> memoryview:
    payload = memoryview(patch)[start:]
    if len(payload) != header.payload_len:
        raise PatchError(f"patch is truncated or padded: payload is {len(payload)} bytes, header says "
                         f"{header.payload_len}")
    if verify and bytes_digest(payload) != header.payload_digest:
        raise IntegrityError("patch payload digest mismatch (corrupt or tampered patch)")
    return payload


#: tensors decoded in parallel (bounded so a node sharing the machine is not starved)
_WORKERS = min(8, os.cpu_count() or 1)


def _patched_bits(entry: TensorEntry, b: TensorBits, payload: memoryview, models: "_Models") -> np.ndarray:
    idx, vals = _decode_tensor(entry, b, payload[entry.offset:entry.offset + entry.length], models)
    bits = b.bits.copy()
    if entry.value_coding == V.PLANES:
        bits[idx] = vals
    else:
        V.apply_delta_into(entry.dtype, bits, idx, vals)
    return bits


def _map(fn, items: list) -> list:
    """``map`` over tensors on a thread pool (numpy releases the GIL in the heavy passes)."""
    if len(items) < 2 or _WORKERS < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        return list(pool.map(fn, items))


def apply_patch(base: State, patch: bytes, *, verify: bool = True, allow_any_base: bool = False,
                base_hash: str | None = None) -> State:
    """Apply ``patch`` to ``base`` and return the new state (``base`` is left untouched).

    ``verify`` checks the base hash (unless ``allow_any_base`` in overwrite mode), the
    payload digest and the result hash. ``base_hash``: the base's known state hash, used
    instead of hashing it (and checked even with ``verify=False``). ``allow_any_base`` is
    refused for compact patches.
    """
    header, start = unpack_header(memoryview(patch))
    if allow_any_base and header.mode != "overwrite":
        raise BaseMismatchError("a compact patch only applies to its exact base (allow_any_base needs overwrite)")
    _check_base(header, base)
    if not allow_any_base and (verify or base_hash is not None):
        actual = base_hash or state_hash(base)
        if actual != header.base_state_hash:
            raise BaseMismatchError(f"base state hash {actual[:16]}... does not match the patch's base "
                                    f"{header.base_state_hash[:16]}...")
    payload = _payload(patch, header, start, verify)
    models = _Models({(t.coding, t.dtype, t.label): t for t in header.tables})
    out: State = dict(base)
    changed = [e for e in header.tensors if e.changed]
    for entry, bits in zip(changed, _map(lambda e: _patched_bits(e, base[e.name], payload, models), changed)):
        out[entry.name] = TensorBits(base[entry.name].dtype, base[entry.name].shape, bits)
    if verify and not allow_any_base and state_hash(out) != header.result_state_hash:
        raise IntegrityError("patched state hash does not match the patch's result hash")
    return out


def changed_positions(patch: bytes, base: State) -> dict[str, np.ndarray]:
    """Changed flat indices per tensor (only tensors with changes); for merging and stats.

    Compact patches need their exact base (the position model is conditioned on it); the
    base's tensor set is always checked, its hash is not.
    """
    header, start = unpack_header(memoryview(patch))
    _check_base(header, base)
    payload = _payload(patch, header, start, verify=False)
    out = {}
    for entry in header.tensors:
        if entry.changed:
            pos_blob, _, _ = _split_stream(payload[entry.offset:entry.offset + entry.length], entry.name)
            out[entry.name] = _decode_positions(entry, base[entry.name].bits, pos_blob)
    return out
