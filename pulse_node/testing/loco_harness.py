"""N PULSELoCo trainers in one process (no network), agreeing as the node's trainers do: tests, bench.

Each simulated trainer owns what a networked trainer owns -- its local model and inner
optimizer (``InnerTrainer``), an ``ErrorFeedback`` and an ``OuterOptimizer`` over its own
replica of the FP32 global weights -- and payloads travel as encoded bytes that every receiver
decodes, so the wire codec is exercised every round (coded against the round's global
weights, ``base=``, which every replica holds). One round, with the round semantics of
``trainer/agreement.py`` (minus the network and the signature):

1. every trainer takes ``cfg.inner_steps`` inner steps;
2. every trainer builds and encodes its payload against the round's base hash;
3. trainers in ``drop(round)`` miss the deadline: their payload is not delivered, so it is not
   decided, and they ``restore`` it into their error feedback;
4. the decided set is every delivered payload (``RoundRecord.contributors``, by trainer id), as
   a coordinator that holds all of them at its deadline decides;
5. every trainer, the left-out ones too, decodes exactly the decided payloads (each against
   its own base hash) and applies them with its ``OuterOptimizer``, in trainer-id order; a
   trainer whose payload the aggregation applied only in part (``loco/aggregate.py``) puts the
   rest back into its error feedback;
6. every trainer resets its local weights to its global replica.

All replicas end every round bit-identical (``RoundRecord.hashes``); nothing re-syncs here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from pulse_node.loco.config import LocoConfig
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload, decode_payload, encode_payload
from pulse_node.loco.sparsify import ErrorFeedback


class InnerTrainer(Protocol):
    """What ``make_trainer(rank)`` returns: FP32 local weights and one inner optimizer step."""

    def local_params(self) -> Mapping[str, torch.Tensor]:
        """Named FP32 weights that ``inner_step`` updates in place."""

    def inner_step(self) -> float:
        """One inner (AdamW) step on this trainer's data shard; returns the loss."""


@dataclass
class Replica:
    """One simulated trainer: its model, error feedback and its replica of the global state."""

    trainer_id: str
    trainer: InnerTrainer
    feedback: ErrorFeedback
    outer: OuterOptimizer


@dataclass
class RoundRecord:
    round: int
    loss: float
    contributors: list[str]
    payload_bytes: dict[str, int]
    fired: dict[str, int]
    hashes: dict[str, bytes]
    rss_bytes: int = 0


@dataclass
class LocoRun:
    replicas: list[Replica]
    records: list[RoundRecord]
    numel: int

    def global_params(self) -> dict[str, torch.Tensor]:
        return self.replicas[0].outer.params


DropFn = Callable[[int], Collection[int]]


def _rss() -> int:
    try:
        import psutil
    except ImportError:
        return 0
    return int(psutil.Process().memory_info().rss)


def _build(n_trainers: int, make_trainer: Callable[[int], InnerTrainer], cfg: LocoConfig,
           make_feedback: Callable[..., ErrorFeedback]) -> list[Replica]:
    trainers = [make_trainer(rank) for rank in range(n_trainers)]
    start = {n: t.detach().clone() for n, t in trainers[0].local_params().items()}
    shapes = {n: tuple(t.shape) for n, t in start.items()}
    replicas = []
    for rank, tr in enumerate(trainers):
        with torch.no_grad():
            for n, t in tr.local_params().items():
                t.copy_(start[n])
        outer = OuterOptimizer({n: t.clone() for n, t in start.items()}, cfg)
        replicas.append(Replica(f"t{rank:03d}", tr, make_feedback(shapes, cfg=cfg), outer))
    return replicas


def _deliver(replicas: list[Replica], rnd: int, cfg: LocoConfig, dropped: Collection[int],
             rec: RoundRecord) -> dict[str, tuple[bytes, LocoPayload]]:
    """Steps 2-3: trainer id -> payload bytes (and the sender's payload) of the trainers that
    made the deadline."""
    delivered = {}
    for rank, rep in enumerate(replicas):
        p = rep.feedback.make_payload(rep.outer.params, rep.trainer.local_params(), round=rnd,
                                      trainer_id=rep.trainer_id, base_hash=rep.outer.state_hash())
        data = encode_payload(p, level=cfg.zstd_level, base=rep.outer.params)
        rec.payload_bytes[rep.trainer_id], rec.fired[rep.trainer_id] = len(data), p.count
        if rank in dropped:
            rep.feedback.restore(p)
        else:
            delivered[rep.trainer_id] = (data, p)
    return delivered


def _apply_decided(replicas: list[Replica], delivered: dict[str, tuple[bytes, LocoPayload]],
                   cfg: LocoConfig, rec: RoundRecord) -> None:
    """Steps 4-5: decide the delivered payloads; every trainer applies exactly those, in id order."""
    rec.contributors = sorted(delivered, key=str.encode)
    for rep in replicas:
        payloads: list[LocoPayload] = [
            decode_payload(delivered[tid][0], shapes=rep.feedback.shapes, max_bytes=cfg.max_payload_bytes,
                           base=rep.outer.params, expect_base=rep.outer.state_hash())
            for tid in rec.contributors]
        rep.outer.apply(payloads)
        keep = rep.outer.kept.get(rep.trainer_id, 1.0)
        if rep.trainer_id in delivered and keep < 1.0:
            rep.feedback.restore(delivered[rep.trainer_id][1], keep=keep)


def run_inprocess(n_trainers: int, make_trainer: Callable[[int], InnerTrainer], *, rounds: int,
                  cfg: LocoConfig, drop: DropFn | None = None,
                  make_feedback: Callable[..., ErrorFeedback] = ErrorFeedback,
                  on_round: Callable[[RoundRecord, list[Replica]], None] | None = None) -> LocoRun:
    """Run ``rounds`` PULSELoCo rounds of ``n_trainers`` trainers; see the module docstring.

    ``drop(round)`` gives the ranks that miss that round's deadline; ``on_round`` sees each record.
    """
    replicas = _build(n_trainers, make_trainer, cfg, make_feedback)
    records = []
    for rnd in range(rounds):
        losses = [rep.trainer.inner_step() for rep in replicas for _ in range(cfg.inner_steps)]
        rec = RoundRecord(rnd, sum(losses) / len(losses), [], {}, {}, {})
        delivered = _deliver(replicas, rnd, cfg, set(drop(rnd)) if drop else set(), rec)
        _apply_decided(replicas, delivered, cfg, rec)
        rec.hashes = {r.trainer_id: r.outer.state_hash() for r in replicas}
        with torch.no_grad():
            for rep in replicas:
                for n, t in rep.trainer.local_params().items():
                    t.copy_(rep.outer.params[n])
        rec.rss_bytes = _rss()
        records.append(rec)
        if on_round is not None:
            on_round(rec, replicas)
    numel = sum(t.numel() for t in replicas[0].outer.params.values())
    return LocoRun(replicas, records, numel)
