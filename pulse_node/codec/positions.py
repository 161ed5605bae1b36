"""Position coder: a sorted set of flat indices into one tensor, entropy-coded.

Used by PULSESync patches (which elements changed) and by the PULSELoCo payload (which
entries fired). The set is split by an optional per-element class label that the receiver
also knows (``context``, e.g. the BF16 exponent of the base weight: small weights change far
more often). Within each class the positions become ranks in that class's own subsequence;
the gaps between ranks are coded with a geometric model whose single parameter (count /
class size) both sides know, so no probability table is sent:

    P(gap = g) = p (1 - p)^g,  p = changed_in_class / class_size

Gaps are binned (``entropy.gap_bins``); bins go through rANS (``codec.rans``), the low
bits of large gaps are stored raw. A class with no member or every member set costs nothing.

Cost: the largest class (the "background") is never materialised: its ranks are derived
from the sorted members of the other classes, so a context whose background holds most
elements costs one compare and one ``flatnonzero`` over the tensor. ``Classes`` lets a caller
that already knows the non-background members (``patch.py``) skip even that.

Stream layout (msgpack array, version 1): ``[1, numel, count, background, labels, counts,
rans_words, raw_bits]``; ``labels``/``counts`` list the classes holding at least one position
(non-background labels ascending, then the background), in the order their gaps are coded.
The geometric tables use only correctly rounded IEEE arithmetic and the rANS model
quantisation is deterministic (``rans.quantize``), so encoder and decoder agree across
machines.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.codec.entropy import (
    MAX_BINS,
    AnsDecoder,
    BitWriter,
    Segments,
    ans_encode,
    bin_bounds,
    categorical,
    gap_bins,
    geometric_freqs,
    group_by_label,
    n_gap_bins,
)
from pulse_node.codec.fused import INT64, RawBits, decode_ranks
from pulse_node.errors import PatchError

POSITIONS_VERSION = 3
MAX_LABEL = 255
_SAMPLE_STRIDE = 61


@dataclass(frozen=True)
class Classes:
    """A partition of ``range(numel)`` into labelled classes.

    ``members`` are the sorted flat indices of every element NOT in the background class,
    ``labels`` their labels (uint8); every other element has label ``background``.
    """

    numel: int
    members: np.ndarray
    labels: np.ndarray
    background: int

    @classmethod
    def single(cls, numel: int) -> Classes:
        return cls(numel, np.zeros(0, np.int64), np.zeros(0, np.uint8), 0)

    @classmethod
    def from_context(cls, context: np.ndarray, numel: int, background: int | None = None) -> Classes:
        """Partition by a per-element label array; the background defaults to a sampled mode."""
        ctx = np.asarray(context).reshape(-1)
        if ctx.size != numel:
            raise PatchError(f"context has {ctx.size} labels for {numel} elements")
        if ctx.size and (ctx.dtype.kind not in "ui" or int(ctx.min()) < 0 or int(ctx.max()) > MAX_LABEL):
            raise PatchError("context labels must be integers in 0..255")
        if background is None:
            sample = ctx[::_SAMPLE_STRIDE]
            background = int(np.bincount(sample).argmax()) if sample.size else 0
        members = np.flatnonzero(ctx != background)
        return cls(numel, members, ctx[members].astype(np.uint8), int(background))

    def universes(self) -> dict[int, np.ndarray]:
        """Sorted member indices of every non-background class."""
        order, groups = group_by_label(self.labels)
        return {label: self.members[order[s:e]] for label, s, e in groups}

    def locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For sorted indices: member mask, labels of the members, members before each index."""
        if not self.members.size:
            return np.zeros(idx.size, bool), np.zeros(0, np.uint8), np.zeros(idx.size, np.int64)
        if K.AVAILABLE:
            hit, before = np.empty(idx.size, bool), np.empty(idx.size, np.int64)
            K.locate(self.members, idx, hit, before)
            return hit, self.labels[before[hit]], before
        before = np.searchsorted(self.members, idx)
        pos = np.minimum(before, self.members.size - 1)
        hit = self.members[pos] == idx
        return hit, self.labels[pos[hit]], before

    def background_positions(self, ranks: np.ndarray) -> np.ndarray:
        """Flat indices of the background elements with the given sorted ranks (``ranks``' dtype,
        which holds ``numel - 1``)."""
        if not self.members.size:  # the background is the whole tensor
            return ranks
        if K.AVAILABLE:
            out = np.empty(ranks.size, ranks.dtype)
            K.background_positions(ranks, self.members, out)
            return out
        shifted = self.members - np.arange(self.members.size)
        return (ranks + np.searchsorted(shifted, ranks, side="right")).astype(ranks.dtype, copy=False)


def _check_idx(idx: np.ndarray, numel: int) -> np.ndarray:
    idx = np.asarray(idx).reshape(-1)
    if idx.size and idx.dtype.kind not in "ui":
        raise PatchError("positions must be integers")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx[0] < 0 or idx[-1] >= numel or not (idx[1:] > idx[:-1]).all()):
        raise PatchError(f"positions must be sorted, unique and within [0, {numel})")
    return idx


def _encode_class(ranks: np.ndarray, size: int, segments: Segments, raw: BitWriter) -> None:
    """Append one class's rank gaps (ranks sorted, within [0, size)) to the streams."""
    if ranks.size == 0 or ranks.size == size:
        return
    gaps = np.diff(ranks, prepend=-1) - 1
    sym, nextra, extra = gap_bins(gaps)
    segments.append((sym, geometric_freqs(ranks.size, size, n_gap_bins(size - 1))))
    raw.write(extra, nextra)


