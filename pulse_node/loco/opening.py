"""Openings of an inner-step commitment at drawn leaves, and the flat layout they index (torch-free).

A trainer whose round was drawn for a spot check answers with a ``RoundOpening``: for each drawn
leaf, the start-state slices (``m``, ``v``, ``e`` [, ``u``]) under the commitment's
``state_root`` and each stepped step's gradient slice under its ``grad_root``, every one with its
Merkle path (``loco/merkle.py``). For the link between rounds the next round's commitment is
opened at the same leaves, start state only. ``verify_opening`` checks everything against the
signed roots, so an opening is self-authenticating: whoever relays it cannot alter it.

Size: ``leaves x leaf x 4 B x (state arrays + stepped steps)`` plus 32 B per proof node; with the
defaults (8 leaves of 4096 values, 3 state arrays, 10 steps) 1.7 MB, whatever the model's size.

``FlatLayout`` is the one flat order every commitment uses: the parameters in sorted name order,
each flattened row-major (the order of ``ErrorFeedback`` and of the payload's tensors).

Wire format (``OPENING_FORMAT`` 1): the statement envelope (``chain/statement.py``; unsigned: it
is checked against signed roots) of a ``RoundOpening``, with ``state = [[leaf bytes, [node, ...]],
...]`` (one per leaf, in leaf order) and ``grads = [[[leaf bytes, [node, ...]], ...], ...]`` (one
list per stepped step, or none for a start-only opening). Decoding is size-capped and exact
(``WireError``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pulse_node.chain.statement import Statement
from pulse_node.errors import IntegrityError
from pulse_node.loco.commit import MAX_STEPS, InnerCommitment
from pulse_node.loco.merkle import leaf_count, split_leaf, verify_leaf

OPENING_MAGIC = "pulse/inner-opening"
OPENING_FORMAT = 1
MAX_LEAVES = 64
MAX_OPENING_BYTES = 256 << 20
STATE_DOMAIN = b"state"
GRAD_DOMAIN = b"grad"

Proven = tuple[bytes, tuple[bytes, ...]]


@dataclass(frozen=True)
class FlatLayout:
    """Parameters in sorted name order, flattened: offsets and sizes of each in the flat vector."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, shapes: Mapping[str, Sequence[int]]) -> FlatLayout:
        names = tuple(sorted(shapes))
        return cls(names, tuple(math.prod(shapes[n]) for n in names))

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for name, size in zip(self.names, self.sizes):
            out[name], at = at, at + size
        return out

    def coords(self, leaves: Sequence[int], leaf: int) -> np.ndarray:
        """Flat indices covered by ``leaves`` (sorted), concatenated in leaf order."""
        return np.concatenate([np.arange(i * leaf, min((i + 1) * leaf, self.total)) for i in leaves])

    def entries_at(self, tensors: Mapping[str, tuple[np.ndarray, np.ndarray]],
                   coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A payload's entries at ``coords`` (ascending flat indices): their positions in ``coords``
        (ascending) and values; only the tensors ``coords`` reach are searched (a payload's positions
        are unique within a tensor)."""
        ats, found = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.float32)]
        for name, off, size in zip(self.names, self.offsets.values(), self.sizes):
            lo, hi = (int(x) for x in np.searchsorted(coords, [off, off + size]))
            if lo == hi or name not in tensors:
                continue
            idx, vals = np.asarray(tensors[name][0], dtype=np.int64), np.asarray(tensors[name][1], dtype=np.float32)
            if idx.size > 1 and np.any(idx[1:] <= idx[:-1]):
                order = np.argsort(idx, kind="stable")
                idx, vals = idx[order], vals[order]
            want = coords[lo:hi] - off
            j = np.minimum(np.searchsorted(idx, want), max(idx.size - 1, 0))
            hit = np.flatnonzero(idx[j] == want) if idx.size else np.zeros(0, dtype=np.int64)
            ats.append(lo + hit)
            found.append(vals[j[hit]])
        return np.concatenate(ats), np.concatenate(found)


@dataclass(frozen=True)
class RoundOpening:
    """A commitment opened at ``leaves``: start state per leaf; per stepped step, its gradient per leaf."""

    round: int
    trainer: str
    leaves: tuple[int, ...]
    state: tuple[Proven, ...]
    grads: tuple[tuple[Proven, ...], ...] = ()


@dataclass(frozen=True)
class Opened:
    """Verified values at the opened leaves, concatenated in leaf order."""

    state: dict[str, np.ndarray]
    grads: dict[int, np.ndarray]  # step index -> gradient values


OPENINGS = Statement(RoundOpening, magic=OPENING_MAGIC, format=OPENING_FORMAT, max_bytes=MAX_OPENING_BYTES,
                     max_str=256, max_bin=1 << 22, max_array=max(MAX_STEPS, MAX_LEAVES, 64), signatures=())


def encode_opening(o: RoundOpening) -> bytes:
    return OPENINGS.encode(o)


def decode_opening(data: bytes, *, max_bytes: int = MAX_OPENING_BYTES) -> RoundOpening:
    """Parse hostile bytes (at most ``max_bytes``); ``WireError`` if malformed. Not yet verified."""
    return OPENINGS.decode(data, max_bytes=max_bytes)


def opening_cap(c: InnerCommitment, leaves: int, *, start_only: bool = False) -> int:
    """The most bytes an honest opening of ``leaves`` leaves of ``c`` takes (values, proofs, framing)."""
    arrays = len(c.state) + (0 if start_only else len(c.stepped))
    return opening_bytes(params=c.params, leaf=c.leaf, arrays=arrays, leaves=leaves)


def opening_bytes(*, params: int, leaf: int, arrays: int, leaves: int) -> int:
    """The most bytes an opening of ``leaves`` leaves of ``arrays`` committed arrays of ``params``
    values (leaves of ``leaf``) takes: values, Merkle paths, framing."""
    depth = max(1, math.ceil(math.log2(leaf_count(params, leaf))) + 1)
    return leaves * arrays * (4 * leaf + 34 * depth + 16) + 4096


def verify_opening(o: RoundOpening, c: InnerCommitment, leaves: Sequence[int], *,
                   start_only: bool = False) -> Opened:
    """The values of an opening of ``c`` at ``leaves``, each checked against its signed root;
    ``IntegrityError`` on any missing, extra or altered leaf."""
    if (o.round, o.trainer, o.leaves) != (c.round, c.trainer, tuple(leaves)):
        raise IntegrityError("the opening is not of this commitment at the drawn leaves")
    stepped = [] if start_only else c.stepped
    if len(o.state) != len(leaves) or len(o.grads) != len(stepped) or any(len(g) != len(leaves) for g in o.grads):
        raise IntegrityError("the opening does not hold one leaf per drawn leaf for every committed array")
    shape = {"elements": c.params, "leaf": c.leaf}
    state_parts = []
    for i, (data, path) in zip(leaves, o.state):
        verify_leaf(c.state_root, domain=STATE_DOMAIN, index=i, data=data, path=path, arrays=len(c.state), **shape)
        state_parts.append(split_leaf(data, len(c.state)))
    state = {name: np.concatenate([p[j] for p in state_parts]) for j, name in enumerate(c.state)}
    grads = {}
    for k, proven in zip(stepped, o.grads):
        root = c.steps[k].grad_root
        for i, (data, path) in zip(leaves, proven):
            verify_leaf(root, domain=GRAD_DOMAIN, index=i, data=data, path=path, arrays=1, **shape)
        grads[k] = np.concatenate([split_leaf(data, 1)[0] for data, _ in proven])
    return Opened(state, grads)
