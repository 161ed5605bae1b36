"""The torch boundary of the codec: torch tensors <-> raw ``TensorBits`` without copies of meaning.

Only this module (and the ``rl``/``loco``/``node`` layers) import torch; ``codec`` and ``chain``
stay torch-free so the data-plane process and the CLI ``patch`` commands start fast.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch

from pulse_node.codec.state import DTYPES, State, TensorBits

_TORCH_TO_NAME: dict[torch.dtype, str] = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_NAME_TO_TORCH = {v: k for k, v in _TORCH_TO_NAME.items()}
_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}


def tensor_to_bits(t: torch.Tensor) -> TensorBits:
    """Exact bits of a tensor (copied to CPU)."""
    name = _TORCH_TO_NAME.get(t.dtype)
    if name is None:
        raise TypeError(f"unsupported tensor dtype {t.dtype}")
    flat = t.detach().contiguous().reshape(-1).cpu()
    if t.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(_INT_VIEW[flat.element_size()]).numpy().view(DTYPES[name])
    return TensorBits(name, tuple(t.shape), raw.copy())


def bits_to_tensor(tb: TensorBits, device: torch.device | str = "cpu") -> torch.Tensor:
    """A torch tensor holding exactly these bits."""
    dtype = _NAME_TO_TORCH[tb.dtype]
    signed = tb.bits.view(np.dtype(f"<i{tb.bits.itemsize}")) if tb.bits.itemsize > 1 else tb.bits
    raw = torch.from_numpy(signed.copy())
    out = raw.to(torch.uint8) if dtype == torch.bool else raw.view(dtype)
    if dtype == torch.bool:
        out = out.to(torch.bool)
    return out.reshape(tb.shape).to(device)


def module_state(named: Iterable[tuple[str, torch.Tensor]], *, cast: torch.dtype | None = torch.bfloat16) -> State:
    """Bits of named tensors, floating tensors cast to ``cast`` (the BF16 compute copy)."""
    out: State = {}
    for name, t in sorted(named, key=lambda kv: kv[0]):
        if cast is not None and t.is_floating_point():
            t = t.detach().to(cast)
        out[name] = tensor_to_bits(t)
    return out


def load_state(targets: Mapping[str, torch.Tensor], state: Mapping[str, TensorBits]) -> None:
    """Copy bits into existing tensors (cast to each target's dtype; BF16 -> FP32 is exact)."""
    missing = set(targets) ^ set(state)
    if missing:
        raise KeyError(f"state and model disagree on tensors: {sorted(missing)[:5]}")
    with torch.no_grad():
        for name, t in targets.items():
            t.copy_(bits_to_tensor(state[name], t.device).to(t.dtype))
