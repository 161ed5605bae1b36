"""The steering forgery: every draw moved, within the verifier's widened interval, toward the answer.

A dishonest producer with full knowledge of the key (the uniforms ``u``), the reference answer
and the tolerances the verifier will apply decodes its batch itself: at each token, the ids
the widened check admits are those ``j`` with ``C_{j-1} - t(C_{j-1}) <= u < C_j + t(C_j)``
(``rl/precision.py``);
while its completion is still a prefix of the answer's tokens and the next one is admitted, it
emits that one (for an exact-match reward the choice that most raises the final reward), else
the honest draw. ``steered_batch`` returns the batch and how many tokens it moved;
bench/rollout_forgery.py reports its reward gain over honest sampling and how often the verifier
catches it, per precision.
"""

from __future__ import annotations

import torch

from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.precision import Tolerances
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.seeded import drawable, uniforms
from pulse_node.rl.tasks import TaskSource


def _admitted(cum: torch.Tensor, u: torch.Tensor, tol: Tolerances) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The honest draw and the first and last id the widened check admits, per row: ``j`` with
    ``C_{j-1} - t(C_{j-1}) <= u < C_j + t(C_j)``."""
    last, u = cum.shape[1] - 1, u.contiguous()
    draw = torch.searchsorted(cum, u[:, None], right=True).clamp_max(last).squeeze(1)
    ids = torch.arange(cum.shape[1], device=cum.device)
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], 1)
    ok = (before - tol.at(before) <= u[:, None]) & (u[:, None] < cum + tol.at(cum))
    lo = torch.where(ok, ids, last + 1).amin(1).clamp_max(last)
    hi = torch.where(ok, ids, -1).amax(1).clamp_min(0)
    return draw, lo, hi


@torch.no_grad()
def steered_batch(worker: RolloutWorker, task: TaskSource, key: BatchKey, *, tol: Tolerances,
                  max_moves: int | None = None) -> tuple[list[Rollout], int]:
    """Batch ``key`` decoded by ``worker`` (in its precision), every draw steered toward the answer
    where ``tol`` allows (a careful forger: at most ``max_moves`` of them, to stay under the
    batch-level test); and the number of tokens moved off the honest draw."""
    cfg, tok = worker.cfg, worker.tokenizer
    problems = assigned_problems(task, key, cfg.prompts_per_batch)
    prompts = [tok.encode(p.prompt) for p in problems for _ in range(cfg.group_size)]
    targets = [tok.encode_target(p.answer) for p in problems for _ in range(cfg.group_size)]
    ids, mask = worker._prompt_batch(prompts)
    u = uniforms(key.digest(), range(len(prompts)), cfg.max_new_tokens)
    logits, cache = worker.lm.prefill(ids, mask, cfg.max_new_tokens)
    vocab = drawable(logits, tok.vocab_size)
    out = [[] for _ in prompts]  # type: list[list[int]]
    lps = [[] for _ in prompts]  # type: list[list[float]]
    on_track, done, moved = [True] * len(prompts), [False] * len(prompts), 0
    for step in range(cfg.max_new_tokens):
        logp = torch.log_softmax(logits[:, :vocab].double() / cfg.temperature, -1)
        cum = logp.exp().cumsum(-1)
        draw, lo, hi = _admitted(cum, u[:, step], tol)
        pick = draw.clone()
        for i, want in enumerate(targets):
            if done[i]:
                continue
            goal = want[step] if on_track[i] and step < len(want) else -1
            if lo[i] <= goal <= hi[i] and (goal == int(draw[i]) or max_moves is None or moved < max_moves):
                pick[i] = goal
                moved += int(goal != int(draw[i]))
            on_track[i] = on_track[i] and int(pick[i]) == goal
            out[i].append(int(pick[i]))
            lps[i].append(float(logp[i, pick[i]]))
            done[i] = int(pick[i]) == tok.eos_id
        if all(done):
            break
        feed = torch.tensor([tok.pad_id if d and o[-1] != tok.eos_id else o[-1] for d, o in zip(done, out)],
                            device=worker.device)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits, cache = worker.lm.decode(feed, mask, cache)
    rollouts = [worker._rollout(problems[i // cfg.group_size], prompts[i], t, lp, t[-1] == tok.eos_id, key=key, sample=i)
                for i, (t, lp) in enumerate(zip(out, lps))]
    return rollouts, moved
