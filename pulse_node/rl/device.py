"""Device selection (``model.device = "auto"`` -> CUDA when present, else CPU)."""

from __future__ import annotations

import torch

from pulse_node.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"model.device: unknown device {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device={name!r} but CUDA is not available")
    return dev
