"""Merkle commitments to flat FP32 arrays, opened at a few leaves (torch-free).

A trainer commits to arrays the size of the model (a gradient, its optimizer state) before it
knows which parts anyone will look at, and later opens only the leaves a round-seeded draw
picks. Leaf ``i`` covers the elements ``[i * leaf, (i + 1) * leaf)`` of the flat arrays (the
last leaf may be short); with several arrays of one length (``m``, ``v``, ``e``) a leaf holds
each array's slice in order, so one opening carries all of them::

    leaf digest  = BLAKE3("pulse/merkle/leaf/1\\0" + domain + u64 index + bytes of the slices)
    node digest  = BLAKE3("pulse/merkle/node/1\\0" + left + right)     (an odd last node moves up)
    root         = BLAKE3("pulse/merkle/root/1\\0" + domain + u64 leaves + u64 elements + top)

The root names the domain, the leaf count and the element count, so a leaf of one tree never
verifies under another and no two sizes share a root. Values are committed bit-exactly (raw
little-endian FP32); whoever compares them may do so within a tolerance. Building a tree hashes
every byte once (0.4-2.8 GB/s per core of this loaded machine for 4-16 KB leaves; bench/RESULTS.md
"Spot recomputation"), its leaves on as many threads as the caller gives it.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import blake3
import numpy as np

from pulse_node.errors import IntegrityError

_LEAF = b"pulse/merkle/leaf/1\0"
_NODE = b"pulse/merkle/node/1\0"
_ROOT = b"pulse/merkle/root/1\0"
DIGEST_LEN = 32


def leaf_count(elements: int, leaf: int) -> int:
    """Leaves of ``elements`` values cut in leaves of ``leaf`` (at least one)."""
    return max(1, -(-elements // leaf))


def leaf_bytes(arrays: Sequence[np.ndarray], index: int, leaf: int) -> bytes:
    """The bytes of leaf ``index``: each array's slice as little-endian FP32, in order."""
    lo = index * leaf
    return b"".join(np.ascontiguousarray(a[lo:lo + leaf], dtype="<f4").tobytes() for a in arrays)


def _leaf_digest(domain: bytes, index: int, data: bytes) -> bytes:
    return blake3.blake3(_LEAF + domain + struct.pack("<Q", index) + data).digest()


def _leaf_digests(arrays: Sequence[np.ndarray], leaf: int, domain: bytes, lo: int, hi: int, *,
                  joined: bool = False) -> list[bytes]:
    """Digests of leaves ``lo..hi`` hashed straight from the arrays (the bytes ``leaf_bytes`` gives).

    ``joined``: each leaf's header and slices are copied into one string and hashed in one call,
    about half the CPU of hashing the slices after the header (BLAKE3 hashes a whole input from its
    start many chunks at a time); the default leaves the GIL free while the slices hash (threads)."""
    raw = [a.view(np.uint8).data for a in arrays]  # sliced as bytes: no array object per leaf
    head, width, out = _LEAF + domain, 4 * leaf, []
    for i in range(lo, hi):
        at = i * width
        if joined:
            out.append(blake3.blake3(b"".join([head, struct.pack("<Q", i), *(b[at:at + width] for b in raw)])).digest())
            continue
        h = blake3.blake3(head + struct.pack("<Q", i))
        for b in raw:
            h.update(b[at:at + width])  # BLAKE3 releases the GIL on large inputs
        out.append(h.digest())
    return out


def _parent(left: bytes, right: bytes) -> bytes:
    return blake3.blake3(_NODE + left + right).digest()


def _level_sizes(n: int) -> list[int]:
    sizes = [n]
    while sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // 2))
    return sizes


def _finish(domain: bytes, leaves: int, elements: int, top: bytes) -> bytes:
    return blake3.blake3(_ROOT + domain + struct.pack("<QQ", leaves, elements) + top).digest()


@dataclass
class MerkleTree:
    """Every level of a tree (level 0: the leaf digests), to prove leaves after the fact."""

    domain: bytes
    elements: int
    leaf: int
    levels: list[list[bytes]]

    @classmethod
    def build(cls, arrays: Sequence[np.ndarray], *, leaf: int, domain: bytes, threads: int = 1) -> MerkleTree:
        """The tree of ``arrays`` (flat FP32, all of one length) cut in leaves of ``leaf`` values,
        the leaves hashed on ``threads`` threads (the same tree whatever the count)."""
        n = int(arrays[0].size)
        if any(int(a.size) != n for a in arrays):
            raise ValueError("arrays committed in one tree must have one length")
        flat = [np.ascontiguousarray(a, dtype="<f4") for a in arrays]
        count = leaf_count(n, leaf)
        if threads <= 1 or count < 64:
            level = _leaf_digests(flat, leaf, domain, 0, count, joined=True)
        else:
            cuts = np.linspace(0, count, 4 * threads + 1).astype(int)
            with ThreadPoolExecutor(threads) as pool:
                parts = pool.map(lambda b: _leaf_digests(flat, leaf, domain, int(b[0]), int(b[1])),
                                 itertools.pairwise(cuts))
                level = [d for part in parts for d in part]
        levels = [level]
        while len(level) > 1:
            level = [_parent(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                     for i in range(0, len(level), 2)]
            levels.append(level)
        return cls(domain, n, leaf, levels)

    @property
    def root(self) -> bytes:
        return _finish(self.domain, len(self.levels[0]), self.elements, self.levels[-1][0])

    def prove(self, index: int) -> list[bytes]:
        """The sibling digests from leaf ``index`` up to the top (none where a node moved up)."""
        path = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                path.append(level[sibling])
            index //= 2
        return path


def verify_leaf(root: bytes, *, domain: bytes, elements: int, leaf: int, index: int, data: bytes,
                path: Sequence[bytes], arrays: int) -> None:
    """``IntegrityError`` unless ``data`` is leaf ``index`` of a tree with this ``root``.

    The leaf's length is checked against the tree's shape (``arrays`` slices of FP32) before
    anything is hashed, and the path must have exactly the length the shape implies.
    """
    n = leaf_count(elements, leaf)
    if not 0 <= index < n:
        raise IntegrityError(f"leaf {index} is outside a tree of {n} leaves")
    want = arrays * 4 * (min(elements, (index + 1) * leaf) - index * leaf)
    if len(data) != want:
        raise IntegrityError(f"leaf {index} holds {len(data)} bytes, the tree's shape says {want}")
    digest, at, used = _leaf_digest(domain, index, data), index, 0
    for size in _level_sizes(n)[:-1]:
        sibling = at ^ 1
        if sibling < size:
            if used >= len(path) or len(path[used]) != DIGEST_LEN:
                raise IntegrityError(f"leaf {index}: the proof is too short or malformed")
            digest = _parent(digest, path[used]) if at % 2 == 0 else _parent(path[used], digest)
            used += 1
        at //= 2
    if used != len(path):
        raise IntegrityError(f"leaf {index}: the proof is longer than the tree is deep")
    if _finish(domain, n, elements, digest) != root:
        raise IntegrityError(f"leaf {index} does not match the committed root")


def split_leaf(data: bytes, arrays: int) -> list[np.ndarray]:
    """The FP32 slices of a verified leaf, one per committed array."""
    flat = np.frombuffer(data, dtype="<f4").astype(np.float32)
    return list(flat.reshape(arrays, -1)) if arrays > 1 else [flat]
