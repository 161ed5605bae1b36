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

Memory: a step runs its batch in micro-batches of at most ``grpo.micro_batch_tokens`` tokens
and accumulates their gradients; each micro-batch adds (its per-token loss sum) / (the whole
batch's completion tokens), so the accumulated gradient is the single big step's. Log-probs of
the chosen tokens come from the last hidden states through the head in chunks of positions
(``rl/chunked.py``), never a [tokens, vocabulary] tensor for the batch, and optionally with
activation checkpointing (``grpo.activation_checkpointing``). Peak memory is one micro-batch's.

Rewards and behaviour log-probs are never a peer's claims: ``step`` takes only ``local``
rollouts, made by this node's own sampler or re-scored by the trainer's verifier
(``rl/verify.py``: reward recomputed with the task's reward function, log-probs recomputed
teacher-forced with the version's weights). A rollout decoded from the wire is refused.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext

import torch

from pulse_node.errors import WireError
from pulse_node.rl.batch import Packed, bf16_params, bf16_rounded, pack, token_logprobs
from pulse_node.rl.chunked import completion_logprobs, enable_hf_checkpointing
from pulse_node.rl.config import GRPOConfig
from pulse_node.rl.policy import Policy
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


def micro_batches(rollouts: list[Rollout], *, budget: int) -> list[list[int]]:
    """Indices of ``rollouts`` in micro-batches of at most ``budget`` tokens (rows x the longest
    row's prompt + completion; one row at least), longest rows first so padding stays small."""
    size = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
    groups: list[list[int]] = []
    for i in sorted(range(len(rollouts)), key=lambda i: -size[i]):
        if groups and size[groups[-1][0]] * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class GRPOLearner:
    """Runs GRPO inner steps on a policy's FP32 masters with AdamW.

    ``chunked=False`` computes log-probs from the model's whole forward (``lm.logits`` per
    micro-batch): an FSDP-sharded model gathers its head only inside its root's forward.
    ``logprobs`` computes the chunked log-probs of a packed micro-batch in place of
    ``completion_logprobs`` (the same function, run as an FSDP2 root's forward).
    """

    def __init__(self, policy: Policy, grpo_cfg: GRPOConfig, *, temperature: float = 1.0, chunked: bool = True,
                 logprobs: Callable[[Packed], torch.Tensor] | None = None) -> None:
        self.policy, self.cfg, self.temperature, self.chunked = policy, grpo_cfg, temperature, chunked
        self.logprobs = logprobs
        self.opt = torch.optim.AdamW(policy.model.parameters(), lr=grpo_cfg.lr,
                                     betas=grpo_cfg.betas, weight_decay=grpo_cfg.weight_decay)
        if grpo_cfg.activation_checkpointing:
            enable_hf_checkpointing(policy.lm)

    def _fresh(self, rollouts: list[Rollout], current_version: int) -> list[Rollout]:
        return [r for r in rollouts if 0 <= current_version - r.version <= self.cfg.max_staleness]

    def _validate(self, rollouts: list[Rollout]) -> None:
        vocab, ctx = self.policy.tokenizer.vocab_size, self.policy.lm.context
        for r in rollouts:
            if len(r.prompt_ids) + len(r.completion_ids) > ctx:
                raise WireError(f"rollout of problem {r.problem_id!r} is longer than the context {ctx}")
            if max(r.prompt_ids + r.completion_ids) >= vocab or len(r.logprobs) != len(r.completion_ids):
                raise WireError(f"rollout of problem {r.problem_id!r} has token ids outside the vocabulary")

    def _new_logprobs(self, packed: Packed, params: dict[str, torch.Tensor] | None) -> torch.Tensor:
        if self.chunked and params is None:
            if self.logprobs is not None:
                return self.logprobs(packed)
            return completion_logprobs(self.policy.lm, packed, chunk=self.cfg.logit_chunk_tokens,
                                       recompute=self.cfg.activation_checkpointing, temperature=self.temperature)
        return token_logprobs(self.policy.lm, packed, params=params, temperature=self.temperature)[packed.target]

    def terms(self, rollouts: list[Rollout], advantages: list[float], *,
              params: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per completion token (rows in order): the clipped surrogate, the importance ratio and
        whether it was clipped (the last two detached)."""
        dev = self.policy.device
        packed = pack([(r.prompt_ids, r.completion_ids) for r in rollouts],
                      pad_id=self.policy.tokenizer.pad_id, device=dev)
        new_lp = self._new_logprobs(packed, params)
        old_lp = torch.tensor([lp for r in rollouts for lp in r.logprobs], dtype=new_lp.dtype, device=dev)
        adv = torch.tensor([a for r, a in zip(rollouts, advantages) for _ in r.completion_ids],
                           dtype=new_lp.dtype, device=dev)
        ratio = torch.exp((new_lp - old_lp).clamp(-20, 20))
        clipped = ratio.clamp(1 - self.cfg.eps_low, 1 + self.cfg.eps_high)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        return per_token, ratio.detach(), (ratio != clipped).detach()

    def loss(self, rollouts: list[Rollout], advantages: list[float]) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped surrogate over ``rollouts`` (all with non-zero advantage) as one graph, for
        a caller that runs backward itself (``step`` micro-batches instead)."""
        params = bf16_params(self.policy.model) if self.cfg.bf16_compute else None
        per_token, ratio, clipped = self.terms(rollouts, advantages, params=params)
        n = max(1, per_token.numel())
        return per_token.sum() / n, {"ratio_mean": float(ratio.sum()) / n, "clip_frac": float(clipped.sum()) / n,
                                     "tokens": float(per_token.numel())}

    def accumulate(self, rollouts: list[Rollout], advantages: list[float], *, scale: float = 1.0,
                   count: int | None = None) -> dict[str, float]:
        """Backward of ``scale`` x the token-mean loss of ``rollouts``, micro-batch by micro-batch
        (gradients add up in ``.grad``); ``count`` pads to that many micro-batches with empty ones
        (ranks of a sharded model must run as many forwards as each other). Returns loss,
        ratio_mean, clip_frac and tokens over the whole batch."""
        groups = micro_batches(rollouts, budget=self.cfg.micro_batch_tokens)
        groups += [[]] * max(0, (count or 0) - len(groups))
        total = sum(len(r.completion_ids) for r in rollouts)
        sums = [0.0, 0.0, 0.0]
        rounded = bf16_rounded(self.policy.model) if self.cfg.bf16_compute else nullcontext()
        with rounded:
            for group in groups:
                part = [rollouts[i] for i in group] or rollouts[:1]  # an empty one: a row with weight 0
                per_token, ratio, clipped = self.terms(part, [advantages[i] for i in group] or [0.0])
                weight = scale / max(total, 1) if group else 0.0
                (per_token.sum() * weight).backward()
                if group:
                    sums = [sums[0] + float(per_token.detach().sum()), sums[1] + float(ratio.sum()),
                            sums[2] + float(clipped.sum())]
        n = max(total, 1)
        return {"loss": sums[0] / n, "ratio_mean": sums[1] / n, "clip_frac": sums[2] / n, "tokens": float(total)}

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

    def gradient(self, rollouts: list[Rollout], *, current_version: int) -> tuple[dict[str, float], float | None]:
        """The step's clipped gradient in ``.grad`` and its stats; the norm before clipping, or None
        when no rollout is informative (no gradient, no step). ``apply`` then takes the AdamW step;
        between the two a trainer may record the gradient (``trainer/spot_record.py``)."""
        stats, batch, adv = self.plan(rollouts, current_version=current_version)
        self.opt.zero_grad(set_to_none=True)
        if not batch:
            return stats, None  # no signal: the weights (and the version's BF16 cast) stay as they are
        self.policy.model.train()
        extra = self.accumulate(batch, adv)
        norm = float(torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), self.cfg.max_grad_norm))
        stats.update(extra, grad_norm=norm)
        return stats, norm

    def apply(self, stats: dict[str, float], norm: float | None) -> dict[str, float]:
        """The AdamW step on the gradient ``gradient`` left (none if ``norm`` is None)."""
        if norm is None:
            return stats
        before = bf16_bits(self.policy.model)
        self.opt.step()
        stats.update(stepped=1.0, bf16_changed=changed_fraction(before, bf16_bits(self.policy.model)))
        return stats

    def step(self, rollouts: list[Rollout], *, current_version: int) -> dict[str, float]:
        """One AdamW step on ``rollouts``; returns loss, reward_mean, kept, dropped_stale, ..."""
        stats, norm = self.gradient(rollouts, current_version=current_version)
        return self.apply(stats, norm)
