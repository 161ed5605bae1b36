"""A trainer's inner side in the harness: local weights, GRPO inner steps, error feedback.

What a trainer of ``trainer/role.py`` does between two outer steps, without the network: ``H``
GRPO steps (``GRPOLearner``, AdamW state kept across rounds) on batches the world's sampler
made from the round's global weights, then the BF16 gate and error feedback (clipped to half
the payload value bound, as ``LocalEngine`` does). ``settle`` puts back into the error feedback
what the round did not apply (left out: all of it; weighed by the aggregation: the rest), and
``reset`` sets the local weights to the new global ones. ``invert_rewards`` makes the
advantage-flip attacker: the same verified rollouts with the reward turned upside down. With
``record`` its inner steps are recorded by an ``InnerStepLog`` (``trainer/spot_record.py``) as
``LocalEngine`` records them, for its commitments and the spot checks it answers (``answer``);
the recording's own time is ``record_s``.

``seconds`` adds up the trainer's own work (inner steps and gate), not the sampler's: in a
swarm inference nodes make the rollouts. A trainer of a swarm also verifies every batch it
trains on (``rl/verify.py``: decode, teacher-forced re-scoring); with ``verify_batches`` it does
so here too (decoding the bytes its producer would push; it still trains on the sampler's own
rollouts, so learning is unchanged), timed apart as ``verify_s`` (refusals in ``refused``).
"""

from __future__ import annotations

import copy
import dataclasses
import time

import torch

from pulse_node.chain.identity import Identity
from pulse_node.loco.commit import InnerCommitment
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.loco.spotdraw import SpotDraw
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.rollout import MAX_BATCH_INDEX, Rollout, decode_rollouts, encode_rollouts
from pulse_node.rl.verify import RolloutVerifier
from pulse_node.testing.byzantine.world import World
from pulse_node.trainer.recompute import SpotCase
from pulse_node.trainer.spot_record import InnerStepLog
from pulse_node.trainer.spot_replay import inner_settings


class InnerTrainer:
    """One trainer's local model, inner optimizer and error feedback."""

    def __init__(self, world: World, trainer_id: str, *, seed: int, invert_rewards: bool = False,
                 record: bool = False, verify_batches: bool = False) -> None:
        self.world, self.trainer_id, self.seed = world, trainer_id, seed
        self.policy = world.policy()
        self.learner = GRPOLearner(self.policy, world.cfg.grpo, temperature=world.cfg.sampling.temperature)
        self.ef = ErrorFeedback(world.shapes, cfg=world.cfg.loco, bound=world.bound)
        self.local = dict(self.policy.model.named_parameters())
        self.invert_rewards = invert_rewards
        self.log = InnerStepLog(world.shapes, leaf=world.leaf, keep=3) if record else None
        self.batches = 0
        self.seconds = 0.0
        self.record_s = 0.0
        self.reward = 0.0
        self.verify_batches, self.verify_s, self.refused = verify_batches, 0.0, 0
        self.verifier: RolloutVerifier | None = None

    def __deepcopy__(self, memo: dict[int, object]) -> InnerTrainer:
        """A copy with its own model, optimizer and error feedback, sharing the world."""
        memo[id(self.world)] = self.world
        new = InnerTrainer.__new__(InnerTrainer)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, None if k == "verifier" else copy.deepcopy(v, memo))  # (it holds the world's worker)
        return new

    def train(self, version: int, outer: OuterOptimizer | None = None) -> None:
        """``loco.inner_steps`` GRPO steps on batches of the version the world's sampler holds
        (recorded from ``outer``'s round and base if this trainer records)."""
        if self.log is not None and outer is not None:
            t0 = time.process_time()
            self.log.begin_round(round=outer.round, base_hash=outer.state_hash(), base=outer.params,
                                 learner=self.learner, ef=self.ef)
            self.record_s += time.process_time() - t0
        rewards = []
        for _ in range(self.world.cfg.loco.inner_steps):
            verified = self.world.batch(self.trainer_id, self.batches, seed=self.seed)
            self.batches += 1
            if self.verify_batches:
                self._verify(encode_rollouts(verified), version)
            rewards.append(sum(r.reward for r in verified) / max(1, len(verified)))
            batch = [dataclasses.replace(r, reward=1.0 - r.reward) for r in verified] if self.invert_rewards \
                else verified
            self._step(batch, verified, version)
        self.reward = sum(rewards) / len(rewards)

    def _verify(self, data: bytes, version: int) -> None:
        """What a swarm's trainer does with a pushed batch before it trains on it (timed)."""
        world = self.world
        t0 = time.process_time()
        self.verifier = self.verifier or RolloutVerifier(
            world.worker, world.task, run_id=f"{world.run_id}-{self.seed}", batches_per_version=MAX_BATCH_INDEX,
            max_staleness=self.learner.cfg.max_staleness, cfg=world.cfg.verify)
        held = world.worker.loaded
        v = self.verifier.check(decode_rollouts(data), sender=self.trainer_id, current_version=version,
                                state_of=lambda k: held if k == world.worker.version else None)
        self.verify_s += time.process_time() - t0
        self.refused += 0 if v.ok else 1

    def _step(self, batch: list[Rollout], verified: list[Rollout], version: int) -> None:
        t0 = time.process_time()
        stats, norm = self.learner.gradient(batch, current_version=version)
        t1 = time.process_time()
        if self.log is not None:  # the verified batch is what it commits to, whatever it trained on
            self.log.record(self.learner, verified, producer=self.trainer_id, grad_norm=norm)
        t2 = time.process_time()
        self.learner.apply(stats, norm)
        self.seconds += (t1 - t0) + (time.process_time() - t2)
        self.record_s += t2 - t1

    def recorded(self, round: int) -> bool:
        """Whether it recorded round ``round``'s inner steps (and can commit to them)."""
        return self.log is not None and round in self.log.rounds

    def commitment(self, identity: Identity, *, run_id: str, payload: bytes) -> InnerCommitment:
        """Its signed inner commitment of this round, standing behind the payload of digest ``payload``."""
        if self.log is None:
            raise RuntimeError("a trainer that does not record makes no commitment")
        t0 = time.process_time()
        c = self.log.commitment(identity, run_id=run_id, trainer=self.trainer_id, payload=payload,
                                settings=inner_settings(self.learner, self.world.cfg.loco))
        self.record_s += time.process_time() - t0
        return c

    def answer(self, draw: SpotDraw, commitment: InnerCommitment, payload: LocoPayload, *, keep: float,
               next_commitment: InnerCommitment | None) -> SpotCase:
        """What it serves for ``draw`` on the round of ``commitment`` (and the next round's start)."""
        assert self.log is not None
        r = commitment.round
        patch = None if draw.step == 0 else self.log.weights_patch(r, draw.step)  # step 0 runs on the base
        nxt = self.log.open(r + 1, draw.leaves, start_only=True) if next_commitment is not None else None
        return SpotCase(commitment, self.log.open(r, draw.leaves), self.log.batch_bytes(r, draw.step), patch,
                        payload, keep, next_commitment, nxt)

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
