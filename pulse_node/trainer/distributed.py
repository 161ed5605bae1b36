"""A trainer on several processes and devices: FSDP2 inner steps, PULSELoCo on each rank's shard.

Launched the way distributed PyTorch is (``torchrun --nproc-per-node N -m pulse_node join --role
trainer ...``). Rank 0 is the node: the one identity, store and network side (DHT and wire
workers, the role, ``DistributedEngine``); ranks 1..N-1 run ``serve_rank`` and only compute,
driven by rank 0's commands (``trainer/ranks.py``). Each rank holds (``ShardWork``):

- its FSDP2 shard (``fully_shard``, every decoder block and the root; a tied head is one
  parameter of the root group) of the FP32 local weights, gradients and AdamW moments, BF16
  forward with ``grpo.bf16_compute``: ``MixedPrecisionPolicy(param_dtype=bf16)``, or, where the
  swarm runs spot checks (``config.runs_spot_checks``), a one-process trainer's arithmetic (FP32
  forward on the BF16-rounded weights, ``rl/batch.bf16_rounded``), which a check re-runs;
- its rows of the FP32 global weights, outer momentum and error feedback (``trainer/shards.py``
  layout, the same rows as its FSDP shard), on CPU as in a one-process trainer.

A round: rank 0 plans each GRPO batch (staleness, advantages) and scatters shares; every rank
steps its share (the loss scaled so the averaged gradient is the whole batch's token mean).
The gate and error feedback run on each rank's rows; the payload pieces are gathered to rank 0
(shard positions + row offset, concatenated in rank order: the same entries, in the same order,
with the same FP32 bits as one process finds). Rank 0 codes and exchanges payloads and agrees
on the round as any trainer; the decided payloads, cut to each rank's rows, drive the outer
step on every shard (per-entry operations only, in trainer-id order, so the FP32 result does
not depend on the sharding), and the new global rows and momentum are gathered back.

Recorded inner steps (spot checks): rank 0 gathers what a one-process trainer's record holds
(``trainer/shard_record.py``).

Rank 0 keeps whole FP32 copies of the global weights and momentum (``ShardedOuter``): payloads
are coded and decoded against the whole base, the outer hash and the trainer-state file cover
whole tensors, and the version is the BF16 cast of them, published by rank 0's ordinary
publisher, so the patch is exactly a one-process trainer's. That is the network side's memory,
8 B per parameter on rank 0's host plus the BF16 version state; everything that grows with
training (weights, gradients, moments: 16 B/param) is split N ways on the devices.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import torch
from torch import nn

from pulse_node.codec.state import State
from pulse_node.config import TrainerConfig, runs_spot_checks
from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.outer import OuterOptimizer, OuterState
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.rl.batch import Packed
from pulse_node.rl.chunked import completion_logprobs
from pulse_node.rl.config import GRPOConfig
from pulse_node.rl.grpo import GRPOLearner, micro_batches
from pulse_node.rl.policy import Policy, build_policy
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.torchbits import load_state
from pulse_node.trainer.ranks import Ranks
from pulse_node.trainer.shard_record import ShardRecorder
from pulse_node.trainer.shards import (
    ShardLayout,
    combine_payloads,
    gather_rows,
    offset_tensors,
    scatter_rows,
    slice_payload,
)
from pulse_node.trainer.spot_record import InnerStepLog

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

    from pulse_node.daemon.status import NodeStatus

log = logging.getLogger("pulse.ranks")

Share = tuple[list[Rollout], list[float], float, int]  # a rank's rollouts, advantages, loss scale, micro-batches


def rank_device(name: str) -> torch.device:
    """``model.device`` for this rank: CUDA device ``LOCAL_RANK`` when the model runs on CUDA."""
    from pulse_node.rl.device import resolve_device

    dev = resolve_device(name)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    return dev


class ChunkedRoot(nn.Module):
    """An FSDP2 root around the model whose forward is a one-process learner's log-probs
    (``rl/chunked.completion_logprobs``): FSDP gathers the root group's parameters (embeddings,
    final norm, a tied head) around it as it does around the model's own forward, so a sharded
    trainer computes the chunked log-probs, and their gradients, as one process does."""

    def __init__(self, policy: Policy, cfg: GRPOConfig, *, temperature: float) -> None:
        super().__init__()
        self.model = policy.model
        self.lm, self.cfg, self.temperature = policy.lm, cfg, temperature

    def forward(self, packed: Packed) -> torch.Tensor:
        return completion_logprobs(self.lm, packed, chunk=self.cfg.logit_chunk_tokens,
                                   recompute=self.cfg.activation_checkpointing, temperature=self.temperature)


def shard_model(model: nn.Module, *, bf16_compute: bool, cpu_offload: bool, root: nn.Module | None = None) -> None:
    """``fully_shard`` every block of the model's outermost ``ModuleList``s, then the root (the
    model, or ``root`` around it)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_compute \
        else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    taken: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(t + ".") for t in taken):
            taken.append(name)
            for block in module:
                fully_shard(block, mp_policy=mp, offload_policy=offload)
    fully_shard(root or model, mp_policy=mp, offload_policy=offload)


