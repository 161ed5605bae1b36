"""One zstd frame whose declared size is capped: how the PULSELoCo payload decoders decompress.

A peer's frame must declare its decompressed size, and that size is checked against a cap the
caller derives from what the payload claims (and bounds by the model's shapes) before anything
is allocated; a frame that decompresses to another size, or carries trailing data, is refused.
Errors are ``WireError``. Torch-free.
"""

from __future__ import annotations

import zstandard

from pulse_node.errors import WireError


def bounded_decompress(blob: bytes, *, limit: int, what: str) -> bytes:
    """Decompress one zstd frame whose declared size is at most ``limit`` bytes."""
    if not blob:
        return b""
    try:
        size = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as exc:
        raise WireError(f"{what}: not a zstd frame ({exc})") from None
    if size < 0:
        raise WireError(f"{what}: zstd frame does not declare its size")
    if size > limit:
        raise WireError(f"{what}: declares {size} bytes, more than the cap {limit}")
    try:
        out = zstandard.ZstdDecompressor().decompress(blob, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise WireError(f"{what}: corrupt zstd frame ({exc})") from None
    if len(out) != size:
        raise WireError(f"{what}: frame size {len(out)} != declared {size}")
    return out
