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

import struct
from collections.abc import Mapping

import blake3
import numpy as np

from pulse_node.codec.state import TensorBits

#: name of the hash algorithm, recorded in patch headers and records
HASH_ALGO = "blake3"
#: hex characters of a digest
HASH_HEX_LEN = 64
_DOMAIN = b"pulse-node state v1\x00"


def _tensor_prefix(name: str, t: TensorBits) -> bytes:
    raw_name = name.encode("utf-8")
    raw_dtype = t.dtype.encode("ascii")
    head = struct.pack("<I", len(raw_name)) + raw_name + struct.pack("<B", len(raw_dtype)) + raw_dtype
    head += struct.pack("<I", len(t.shape)) + b"".join(struct.pack("<Q", d) for d in t.shape)
    return head + struct.pack("<Q", t.nbytes)


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
