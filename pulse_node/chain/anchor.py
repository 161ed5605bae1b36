"""What an anchor's signed record says about its file, so a download is bounded and every chunk checked.

An anchor is a safetensors file: 8 bytes of header length, a JSON header (the tensor layout, and
metadata that embeds the anchor's own signed record, so the record cannot commit to the header's
bytes), then the data region (every tensor's bytes in layout order). The record of an anchor
version carries an ``AnchorManifest`` in its signed ``anchor_manifest`` field:

- ``layout``: BLAKE3 of the canonical tensor layout (name -> dtype, shape, data offsets; the
  header's metadata excluded);
- ``data_bytes``: the size of the data region;
- ``chunk_bytes`` and ``chunks``: the data region cut in ``chunk_bytes`` pieces (at most
  ``MAX_CHUNKS``), the BLAKE3 digest of each.

A receiver fetches the header from one provider (``header_length``: at most
``MAX_HEADER_BYTES``), checks it (``check_header``: its metadata is exactly the record's, its
layout hashes to the signed one), and then knows the file's exact size, ``8 + header +
data_bytes``, and a digest for each piece of it (``pieces``: the header it checked, then each
chunk). The download checks every piece as it arrives, so a bad chunk blames the peer that sent
it and nothing larger than the signed size is ever written. Pure (numpy, msgpack, blake3).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import blake3
import msgpack
import numpy as np

from pulse_node.codec.state import TensorBits, to_safetensors_bytes
from pulse_node.errors import IntegrityError, WireError

MAX_CHUNKS = 128
MIN_CHUNK_BYTES = 4 << 20
_CHUNK_ALIGN = 1 << 20
#: largest safetensors header an anchor download accepts (a model with ~100k tensors)
MAX_HEADER_BYTES = 16 << 20
MAX_MANIFEST_BYTES = 64 + 32 * MAX_CHUNKS
_DIGEST = 32


@dataclass(frozen=True)
class AnchorManifest:
    """The signed description of an anchor file's layout and data (see the module docstring)."""

    layout: bytes
    data_bytes: int
    chunk_bytes: int
    chunks: bytes  # concatenated 32-byte BLAKE3 digests, one per chunk of the data region

    def encode(self) -> bytes:
        return msgpack.packb([self.layout, self.data_bytes, self.chunk_bytes, self.chunks], use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> AnchorManifest:
        """Parse hostile bytes; ``WireError`` unless well formed and self-consistent."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise WireError(f"anchor manifest of {len(data)} bytes exceeds {MAX_MANIFEST_BYTES}")
        try:
            items = msgpack.unpackb(bytes(data), raw=False, max_bin_len=_DIGEST * MAX_CHUNKS, max_str_len=0,
                                    max_array_len=4, max_map_len=0, max_ext_len=0)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise WireError(f"anchor manifest is not valid msgpack ({type(exc).__name__})") from None
        if not (isinstance(items, list) and len(items) == 4 and [type(x) for x in items] == [bytes, int, int, bytes]):
            raise WireError("anchor manifest must be [layout, data_bytes, chunk_bytes, chunks]")
        m = cls(*items)
        if len(m.layout) != _DIGEST or not 0 <= m.data_bytes < 2**63 or not 0 < m.chunk_bytes < 2**63:
            raise WireError("anchor manifest fields are out of range")
        if len(m.chunks) != _DIGEST * m.n_chunks or m.n_chunks > MAX_CHUNKS:
            raise WireError(f"anchor manifest lists {len(m.chunks) // _DIGEST} chunk digests, its sizes give "
                            f"{m.n_chunks} (at most {MAX_CHUNKS})")
        return m

    @property
    def n_chunks(self) -> int:
        return -(-self.data_bytes // self.chunk_bytes)

    def chunk_digest(self, i: int) -> str:
        return self.chunks[_DIGEST * i:_DIGEST * (i + 1)].hex()


def chunk_size_for(data_bytes: int) -> int:
    """At most ``MAX_CHUNKS`` chunks, each at least ``MIN_CHUNK_BYTES``, a whole number of MiB."""
    per = -(-data_bytes // MAX_CHUNKS)
    return max(MIN_CHUNK_BYTES, -(-per // _CHUNK_ALIGN) * _CHUNK_ALIGN)


def _layout_digest(entries: Mapping[str, tuple[str, list[int], list[int]]]) -> bytes:
    canon = json.dumps({n: [d, list(s), list(o)] for n, (d, s, o) in sorted(entries.items())},
                       separators=(",", ":"), sort_keys=True)
    return blake3.blake3(canon.encode()).digest()


def _order(state: Mapping[str, TensorBits]) -> list[str]:
    """The order safetensors lays tensors out in, asked of safetensors itself (one element each)."""
    placeholders = {n: TensorBits(t.dtype, (1,), np.zeros(1, t.bits.dtype)) for n, t in state.items()}
    _, header = split_header(to_safetensors_bytes(placeholders))
    return sorted(placeholders, key=lambda n: header[n]["data_offsets"][0])


def anchor_manifest(state: Mapping[str, TensorBits]) -> bytes:
    """The encoded manifest of the anchor file ``state`` is stored as (any metadata)."""
    entries, pos = {}, 0
    order = _order(state)
    for name in order:
        t = state[name]
        entries[name] = (t.dtype, list(t.shape), [pos, pos + t.nbytes])
        pos += t.nbytes
    chunk = chunk_size_for(pos)
    digests, hasher, filled = bytearray(), blake3.blake3(), 0
    for name in order:
        view = np.ascontiguousarray(state[name].bits).view(np.uint8).data
        while len(view):
            take = min(len(view), chunk - filled)
            hasher.update(view[:take])
            view, filled = view[take:], filled + take
            if filled == chunk:
                digests += hasher.digest()
                hasher, filled = blake3.blake3(), 0
    if filled:
        digests += hasher.digest()
    return AnchorManifest(_layout_digest(entries), pos, chunk, bytes(digests)).encode()


def header_length(first8: bytes) -> int:
    """The header length a file's first 8 bytes declare; ``IntegrityError`` past ``MAX_HEADER_BYTES``."""
    if len(first8) < 8:
        raise IntegrityError("anchor is shorter than a safetensors header")
    n: int = struct.unpack("<Q", first8[:8])[0]
    if not 2 <= n <= MAX_HEADER_BYTES:
        raise IntegrityError(f"anchor header of {n} bytes is outside [2, {MAX_HEADER_BYTES}]")
    return n


def split_header(data: bytes) -> tuple[int, dict[str, Any]]:  # Any: a peer's JSON, read field by field
    """(header length, parsed header) of safetensors bytes; ``IntegrityError`` if malformed."""
    n = header_length(data[:8])
    if len(data) < 8 + n:
        raise IntegrityError(f"anchor header is cut short ({len(data) - 8} of {n} bytes)")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except (ValueError, RecursionError) as exc:
        raise IntegrityError(f"anchor header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise IntegrityError("anchor header is not a JSON object")
    return n, header


def check_header(data: bytes, *, manifest: AnchorManifest, metadata: Mapping[str, str]) -> int:
    """Check an anchor header (``data`` = the file's first ``8 + n`` bytes) against the signed
    manifest and the metadata the record implies; returns ``8 + n``. ``IntegrityError`` otherwise."""
    n, header = split_header(data)
    if header.get("__metadata__") != dict(metadata):
        raise IntegrityError("anchor header metadata is not the signed record's")
    try:
        entries = {k: (v["dtype"], v["shape"], v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}
        digest = _layout_digest(entries)
    except (TypeError, KeyError, AttributeError) as exc:
        raise IntegrityError(f"anchor header tensor entries are malformed ({type(exc).__name__})") from None
    if digest != manifest.layout:
        raise IntegrityError("anchor header layout differs from the signed manifest")
    return 8 + n


@dataclass(frozen=True)
class Piece:
    """A byte range of the anchor file and the BLAKE3 digest (hex) its bytes must have."""

    offset: int
    length: int
    digest: str


def pieces(header: bytes, manifest: AnchorManifest) -> list[Piece]:
    """The header (already checked) and each data chunk of the file, with their digests."""
    out = [Piece(0, len(header), blake3.blake3(header).hexdigest())]
    for i in range(manifest.n_chunks):
        off = i * manifest.chunk_bytes
        out.append(Piece(len(header) + off, min(manifest.chunk_bytes, manifest.data_bytes - off),
                         manifest.chunk_digest(i)))
    return out