def index_dtype(numel: int) -> np.dtype:
    """The narrowest index type kept for positions in a tensor of ``numel`` elements: 4 bytes
    per changed entry up to 2**32 elements (every tensor of a 7 B model), else 8."""
    return np.dtype(np.uint32) if numel <= 1 << 32 else np.dtype(np.int64)


def _decode_class(count: int, size: int, dec: AnsDecoder, raw: RawBits, dtype: np.dtype) -> np.ndarray:
    if count == size:
        return np.arange(size, dtype=dtype)
    low, nextra = bin_bounds(MAX_BINS)
    model = categorical(geometric_freqs(count, size, n_gap_bins(size - 1)))
    return decode_ranks(dec, raw, count, model, size, low, nextra, dtype)


def encode_positions(idx: np.ndarray, numel: int, *, context: np.ndarray | None = None,
                     classes: Classes | None = None) -> bytes:
    """Code sorted unique flat indices of a tensor with ``numel`` elements.

    ``context``: optional per-element small-int label (0..255) the decoder also has; or pass
    a prebuilt ``classes`` partition instead. The decoder must get the same one.
    """
    idx = _check_idx(idx, numel)
    if classes is None:
        classes = Classes.single(numel) if context is None else Classes.from_context(context, numel)
    segments: Segments = []
    raw = BitWriter()
    labels: list[int] = []
    counts: list[int] = []
    hit, hit_labels, before = classes.locate(idx)
    if hit_labels.size:
        universes = classes.universes()
        hit_idx = idx[hit]
        order, groups = group_by_label(hit_labels)
        for label, s, e in groups:
            uni = universes[label]
            labels.append(label)
            counts.append(e - s)
            _encode_class(np.searchsorted(uni, hit_idx[order[s:e]]), uni.size, segments, raw)
    bg_idx = idx[~hit]
    if bg_idx.size:
        labels.append(classes.background)
        counts.append(int(bg_idx.size))
        bg_size = numel - classes.members.size
        _encode_class(bg_idx - before[~hit], bg_size, segments, raw)
    body = [POSITIONS_VERSION, int(numel), int(idx.size), classes.background, labels, counts,
            ans_encode(segments), raw.getvalue()]
    return msgpack.packb(body, use_bin_type=True)


def _parse(data: bytes, numel: int, max_count: int) -> tuple[int, int, list[int], list[int], bytes, bytes]:
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=len(data),
                               max_array_len=2 * (MAX_LABEL + 1) + 8)
    except Exception as exc:
        raise PatchError(f"corrupt position stream: {exc}") from None
    if not isinstance(body, list) or len(body) != 8 or body[0] != POSITIONS_VERSION:
        raise PatchError("unknown position stream format")
    _, n, count, bg, labels, counts, words, raw = body
    ok = (isinstance(n, int) and isinstance(count, int) and isinstance(bg, int)
          and isinstance(labels, list) and isinstance(counts, list)
          and isinstance(words, bytes) and isinstance(raw, bytes) and len(labels) == len(counts)
          and all(isinstance(v, int) for v in labels + counts))
    if not ok:
        raise PatchError("malformed position stream")
    if n != numel:
        raise PatchError(f"position stream is for {n} elements, tensor has {numel}")
    if not 0 <= count <= min(max_count, numel):
        raise PatchError(f"position stream declares {count} positions (limit {min(max_count, numel)})")
    if sum(counts) != count or any(c <= 0 for c in counts) or len(set(labels)) != len(labels) \
            or any(not 0 <= v <= MAX_LABEL for v in labels + [bg]):
        raise PatchError("position stream class counts are inconsistent")
    return count, bg, labels, counts, words, raw


def decode_positions(data: bytes, numel: int, *, context: np.ndarray | None = None, max_count: int,
                     classes: Classes | None = None, dtype: np.dtype = INT64) -> np.ndarray:
    """Inverse of ``encode_positions``: sorted unique flat indices, as ``dtype`` (int64, or
    ``index_dtype(numel)`` for positions decoded straight into the width a patch keeps them in).

    Raises ``PatchError`` for anything malformed; ``max_count`` bounds the allocation.
    """
    if np.iinfo(dtype).max < numel - 1:
        raise ValueError(f"{dtype} cannot hold positions of {numel} elements")
    _count, bg, labels, counts, words, raw_bytes = _parse(data, numel, max_count)
    if classes is None:
        classes = Classes.single(numel) if context is None else Classes.from_context(context, numel, bg)
    if classes.background != bg:
        raise PatchError("position stream was coded with a different class partition")
    universes = classes.universes() if labels != [bg] else {}
    dec = AnsDecoder(words)
    raw = RawBits(raw_bytes)
    parts = []
    for label, cnt in zip(labels, counts):
        if label == bg:
            size = numel - classes.members.size
            if cnt > size:
                raise PatchError("position stream declares more positions than its class holds")
            parts.append(classes.background_positions(_decode_class(cnt, size, dec, raw, dtype)))
        else:
            uni = universes.get(label)
            if uni is None or cnt > uni.size:
                raise PatchError(f"position stream class {label} does not fit the context")
            parts.append(uni[_decode_class(cnt, uni.size, dec, raw, dtype)].astype(dtype, copy=False))
    if not dec.is_empty() or raw.remaining_bytes() > 0:
        raise PatchError("position stream has trailing data")
    if not parts:
        return np.zeros(0, dtype)
    return np.sort(np.concatenate(parts)) if len(parts) > 1 else parts[0]
