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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import msgpack
import numpy as np

from pulse_node.codec import values as V
from pulse_node.codec.context import choose_threshold, position_classes, supports_context
from pulse_node.codec.entropy import MAX_BINS, AnsDecoder, BitWriter, ans_encode, bin_bounds
from pulse_node.codec.fused import LiveWords, RawBits, decode_deltas_into, decode_planes_into, write_live
from pulse_node.codec.header import (
    FORMAT_VERSION,
    MODES,
    Mode,
    PatchHeader,
    TensorEntry,
    ValueTable,
    pack_header,
    unpack_header,
)
from pulse_node.codec.models import Key, PatchModels, delta_counts
from pulse_node.codec.positions import decode_positions, encode_positions, index_dtype
from pulse_node.codec.rans import encode_rows
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import HASH_ALGO, bytes_digest, state_hash
from pulse_node.errors import BaseMismatchError, IntegrityError, PatchError

__all__ = [
    "Mode",
    "ParsedPatch",
    "PatchHeader",
    "PatchStats",
    "apply_patch",
    "changed_positions",
    "encode_patch",
    "make_patch",
    "parse_patch",
    "patch_stats",
    "read_header",
]


@dataclass(frozen=True)
class ParsedPatch:
    """A whole patch with its header parsed and checked once (``parse_patch`` or ``encode_patch``).

    Every function that reads a patch takes one of these or the raw bytes (parsed on the spot), so
    a caller that keeps it (``chain/verified.py``'s ``VerifiedVersion``) never parses a header twice.
    """

    data: bytes
    header: PatchHeader
    start: int  # where the payload begins

    @property
    def payload(self) -> memoryview:
        return memoryview(self.data)[self.start:]

    def __len__(self) -> int:
        return len(self.data)


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
    symbols: list[np.ndarray]  # one per byte plane (planes), or the delta symbols in position order
    labels: np.ndarray | None  # delta: the base exponent of each changed element (its value model)
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
        pos = encode_positions(idx, old.numel)
        return _Pending(name, old, idx, 0, V.PLANES, pos, V.plane_symbols(new.bits[idx]), None, None)
    labels = V.exponent_labels(old.dtype, old.bits[idx])
    threshold = choose_threshold(old.dtype, old.bits, labels) if context else 0
    pos = encode_positions(idx, old.numel, classes=position_classes(old.dtype, old.bits, threshold))
    sym, nextra, extra = V.delta_symbols(old.dtype, old.bits[idx], new.bits[idx])
    return _Pending(name, old, idx, threshold, V.DELTA, pos, [sym.astype(np.int64)], labels, (extra, nextra))


def _build_tables(pending: list[_Pending]) -> dict[Key, np.ndarray]:
    """Symbol counts per value model over the whole patch (the header carries them)."""
    parts: dict[Key, list[np.ndarray]] = {}
    for p in pending:
        if p.coding == V.PLANES:
            for j, sym in enumerate(p.symbols):
                parts.setdefault((V.PLANES, p.tb.dtype, j), []).append(np.bincount(sym, minlength=256))
        else:
            if p.labels is None:
                raise PatchError(f"{p.name}: delta coding without exponent labels")
            present, counts = delta_counts(p.symbols[0], p.labels)
            for label, row in zip(present.tolist(), counts):
                parts.setdefault((V.DELTA, p.tb.dtype, label), []).append(row)
    tables = {}
    for key, rows in parts.items():
        total = np.zeros(max(r.size for r in rows), np.int64)
        for r in rows:
            total[:r.size] += r
        tables[key] = total[:int(np.flatnonzero(total)[-1]) + 1]  # every key has a symbol
    return tables


def _encode_tensor(p: _Pending, models: PatchModels) -> bytes:
    if p.coding == V.PLANES:
        words = ans_encode([(s, models.model((V.PLANES, p.tb.dtype, j), p.name)) for j, s in enumerate(p.symbols)])
    else:
        label_row, stack = models.delta_stack(p.tb.dtype, p.name)
        words = encode_rows(p.symbols[0], label_row[p.labels], stack)
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
    return encode_patch(base, new, mode=mode, base_hash=base_hash, new_hash=new_hash,
                        position_context=position_context).data


