"""The PULSELoCo wire struct: one trainer's contribution to one round (torch-free).

``LocoPayload`` holds, per tensor, the flat positions where the BF16 gate fired and the exact
FP32 values of ``s = e + d`` there. On the wire (format 2) it is a msgpack map::

    {"kind": "pulseloco/payload", "v": 2, "round": int, "trainer": str, "base": bytes,
     "pos_coder": str, "val_coder": str,
     "tensors": [[name, count], ...],    # sorted by name, count > 0
     "positions": bytes,                 # ONE stream over the listed tensors, concatenated
     "values": bytes}                    # all values, in that order

Positions of all listed tensors are coded as one set of indices into their concatenation (in
name order), so a model's many small tensors share one position model. Coders:

- positions: ``codec.positions`` (the shared rANS gap coder) and ``codec.positions/base-ctx``
  (the same with a per-element class from the base weights, ``basecoder.position_labels``);
- values: ``f32-rot-planes-zstd`` (FP32 bits rotated left by one, byte planes, zstd) and
  ``f32-base-excess-rans`` (``basecoder``: sign and excess over the BF16 boundary coded with
  the base weight as context, mantissa bits raw). Both are lossless.

The ``*base*`` coders need the round's FP32 global weights on both sides: pass them as
``base=`` to ``encode_payload`` and ``decode_payload`` (every trainer of a round holds the
same ones; the payload's ``base`` hash names them). Without ``base=`` the encoder uses the
base-free coders, so callers that do not pass it keep working. A receiver passes its own
base hash as ``expect_base=``: a payload naming another base is refused with
``BaseMismatchError`` before any of its data is decoded (never against the wrong weights).
``read_header`` checks and returns the header alone (round, trainer, base hash, coders), e.g.
to hold a payload of a coming round until its base is known.

``decode_payload`` checks sizes before allocating, index ranges and order, finiteness of values,
and raises ``pulse_node.errors.WireError`` on anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zstandard

from pulse_node.codec import positions as shared_positions
from pulse_node.errors import BaseMismatchError, PulseError, WireError
from pulse_node.loco.bounded_zstd import bounded_decompress

KIND = "pulseloco/payload"
VERSION = 2
VAL_CODER = "f32-rot-planes-zstd"
VAL_CODER_BASE = "f32-base-excess-rans"
POS_CODER_BASE = "codec.positions/base-ctx"
MAX_TRAINER_ID = 128
MAX_NAME = 1024
_FIELDS = {"kind", "v", "round", "trainer", "base", "pos_coder", "val_coder", "tensors", "positions", "values"}


@dataclass
class LocoPayload:
    """Positions (int64, strictly increasing) and FP32 values per tensor, for one round."""

    round: int
    trainer_id: str
    base_hash: bytes
    tensors: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    numel: dict[str, int] = field(default_factory=dict)
    """Element count of every tensor in ``tensors`` (the position coder's range)."""

    @property
    def count(self) -> int:
        """Number of entries sent (fired) in this payload."""
        return sum(int(p.size) for p, _ in self.tensors.values())


@dataclass(frozen=True)
class PayloadHeader:
    """What a payload says about itself, checked, without its positions and values decoded."""

    round: int
    trainer_id: str
    base_hash: bytes
    pos_coder: str
    val_coder: str

    @property
    def needs_base(self) -> bool:
        """Whether decoding needs the round's FP32 global weights (a ``*base*`` coder)."""
        return _needs_base(self.pos_coder, self.val_coder)


#: the coder new payloads are written with when no base is given
POSITION_CODER = "codec.positions"
#: position coder name -> (encode, decode); the base-context one passes ``context=`` labels
POSITION_CODERS: dict[str, tuple[Callable[..., bytes], Callable[..., np.ndarray]]] = {
    POSITION_CODER: (shared_positions.encode_positions, shared_positions.decode_positions),
    POS_CODER_BASE: (shared_positions.encode_positions, shared_positions.decode_positions),
}
VALUE_CODERS = (VAL_CODER, VAL_CODER_BASE)


def encode_values(values: np.ndarray, *, level: int = 3) -> bytes:
    """FP32 values -> rotated byte planes -> one zstd frame (empty input -> b"")."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if u.size == 0:
        return b""
    rot = (u << np.uint32(1)) | (u >> np.uint32(31))
    planes = rot.view(np.uint8).reshape(-1, 4).T
    return zstandard.ZstdCompressor(level=level).compress(np.ascontiguousarray(planes).tobytes())


def decode_values(blob: bytes, count: int) -> np.ndarray:
    """Inverse of ``encode_values`` for exactly ``count`` values."""
    if count == 0:
        if blob:
            raise WireError("values: data present for zero values")
        return np.zeros(0, dtype=np.float32)
    raw = bounded_decompress(blob, limit=4 * count, what="values")
    if len(raw) != 4 * count:
        raise WireError(f"values: {len(raw)} bytes for {count} FP32 values")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(4, count)
    rot = np.ascontiguousarray(planes.T).view(np.uint32).reshape(-1)
    u = (rot >> np.uint32(1)) | (rot << np.uint32(31))
    values: np.ndarray = u.view(np.float32)
    return values


# ---------------------------------------------------------------- the concatenated index space


def _flat_base(base: Mapping[str, Any], names: list[str], numel: list[int]) -> np.ndarray:
    """FP32 bits (uint32) of the base tensors ``names``, concatenated."""
    parts = []
    for name, n in zip(names, numel):
        if name not in base:
            raise ValueError(f"base weights lack tensor {name!r}")
        a = np.asarray(base[name])
        if a.dtype != np.float32 or a.size != n:
            raise ValueError(f"{name}: base must be FP32 with {n} elements")
        parts.append(np.ascontiguousarray(a).reshape(-1).view(np.uint32))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


def _needs_base(pos_coder: str, val_coder: str) -> bool:
    return pos_coder == POS_CODER_BASE or val_coder == VAL_CODER_BASE


def _held(w: np.ndarray | None) -> np.ndarray:
    """The base bits of a base-context coder (the callers check first that a base was given)."""
    if w is None:
        raise WireError("a base-context coder without the base weights")
    return w


def _encode_body(flat_pos: np.ndarray, vals: np.ndarray, total: int, w: np.ndarray | None, *,
                 pos_coder: str, val_coder: str, level: int) -> tuple[bytes, bytes]:
    if flat_pos.size == 0:
        return b"", b""
    enc = POSITION_CODERS[pos_coder][0]
    if pos_coder == POS_CODER_BASE:
        from pulse_node.loco.basecoder import position_labels
        positions = enc(flat_pos, total, context=position_labels(_held(w)))
    else:
        positions = enc(flat_pos, total)
    if val_coder == VAL_CODER_BASE:
        from pulse_node.loco.basecoder import encode_values_ctx
        return positions, encode_values_ctx(vals, _held(w)[flat_pos], level=level)
    return positions, encode_values(vals, level=level)


def encode_payload(p: LocoPayload, *, level: int = 3, pos_coder: str | None = None,
                   val_coder: str | None = None, base: Mapping[str, Any] | None = None) -> bytes:
    """The msgpack bytes of a payload (tensors with no fired entry are omitted).

    ``base``: the round's FP32 global weights by tensor name (numpy arrays or CPU tensors);
    with it the default coders are the base-context ones, without it the base-free ones.
    ``pos_coder`` / ``val_coder`` name entries of ``POSITION_CODERS`` / ``VALUE_CODERS``.
    """
    pos_coder = pos_coder or (POS_CODER_BASE if base is not None else POSITION_CODER)
    val_coder = val_coder or (VAL_CODER_BASE if base is not None else VAL_CODER)
    if pos_coder not in POSITION_CODERS or val_coder not in VALUE_CODERS:
        raise ValueError(f"unknown coder {pos_coder!r} / {val_coder!r}")
    if _needs_base(pos_coder, val_coder) and base is None:
        raise ValueError(f"coders {pos_coder!r} / {val_coder!r} need base=")
    names, counts, numel, flat, values = [], [], [], [], []
    offset = 0
    for name in sorted(p.tensors):
        pos, val = p.tensors[name]
        if pos.size != val.size:
            raise ValueError(f"{name}: {pos.size} positions but {val.size} values")
        if pos.size == 0:
            continue
        if name not in p.numel:
            raise ValueError(f"{name}: payload does not say the tensor's element count")
        flat.append(np.asarray(pos, dtype=np.int64) + offset)
        names.append(name)
        counts.append(int(pos.size))
        numel.append(int(p.numel[name]))
        offset += numel[-1]
        values.append(np.asarray(val, dtype=np.float32))
    w = _flat_base(base, names, numel) if base is not None and _needs_base(pos_coder, val_coder) else None
    flat_pos = np.concatenate(flat) if flat else np.zeros(0, np.int64)
    vals = np.concatenate(values) if values else np.zeros(0, np.float32)
    positions, vblob = _encode_body(flat_pos, vals, sum(numel), w, pos_coder=pos_coder,
                                    val_coder=val_coder, level=level)
    msg = {"kind": KIND, "v": VERSION, "round": int(p.round), "trainer": p.trainer_id,
           "base": bytes(p.base_hash), "pos_coder": pos_coder, "val_coder": val_coder,
           "tensors": [[n, c] for n, c in zip(names, counts)], "positions": positions, "values": vblob}
    return msgpack.packb(msg, use_bin_type=True)


# ---------------------------------------------------------------- decoding (hostile input)


def _unpack(data: bytes, *, max_bytes: int, max_tensors: int) -> dict[str, Any]:
    if len(data) > max_bytes:
        raise WireError(f"payload of {len(data)} bytes exceeds the cap {max_bytes}")
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=max_bytes,
                              max_str_len=MAX_NAME, max_array_len=max(max_tensors, 2),
                              max_map_len=16, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise WireError(f"payload is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(msg, dict) or msg.get("kind") != KIND:
        raise WireError("not a PULSELoCo payload")
    if msg.get("v") != VERSION:
        raise WireError(f"unsupported payload version {msg.get('v')!r} (want {VERSION})")
    if set(msg) != _FIELDS:
        raise WireError(f"payload fields {sorted(map(str, msg))} != {sorted(_FIELDS)}")
    return msg


def _check_header(msg: dict[str, Any]) -> None:
    if not isinstance(msg["round"], int) or isinstance(msg["round"], bool) or msg["round"] < 0:
        raise WireError("payload round must be a non-negative integer")
    t = msg["trainer"]
    if not isinstance(t, str) or not 0 < len(t) <= MAX_TRAINER_ID:
        raise WireError(f"payload trainer id must be a string of 1..{MAX_TRAINER_ID} chars")
    if not isinstance(msg["base"], bytes) or len(msg["base"]) > 64:
        raise WireError("payload base hash must be at most 64 bytes")
    if not isinstance(msg["pos_coder"], str) or msg["pos_coder"] not in POSITION_CODERS:
        raise WireError(f"unknown position coder {msg['pos_coder']!r}")
    if not isinstance(msg["val_coder"], str) or msg["val_coder"] not in VALUE_CODERS:
        raise WireError(f"unknown value coder {msg['val_coder']!r}")
    if not isinstance(msg["tensors"], list) or not isinstance(msg["values"], bytes) \
            or not isinstance(msg["positions"], bytes):
        raise WireError("payload tensors must be a list, positions and values bytes")


def _records(msg: dict[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> tuple[list[str], list[int], list[int]]:
    """Names, counts and element counts of the listed tensors (validated; nothing allocated)."""
    names: list[str] = []
    counts: list[int] = []
    numel: list[int] = []
    for rec in msg["tensors"]:
        if not (isinstance(rec, list) and len(rec) == 2 and isinstance(rec[0], str)
                and isinstance(rec[1], int) and not isinstance(rec[1], bool)):
            raise WireError("payload tensor record must be [name, count]")
        name, count = rec
        if name not in shapes:
            raise WireError(f"payload names unknown tensor {name!r}")
        if names and name <= names[-1]:
            raise WireError("payload tensors must be sorted by name without repeats")
        n = int(np.prod(shapes[name], dtype=np.int64))
        if not 0 < count <= n:
            raise WireError(f"{name}: count {count} outside 1..{n}")
        names.append(name)
        counts.append(count)
        numel.append(n)
    return names, counts, numel


def _decode_positions(msg: dict[str, Any], counts: list[int], numel: list[int], w: np.ndarray | None) -> np.ndarray:
    total, count = sum(numel), sum(counts)
    decode_pos = POSITION_CODERS[msg["pos_coder"]][1]
    kw = {}
    if msg["pos_coder"] == POS_CODER_BASE:
        from pulse_node.loco.basecoder import position_labels
        kw["context"] = position_labels(_held(w))
    try:
        pos = decode_pos(msg["positions"], total, max_count=count, **kw)
    except WireError:
        raise
    except (PulseError, ValueError, IndexError, OverflowError, TypeError, KeyError) as exc:
        # the shared coder reports PatchError; whatever it raises, the peer sent bad bytes
        raise WireError(f"bad positions ({exc})") from None
    pos = np.asarray(pos).astype(np.int64, copy=False)
    if pos.shape != (count,) or (count > 1 and np.any(np.diff(pos) <= 0)) \
            or int(pos[0]) < 0 or int(pos[-1]) >= total:
        raise WireError(f"positions are not {count} increasing indices inside the tensors")
    ends = np.cumsum(numel)
    if not np.array_equal(np.diff(np.searchsorted(pos, ends), prepend=0), counts):
        raise WireError("positions do not match the per-tensor counts")
    return pos


def _decode_vals(msg: dict[str, Any], flat_pos: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    if msg["val_coder"] == VAL_CODER:
        vals = decode_values(msg["values"], flat_pos.size)
    else:
        from pulse_node.loco.basecoder import decode_values_ctx
        try:
            vals = decode_values_ctx(msg["values"], _held(w)[flat_pos])
        except WireError:
            raise
        except (PulseError, ValueError, IndexError, OverflowError, TypeError, KeyError) as exc:
            raise WireError(f"bad values ({exc})") from None
    if not np.all(np.isfinite(vals)):
        raise WireError("values: non-finite FP32 value")
    return vals


def read_header(data: bytes, *, max_bytes: int, max_tensors: int) -> PayloadHeader:
    """The checked header of payload bytes (``WireError`` if malformed); nothing else is decoded."""
    msg = _unpack(data, max_bytes=max_bytes, max_tensors=max_tensors)
    _check_header(msg)
    return PayloadHeader(round=msg["round"], trainer_id=msg["trainer"], base_hash=msg["base"],
                         pos_coder=msg["pos_coder"], val_coder=msg["val_coder"])


def decode_payload(data: bytes, *, shapes: Mapping[str, tuple[int, ...]], max_bytes: int,
                   base: Mapping[str, Any] | None = None, expect_base: bytes | None = None) -> LocoPayload:
    """Parse and validate payload bytes against the model's tensor shapes.

    ``base``: the round's FP32 global weights (needed iff the payload uses a base coder).
    ``expect_base``: the hash of those weights; a payload naming another base raises
    ``BaseMismatchError`` right after its header is checked, before anything else is decoded.
    """
    msg = _unpack(data, max_bytes=max_bytes, max_tensors=len(shapes))
    _check_header(msg)
    if expect_base is not None and msg["base"] != expect_base:
        raise BaseMismatchError(f"payload of {msg['trainer'][:12]} for round {msg['round']} was made on base "
                                f"{msg['base'][:4].hex()}.., not ours ({expect_base[:4].hex()}..)")
    names, counts, numel = _records(msg, shapes)
    if not names:
        if msg["positions"] or msg["values"]:
            raise WireError("payload without tensors carries data")
        return LocoPayload(round=msg["round"], trainer_id=msg["trainer"], base_hash=msg["base"])
    w = None
    if _needs_base(msg["pos_coder"], msg["val_coder"]):
        if base is None:
            raise WireError("payload is coded against the base weights, but no base was given")
        w = _flat_base(base, names, numel)
    flat_pos = _decode_positions(msg, counts, numel, w)
    vals = _decode_vals(msg, flat_pos, w)
    tensors, at, off = {}, 0, 0
    for name, c, n in zip(names, counts, numel):
        tensors[name] = (flat_pos[at:at + c] - off, vals[at:at + c])
        at, off = at + c, off + n
    return LocoPayload(round=msg["round"], trainer_id=msg["trainer"], base_hash=msg["base"],
                       tensors=tensors, numel=dict(zip(names, numel)))
