"""How a trainer on several processes splits its tensors, and how the pieces make whole ones.

FSDP2 (``fully_shard``) splits every parameter along dim 0 into ``world`` chunks of
``ceil(rows / world)`` rows (the last ones shorter, possibly empty); rank ``r`` holds chunk ``r``.
A range of rows of a row-major tensor is one contiguous range of its flat positions, so each
rank's part of a tensor is a flat span ``[start, stop)`` and everything PULSELoCo does per
entry maps between a shard and the whole tensor by adding or subtracting ``start``:

- a payload made on a shard has shard positions; adding ``start`` and concatenating the pieces
  in rank order gives exactly the positions (ascending) and values a one-process trainer finds
  (``combine_payloads``);
- a round's payload cut to a rank's spans (``slice_payload``) drives that rank's outer step;
- ``gather_rows`` / ``scatter_rows`` move whole tensors between rank 0 and the shards
  (``torch.distributed`` gather/scatter of equal, zero-padded chunks, one tensor at a time);
  ``gather_flat`` moves many at once into one flat vector (a recorded inner step's gradient and
  weights: one gather per bucket, not per tensor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from pulse_node.errors import ConfigError
from pulse_node.loco.payload import LocoPayload

Span = tuple[int, int]


class ShardLayout:
    """Row chunks of every tensor for ``world`` ranks (the FSDP2 ``Shard(0)`` layout)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], *, world: int) -> None:
        self.world = world
        self.shapes = {n: tuple(int(d) for d in shapes[n]) for n in sorted(shapes)}
        for name, shape in self.shapes.items():
            if not shape:
                raise ConfigError(f"{name}: a 0-dimensional parameter cannot be sharded by rows")

    def chunk_numel(self, name: str) -> int:
        """Elements of one (padded) chunk of ``name``."""
        shape = self.shapes[name]
        return math.ceil(shape[0] / self.world) * math.prod(shape[1:])

    def span(self, name: str, rank: int) -> Span:
        """Flat positions ``[start, stop)`` of ``name`` held by ``rank``."""
        numel = math.prod(self.shapes[name])
        start = min(rank * self.chunk_numel(name), numel)
        return start, min(start + self.chunk_numel(name), numel)

    def spans(self, rank: int) -> dict[str, Span]:
        return {n: self.span(n, rank) for n in self.shapes}

    def local_shape(self, name: str, rank: int) -> tuple[int, ...]:
        start, stop = self.span(name, rank)
        shape = self.shapes[name]
        cols = math.prod(shape[1:])
        return ((stop - start) // cols, *shape[1:])

    def local_shapes(self, rank: int) -> dict[str, tuple[int, ...]]:
        return {n: self.local_shape(n, rank) for n in self.shapes}


def offset_tensors(tensors: Mapping[str, tuple[np.ndarray, np.ndarray]], spans: Mapping[str, Span]
                   ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Shard positions of a payload's entries -> positions in the whole tensors."""
    return {n: (idx + spans[n][0], vals) for n, (idx, vals) in tensors.items()}


def combine_payloads(pieces: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]], *, round: int,
                     trainer_id: str, base_hash: bytes, numel: Mapping[str, int]) -> LocoPayload:
    """One payload from the ranks' pieces (rank order, whole-tensor positions)."""
    tensors = {n: (np.concatenate([p[n][0] for p in pieces]).astype(np.int64, copy=False),
                   np.concatenate([p[n][1] for p in pieces]).astype(np.float32, copy=False)) for n in numel}
    return LocoPayload(round=round, trainer_id=trainer_id, base_hash=base_hash, tensors=tensors, numel=dict(numel))