def encode_patch(base: State, new: State, *, mode: Mode = "compact", base_hash: str | None = None,
                 new_hash: str | None = None, position_context: bool = False) -> ParsedPatch:
    """``make_patch`` with the header it wrote (the publisher keeps it: nothing parses it again)."""
    if mode not in MODES:
        raise PatchError(f"unknown patch mode {mode!r} (expected one of {', '.join(MODES)})")
    _check_same_layout(base, new)
    def prepare(name: str) -> _Pending | None:
        idx = np.flatnonzero(base[name].bits != new[name].bits)
        return _prepare(name, base[name], new[name], idx, mode, position_context) if idx.size else None

    elements = sum(int(t.bits.size) for t in base.values())
    pending = [p for p in _map(prepare, sorted(base), elements=elements) if p is not None]
    tables = _build_tables(pending)
    models = PatchModels(tables)
    streams = dict(zip([p.name for p in pending], _map(lambda p: _encode_tensor(p, models), pending,
                                                       elements=elements)))
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
    packed = pack_header(header)
    return ParsedPatch(packed + payload, header, len(packed))


def parse_patch(patch: bytes | ParsedPatch) -> ParsedPatch:
    """Parse and validate a whole patch's header once (``PatchError`` if malformed or truncated).

    Checks structure, caps and the payload length; not the payload digest (``apply_patch``).
    An already parsed patch is returned as it is.
    """
    if isinstance(patch, ParsedPatch):
        return patch
    data = bytes(patch)
    header, start = unpack_header(memoryview(data))
    _payload(data, header, start, verify=False)
    return ParsedPatch(data, header, start)


def read_header(patch: bytes | ParsedPatch) -> PatchHeader:
    """The validated header of a whole patch (``parse_patch``)."""
    return parse_patch(patch).header


def patch_stats(patch: bytes | ParsedPatch) -> PatchStats:
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
    idx = decode_positions(pos_blob, entry.numel, max_count=entry.changed, classes=classes,
                           dtype=index_dtype(entry.numel))
    if idx.size != entry.changed:
        raise PatchError(f"tensor {entry.name!r}: header declares {entry.changed} changes, stream has {idx.size}")
    return idx


def _decode_planes(entry: TensorEntry, idx: np.ndarray, words: bytes, models: PatchModels,
                   bits: np.ndarray) -> None:
    dec = AnsDecoder(words)
    decode_planes_into(dec, models.plane_stack(entry.dtype, entry.name), idx, bits)
    if not dec.is_empty():
        raise PatchError(f"tensor {entry.name!r}: value stream has trailing data")


def _decode_deltas(entry: TensorEntry, idx: np.ndarray, words: bytes, raw_bytes: bytes, models: PatchModels,
                   bits: np.ndarray, *, old: np.ndarray | None = None, new: np.ndarray | None = None,
                   live: LiveWords | None = None) -> None:
    """The value stream into ``bits`` at ``idx`` (``old`` / ``new`` / ``live``: see ``decode_deltas_into``)."""
    if bits.itemsize == 8:
        raise PatchError(f"tensor {entry.name!r}: delta coding is not defined for 8-byte dtypes")
    label_row, stack = models.delta_stack(entry.dtype, entry.name)
    dec, raw = AnsDecoder(words), RawBits(raw_bytes)
    low, nextra = bin_bounds(MAX_BINS)
    _kind, mant, emask = V.label_layout(entry.dtype)
    decode_deltas_into(dec, raw, label_row, stack, idx, bits, V.kind_of(entry.dtype), mant, emask, low, nextra,
                       old=old, new=new, live=live)
    if not dec.is_empty() or raw.remaining_bytes() > 0:
        if old is not None:
            bits[idx] = old
            if live is not None and new is not None:
                write_live(live, idx, old)
        raise PatchError(f"tensor {entry.name!r}: value stream has trailing data")


def _payload(patch: bytes | memoryview, header: PatchHeader, start: int, verify: bool) -> memoryview:
    payload = memoryview(patch)[start:]
    if len(payload) != header.payload_len:
        raise PatchError(f"patch is truncated or padded: payload is {len(payload)} bytes, header says "
                         f"{header.payload_len}")
    if verify and bytes_digest(payload) != header.payload_digest:
        raise IntegrityError("patch payload digest mismatch (corrupt or tampered patch)")
    return payload