def _sharded(name: str, p: torch.nn.Parameter) -> DTensor:
    """A parameter ``fully_shard`` replaced by its shard (a ``DTensor``)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        raise RuntimeError(f"{name}: FSDP left the parameter unsharded ({type(p).__name__})")
    return p


def memory_mb() -> dict[str, float]:
    """This process's resident memory now and at its peak (MB)."""
    return {"rss_mb": psutil.Process().memory_info().rss / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class ShardWork:
    """One rank's part of the trainer. Every ``cmd_*`` method is collective: rank 0 calls it with
    the argument, the other ranks with None (they receive theirs inside)."""

    def __init__(self, cfg: TrainerConfig, ranks: Ranks) -> None:
        self.cfg, self.ranks = cfg, ranks
        rank = ranks.rank
        device = rank_device(cfg.model.device)
        model_cfg = cfg.model.model_copy(update={"device": str(device)})
        # only rank 0 warm-starts the tiny model: the others get rank 0's weights (cmd_load)
        grpo = cfg.grpo if rank == 0 else cfg.grpo.model_copy(update={"warmstart_steps": 0})
        self.policy = build_policy(model_cfg, cfg.task, seed=cfg.seed, grpo_cfg=grpo, progress=rank == 0)
        # checked inner steps run a one-process trainer's arithmetic (module docstring)
        self.exact_bf16 = cfg.grpo.bf16_compute and runs_spot_checks(cfg)
        named = dict(self.policy.model.named_parameters())
        self.layout = ShardLayout({n: tuple(p.shape) for n, p in named.items()}, world=ranks.world)
        self.initial = {n: p.detach().to("cpu", torch.float32).clone() for n, p in named.items()} if rank == 0 else None
        # offloading to the host only means something when the model runs on an accelerator
        temperature = cfg.sampling.temperature
        root = ChunkedRoot(self.policy, cfg.grpo, temperature=temperature) if self.exact_bf16 else None
        shard_model(self.policy.model, bf16_compute=cfg.grpo.bf16_compute and not self.exact_bf16,
                    cpu_offload=cfg.dist.cpu_offload and device.type != "cpu", root=root)
        self.local = {n: _sharded(n, p) for n, p in self.policy.model.named_parameters()}
        for n, p in self.local.items():
            if tuple(p.to_local().shape) != self.layout.local_shape(n, rank):
                raise RuntimeError(f"{n}: FSDP shard {tuple(p.to_local().shape)} is not rows "
                                   f"{self.layout.span(n, rank)} of {self.layout.shapes[n]}")
        self.spans = self.layout.spans(rank)
        shapes = self.layout.local_shapes(rank)
        self.outer = OuterOptimizer({n: torch.zeros(s) for n, s in shapes.items()}, cfg.loco)
        self.ef = ErrorFeedback(shapes, cfg=cfg.loco, bound=PayloadBound.of_trainer(cfg))
        # BF16 forward from FSDP's mixed precision and log-probs from the model's whole forward (the
        # head is gathered only inside the root's); or (exact_bf16) the learner rounds the shards
        # and the chunked log-probs are the root's forward
        if root is None:
            self.learner = GRPOLearner(self.policy, cfg.grpo.model_copy(update={"bf16_compute": False}),
                                       temperature=temperature, chunked=False)
        else:
            self.learner = GRPOLearner(self.policy, cfg.grpo, temperature=temperature, logprobs=root)
        self.replica: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None  # rank 0
        self._mine: LocoPayload | None = None
        self.recorder = ShardRecorder(self.layout, ranks, self.local)  # rank 0's record of inner steps

    def run(self, name: str, arg: Any = None) -> Any:
        return getattr(self, f"cmd_{name}")(arg)

    # ---- weights ----------------------------------------------------------------------
    def cmd_load(self, round: int | None) -> None:
        """The global rows and momentum from rank 0's replica; the local weights reset to them."""
        round = self.ranks.bcast(round)
        params, momentum = self.replica or ({}, {})
        for n in self.layout.shapes:
            scatter_rows(self.layout, n, params.get(n), rank=self.ranks.rank, into=self.outer.params[n])
            scatter_rows(self.layout, n, momentum.get(n), rank=self.ranks.rank, into=self.outer.momentum[n])
        self.outer.set_round(round)
        self.cmd_reset_local(None)

    @torch.no_grad()
    def cmd_reset_local(self, _: None) -> None:
        for n, p in self.local.items():
            p.to_local().copy_(self.outer.params[n].to(p.device))
        torch.distributed.barrier()

    def _gather_global(self) -> None:
        params, momentum = self.replica or ({}, {})
        for n in self.layout.shapes:
            gather_rows(self.layout, n, self.outer.params[n], rank=self.ranks.rank, into=params.get(n))
            gather_rows(self.layout, n, self.outer.momentum[n], rank=self.ranks.rank, into=momentum.get(n))

    # ---- PULSELoCo ----------------------------------------------------------------------
    def cmd_make_payload(self, head: tuple[int, str, bytes] | None) -> LocoPayload | None:
        round, trainer_id, base_hash = self.ranks.bcast(head)
        local = {n: p.to_local().detach().to("cpu", torch.float32) for n, p in self.local.items()}
        self._mine = self.ef.make_payload(self.outer.params, local, round=round, trainer_id=trainer_id,
                                          base_hash=base_hash)
        pieces = self.ranks.gather(offset_tensors(self._mine.tensors, self.spans))
        if pieces is None:
            return None
        numel = {n: int(torch.Size(s).numel()) for n, s in self.layout.shapes.items()}
        return combine_payloads(pieces, round=round, trainer_id=trainer_id, base_hash=base_hash, numel=numel)

    def cmd_restore(self, keep: float | None) -> None:
        keep = self.ranks.bcast(keep)
        if self._mine is not None:
            self.ef.restore(self._mine, keep=keep)
            self._mine = None
        torch.distributed.barrier()

    def cmd_apply(self, slices: list[tuple[list[LocoPayload], dict[str, float], dict[str, float]]] | None) -> None:
        """Each rank's cut of the round's (checked) payloads, their clip factors and trust weights
        (found by rank 0 over whole payloads): outer step on the rows, gathered back."""
        payloads, keep, trust = self.ranks.scatter(slices)
        self.outer.step(payloads, keep=keep, trust=trust)
        self._gather_global()

    # ---- inner steps --------------------------------------------------------------------
    def cmd_step(self, shares: list[tuple[Share, bool]] | None) -> list[dict[str, float]] | None:
        """One data-parallel GRPO step; each rank's loss is scaled by ``world * its tokens / all
        tokens`` so FSDP's gradient mean is the token mean over the whole batch. Every rank runs
        the same number of micro-batches (each forward and backward is collective). With the flag
        set the step is recorded (``ShardRecorder.clip``)."""
        (rollouts, adv, scale, count), record = self.ranks.scatter(shares)
        learner, model = self.learner, self.policy.model
        learner.opt.zero_grad(set_to_none=True)
        model.train()
        extra = learner.accumulate(rollouts, adv, scale=scale, count=count)
        if record:
            norm = self.recorder.clip(self.cfg.grpo.max_grad_norm)
        else:
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grpo.max_grad_norm)
            norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        before = {n: p.to_local().detach().to(torch.bfloat16) for n, p in self.local.items()}
        learner.opt.step()
        changed = sum(int((before[n].view(torch.int16) != p.to_local().detach().to(torch.bfloat16).view(torch.int16))
                          .sum()) for n, p in self.local.items())
        extra["tokens"] = extra["tokens"] if scale else 0.0  # a placeholder share counts nothing
        return self.ranks.gather({**extra, "loss": extra["loss"] * scale, "grad_norm": norm,
                                  "changed": changed, "numel": sum(p.to_local().numel() for p in self.local.values()),
                                  **memory_mb()})

    # ---- recorded inner steps (spot checks, ``trainer/shard_record.py``) -----------------
    def cmd_weights(self, _: None) -> None:
        """A recorded step that takes no AdamW step: rank 0 keeps the BF16 weights it would have run on."""
        self.recorder.keep_weights()

    def cmd_start_state(self, _: None) -> tuple[list[np.ndarray], int] | None:
        """A recorded round's start state, whole on rank 0 (``ShardRecorder.start_state``)."""
        return self.recorder.start_state(self.learner.opt, self.ef)


