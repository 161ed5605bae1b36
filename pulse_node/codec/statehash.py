"""State hash: one collision-resistant digest naming a whole model state.

The hash covers a canonical encoding of the state, independent of dict order and of how the
arrays are laid out in memory: for every tensor in sorted name order, the UTF-8 name, the dtype
name, the shape and the raw little-endian bits, each length-prefixed so no two different
states share an encoding.

Algorithm: BLAKE3 (256-bit). ``bench/codec.py`` measured the candidates over this canonical
encoding of a 512 MB state on the shared 2-core box (2026-11-21, bench/RESULTS.md, codec section):
xxh3-128 8.3 GB/s, BLAKE3 2.0 GB/s on one thread / 3.6 GB/s with its thread pool, SHA-256
0.7 GB/s (on a quiet moment earlier, 80 MB: 11.2 / 4.7 / 8.7 / 1.4 GB/s). xxh3-128 is faster
but not collision resistant: anyone can craft a second state or patch with the same xxh3
digest, so a signature over a record naming only that digest would vouch for the forgery too.
BLAKE3 is a cryptographic hash, and at several GB/s it costs less than reading the model from
disk, so the state hash itself can be signed and trusted.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Mapping

import blake3
import numpy as np

from pulse_node.codec.state import DTYPES, TensorBits

#: name of the hash algorithm, recorded in patch headers and records
HASH_ALGO = "blake3"
#: hex characters of a digest
HASH_HEX_LEN = 64
_DOMAIN = b"pulse-node state v1\x00"


def _tensor_prefix(name: str, t: TensorBits) -> bytes:
    return _prefix(name, t.dtype, t.shape, t.nbytes)


def _prefix(name: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    raw_name = name.encode("utf-8")
    raw_dtype = dtype.encode("ascii")
    head = struct.pack("<I", len(raw_name)) + raw_name + struct.pack("<B", len(raw_dtype)) + raw_dtype
    head += struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
    return head + struct.pack("<Q", nbytes)


def state_hash(state: Mapping[str, TensorBits]) -> str:
    """Hex BLAKE3 digest of the canonical encoding of ``state`` (sorted names, dtype, shape, bits)."""
    hasher = blake3.blake3(_DOMAIN, max_threads=blake3.blake3.AUTO)
    hasher.update(struct.pack("<Q", len(state)))
    for name in sorted(state):
        t = state[name]
        hasher.update(_tensor_prefix(name, t))
        bits = np.ascontiguousarray(t.bits, dtype=t.bits.dtype.newbyteorder("<"))
        hasher.update(bits.view(np.uint8).data if bits.size else b"")
    return hasher.hexdigest()


def flat_state_hash(dtype: str, shapes: Mapping[str, tuple[int, ...]], flat: np.ndarray) -> str:
    """``state_hash`` of the state whose tensors (``shapes``, all of ``dtype``) are consecutive slices
    of ``flat`` in sorted name order, without building it (the same digest, bit for bit)."""
    prefixes, total = _layout_prefixes(dtype, tuple(sorted((n, tuple(s)) for n, s in shapes.items())))
    if flat.ndim != 1 or flat.size != total:
        raise ValueError(f"a flat state of {total} elements expected, got shape {flat.shape}")
    raw = np.ascontiguousarray(flat, dtype=flat.dtype.newbyteorder("<")).view(np.uint8).data
    hasher = blake3.blake3(_DOMAIN, max_threads=blake3.blake3.AUTO)
    hasher.update(struct.pack("<Q", len(prefixes)))
    at = 0
    for prefix, nbytes in prefixes:
        hasher.update(prefix)
        hasher.update(raw[at:at + nbytes])
        at += nbytes
    return hasher.hexdigest()


@functools.lru_cache(maxsize=16)
def _layout_prefixes(dtype: str, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[tuple[tuple[bytes, int], ...], int]:
    """Each tensor's canonical prefix and byte count, in sorted name order; the element total."""
    out, total = [], 0
    for name, shape in shapes:
        size = math.prod(shape)
        nbytes = size * DTYPES[dtype].itemsize
        out.append((_prefix(name, dtype, shape, nbytes), nbytes))
        total += size
    return tuple(out), total


def bytes_digest(data: bytes | memoryview) -> str:
    """Hex BLAKE3 digest of a byte string (patch payload digests)."""
    return blake3.blake3(data).hexdigest()


def is_hex_digest(value: object) -> bool:
    """True if ``value`` looks like a digest this module produces."""
    if not isinstance(value, str) or len(value) != HASH_HEX_LEN:
        return False
    try:
        int(value, 16)
    except ValueError:
        return False
    return True
