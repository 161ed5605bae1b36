"""A trainer's inner side in the harness: local weights, GRPO inner steps, error feedback.

What a trainer of ``trainer/role.py`` does between two outer steps, without the network: ``H``
GRPO steps (``GRPOLearner``, AdamW state kept across rounds) on batches the world's sampler
made from the round's global weights, then the BF16 gate and error feedback (clipped to half
the payload value bound, as ``LocalEngine`` does). ``settle`` puts back into the error feedback
what the round did not apply (left out: all of it; weighed by the aggregation: the rest), and
``reset`` sets the local weights to the new global ones. ``invert_rewards`` makes the
advantage-flip attacker: the same verified rollouts with the reward turned upside down.

``seconds`` adds up the trainer's own work (inner steps and gate), not the sampler's: in a
swarm inference nodes make the rollouts, so overheads are measured against this.
"""

from __future__ import annotations

import copy
import dataclasses
import time

import torch

from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.testing.byzantine.world import World


class InnerTrainer:
    """One trainer's local model, inner optimizer and error feedback."""

    def __init__(self, world: World, trainer_id: str, *, seed: int, invert_rewards: bool = False) -> None:
        self.world, self.trainer_id, self.seed = world, trainer_id, seed
        self.policy = world.policy()
        self.learner = GRPOLearner(self.policy, world.cfg.grpo, temperature=world.cfg.sampling.temperature)
        self.ef = ErrorFeedback(world.shapes, cfg=world.cfg.loco, bound=world.bound)
        self.local = dict(self.policy.model.named_parameters())
        self.invert_rewards = invert_rewards
        self.batches = 0
        self.seconds = 0.0
        self.reward = 0.0

    def __deepcopy__(self, memo: dict) -> InnerTrainer:
        """A copy with its own model, optimizer and error feedback, sharing the world."""
        memo[id(self.world)] = self.world
        new = InnerTrainer.__new__(InnerTrainer)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, copy.deepcopy(v, memo))
        return new

    def train(self, version: int) -> None:
        """``loco.inner_steps`` GRPO steps on batches of the version the world's sampler holds."""
        rewards = []
        for _ in range(self.world.cfg.loco.inner_steps):
            batch = self.world.batch(self.trainer_id, self.batches, seed=self.seed)
            self.batches += 1
            rewards.append(sum(r.reward for r in batch) / max(1, len(batch)))
            if self.invert_rewards:
                batch = [dataclasses.replace(r, reward=1.0 - r.reward) for r in batch]
            t0 = time.process_time()
            self.learner.step(batch, current_version=version)
            self.seconds += time.process_time() - t0
        self.reward = sum(rewards) / len(rewards)

    def payload(self, outer: OuterOptimizer) -> LocoPayload:
        """Gate ``global - local`` plus the error feedback into this round's payload."""
        t0 = time.process_time()
        local = {n: p.detach() for n, p in self.local.items()}
        p = self.ef.make_payload(outer.params, local, round=outer.round, trainer_id=self.trainer_id,
                                 base_hash=outer.state_hash())
        self.seconds += time.process_time() - t0
        return p

    def settle(self, payload: LocoPayload, keep: float) -> None:
        """The round applied the share ``keep`` of our payload (0: left out); the rest goes back."""
        if keep < 1.0:
            self.ef.restore(payload, keep=keep)

    @torch.no_grad()
    def reset(self, outer: OuterOptimizer) -> None:
        """Local weights := the new global weights."""
        for n, p in self.local.items():
            p.copy_(outer.params[n])
