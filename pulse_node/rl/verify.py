"""What a trainer checks before it learns from a rollout batch, and the numbers it learns with.

A batch is a producer's answer to its assignment ``BatchKey(run, version, sender, batch)``
(``rl/assign.py``); the sender is the peer the transport authenticated. ``RolloutVerifier.check``
takes the decoded batch and, in order (cheap checks first; the first failure refuses the whole
batch):

1. shape: exactly ``prompts_per_batch * group_size`` rollouts, one version and batch index,
   samples ``0..n-1`` in order, batch index below ``batches_per_version`` (``batch_shape``,
   ``batch_index``);
2. freshness: the version is within ``max_staleness`` of ours and we hold its weights (``stale``,
   ``future_version``, ``unknown_version``: not the sender's fault, no strike); not a batch we
   accepted before (``replayed``);
3. per rollout: the prompt is the assigned one (``eval_prompt`` if it is an eval-split prompt,
   else ``prompt_not_assigned``), the group id is the canonical one (``group_id``), termination
   (a finished completion ends in its only EOS; an unfinished one is exactly ``max_new_tokens``
   long and has none: ``termination``), token ids inside the vocabulary and context
   (``token_range``);
4. a spot check: ``SPOT_ROWS`` rollouts picked by a secret of ours and the batch key (the
   sender cannot know which) get checks 5-6 first, with a forward of those rows alone; if one
   fails the batch is refused without the full forward (a batch of junk completions under the
   right prompts costs two rows' forward, not the batch's);
5. one teacher-forced forward of the version's weights over the rest of the batch (the head
   only where a completion token is predicted, tile by tile: ``rl/tiled_head.py``): every
   completion token must be the seeded draw (``rl/seeded.py``): its keyed uniform must lie in
   the token's recomputed CDF interval widened by ``verify.score_tolerance`` (``not_sampled``:
   edited, swapped, written, truncated-then-EOS or other-model completions); per token only the
   interval bounds and the log-prob are kept, never a [tokens, vocabulary] noise tensor;
6. only for rows whose draws verified (cheap before expensive: unverified text never reaches the
   answer checker): the reward, recomputed with the task's reward (``rl/rewards.py``; the answer
   checker gets ``verify.checker_cpu_s`` of CPU per batch, each call bounded), must equal the claim
   (``wrong_reward``; a reward the bound left undecided scores 0 and is not compared); the claimed
   log-probs must match ours within ``verify.logprob_tolerance`` (``forged_logprobs``).

An accepted batch comes back as ``local`` rollouts carrying the trainer's reward and behaviour
log-probs of that version: no number from the producer enters the loss.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import blake3
import numpy as np
import torch

from pulse_node.codec.state import State
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.batch import Packed, pack
from pulse_node.rl.checker import CheckerBudget
from pulse_node.rl.chunked import hidden_states, output_head
from pulse_node.rl.config import VerifyConfig
from pulse_node.rl.precision import Probe, Tolerances, beyond, probe, tolerances
from pulse_node.rl.rewards import Score
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.seeded import Intervals, drawable, intervals, outside, uniforms
from pulse_node.rl.tasks import Problem, TaskSource
from pulse_node.rl.tiled_head import chosen_intervals
from pulse_node.vocab import BATCH_STRIKES, BatchRefusal

#: refusals that strike the sender (it sent something false); the others are nobody's fault
STRIKES = BATCH_STRIKES
REWARD_TOLERANCE = 1e-6
#: floats held at once by the teacher-forced forward: its logits, or with the tiled head its trunk's
#: activations (rows are chunked to stay under it)
LOGIT_BUDGET = 1 << 26
#: activations per token of a forward without logits, in units of the hidden size (a Llama block's
#: MLP holds ~11 x hidden at once; attention and residual stream the rest)
TRUNK_FLOATS_PER_HIDDEN = 16
#: rollouts checked first, alone, before the forward over the whole batch
SPOT_ROWS = 2


@dataclass
class RolloutCheck:
    """The verdict on one rollout: ``reason`` "" when it passes.

    ``gap``: its largest token gap, how far a token's keyed uniform lies outside the token's
    recomputed CDF interval (0 when every token is exactly the recomputed draw);
    ``closest``: the smallest distance of a token's uniform to a boundary of its interval, i.e.
    how near a choice between two adjacent tokens its closest draw was (only there could a token
    be swapped within the tolerance). Both NaN when the tokens were not recomputed.
    """

    sample: int
    reason: BatchRefusal | Literal[""] = ""
    detail: str = ""
    gap: float = float("nan")
    closest: float = float("nan")

    @property
    def ok(self) -> bool:
        return not self.reason


@dataclass
class BatchVerdict:
    """The verdict on a batch: accepted (with trainer-scored rollouts) or refused with a reason."""

    reason: BatchRefusal | Literal[""] = ""
    detail: str = ""
    checks: list[RolloutCheck] = field(default_factory=list)
    rollouts: list[Rollout] = field(default_factory=list)
    tolerance: float = float("nan")  # the widest draw tolerance applied (its precision's, rl/precision.py)

    @property
    def ok(self) -> bool:
        return not self.reason

    @property
    def strike(self) -> bool:
        return self.reason in STRIKES


def _refuse(reason: BatchRefusal, detail: str, n: int) -> BatchVerdict:
    return BatchVerdict(reason, detail, [RolloutCheck(i, reason, detail) for i in range(n)])


class RolloutVerifier:
    """Checks rollout batches against version weights; shares the trainer's rollout worker."""

    def __init__(self, worker: RolloutWorker, task: TaskSource, *, run_id: str, batches_per_version: int,
                 max_staleness: int, cfg: VerifyConfig) -> None:
        self.worker, self.task, self.run_id, self.cfg = worker, task, run_id, cfg
        self.sampling = worker.cfg
        self.batches_per_version, self.max_staleness = batches_per_version, max_staleness
        tok = worker.tokenizer
        self._eval_prompts = {tuple(tok.encode(p.prompt)) for p in task.eval_set()}
        self._accepted: set[BatchKey] = set()
        self._logit_width: int | None = None
        self.logit_budget = LOGIT_BUDGET  # logits per forward (benches lower it to vary the shape)
        self._secret = os.urandom(32)  # picks the spot rows: the sender cannot know which
        self._rewards: dict[tuple[tuple[int, ...], str], Score] = {}
        self.forwarded_rows = 0  # sequences run through the teacher-forced forward (benches, tests)
        self.tol = tolerances(Probe.none(), score_tolerance=cfg.score_tolerance, logprob_tolerance=cfg.logprob_tolerance,
                              temperature=self.sampling.temperature)  # the last batch's (benches, the CLI)
        self._near = [0, 0]  # tokens outside their FP32 interval, tokens checked (this batch)

    def forget_accepted(self) -> None:
        """Forget the batches accepted so far: the next check of one is not refused as ``replayed``
        (a spot checker re-verifies batches committed by trainers that took them already)."""
        self._accepted.clear()

    # ---- the checks --------------------------------------------------------------------
    def check(self, rollouts: list[Rollout], *, sender: str, current_version: int,
              state_of: Callable[[int], State | None], full: bool = False) -> BatchVerdict:
        """Verify a batch from ``sender``; ``full`` checks every rollout even after a failure
        (``rollouts check`` prints them all), else the first failure ends the work."""
        self.tol = tolerances(Probe.none(), score_tolerance=self.cfg.score_tolerance,
                              logprob_tolerance=self.cfg.logprob_tolerance, temperature=self.sampling.temperature)
        verdict = self._check(rollouts, sender=sender, current_version=current_version, state_of=state_of, full=full)
        verdict.tolerance = self.tol.widest
        return verdict

    def _check(self, rollouts: list[Rollout], *, sender: str, current_version: int,
               state_of: Callable[[int], State | None], full: bool) -> BatchVerdict:
        n = len(rollouts)
        refused = self._shape(rollouts) or self._freshness(rollouts[0], current_version)
        if refused:
            return _refuse(*refused, n)
        key = BatchKey(self.run_id, rollouts[0].version, sender, rollouts[0].batch)
        if key in self._accepted:
            return _refuse(BatchRefusal.REPLAYED, f"batch {key.batch} of version {key.version} was accepted before", n)
        state = state_of(key.version)
        if state is None:
            return _refuse(BatchRefusal.UNKNOWN_VERSION, f"weights of version {key.version} are not held here", n)
        problems = assigned_problems(self.task, key, self.sampling.prompts_per_batch)
        wants = [self.worker.tokenizer.encode(p.prompt) for p in problems]
        g = self.sampling.group_size
        checks = [self._static(r, key, problems[r.sample // g], wants[r.sample // g]) for r in rollouts]
        if not full and not all(c.ok for c in checks):
            return self._verdict(checks, [])
        if self.worker.loaded is not state or self.worker.version != key.version:
            self.worker.set_weights(state, key.version)  # sparse: undo/redo between nearby versions
        todo = [i for i, c in enumerate(checks) if c.ok]
        scored: dict[int, Rollout] = {}
        spot = [] if full else self.spot_rows(todo, key)
        self._rewards, self._near = {}, [0, 0]
        self.tol = self._tolerances([rollouts[i] for i in (spot or todo[:SPOT_ROWS])])
        budget = CheckerBudget(self.cfg.checker_cpu_s)  # the answer checker's CPU for this batch
        self._score(rollouts, spot, problems=problems, key=key, checks=checks, scored=scored, budget=budget)
        if not all(checks[i].ok for i in spot):  # a cheap refusal: the spot rows' forward only
            return self._verdict(checks, [])
        rest = [i for i in todo if i not in set(spot)]
        self._score(rollouts, rest, problems=problems, key=key, checks=checks, scored=scored, budget=budget)
        out = [scored[i] for i in todo if i in scored]  # rows whose draws failed were not scored
        verdict = self._verdict(checks, out)
        near, tokens = self._near
        if verdict.ok and near > self.tol.near_limit(tokens):  # the batch-level test (rl/precision.py)
            verdict = BatchVerdict(BatchRefusal.NOT_SAMPLED, f"{near} of {tokens} tokens drawn outside their FP32 "
                                   f"interval, {rollouts[0].precision} rounding explains at most "
                                   f"{self.tol.near_limit(tokens)}", checks)
        if verdict.ok:
            self._accepted.add(key)
            self._accepted = {k for k in self._accepted if k.version >= current_version - self.max_staleness}
        return verdict

    def spot_rows(self, todo: list[int], key: BatchKey) -> list[int]:
        """``SPOT_ROWS`` of ``todo`` picked by our secret and the batch key (unpredictable to the sender)."""
        pick = blake3.blake3(key.digest(), key=self._secret).digest(length=8)
        return sorted(random.Random(pick).sample(todo, min(SPOT_ROWS, len(todo))))

    def _score(self, rollouts: list[Rollout], idx: list[int], *, problems: list[Problem], key: BatchKey,
               checks: list[RolloutCheck], scored: dict[int, Rollout], budget: CheckerBudget) -> None:
        """Recompute rollouts ``idx`` (one forward) and check their draws, then (cheap before
        expensive: only rows whose draws verified reach the answer checker) rewards and log-probs."""
        if not idx:
            return
        rec = self.recompute([rollouts[i] for i in idx], key)
        for j, i in enumerate(idx):
            r, problem = rollouts[i], problems[i // self.sampling.group_size]
            checks[i] = self._draws(r, rec, j)
            if not checks[i].ok:
                continue
            self._near[0] += int((rec.token_gaps[j] > self.cfg.score_tolerance).sum())
            self._near[1] += len(r.completion_ids)
            seen = (tuple(r.completion_ids), problem.answer)
            if seen not in self._rewards:
                text = self.worker.tokenizer.decode(r.completion_ids)
                self._rewards[seen] = self.worker.reward_fn.score(text, problem.answer, budget=budget)
            score = self._rewards[seen]
            checks[i] = self._claims(r, rec, j, score=score, check=checks[i])
            scored[i] = copy.copy(r)
            scored[i].reward, scored[i].logprobs, scored[i].local = score.value, rec.logprobs[j], True

    def _tolerances(self, probed: list[Rollout]) -> Tolerances:
        """The batch's tolerances: FP32's, or widened by the declared precision's error in the
        logits as measured on ``probed`` (the spot rows; ``rl/precision.py``)."""
        w, base = self.worker, dict(score_tolerance=self.cfg.score_tolerance,
                                    logprob_tolerance=self.cfg.logprob_tolerance, temperature=self.sampling.temperature)
        if not probed or (probed[0].precision == "fp32" and w.compute == "fp32"):
            return tolerances(Probe.none(), **base)
        packed = pack([(r.prompt_ids, r.completion_ids) for r in probed], pad_id=w.tokenizer.pad_id, device=w.device)
        row = torch.tensor([i for i, r in enumerate(probed) for _ in r.completion_ids], device=w.device)
        pos = torch.tensor([len(r.prompt_ids) - 1 + k for r in probed for k in range(len(r.completion_ids))],
                           device=w.device)
        tokens = torch.tensor([t for r in probed for t in r.completion_ids], device=w.device)
        found = probe(w.lm, packed, row, pos, tokens, precision=probed[0].precision, verifier=w.compute,  # type: ignore[arg-type]
                      vocab=drawable(self._vocab(), w.tokenizer.vocab_size), temperature=self.sampling.temperature)
        return tolerances(found, **base)

    def _verdict(self, checks: list[RolloutCheck], scored: list[Rollout]) -> BatchVerdict:
        bad = next((c for c in checks if not c.ok), None)
        if bad is None:
            return BatchVerdict("", "", checks, scored)
        return BatchVerdict(bad.reason, f"sample {bad.sample}: {bad.detail}", checks)

    def _shape(self, rollouts: list[Rollout]) -> tuple[BatchRefusal, str] | None:
        want = self.sampling.prompts_per_batch * self.sampling.group_size
        if len(rollouts) != want:
            return BatchRefusal.BATCH_SHAPE, f"{len(rollouts)} rollouts, a batch has {want}"
        first = rollouts[0]
        for i, r in enumerate(rollouts):
            if (r.version, r.batch, r.sample) != (first.version, first.batch, i):
                return BatchRefusal.BATCH_SHAPE, (f"rollout {i} is (version {r.version}, batch {r.batch}, sample {r.sample}), "
                                       f"expected ({first.version}, {first.batch}, {i})")
        if first.batch >= self.batches_per_version:
            return BatchRefusal.BATCH_INDEX, f"batch index {first.batch} >= {self.batches_per_version} per version"
        return None

    def _freshness(self, r: Rollout, current: int) -> tuple[BatchRefusal, str] | None:
        if r.version > current:
            return BatchRefusal.FUTURE_VERSION, f"version {r.version} is ahead of ours ({current})"
        if current - r.version > self.max_staleness:
            return BatchRefusal.STALE, f"version {r.version} is more than {self.max_staleness} behind {current}"
        return None

    def _static(self, r: Rollout, key: BatchKey, problem: Problem, want: list[int]) -> RolloutCheck:
        """Prompt (``want``: the assigned one's ids), group, termination and token-range checks."""
        tok, cfg = self.worker.tokenizer, self.sampling
        c = RolloutCheck(r.sample)
        if tuple(r.prompt_ids) in self._eval_prompts and r.prompt_ids != want:
            c.reason, c.detail = BatchRefusal.EVAL_PROMPT, "the prompt is one of the eval split"
        elif r.prompt_ids != want or r.problem_id != problem.id[:256]:
            c.reason, c.detail = BatchRefusal.PROMPT_NOT_ASSIGNED, f"the assigned problem is {problem.id[:40]!r}"
        elif r.group_id != key.group_id(r.sample // cfg.group_size):
            c.reason, c.detail = BatchRefusal.GROUP_ID, f"group id {r.group_id[:40]!r} is not the batch's"
        elif why := _termination(r, eos=tok.eos_id, max_new=cfg.max_new_tokens):
            c.reason, c.detail = BatchRefusal.TERMINATION, why
        elif max(r.completion_ids) >= tok.vocab_size or len(r.prompt_ids) + len(r.completion_ids) > self.worker.lm.context:
            c.reason, c.detail = BatchRefusal.TOKEN_RANGE, "token ids outside the vocabulary or longer than the context"
        return c

    def _draws(self, r: Rollout, rec: Recomputed, j: int) -> RolloutCheck:
        """Whether every token of ``r`` (``rec``'s ``j``-th) is the seeded draw of the recomputation."""
        c = RolloutCheck(r.sample, gap=float(rec.gap[j]), closest=float(rec.closest[j]))
        if rec.over[j] > 0:
            c.reason = BatchRefusal.NOT_SAMPLED
            c.detail = (f"token {int(rec.token_gaps[j].argmax())} is not the seeded draw (gap {c.gap:.4g} beyond "
                        f"the tolerance of {r.precision} by {float(rec.over[j]):.4g})")
        return c

    def _claims(self, r: Rollout, rec: Recomputed, j: int, *, score: Score, check: RolloutCheck) -> RolloutCheck:
        """The reward and log-prob claims of a rollout whose draws verified. A reward the checker
        left undecided (its CPU bound ran out: scored 0) is not held against the claim."""
        c = check
        if score.exact and abs(r.reward - score.value) > REWARD_TOLERANCE:
            c.reason, c.detail = BatchRefusal.WRONG_REWARD, f"reward {r.reward:g} claimed, {score.value:g} recomputed"
        elif (off := float(rec.claim_off[j])) > self.tol.logprob:
            c.reason = BatchRefusal.FORGED_LOGPROBS
            c.detail = f"log-probs differ by {off:.4g} > tolerance {self.tol.logprob:g} for {r.precision}"
        return c

    # ---- the teacher-forced recomputation ------------------------------------------------
    @torch.no_grad()
    def recompute(self, rollouts: list[Rollout], key: BatchKey) -> Recomputed:
        """The teacher-forced recomputation of ``rollouts`` (batch ``key``) with the loaded weights."""
        if not rollouts:
            return Recomputed.empty()
        width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
        rows = self.rows_per_forward(width)
        return Recomputed.join([self._recompute_rows(rollouts[start:start + rows], key.digest())
                                for start in range(0, len(rollouts), rows)])

    def rows_per_forward(self, width: int) -> int:
        """Sequences of ``width`` tokens per teacher-forced forward, within ``logit_budget`` floats:
        the logits they make, or with the tiled head (which makes none) their trunk's activations,
        about ``TRUNK_FLOATS_PER_HIDDEN`` x the hidden size per token."""
        try:
            per_token = TRUNK_FLOATS_PER_HIDDEN * int(output_head(self.worker.lm)[0].shape[1])
        except TypeError:
            per_token = self._vocab()
        return max(1, self.logit_budget // (width * per_token))

    def _vocab(self) -> int:
        """Width of the logits (may exceed the tokenizer's vocabulary), from a one-token forward."""
        if self._logit_width is None:
            probe = torch.tensor([[self.worker.tokenizer.eos_id]], device=self.worker.device)
            self._logit_width = int(self.worker.lm.logits(probe, torch.ones_like(probe, dtype=torch.bool)).shape[-1])
        return self._logit_width

    def _recompute_rows(self, rollouts: list[Rollout], digest: bytes) -> Recomputed:
        """One forward over the distinct sequences (samples of a group often repeat), then per
        completion token only its CDF interval and log-prob (``rl/seeded.py``): by the tiled head
        (``rl/tiled_head.py``) where the model's head allows, else from the positions' logits."""
        w = self.worker
        distinct: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        which = [distinct.setdefault((tuple(r.prompt_ids), tuple(r.completion_ids)), len(distinct)) for r in rollouts]
        packed = pack(list(distinct), pad_id=w.tokenizer.pad_id, device=w.device)
        self.forwarded_rows += len(distinct)
        sizes = np.array([len(r.completion_ids) for r in rollouts])
        starts = np.cumsum(sizes) - sizes
        # the position that predicts each completion token, in its packed row
        pos = np.arange(sizes.sum()) - np.repeat(starts, sizes) + np.repeat([len(r.prompt_ids) - 1 for r in rollouts], sizes)
        row = np.repeat(which, sizes)
        tokens = torch.tensor([t for r in rollouts for t in r.completion_ids], device=w.device)
        try:
            head = output_head(w.lm)
        except TypeError:
            lo, hi, logp = self._from_logits(packed, row, pos, tokens)
        else:
            hidden, _ = hidden_states(w.lm, packed)
            h = hidden[torch.from_numpy(row).to(w.device), torch.from_numpy(pos).to(w.device)]
            lo, hi, logp = chosen_intervals(h, head, tokens, vocab=drawable(head[0].shape[0], w.tokenizer.vocab_size),
                                            temperature=self.sampling.temperature)
        u = torch.cat([uniforms(digest, [r.sample], len(r.completion_ids))[0] for r in rollouts])
        gap, closest = outside(u, lo, hi)
        over = beyond(u, lo, hi, self.tol)
        return Recomputed.of(gap=gap.cpu().numpy(), closest=closest.cpu().numpy(), logp=logp.cpu().numpy(),
                             over=over.cpu().numpy(), sizes=sizes,
                             claimed=np.array([x for r in rollouts for x in r.logprobs]))

    def _from_logits(self, packed: Packed, row: np.ndarray, pos: np.ndarray, tokens: torch.Tensor) -> Intervals:
        """The intervals from the logits of every position from the first predicting one on (for
        heads ``chosen_intervals`` cannot reproduce)."""
        w, temp = self.worker, self.sampling.temperature
        first = int(pos.min())  # no logits before the first completion token
        logits = w.lm.logits(packed.ids, packed.mask, last=packed.ids.shape[1] - first)
        rows = torch.from_numpy(row * logits.shape[1] + pos - first).to(w.device)
        vocab = drawable(logits, w.tokenizer.vocab_size)
        got = intervals(logits.flatten(0, 1), rows, tokens, temperature=temp, vocab=vocab, unshifted=True)
        if got is None:  # logits past +-80: again, with each row's maximum subtracted
            logits = w.lm.logits(packed.ids, packed.mask, last=packed.ids.shape[1] - first)
            got = intervals(logits.flatten(0, 1), rows, tokens, temperature=temp, vocab=vocab)
        return got


@dataclass
class Recomputed:
    """Per rollout: its largest token gap, its closest draw (smallest distance of a uniform to
    its token's interval boundary), the largest |claimed - recomputed| log-prob, our log-probs, and per token
    the gaps (to say which token failed)."""

    gap: np.ndarray
    closest: np.ndarray
    over: np.ndarray  # how far the largest gap lies past the token's tolerance (> 0: not the draw)
    claim_off: np.ndarray
    logprobs: list[list[float]]
    token_gaps: list[np.ndarray]

    @classmethod
    def of(cls, *, gap: np.ndarray, closest: np.ndarray, logp: np.ndarray, claimed: np.ndarray, over: np.ndarray,
           sizes: np.ndarray) -> Recomputed:
        starts = np.cumsum(sizes) - sizes
        flat = logp.astype(np.float64).tolist()
        return cls(gap=np.maximum.reduceat(gap, starts), closest=np.minimum.reduceat(closest, starts),
                   over=np.maximum.reduceat(over, starts),
                   claim_off=np.maximum.reduceat(np.abs(claimed - logp), starts),
                   logprobs=[flat[a:a + n] for a, n in zip(starts, sizes)], token_gaps=np.split(gap, starts[1:]))

    @classmethod
    def empty(cls) -> Recomputed:
        return cls(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), [], [])

    @classmethod
    def join(cls, parts: list[Recomputed]) -> Recomputed:
        return cls(gap=np.concatenate([p.gap for p in parts]), closest=np.concatenate([p.closest for p in parts]),
                   over=np.concatenate([p.over for p in parts]),
                   claim_off=np.concatenate([p.claim_off for p in parts]),
                   logprobs=[x for p in parts for x in p.logprobs], token_gaps=[x for p in parts for x in p.token_gaps])


def _termination(r: Rollout, *, eos: int, max_new: int) -> str:
    """Why the completion's end does not match its ``finished`` flag ("" if it does)."""
    c = r.completion_ids
    if len(c) > max_new:
        return f"{len(c)} tokens, more than max_new_tokens={max_new}"
    if r.finished and (c[-1] != eos or eos in c[:-1]):
        return "marked finished but does not end in its only EOS"
    if not r.finished and (eos in c or len(c) != max_new):
        return f"marked unfinished but has an EOS or is not max_new_tokens={max_new} long"
    return ""