#: tensors decoded in parallel (bounded so a node sharing the machine is not starved)
_WORKERS = min(8, os.cpu_count() or 1)
#: below this many elements in all a state is coded on the calling thread: a pool's start and
#: hand-offs cost more CPU than it saves (a 0.2 M-parameter state: 12 ms of CPU serial, 14-22 ms
#: on 2 threads, bench/RESULTS.md "spot checks ... cut again")
PARALLEL_MIN_ELEMENTS = 1 << 20
T = TypeVar("T")
R = TypeVar("R")


def _patched_bits(entry: TensorEntry, b: TensorBits, payload: memoryview, models: PatchModels) -> np.ndarray:
    """A copy of the base tensor with the entry's changes applied."""
    pos_blob, words, raw = _split_stream(payload[entry.offset:entry.offset + entry.length], entry.name)
    idx = _decode_positions(entry, b.bits, pos_blob)
    bits: np.ndarray = b.bits.copy()
    if entry.value_coding == V.PLANES:
        _decode_planes(entry, idx, words, models, bits)
    else:
        _decode_deltas(entry, idx, words, raw, models, bits)
    return bits


def _map(fn: Callable[[T], R], items: list[T], *, elements: int) -> list[R]:
    """``map`` over tensors on a thread pool (numpy releases the GIL in the heavy passes), unless
    they hold fewer than ``PARALLEL_MIN_ELEMENTS`` ``elements`` in all."""
    if len(items) < 2 or _WORKERS < 2 or elements < PARALLEL_MIN_ELEMENTS:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        return list(pool.map(fn, items))


def apply_patch(base: State, patch: bytes | ParsedPatch, *, verify: bool = True, allow_any_base: bool = False,
                base_hash: str | None = None) -> State:
    """Apply ``patch`` to ``base`` and return the new state (``base`` is left untouched).

    ``verify`` checks the base hash (unless ``allow_any_base`` in overwrite mode), the
    payload digest and the result hash. ``base_hash``: the base's known state hash, used
    instead of hashing it (and checked even with ``verify=False``). ``allow_any_base`` is
    refused for compact patches.
    """
    parsed = parse_patch(patch)
    header = parsed.header
    if allow_any_base and header.mode != "overwrite":
        raise BaseMismatchError("a compact patch only applies to its exact base (allow_any_base needs overwrite)")
    _check_base(header, base)
    if not allow_any_base and (verify or base_hash is not None):
        actual = base_hash or state_hash(base)
        if actual != header.base_state_hash:
            raise BaseMismatchError(f"base state hash {actual[:16]}... does not match the patch's base "
                                    f"{header.base_state_hash[:16]}...")
    payload = _payload(parsed.data, header, parsed.start, verify)
    models = PatchModels({(t.coding, t.dtype, t.label): t.counts for t in header.tables})
    out: State = dict(base)
    changed = [e for e in header.tensors if e.changed]
    elements = sum(int(base[e.name].bits.size) for e in changed)
    for entry, bits in zip(changed, _map(lambda e: _patched_bits(e, base[e.name], payload, models), changed,
                                         elements=elements)):
        out[entry.name] = TensorBits(base[entry.name].dtype, base[entry.name].shape, bits)
    if verify and not allow_any_base and state_hash(out) != header.result_state_hash:
        raise IntegrityError("patched state hash does not match the patch's result hash")
    return out


def changed_positions(patch: bytes | ParsedPatch, base: State) -> dict[str, np.ndarray]:
    """Changed flat indices per tensor (only tensors with changes); for merging and stats.

    Compact patches need their exact base (the position model is conditioned on it); the
    base's tensor set is always checked, its hash is not.
    """
    parsed = parse_patch(patch)
    header = parsed.header
    _check_base(header, base)
    payload = parsed.payload
    out = {}
    for entry in header.tensors:
        if entry.changed:
            pos_blob, _, _ = _split_stream(payload[entry.offset:entry.offset + entry.length], entry.name)
            out[entry.name] = _decode_positions(entry, base[entry.name].bits, pos_blob)
    return out
