"""What the chain needs from a codec patch header: the base and result state hashes it names."""

from __future__ import annotations

from pulse_node.codec.patch import ParsedPatch, read_header


def patch_hashes(patch: bytes | ParsedPatch) -> tuple[str, str]:
    """``(base_state_hash, result_state_hash)`` named by the patch header (``PatchError``)."""
    header = read_header(patch)
    return header.base_state_hash, header.result_state_hash
