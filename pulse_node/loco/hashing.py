"""State hash of the global FP32 weights and outer momentum that every trainer compares.

Uses the project's state hash (``pulse_node.codec.statehash.state_hash``, BLAKE3 over the
canonical encoding of a ``State``) on zero-copy ``TensorBits`` views of the tensors, named
``param/<name>`` and ``momentum/<name>``, plus the round number as a one-element I64 tensor
``round``. Two trainers hold bit-identical state iff their digests are equal. ``outer_hash``
adds the trust ledger's digest (``loco/ledger.py``): the outer state every trainer replicates.
"""

from __future__ import annotations

from collections.abc import Mapping

import blake3
import numpy as np
import torch

from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import state_hash


def _view(t: torch.Tensor) -> TensorBits:
    if t.dtype != torch.float32:
        raise TypeError(f"state hash expects FP32 tensors, got {t.dtype}")
    flat = t.detach().contiguous().reshape(-1)
    return TensorBits("F32", tuple(t.shape), flat.view(torch.int32).numpy().view(np.uint32))


def tensors_hash(*groups: tuple[str, Mapping[str, torch.Tensor]], round: int | None = None) -> bytes:
    """32-byte digest of named FP32 CPU tensors grouped by prefix, e.g. ``("param", p)``."""
    state: State = {f"{prefix}/{name}": _view(t) for prefix, named in groups for name, t in named.items()}
    if round is not None:
        state["round"] = TensorBits("I64", (1,), np.array([round], dtype=np.uint64))
    return bytes.fromhex(state_hash(state))


_OUTER_DOMAIN = b"pulse/outer-state/1\0"


def outer_hash(params: Mapping[str, torch.Tensor], momentum: Mapping[str, torch.Tensor], *, round: int,
               ledger: bytes) -> bytes:
    """The outer state's 32-byte digest: round, FP32 weights and momentum, and the ledger's digest."""
    tensors = tensors_hash(("param", params), ("momentum", momentum), round=round)
    return blake3.blake3(_OUTER_DOMAIN + tensors + ledger).digest()