def split_batch(batch: list[Rollout], adv: list[float], world: int, *, micro_batch_tokens: int) -> list[Share]:
    """Contiguous shares of ``batch`` per rank, with each share's loss scale and the number of
    micro-batches every rank runs (the most any share needs). A rank without a rollout of its
    own takes a placeholder with scale 0 (it must still join the collectives)."""
    tokens = sum(len(r.completion_ids) for r in batch)
    shares = []
    for r in range(world):
        lo, hi = r * len(batch) // world, (r + 1) * len(batch) // world
        part, part_adv = batch[lo:hi], adv[lo:hi]
        if not part:
            shares.append((batch[:1], [0.0], 0.0))
            continue
        shares.append((part, part_adv, world * sum(len(x.completion_ids) for x in part) / max(tokens, 1)))
    count = max(len(micro_batches(s[0], budget=micro_batch_tokens)) for s in shares)
    return [(*s, count) for s in shares]


def combine_stats(parts: list[dict[str, float]]) -> dict[str, float]:
    """The whole step's figures from the ranks' (token-weighted means, sums, per-rank memory)."""
    tokens = sum(p["tokens"] for p in parts) or 1.0
    return {"loss": sum(p["loss"] for p in parts) / len(parts), "grad_norm": parts[0]["grad_norm"],
            "ratio_mean": sum(p["ratio_mean"] * p["tokens"] for p in parts) / tokens,
            "clip_frac": sum(p["clip_frac"] * p["tokens"] for p in parts) / tokens,
            "tokens": sum(p["tokens"] for p in parts), "stepped": 1.0,
            "bf16_changed": sum(p["changed"] for p in parts) / max(1, sum(p["numel"] for p in parts))}


