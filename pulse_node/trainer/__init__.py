"""The trainer role: GRPO inner steps, the PULSELoCo round agreement, version publication."""

from __future__ import annotations

import os


def world_size() -> int:
    """Processes of this trainer: ``WORLD_SIZE`` as torchrun sets it, else 1 (torch-free)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1
