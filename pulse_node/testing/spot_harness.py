"""Honest and cheating trainers for spot recomputation: tests and ``bench/spot_calibrate.py``.

``RoundTrainer`` is one trainer's weights work for a round, as ``LocalEngine`` does it (GRPO inner
steps recorded by an ``InnerStepLog``, the error-feedback gate, an outer step on the decided
payloads), with a ``cheat`` that changes what it really does while it commits as if honest:

- ``flip``: trains on the verified batches with inverted rewards (every advantage negated) and
  commits the verified batches and its real (flipped) gradients; ``flip_quarter`` inverts one
  group in four;
- ``free_rider``: no forward or backward: commits zero gradients with a plausible norm, takes no
  AdamW step, sends what its error feedback holds;
- ``copier``: a free rider that sends another trainer's payload as its own;
- ``lazy_copier``: honest steps, another trainer's payload;
- ``scaled``: honest steps, its payload's values doubled;
- ``ef_inflate``: an honest round, then the next round starts from an error feedback grown by a
  constant push along ``sign(w)`` (error feedback hoarded from nowhere).

``answer`` is what the target serves for a drawn check; ``make_batches`` makes verified batches
as an inference node would (seeded sampler, the round's version).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import blake3
import torch

from pulse_node.chain.identity import Identity
from pulse_node.loco.bound import SENDER_SHARE, PayloadBound
from pulse_node.loco.commit import InnerCommitment
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.loco.spotdraw import SpotDraw
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import SoloConfig
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import TaskSource
from pulse_node.torchbits import module_state
from pulse_node.trainer.recompute import RoundBase, SpotCase
from pulse_node.trainer.spot_record import InnerStepLog
from pulse_node.trainer.spot_replay import inner_settings

CHEATS = ("honest", "flip", "flip_quarter", "free_rider", "copier", "lazy_copier", "scaled", "ef_inflate")


def make_batches(worker: RolloutWorker, task: TaskSource, *, run_id: str, version: int, producer: str,
                 count: int, first: int = 0) -> list[tuple[str, list[Rollout]]]:
    """``count`` seeded batches of ``producer`` for ``version`` (the worker holds that version)."""
    out = []
    for b in range(first, first + count):
        rollouts = worker.generate_batch(task, BatchKey(run_id, version, producer, b))
        for r in rollouts:
            r.local = True  # made with the version's own weights (what the verifier hands a trainer)
        out.append((producer, rollouts))
    return out


def _flipped(rollouts: list[Rollout], *, every: int) -> list[Rollout]:
    groups = sorted({r.group_id for r in rollouts})
    flip = set(groups[::every])
    out = []
    for r in rollouts:
        r2 = copy.copy(r)
        r2.reward = -r.reward if r.group_id in flip else r.reward
        out.append(r2)
    return out


@dataclass
class Made:
    payload: LocoPayload
    data: bytes
    commitment: InnerCommitment


class RoundTrainer:
    """One trainer's rounds (see the module docstring)."""

    def __init__(self, solo: SoloConfig, loco: LocoConfig, *, trainer_id: str, identity: Identity,
                 run_id: str, seed: int = 0, leaf: int = 4096, claim_settings: bytes | None = None) -> None:
        self.policy = build_policy(solo.model, solo.task, seed=seed, grpo_cfg=solo.grpo)
        self.learner = GRPOLearner(self.policy, solo.grpo, temperature=solo.sampling.temperature)
        self.loco, self.trainer_id, self.identity, self.run_id = loco, trainer_id, identity, run_id
        local = dict(self.policy.model.named_parameters())
        self.shapes = {n: tuple(p.shape) for n, p in local.items()}
        self.outer = OuterOptimizer({n: p.detach().clone() for n, p in local.items()}, loco)
        self.bound = PayloadBound.of(loco, lr=solo.grpo.lr, betas=solo.grpo.betas,
                                     weight_decay=solo.grpo.weight_decay)
        self.ef = ErrorFeedback(self.shapes, cfg=loco, bound=self.bound)
        self.log = InnerStepLog(self.shapes, leaf=leaf)
        # what it commits to: its own settings, unless it claims the swarm's while running others
        self.settings = claim_settings or inner_settings(self.learner, loco)
        self.pending_cheat = ""

    def base(self, version: int) -> RoundBase:
        """The round as every trainer holds it (the FP32 global weights are copied)."""
        params = {n: t.clone() for n, t in self.outer.params.items()}
        return RoundBase(version, module_state(params.items()), params)

    def _begin(self) -> None:
        with torch.no_grad():
            for n, p in self.policy.model.named_parameters():
                p.copy_(self.outer.params[n])
        if self.pending_cheat == "ef_inflate":
            for n, e in self.ef.e.items():
                e.add_(self.outer.params[n].sign() * float(self.bound.absolute) * SENDER_SHARE * 0.5)
        self.pending_cheat = ""
        self.log.begin_round(round=self.outer.round, base_hash=self.outer.state_hash(), base=self.outer.params,
                             learner=self.learner, ef=self.ef)

    def _step(self, producer: str, rollouts: list[Rollout], *, cheat: str, version: int) -> None:
        if cheat in ("free_rider", "copier"):
            for p in self.policy.model.parameters():
                p.grad = torch.zeros_like(p)
            self.log.record(self.learner, rollouts, producer=producer, grad_norm=0.5)
            return
        used = _flipped(rollouts, every=1 if cheat == "flip" else 4) if cheat.startswith("flip") else rollouts
        stats, norm = self.learner.gradient(used, current_version=version)
        self.log.record(self.learner, rollouts, producer=producer, grad_norm=norm)
        self.learner.apply(stats, norm)

    def run_round(self, batches: list[tuple[str, list[Rollout]]], *, version: int, cheat: str = "honest",
                  copy_of: LocoPayload | None = None) -> Made:
        """Inner steps on ``batches``, the payload, the signed commitment."""
        if cheat not in CHEATS:
            raise ValueError(f"unknown cheat {cheat!r}")
        self._begin()
        for producer, rollouts in batches:
            self._step(producer, rollouts, cheat=cheat, version=version)
        local = {n: p.detach().to("cpu", torch.float32) for n, p in self.policy.model.named_parameters()}
        payload = self.ef.make_payload(self.outer.params, local, round=self.outer.round, trainer_id=self.trainer_id,
                                       base_hash=self.outer.state_hash())
        if cheat in ("copier", "lazy_copier") and copy_of is not None:
            payload = LocoPayload(payload.round, self.trainer_id, payload.base_hash, dict(copy_of.tensors),
                                  dict(copy_of.numel))
        elif cheat == "scaled":
            payload.tensors = {n: (i, v * 2) for n, (i, v) in payload.tensors.items()}
        self.pending_cheat = cheat
        data = encode_payload(payload, base=None)
        c = self.log.commitment(self.identity, run_id=self.run_id, trainer=self.trainer_id,
                                payload=blake3.blake3(data).digest(), settings=self.settings)
        return Made(payload, data, c)

    def finish_round(self, payloads: list[LocoPayload], *, included: bool, mine: LocoPayload) -> None:
        """The outer step on the decided payloads; ``mine`` back into the error feedback if left out."""
        if not included:
            self.ef.restore(mine)
        self.outer.apply(payloads)

    def answer(self, draw: SpotDraw, made: Made, *, included: bool = True,
               next_made: Made | None = None) -> SpotCase:
        """What this trainer serves for ``draw`` on the round of ``made`` (and the next round's start)."""
        r = made.commitment.round
        patch = None if draw.step == 0 else self.log.weights_patch(r, draw.step)  # step 0 runs on the base
        return SpotCase(made.commitment, self.log.open(r, draw.leaves), self.log.batch_bytes(r, draw.step), patch,
                        made.payload, 1.0 if included else 0.0, next_made.commitment if next_made else None,
                        self.log.open(r + 1, draw.leaves, start_only=True) if next_made else None)


def verifier_parts(solo: SoloConfig, *, seed: int = 0) -> tuple[GRPOLearner, RolloutWorker]:
    """A verifier's own model copy: a learner (for gradients) and a worker (to re-verify batches)."""
    policy = build_policy(solo.model, solo.task, seed=seed, grpo_cfg=solo.grpo)
    return GRPOLearner(policy, solo.grpo, temperature=solo.sampling.temperature), RolloutWorker(policy, solo.sampling)
