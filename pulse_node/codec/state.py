"""Raw tensor bits: the torch-free representation every codec and chain module works on.

A model state is an ordered mapping ``name -> TensorBits``. Values are held as unsigned
integer views of the exact stored bits (uint16 for BF16/F16, uint32 for F32, ...), so
comparisons are bitwise: -0/+0, NaN payloads, inf and subnormals are all distinct values.

Safetensors files are read and written with the ``safetensors`` library's framework-free
(de)serializer, so the data-plane process never needs torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pulse_node.errors import PatchError
from pulse_node.fsutil import write_atomic

#: safetensors dtype name -> (unsigned view dtype, bytes per element)
DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<u2"),
    "F32": np.dtype("<u4"),
    "F64": np.dtype("<u8"),
    "I64": np.dtype("<u8"),
    "I32": np.dtype("<u4"),
    "I16": np.dtype("<u2"),
    "I8": np.dtype("u1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("u1"),
}


@dataclass(frozen=True)
class TensorBits:
    """The exact bits of one tensor: dtype name, shape, flat unsigned-integer view."""

    dtype: str
    shape: tuple[int, ...]
    bits: np.ndarray

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise PatchError(f"unsupported dtype {self.dtype!r}")
        want = DTYPES[self.dtype]
        if self.bits.dtype != want or self.bits.ndim != 1:
            raise PatchError(f"bits of a {self.dtype} tensor must be a flat {want} array")
        if self.bits.size != int(np.prod(self.shape, dtype=np.int64)):
            raise PatchError(f"shape {self.shape} does not match {self.bits.size} elements")

    @property
    def numel(self) -> int:
        return int(self.bits.size)

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)

    def copy(self) -> TensorBits:
        return TensorBits(self.dtype, self.shape, self.bits.copy())


State = dict[str, TensorBits]


def state_nbytes(state: Mapping[str, TensorBits]) -> int:
    """Total stored bytes of a state (the dense size a full sync would send)."""
    return sum(t.nbytes for t in state.values())


def from_safetensors_bytes(data: bytes) -> State:
    """Parse a safetensors blob into a state (no torch)."""
    from safetensors import deserialize

    try:
        items = deserialize(data)
    except Exception as exc:  # the Rust parser raises its own error type
        raise PatchError(f"not a valid safetensors file: {exc}") from None
    state: State = {}
    for name, info in sorted(items, key=lambda kv: kv[0]):
        dtype = info["dtype"].upper()
        if dtype not in DTYPES:
            raise PatchError(f"tensor {name!r} has unsupported dtype {dtype}")
        arr = np.frombuffer(bytes(info["data"]), dtype=DTYPES[dtype]).copy()
        state[name] = TensorBits(dtype, tuple(int(d) for d in info["shape"]), arr)
    return state


def load_safetensors(path: str | os.PathLike[str]) -> State:
    """Read a safetensors file into a state; errors name the file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise PatchError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        return from_safetensors_bytes(data)
    except PatchError as exc:
        raise PatchError(f"{p}: {exc}") from None


def to_safetensors_bytes(state: Mapping[str, TensorBits], metadata: dict[str, str] | None = None) -> bytes:
    """Serialize a state as safetensors bytes (HF-compatible)."""
    from safetensors import serialize

    try:
        from safetensors import TensorSpec  # safetensors >= 0.7 takes specs, not dicts
    except ImportError:
        tensors = {
            name: {"dtype": t.dtype, "shape": list(t.shape), "data": t.bits.tobytes()}
            for name, t in state.items()
        }
        # safetensors < 0.7 takes plain dicts; the stubs describe >= 0.7
        return bytes(serialize(tensors, metadata=metadata))  # type: ignore[arg-type]
    arrays = {name: np.ascontiguousarray(t.bits) for name, t in state.items()}  # kept alive
    specs = {
        name: TensorSpec(dtype=_SPEC_DTYPES[t.dtype], shape=list(t.shape),
                         data_ptr=arrays[name].ctypes.data, data_len=arrays[name].nbytes)
        for name, t in state.items()
    }
    return bytes(serialize(specs, metadata=metadata))


#: our dtype names -> the names ``safetensors.TensorSpec`` accepts
_SPEC_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool"}


def save_safetensors_atomic(state: Mapping[str, TensorBits], path: str | os.PathLike[str],
                            metadata: dict[str, str] | None = None) -> None:
    """Write a state to ``path`` atomically (temp file, fsync, rename)."""
    write_atomic(Path(path), to_safetensors_bytes(state, metadata))
