"""What a sharded trainer's ranks gather so rank 0 records its inner steps as one process does.

Spot checks (``trainer/spot_round.py``) re-run a drawn inner step from a trainer's record
(``trainer/spot_record.py``, ``InnerStepLog``). A trainer on several processes
(``trainer/distributed.py``) keeps that record on rank 0; every rank takes part in gathering it,
as whole tensors in the log's flat arrays:

- at a round's start (``start_state``): the AdamW moments and step, the error feedback and the
  outer momentum rows;
- at each recorded step, between backward and AdamW (``clip``): the gradient, whose norm rank 0
  finds over whole tensors in the model's order, as one process does, and every rank clips with;
  then the BF16 weights the forward ran on (``keep_weights`` alone for a step with no batch).

The record holds on rank 0 what a one-process record holds (per parameter and round: 12-16 B of
start state, 4 B per stepped step, the BF16 changes); gathering holds one bucket of padded chunks
at a time on top (``shards.gather_flat``). The bytes committed are a one-process trainer's given the
same gradients; the gradients are the sum of the ranks' in another order (and FP32 rounding),
within a check's tolerance (bench/RESULTS.md "Sharded trainers record").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from pulse_node.loco.opening import FlatLayout
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.rl.rollout import Rollout
from pulse_node.trainer.ranks import Ranks
from pulse_node.trainer.shards import ShardLayout, gather_flat
from pulse_node.trainer.spot_record import InnerStepLog, adam_moments

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

#: a recorded step's BF16 weights (uint16 bits), clipped gradient (None: no AdamW step) and its norm
Recorded = tuple[np.ndarray, np.ndarray | None, float | None]


def local_part(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s local shard (sharing its memory); a plain tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class ShardRecorder:
    """One rank's side of the record (module docstring). Every method but ``record`` is collective:
    all ranks call it alike; ``log`` and ``recorded`` are set on rank 0 only."""

    def __init__(self, layout: ShardLayout, ranks: Ranks, local: Mapping[str, DTensor]) -> None:
        self.layout, self.ranks, self.local = layout, ranks, local
        self.offsets = FlatLayout.of(layout.shapes).offsets  # of each tensor in an inner-step log's arrays
        self.log: InnerStepLog | None = None  # rank 0, while inner steps are recorded
        self.recorded: Recorded | None = None  # rank 0: the last step's, until ``record`` takes it

    def gather_flat(self, tensors: Mapping[str, torch.Tensor | None], dtype: type) -> np.ndarray | None:
        """Each rank's rows of ``tensors`` (None: zeros), whole, into one of rank 0's log arrays of
        ``dtype`` (float32 values from FP32 rows, or uint16 BF16 bits from bfloat16 rows); None elsewhere."""
        rank = self.ranks.rank
        local = {n: (local_part(t).detach().to("cpu") if t is not None else
                     torch.zeros(self.layout.local_shape(n, rank), dtype=torch.bfloat16 if dtype is np.uint16 else None))
                 for n, t in tensors.items()}
        flat = self.log.take(dtype) if self.log is not None else None
        into = None
        if flat is not None:
            into = torch.from_numpy(flat.view(np.int16)).view(torch.bfloat16) if dtype is np.uint16 else torch.from_numpy(flat)
        gather_flat(self.layout, local, rank=rank, into=into, offsets=self.offsets)
        return flat

    def bf16_weights(self) -> np.ndarray | None:
        """The BF16 bits of the local weights (what the forward runs on), whole on rank 0."""
        return self.gather_flat({n: p.to_local().detach().to(torch.bfloat16) for n, p in self.local.items()},
                                np.uint16)

    @torch.no_grad()
    def clip(self, max_norm: float) -> float:
        """Between a recorded step's backward and its AdamW step: the gradient whole on rank 0, its
        norm found there over the whole tensors in the model's order (what ``clip_grad_norm_`` finds
        on one process), every rank's rows and rank 0's copy clipped with it. Rank 0 keeps the BF16
        weights, the clipped gradient and the norm in ``recorded``."""
        grad = self.gather_flat({n: p.grad for n, p in self.local.items()}, np.float32)
        whole = self.log.views(grad) if self.log is not None and grad is not None else {}
        total = float(torch.nn.utils.get_total_norm([whole[n] for n in self.local])) if whole else None
        norm: float = self.ranks.bcast(total)
        # torch.nn.utils.clip_grads_with_norm_'s coefficient, applied to every entry alike
        coef = torch.clamp(max_norm / (torch.tensor(norm, dtype=torch.float32) + 1e-6), max=1.0)
        for p in self.local.values():
            if p.grad is not None:
                local_part(p.grad).mul_(coef.to(p.grad.device))
        for t in whole.values():
            t.mul_(coef)
        weights = self.bf16_weights()
        if weights is not None:
            self.recorded = (weights, grad, norm)
        return norm

    def keep_weights(self) -> None:
        """A recorded step that takes no AdamW step: rank 0 keeps the BF16 weights in ``recorded``."""
        weights = self.bf16_weights()
        if weights is not None:
            self.recorded = (weights, None, None)

    def start_state(self, opt: torch.optim.Optimizer, ef: ErrorFeedback) -> tuple[list[np.ndarray], int] | None:
        """A recorded round's start state, whole on rank 0 in the log's flat arrays: the AdamW
        moments, the error feedback and (outer step on the trainer) its momentum; and the AdamW step."""
        names = list(self.layout.shapes)
        m, v, step = adam_moments(opt, [self.local[n] for n in names])
        kinds: list[Mapping[str, torch.Tensor | None]] = [dict(zip(names, m)), dict(zip(names, v)), ef.e]
        kinds += [ef.v] if ef.v else []
        arrays = [self.gather_flat(k, np.float32) for k in kinds]
        steps = self.ranks.gather(step)
        if steps is None:
            return None
        if len(set(steps)) > 1:
            raise RuntimeError(f"the ranks have taken different numbers of AdamW steps: {steps}")
        return [a for a in arrays if a is not None], step

    def record(self, rollouts: list[Rollout], *, producer: str) -> None:
        """Rank 0: the step the ranks just ran, from what it gathered, into ``log``."""
        if self.log is None or self.recorded is None:
            raise RuntimeError("a recorded step left nothing to record")
        weights, grad, norm = self.recorded
        self.recorded = None
        self.log.record_flat(rollouts, producer=producer, weights=weights, grad=grad, grad_norm=norm)
