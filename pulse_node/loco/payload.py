"""The PULSELoCo wire struct: one trainer's contribution to one round (torch-free).

``LocoPayload`` holds, per tensor, the flat positions where the BF16 gate fired and the exact
FP32 values of ``s = e + d`` there. On the wire it is a msgpack map with explicit fields::

    {"kind": "pulseloco/payload", "v": 1, "round": int, "trainer": str, "base": bytes,
     "pos_coder": str, "val_coder": "f32-rot-planes-zstd",
     "tensors": [[name, count, position_bytes], ...],   # sorted by name, count > 0
     "values": bytes}                                     # all values, in tensor order

Values: each FP32 bit pattern is rotated left by one (exponent in the top byte, sign next to
the mantissa), split into four byte planes, and the planes are zstd-compressed as one frame.
Lossless by construction. ``decode_payload`` checks sizes before allocating, index ranges and
order, finiteness of values, and raises ``pulse_node.errors.WireError`` on anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import msgpack
import numpy as np
import zstandard

from pulse_node.errors import PulseError, WireError
from pulse_node.loco import positions as _fallback_positions
from pulse_node.loco.positions import bounded_decompress

KIND = "pulseloco/payload"
VERSION = 1
VAL_CODER = "f32-rot-planes-zstd"
MAX_TRAINER_ID = 128
MAX_NAME = 1024


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


def _position_coders() -> dict[str, tuple[Callable, Callable]]:
    coders = {"loco-varint-zstd": (_fallback_positions.encode_positions,
                                   _fallback_positions.decode_positions)}
    try:
        from pulse_node.codec import positions as shared
        coders["codec.positions"] = (shared.encode_positions, shared.decode_positions)
    except ImportError:
        pass
    return coders


POSITION_CODERS = _position_coders()
#: the coder new payloads are written with (the shared codec when available)
POSITION_CODER = "codec.positions" if "codec.positions" in POSITION_CODERS else "loco-varint-zstd"


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
    vals = u.view(np.float32)
    if not np.all(np.isfinite(vals)):
        raise WireError("values: non-finite FP32 value")
    return vals


def encode_payload(p: LocoPayload, *, level: int = 3, pos_coder: str | None = None) -> bytes:
    """The msgpack bytes of a payload (tensors with no fired entry are omitted).

    ``pos_coder`` names an entry of ``POSITION_CODERS`` (default ``POSITION_CODER``).
    """
    pos_coder = pos_coder or POSITION_CODER
    encode_pos = POSITION_CODERS[pos_coder][0]
    records, values = [], []
    for name in sorted(p.tensors):
        pos, val = p.tensors[name]
        if pos.size != val.size:
            raise ValueError(f"{name}: {pos.size} positions but {val.size} values")
        if pos.size == 0:
            continue
        if name not in p.numel:
            raise ValueError(f"{name}: payload does not say the tensor's element count")
        records.append([name, int(pos.size), encode_pos(pos, int(p.numel[name]))])
        values.append(np.asarray(val, dtype=np.float32))
    flat = np.concatenate(values) if values else np.zeros(0, dtype=np.float32)
    msg = {"kind": KIND, "v": VERSION, "round": int(p.round), "trainer": p.trainer_id,
           "base": bytes(p.base_hash), "pos_coder": pos_coder, "val_coder": VAL_CODER,
           "tensors": records, "values": encode_values(flat, level=level)}
    return msgpack.packb(msg, use_bin_type=True)


def _unpack(data: bytes, *, max_bytes: int, max_tensors: int) -> dict:
    if len(data) > max_bytes:
        raise WireError(f"payload of {len(data)} bytes exceeds the cap {max_bytes}")
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=max_bytes,
                              max_str_len=MAX_NAME, max_array_len=max(max_tensors, 3),
                              max_map_len=16, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise WireError(f"payload is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(msg, dict) or msg.get("kind") != KIND:
        raise WireError("not a PULSELoCo payload")
    if msg.get("v") != VERSION:
        raise WireError(f"unsupported payload version {msg.get('v')!r} (want {VERSION})")
    want = {"kind", "v", "round", "trainer", "base", "pos_coder", "val_coder", "tensors", "values"}
    if set(msg) != want:
        raise WireError(f"payload fields {sorted(msg)} != {sorted(want)}")
    return msg


def _check_header(msg: dict) -> None:
    if not isinstance(msg["round"], int) or isinstance(msg["round"], bool) or msg["round"] < 0:
        raise WireError("payload round must be a non-negative integer")
    t = msg["trainer"]
    if not isinstance(t, str) or not 0 < len(t) <= MAX_TRAINER_ID:
        raise WireError(f"payload trainer id must be a string of 1..{MAX_TRAINER_ID} chars")
    if not isinstance(msg["base"], bytes) or len(msg["base"]) > 64:
        raise WireError("payload base hash must be at most 64 bytes")
    if msg["pos_coder"] not in POSITION_CODERS:
        raise WireError(f"unknown position coder {msg['pos_coder']!r}")
    if msg["val_coder"] != VAL_CODER:
        raise WireError(f"unknown value coder {msg['val_coder']!r}")
    if not isinstance(msg["tensors"], list) or not isinstance(msg["values"], bytes):
        raise WireError("payload tensors must be a list and values bytes")


def _decode_records(msg: dict, shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, np.ndarray]]:
    decode_pos = POSITION_CODERS[msg["pos_coder"]][1]
    out, last = [], None
    for rec in msg["tensors"]:
        if not (isinstance(rec, list) and len(rec) == 3 and isinstance(rec[0], str)
                and isinstance(rec[1], int) and isinstance(rec[2], bytes)):
            raise WireError("payload tensor record must be [name, count, positions]")
        name, count, blob = rec
        if name not in shapes:
            raise WireError(f"payload names unknown tensor {name!r}")
        if last is not None and name <= last:
            raise WireError("payload tensors must be sorted by name without repeats")
        last = name
        numel = int(np.prod(shapes[name], dtype=np.int64))
        if not 0 < count <= numel:
            raise WireError(f"{name}: count {count} outside 1..{numel}")
        try:
            pos = decode_pos(blob, numel, max_count=count)
        except WireError:
            raise
        except (PulseError, ValueError, IndexError, OverflowError, TypeError, KeyError) as exc:
            # the shared coder reports PatchError; whatever it raises, the peer sent bad bytes
            raise WireError(f"{name}: bad positions ({exc})") from None
        if pos.shape != (count,) or (count > 1 and np.any(np.diff(pos) <= 0)) \
                or int(pos[0]) < 0 or int(pos[-1]) >= numel:
            raise WireError(f"{name}: positions not {count} increasing indices inside the tensor")
        pos = pos.astype(np.int64, copy=False)
        out.append((name, pos))
    return out


def decode_payload(data: bytes, *, shapes: Mapping[str, tuple[int, ...]], max_bytes: int) -> LocoPayload:
    """Parse and validate payload bytes against the model's tensor shapes."""
    msg = _unpack(data, max_bytes=max_bytes, max_tensors=len(shapes))
    _check_header(msg)
    records = _decode_records(msg, shapes)
    total = sum(int(pos.size) for _, pos in records)
    vals = decode_values(msg["values"], total)
    tensors, at = {}, 0
    for name, pos in records:
        tensors[name] = (pos, vals[at:at + pos.size])
        at += pos.size
    numel = {name: int(np.prod(shapes[name], dtype=np.int64)) for name in tensors}
    return LocoPayload(round=msg["round"], trainer_id=msg["trainer"], base_hash=msg["base"],
                       tensors=tensors, numel=numel)
