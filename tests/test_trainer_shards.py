"""PULSELoCo on row shards gives the same FP32 bits as on whole tensors, for any number of ranks.

Simulated in one process: each "rank" runs the gate, error feedback and outer step on its rows
(``trainer/shards.py`` layout, FSDP2's ``Shard(0)``); the combined payload and the stitched
weights and momentum must equal, bit for bit, what one process computes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pulse_node.loco.config import LocoConfig
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.trainer.shards import ShardLayout, combine_payloads, offset_tensors, slice_payload

SHAPES = {"emb": (7, 5), "bias": (3,), "w": (4, 6), "tall": (2, 3)}  # odd rows: uneven and empty shards


def _tensors(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen) * scale for n, s in SHAPES.items()}


def _rows(t: torch.Tensor, layout: ShardLayout, name: str, rank: int) -> torch.Tensor:
    start, stop = layout.span(name, rank)
    return t.reshape(-1)[start:stop].reshape(layout.local_shape(name, rank)).clone()


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_layout_matches_torch_chunk(world) -> None:
    layout = ShardLayout(SHAPES, world=world)
    for name, shape in SHAPES.items():
        chunks = torch.arange(int(np.prod(shape))).reshape(shape).chunk(world)
        for rank in range(world):
            start, stop = layout.span(name, rank)
            want = chunks[rank].reshape(-1) if rank < len(chunks) else torch.zeros(0, dtype=torch.long)
            assert torch.equal(torch.arange(start, stop), want), (name, rank)


@pytest.mark.parametrize("placement", ["global", "trainer"])
@pytest.mark.parametrize("world", [2, 3])
def test_sharded_round_is_bit_identical(world, placement) -> None:
    cfg = LocoConfig(outer_placement=placement, min_contributors=1)
    layout = ShardLayout(SHAPES, world=world)
    glob = _tensors(0)
    whole = OuterOptimizer({n: t.clone() for n, t in glob.items()}, cfg)
    ef = ErrorFeedback(SHAPES, cfg=cfg)
    shards = [OuterOptimizer({n: _rows(t, layout, n, r) for n, t in glob.items()}, cfg) for r in range(world)]
    efs = [ErrorFeedback(layout.local_shapes(r), cfg=cfg) for r in range(world)]
    for round_no in range(3):
        noise = _tensors(10 + round_no, 1e-2)
        local = {n: t + noise[n] for n, t in whole.params.items()}
        mine = ef.make_payload(whole.params, local, round=round_no, trainer_id="b", base_hash=whole.state_hash())
        pieces = [efs[r].make_payload(shards[r].params, {n: _rows(t, layout, n, r) for n, t in local.items()},
                                      round=round_no, trainer_id="b", base_hash=b"") for r in range(world)]
        combined = combine_payloads([offset_tensors(p.tensors, layout.spans(r)) for r, p in enumerate(pieces)],
                                    round=round_no, trainer_id="b", base_hash=mine.base_hash, numel=mine.numel)
        for name in SHAPES:
            assert np.array_equal(combined.tensors[name][0], mine.tensors[name][0])
            assert np.array_equal(combined.tensors[name][1].view(np.int32), mine.tensors[name][1].view(np.int32))
        other, third = (ErrorFeedback(SHAPES, cfg=cfg).make_payload(
            whole.params, {n: t - d for n, t in whole.params.items()}, round=round_no, trainer_id=tid,
            base_hash=whole.state_hash()) for tid, d in (("a", 4e-3), ("c", -4e-3)))
        if round_no == 1:  # left out of the round: both put the payload back into the error feedback
            ef.restore(mine)
            for r, p in enumerate(pieces):
                efs[r].restore(p)
            payloads = [other]
        else:
            payloads = [mine, other, third]
        whole.apply(payloads)  # weighed over whole payloads; the ranks step with those weights
        assert min(whole.kept.values()) < 1.0 or len(payloads) == 1  # the farthest payload is weighed down
        if whole.kept.get("b", 1.0) < 1.0:
            ef.restore(mine, keep=whole.kept["b"])
            for r, p in enumerate(pieces):
                efs[r].restore(p, keep=whole.kept["b"])
        for r in range(world):
            shards[r].step([slice_payload(p, layout.spans(r)) for p in payloads], keep=whole.kept)
        for name in SHAPES:
            for got, want in ((shards, whole.params), (efs, ef.e)):
                parts = [(g.params if isinstance(g, OuterOptimizer) else g.e)[name].reshape(-1) for g in got]
                assert np.array_equal(_bits(torch.cat(parts)), _bits(want[name].reshape(-1))), (round_no, name)
            stitched = torch.cat([s.momentum[name].reshape(-1) for s in shards])
            assert np.array_equal(_bits(stitched), _bits(whole.momentum[name].reshape(-1)))
