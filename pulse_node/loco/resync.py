"""Re-sync message: the global FP32 weights + outer momentum a diverged trainer pulls from a peer.

A trainer whose ``OuterOptimizer.state_hash()`` differs from the swarm's agreed hash (the
majority of the round's published hashes) asks a peer on the agreed hash for its state, decodes
it with ``decode_outer_state`` and calls ``OuterOptimizer.load_state_dict(state,
expect_hash=agreed)``, which verifies the hash before changing anything; then it resets its local
weights to the new global weights. Its error-feedback buffer is kept (it is the trainer's own
unsent work, valid against any global state).

Format: safetensors (tensors ``param/<name>`` and ``momentum/<name>``, F32) with metadata
``{"kind": "pulseloco/outer-state", "v": "1", "round": "<int>"}``.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from pulse_node.codec.state import TensorBits, from_safetensors_bytes, to_safetensors_bytes
from pulse_node.errors import PatchError, WireError
from pulse_node.torchbits import bits_to_tensor, tensor_to_bits

KIND = "pulseloco/outer-state"
VERSION = "1"


def encode_outer_state(state: Mapping[str, object]) -> bytes:
    """Bytes of ``OuterOptimizer.state_dict()``."""
    bits: dict[str, TensorBits] = {}
    for group in ("params", "momentum"):
        prefix = "param" if group == "params" else "momentum"
        for name, t in state[group].items():
            bits[f"{prefix}/{name}"] = tensor_to_bits(t)
    meta = {"kind": KIND, "v": VERSION, "round": str(int(state["round"]))}
    return to_safetensors_bytes(bits, metadata=meta)


def _metadata(data: bytes) -> dict[str, str]:
    import json
    import struct

    if len(data) < 8:
        raise WireError("outer state: truncated")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, 100_000_000):
        raise WireError("outer state: header size out of range")
    try:
        return json.loads(data[8:8 + n]).get("__metadata__", {})
    except (ValueError, AttributeError):
        raise WireError("outer state: header is not JSON") from None


def decode_outer_state(data: bytes, *, shapes: Mapping[str, tuple[int, ...]], max_bytes: int) -> dict[str, object]:
    """Parse and validate a peer's outer state against the model's tensor shapes."""
    if len(data) > max_bytes:
        raise WireError(f"outer state of {len(data)} bytes exceeds the cap {max_bytes}")
    meta = _metadata(data)
    if meta.get("kind") != KIND or meta.get("v") != VERSION or not str(meta.get("round", "")).isdigit():
        raise WireError("not a PULSELoCo outer state (kind/version/round)")
    try:
        bits = from_safetensors_bytes(data)
    except PatchError as exc:
        raise WireError(f"outer state: {exc}") from None
    want = {f"{p}/{n}": tuple(s) for p in ("param", "momentum") for n, s in shapes.items()}
    got = {k: t.shape for k, t in bits.items()}
    if got != want or any(t.dtype != "F32" for t in bits.values()):
        raise WireError("outer state tensors do not match the model (names, shapes or dtype)")
    if not all(np.isfinite(t.bits.view(np.float32)).all() for t in bits.values()):
        raise WireError("outer state holds non-finite values")
    return {"round": int(meta["round"]),
            "params": {n: bits_to_tensor(bits[f"param/{n}"]) for n in shapes},
            "momentum": {n: bits_to_tensor(bits[f"momentum/{n}"]) for n in shapes}}


def tensor_shapes(params: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in params.items()}
