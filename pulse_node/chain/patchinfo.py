"""What the chain needs from a codec patch header: the base and result state hashes it names.

The one place the chain reads codec header fields, so a rename in the codec touches one line.
"""

from __future__ import annotations

from pulse_node.codec.patch import read_header


def patch_hashes(patch: bytes) -> tuple[str, str]:
    """``(base_state_hash, result_state_hash)`` named by the patch header (``PatchError``)."""
    header = read_header(patch)
    base = getattr(header, "base_state_hash", None) or header.base_hash
    result = getattr(header, "result_state_hash", None) or header.result_hash
    return base, result
