"""GRPO learner: group-relative advantages, DAPO-style asymmetric clipping, off-policy correction.

One ``step`` = one inner AdamW step on the FP32 master weights (one new policy version):

1. drop rollouts whose version is more than ``max_staleness`` behind ``current_version``
   (or ahead of it); validate token ids against the vocabulary and context;
2. advantage A = (r - mean_group) / std_group per GRPO group (0 for all-equal groups, which
   carry no signal and are skipped);
3. token-level (DAPO) loss  -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A), averaged
   over completion tokens, with rho = exp(logp_theta - logp_behaviour), the importance weight
   that corrects for rollouts made by an older version;
4. the forward pass uses the BF16-rounded weights (straight-through), i.e. the same numbers
   inference ran on; gradients and AdamW act on the FP32 masters.

Rewards and behaviour log-probs are never a peer's claims: ``step`` takes only ``local``
rollouts, made by this node's own sampler or re-scored by the trainer's verifier
(``rl/verify.py``: reward recomputed with the task's reward function, log-probs recomputed
teacher-forced with the version's weights). A rollout decoded from the wire is refused.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from pulse_node.errors import WireError
from pulse_node.rl.batch import bf16_params, masked_mean, pack, token_logprobs
from pulse_node.rl.config import GRPOConfig
from pulse_node.rl.rollout import Rollout


def group_advantages(rollouts: list[Rollout]) -> list[float]:
    """Per-rollout (r - group mean) / group std; 0 where a group's rewards are all equal."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        groups[r.group_id].append(i)
    adv = [0.0] * len(rollouts)
    for members in groups.values():
        rewards = [rollouts[i].reward for i in members]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
        if std > 1e-8:
            for i in members:
                adv[i] = (rollouts[i].reward - mean) / std
    return adv


def bf16_bits(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to(torch.bfloat16).view(torch.int16).clone() for n, p in module.named_parameters()}


def changed_fraction(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """Fraction of BF16 elements whose bits differ."""
    changed = sum(int((before[n] != after[n]).sum()) for n in before)
    return changed / max(1, sum(t.numel() for t in before.values()))


class GRPOLearner:
    """Runs GRPO inner steps on a policy's FP32 masters with AdamW."""

    def __init__(self, policy, grpo_cfg: GRPOConfig, *, temperature: float = 1.0) -> None:
        self.policy, self.cfg, self.temperature = policy, grpo_cfg, temperature
        self.opt = torch.optim.AdamW(policy.model.parameters(), lr=grpo_cfg.lr,
                                     betas=tuple(grpo_cfg.betas), weight_decay=grpo_cfg.weight_decay)

    def _fresh(self, rollouts: list[Rollout], current_version: int) -> list[Rollout]:
        return [r for r in rollouts if 0 <= current_version - r.version <= self.cfg.max_staleness]

    def _validate(self, rollouts: list[Rollout]) -> None:
        vocab, ctx = self.policy.tokenizer.vocab_size, self.policy.lm.context
        for r in rollouts:
            if len(r.prompt_ids) + len(r.completion_ids) > ctx:
                raise WireError(f"rollout of problem {r.problem_id!r} is longer than the context {ctx}")
            if max(r.prompt_ids + r.completion_ids) >= vocab or len(r.logprobs) != len(r.completion_ids):
                raise WireError(f"rollout of problem {r.problem_id!r} has token ids outside the vocabulary")

    def loss(self, rollouts: list[Rollout], advantages: list[float]) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped surrogate over ``rollouts`` (all with non-zero advantage)."""
        dev = self.policy.device
        packed = pack([(r.prompt_ids, r.completion_ids) for r in rollouts],
                      pad_id=self.policy.tokenizer.pad_id, device=dev)
        params = bf16_params(self.policy.model) if self.cfg.bf16_compute else None
        new_lp = token_logprobs(self.policy.lm, packed, params=params, temperature=self.temperature)
        old_lp = torch.zeros_like(new_lp)
        for i, r in enumerate(rollouts):
            start = len(r.prompt_ids) - 1
            old_lp[i, start:start + len(r.logprobs)] = torch.tensor(r.logprobs, dtype=old_lp.dtype)
        adv = torch.tensor(advantages, dtype=new_lp.dtype, device=dev)[:, None]
        ratio = torch.exp((new_lp - old_lp).clamp(-20, 20))
        clipped = ratio.clamp(1 - self.cfg.eps_low, 1 + self.cfg.eps_high)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        mask = packed.target
        with torch.no_grad():
            stats = {"ratio_mean": masked_mean(ratio, mask).item(),
                     "clip_frac": masked_mean((ratio != clipped).float(), mask).item(),
                     "tokens": float(mask.sum().item())}
        return masked_mean(per_token, mask), stats

    def plan(self, rollouts: list[Rollout], *, current_version: int) -> tuple[dict[str, float], list[Rollout], list[float]]:
        """Drop stale rollouts, validate the rest, keep the informative ones.

        Returns the step's stats so far, the rollouts with a non-zero advantage and their
        advantages (a trainer on several processes plans on rank 0 and splits the batch).
        """
        if not all(r.local for r in rollouts):
            raise ValueError("GRPO trains only on local rollouts (own sampler or re-scored by the verifier)")
        fresh = self._fresh(rollouts, current_version)
        self._validate(fresh)
        adv = group_advantages(fresh)
        useful = [i for i, a in enumerate(adv) if a != 0.0]
        stats = {"loss": 0.0, "reward_mean": sum(r.reward for r in fresh) / max(1, len(fresh)),
                 "kept": float(len(fresh)), "dropped_stale": float(len(rollouts) - len(fresh)),
                 "informative": float(len(useful)), "ratio_mean": 1.0, "clip_frac": 0.0,
                 "tokens": 0.0, "grad_norm": 0.0, "bf16_changed": 0.0, "stepped": 0.0,
                 "staleness_mean": sum(current_version - r.version for r in fresh) / max(1, len(fresh))}
        return stats, [fresh[i] for i in useful], [adv[i] for i in useful]

    def step(self, rollouts: list[Rollout], *, current_version: int) -> dict[str, float]:
        """One AdamW step on ``rollouts``; returns loss, reward_mean, kept, dropped_stale, ..."""
        stats, batch, adv = self.plan(rollouts, current_version=current_version)
        self.opt.zero_grad(set_to_none=True)
        if not batch:
            return stats  # no signal: the weights (and the version's BF16 cast) stay as they are
        self.policy.model.train()
        loss, extra = self.loss(batch, adv)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), self.cfg.max_grad_norm)
        before = bf16_bits(self.policy.model)
        self.opt.step()
        stats.update(extra, loss=float(loss.item()), grad_norm=float(norm), stepped=1.0,
                     bf16_changed=changed_fraction(before, bf16_bits(self.policy.model)))
        return stats