class ShardedOuter(OuterOptimizer):
    """Rank 0's whole FP32 global weights and momentum; ``apply`` runs the step on the shards."""

    def __init__(self, params: dict[str, torch.Tensor], cfg: LocoConfig, *, engine: DistributedEngine) -> None:
        super().__init__(params, cfg)
        self._engine = engine

    def _advance(self, payloads: Sequence[LocoPayload], *, keep: Mapping[str, float],
                 trust: Mapping[str, float] | None) -> None:
        """Checked and weighed here over whole payloads and tensors, once; stepped on every rank's rows."""
        self.settle(payloads, keep, trust)
        self._engine.apply_on_shards(payloads, self.kept, self.trust)
        self.set_round(self.round + 1)

    def load_state_dict(self, state: OuterState) -> None:
        super().load_state_dict(state)
        self._engine.push_global()


class DistributedEngine:
    """Rank 0's ``Engine`` (``trainer/engine.py``) over the ranks of a torchrun group."""

    def __init__(self, cfg: TrainerConfig, *, status: NodeStatus | None = None) -> None:
        self.cfg = cfg
        self.ranks = Ranks(timeout_s=cfg.dist.timeout_s)
        self.work = ShardWork(cfg, self.ranks)
        self.policy = self.work.policy  # rank 0's shard of the model, its tokenizer and task
        self.shapes = dict(self.work.layout.shapes)
        if self.work.initial is None:
            raise RuntimeError("the engine runs on rank 0, which holds the initial weights")
        self.outer = ShardedOuter(self.work.initial, cfg.loco, engine=self)
        self.work.initial = None
        self.work.replica = (self.outer.params, self.outer.momentum)
        self.learner = self.work.learner  # rank 0's: its settings are every rank's
        self._worker: RolloutWorker | None = None
        self.push_global()  # every rank starts from rank 0's weights
        self.status = status
        if status is not None:
            status.update(ranks=self.ranks.world)

    def _call(self, name: str, arg: Any = None) -> Any:
        self.ranks.post(name)
        return self.work.run(name, arg)

    @property
    def worker(self) -> RolloutWorker:
        """Rollouts and evals on rank 0 (built on first use: a trainer fed by inference nodes and
        not evaluating never holds this whole-model copy)."""
        if self._worker is None:
            policy = build_policy(self.cfg.model, self.cfg.task, seed=self.cfg.seed,
                                  grpo_cfg=GRPOConfig(warmstart_steps=0))
            self._worker = RolloutWorker(policy, self.cfg.sampling, compute=self.cfg.verify.compute)
        return self._worker

    @property
    def inner_log(self) -> InnerStepLog | None:
        """Set: inner steps are recorded for spot checks (``trainer/spot_record.py``), on rank 0."""
        return self.work.recorder.log

    @inner_log.setter
    def inner_log(self, log: InnerStepLog | None) -> None:
        self.work.recorder.log = log

    def begin_inner_log(self, *, round: int, base_hash: bytes) -> None:
        """Start recording round ``round`` (after ``reset_local``), if ``inner_log`` is set."""
        if self.inner_log is not None:
            arrays, adam_step = self._call("start_state")
            self.inner_log.begin_round_flat(round=round, base_hash=base_hash, base=self.outer.params, arrays=arrays,
                                           adam_step=adam_step)

    def step(self, rollouts: list[Rollout], *, current_version: int, producer: str = "") -> dict[str, float]:
        """One GRPO step on every rank; with ``inner_log`` recorded as ``LocalEngine.step`` records it."""
        stats, batch, adv = self.work.learner.plan(rollouts, current_version=current_version)
        log = self.inner_log
        if not batch:
            if log is not None:  # no gradient, no AdamW step: the weights the step would have run on
                self._call("weights")
                self._record(rollouts, producer=producer)
            return stats
        shares = split_batch(batch, adv, self.ranks.world, micro_batch_tokens=self.cfg.grpo.micro_batch_tokens)
        parts = self._call("step", [(share, log is not None) for share in shares])
        if log is not None:
            self._record(rollouts, producer=producer)
        stats.update(combine_stats(parts))
        if self.status is not None:
            self.status.update(rank_rss_mb=[round(p["rss_mb"]) for p in parts],
                               rank_peak_rss_mb=[round(p["peak_rss_mb"]) for p in parts])
        return stats

    def _record(self, rollouts: list[Rollout], *, producer: str) -> None:
        """The step the ranks just ran, from what rank 0 gathered, into ``inner_log``."""
        self.work.recorder.record(rollouts, producer=producer)

    def make_payload(self, *, round: int, trainer_id: str, base_hash: bytes) -> LocoPayload:
        payload: LocoPayload = self._call("make_payload", (round, trainer_id, base_hash))
        return payload

    def restore(self, payload: LocoPayload, *, keep: float = 0.0) -> None:
        self._call("restore", keep)

    def reset_local(self) -> None:
        self._call("reset_local")

    def apply_on_shards(self, payloads: Sequence[LocoPayload], keep: dict[str, float],
                        trust: dict[str, float]) -> None:
        slices = [([slice_payload(p, self.work.layout.spans(r)) for p in payloads], keep, trust)
                  for r in range(self.ranks.world)]
        self._call("apply", slices)

    def push_global(self) -> None:
        """Rank 0's global weights and momentum to every rank's rows (and its local weights)."""
        self._call("load", self.outer.round)

    def load_global(self, state: State, *, round: int) -> None:
        load_state(self.outer.params, state)
        self.outer.set_round(round)
        self.push_global()

    def close(self) -> None:
        """Let the other ranks exit (bounded wait), then leave the process group."""
        try:
            self.ranks.stop()
        finally:
            self.ranks.close()


def serve_rank(cfg: TrainerConfig) -> int:
    """Ranks 1..N-1 of a trainer: run rank 0's commands until it says stop."""
    logging.basicConfig(level=cfg.log_level.upper(), format=f"%(asctime)s [rank {os.environ.get('RANK')}] %(message)s")
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # rank 0 decides when the group stops
        signal.signal(sig, lambda *_: stopping.set())
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    ranks = Ranks(timeout_s=cfg.dist.timeout_s)
    work = ShardWork(cfg, ranks)
    log.info("rank %d of %d ready", ranks.rank, ranks.world)
    try:
        while (name := ranks.next(stopping)) not in ("stop", None):
            work.run(name)
        if name == "stop":
            ranks.acknowledge_stop()
    finally:
        ranks.close()
    return 0
