"""The fixed pieces of every Byzantine scenario: config, warm-started weights, sampler, held-out set.

The swarm's default (``configs/trainer.toml``: the embedded tiny model, 2-digit arithmetic,
GRPO at lr 3e-4 on rollouts of the current version only, H = 10 inner steps, the BF16 gate,
outer Nesterov 0.7 / 0.9), with the bench's own batch size. One ``RolloutWorker`` holds the
round's global BF16 weights and makes every trainer's batches, as the inference nodes of a
swarm do (each batch named by its ``BatchKey``: run, version, producer, index, so a batch's
prompts and token draws are the same in every scenario with that seed), and scores the
held-out set.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import blake3
import torch

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.config import TrainerConfig
from pulse_node.loco.bound import PayloadBound
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.policy import Policy, build_policy
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.torchbits import module_state


@cache
def identity_of(name: str) -> Identity:
    """The bench's key named ``name`` (the same in every process and run)."""
    return Identity.from_private_bytes(blake3.blake3(b"pulse/byzantine-bench/" + name.encode()).digest())


_BY_PEER: dict[str, Identity] = {}


def peer_of(name: str) -> str:
    """The peer id (the trainer id a swarm knows it by) of the bench's key ``name``."""
    identity = identity_of(name)
    pid = peer_id_of_key(identity.public_key_hex)
    _BY_PEER[pid] = identity
    return pid


def key_for(peer_id: str) -> Identity:
    """The bench's key of a trainer id ``peer_of`` made."""
    return _BY_PEER[peer_id]


class World:
    """What every trainer of every scenario shares (built once per process)."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        first = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo)
        self.base = {n: p.detach().to("cpu", torch.float32).clone() for n, p in first.model.named_parameters()}
        self.shapes = {n: tuple(t.shape) for n, t in self.base.items()}
        self.numel = sum(t.numel() for t in self.base.values())
        self.bound = PayloadBound.of_trainer(cfg)
        self.task = make_task_source(cfg.task)
        self.evals = self.task.eval_set()
        self.worker = RolloutWorker(first, cfg.sampling)
        self.run_id = "byzantine"
        self.leaf = 256 if self.numel < 100_000 else 4096  # inner-commitment leaf (loco/merkle.py)
        self.first_rounds: dict[tuple, Any] = {}  # (seed, trainer id, ...) -> a trainer after round 0

    def policy(self) -> Policy:
        """A fresh policy holding the base weights (built without the warm start, then loaded)."""
        grpo = self.cfg.grpo.model_copy(update={"warmstart_steps": 0})
        p = build_policy(self.cfg.model, self.cfg.task, seed=self.cfg.seed, grpo_cfg=grpo)
        with torch.no_grad():
            for n, t in p.model.named_parameters():
                t.copy_(self.base[n])
        return p

    def load(self, params: Mapping[str, torch.Tensor], version: int) -> None:
        """The sampler now holds the BF16 cast of these global weights as ``version``."""
        self.worker.set_weights(module_state(params.items()), version)

    def batch(self, producer: str, index: int, *, seed: int) -> list[Rollout]:
        """Batch ``index`` of ``producer`` for the version the sampler holds (a swarm's batch)."""
        key = BatchKey(f"{self.run_id}-{seed}", self.worker.version, producer, index)
        return self.worker.generate_batch(self.task, key)

    def accuracy(self, params: Mapping[str, torch.Tensor]) -> float:
        """Held-out greedy accuracy of the BF16 cast of ``params`` (the task's eval split)."""
        self.load(params, self.worker.version + 1)
        return evaluate(self.worker, self.evals)