def slice_payload(p: LocoPayload, spans: Mapping[str, Span]) -> LocoPayload:
    """The entries of ``p`` inside ``spans``, at shard positions (every tensor kept, maybe empty)."""
    tensors = {}
    for name, (start, stop) in spans.items():
        idx, vals = p.tensors.get(name, (np.zeros(0, np.int64), np.zeros(0, np.float32)))
        keep = (idx >= start) & (idx < stop)
        tensors[name] = (idx[keep] - start, vals[keep])
    return LocoPayload(round=p.round, trainer_id=p.trainer_id, base_hash=p.base_hash, tensors=tensors,
                       numel={n: stop - start for n, (start, stop) in spans.items()})


def gather_rows(layout: ShardLayout, name: str, local: torch.Tensor, *, rank: int,
                into: torch.Tensor | None) -> None:
    """Collective: every rank's rows of ``name`` into ``into`` on rank 0 (CPU tensors)."""
    import torch.distributed as dist

    chunk = layout.chunk_numel(name)
    send = torch.zeros(chunk, dtype=local.dtype)
    send[:local.numel()] = local.reshape(-1)
    recv = torch.empty(chunk * layout.world, dtype=local.dtype) if rank == 0 else None
    dist.gather(send, list(recv.split(chunk)) if recv is not None else None, dst=0)
    if into is not None and recv is not None:
        into.view(-1).copy_(recv[:into.numel()])


def scatter_rows(layout: ShardLayout, name: str, full: torch.Tensor | None, *, rank: int,
                 into: torch.Tensor) -> None:
    """Collective: rank 0's whole ``full`` tensor, each rank's rows into its ``into``."""
    import torch.distributed as dist

    chunk = layout.chunk_numel(name)
    parts = None
    if rank == 0:
        assert full is not None
        padded = torch.zeros(chunk * layout.world, dtype=full.dtype)
        padded[:full.numel()] = full.reshape(-1)
        parts = list(padded.split(chunk))
    recv = torch.empty(chunk, dtype=into.dtype)
    dist.scatter(recv, parts, src=0)
    into.view(-1).copy_(recv[:into.numel()])


BUCKET_NUMEL = 1 << 22  # padded elements per rank in one gather of ``gather_flat`` (16 MB of FP32 per rank)


def gather_flat(layout: ShardLayout, local: Mapping[str, torch.Tensor], *, rank: int, into: torch.Tensor | None,
                offsets: Mapping[str, int], bucket_numel: int = BUCKET_NUMEL) -> None:
    """Collective: every rank's rows of the tensors ``local`` (CPU, one dtype, the same names in
    the same order on every rank) into rank 0's flat ``into``, each whole tensor at its offset.
    The rows go in buckets of at most ``bucket_numel`` padded elements per rank (a larger tensor
    alone), one gather each: rank 0 holds one bucket of every rank at a time on top of ``into``."""
    import torch.distributed as dist

    buckets: list[list[str]] = []
    size = 0
    for name in local:
        chunk = layout.chunk_numel(name)
        if not buckets or (buckets[-1] and size + chunk > bucket_numel):
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += chunk
    for names in buckets:
        chunks = [layout.chunk_numel(n) for n in names]
        total = sum(chunks)
        send = torch.zeros(total, dtype=next(iter(local.values())).dtype)
        at = 0
        for name, chunk in zip(names, chunks):
            flat = local[name].reshape(-1)
            send[at:at + flat.numel()] = flat
            at += chunk
        recv = torch.empty(total * layout.world, dtype=send.dtype) if rank == 0 else None
        dist.gather(send, list(recv.split(total)) if recv is not None else None, dst=0)
        if into is not None and recv is not None:
            _place(layout, names, recv.view(layout.world, total), into=into, offsets=offsets)


def _place(layout: ShardLayout, names: Sequence[str], parts: torch.Tensor, *, into: torch.Tensor,
           offsets: Mapping[str, int]) -> None:
    """Rank ``r``'s padded chunks (row ``r`` of ``parts``, ``names`` in order) to their whole-tensor spans."""
    at = 0
    for name in names:
        for r in range(layout.world):
            start, stop = layout.span(name, r)
            into[offsets[name] + start:offsets[name] + stop] = parts[r, at:at + stop - start]
        at += layout.chunk_numel(name)
