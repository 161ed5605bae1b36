"""Inference side: a rollout worker that generates on exactly the versioned BF16 weights.

The worker owns its own copy of the network. ``set_weights`` loads a BF16 State into it, held in
the worker's compute precision (``compute``: "fp32", the BF16 values upcast exactly, or "bf16"
(exact) or "fp16", as engines run). The batch declares that precision (``Rollout.precision``) and
trainers widen their checks by that precision's error in the logits (``rl/precision.py``). Generation is
batched (left padding, optionally ``rows_per_pass`` rows at a time), uses the KV cache (rows
that finished leave the batch and its cache), draws each token with the seeded sampler
(``rl/seeded.py``: one keyed uniform per token, made for all steps of a row up front, the draw on
the model's device), and records the behaviour log-prob of every sampled token (under the
temperature-scaled distribution, gathered on the device and moved to the host once) and the
weights' version.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from pulse_node.codec.inplace import Move
from pulse_node.codec.state import State
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.config import DecodeMode, Precision, SamplingConfig
from pulse_node.rl.liveweights import LiveWeights
from pulse_node.rl.models import HFLM, TinyLM
from pulse_node.rl.policy import Policy, check_prompts
from pulse_node.rl.precision import DTYPES
from pulse_node.rl.rewards import Reward, reward_for
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.seeded import draw, drawable, greedy, uniforms
from pulse_node.rl.static_decode import StaticDecoder
from pulse_node.rl.tasks import Problem, TaskSource
from pulse_node.rl.tokenizer import Tokenizer

EVAL_CHUNK = 256


class RolloutWorker:
    """Generates scored rollouts with the BF16 weights of one policy version."""

    def __init__(self, policy_like: Policy, sampling_cfg: SamplingConfig, *, reward_fn: Reward | None = None,
                 compute: Precision = "fp32", decode: DecodeMode = "eager") -> None:
        self.cfg, self.compute, self.decode = sampling_cfg, compute, decode
        self.tokenizer: Tokenizer = policy_like.tokenizer
        self.device = policy_like.device
        self.lm: TinyLM | HFLM = copy.copy(policy_like.lm)
        module = copy.deepcopy(policy_like.lm.module)
        # transformers wraps ``to`` with functools.wraps, whose stub does not bind ``self``
        self.lm.module = module.to(DTYPES[compute]).eval().requires_grad_(False)  # type: ignore[arg-type]
        self.reward_fn = reward_fn or reward_for(policy_like.task)
        self.version = -1
        self.loaded: State | None = None  # the State last loaded (two forks may share a version number)
        self.static = None if decode == "eager" else StaticDecoder(self.lm, device=self.device,
                                                                   compiled=decode == "compiled")

    def set_weights(self, state: State, version: int, *, changes: list[Move] | None = None) -> str:
        """Hold a BF16 State as policy ``version``: moved sparsely from the version held when it can
        (kept steps, the ``changes`` an in-place apply made, or a bitwise diff; ``rl/liveweights.py``),
        else loaded whole. Returns how ("kept", "moved", "advanced", "diffed", "loaded")."""
        live = getattr(self, "live", None)
        if live is None:
            live = self.live = LiveWeights(dict(self.lm.module.named_parameters()))
        how = live.set(state, version, changes=changes)
        self.version, self.loaded = int(version), state
        return how

    def _prompt_batch(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = True
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def _sample(self, prompts: list[list[int]], *, u: torch.Tensor | None, compact: bool = True
                ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Token ids, log-probs and finished flags: seeded draws (``u``: [rows, max_new] keyed
        uniforms, ``rl/seeded.py``), or greedy when ``u`` is None. Rows that finished leave the
        batch (``compact``); tokens and log-probs stay on the device until the end."""
        ids, mask = self._prompt_batch(prompts)
        u = u.to(self.device) if u is not None else None
        if self.static is not None:  # fixed shapes, every row to the end (rl/static_decode.py)
            toks, lps = self.static.run(ids, mask, u, max_new=self.cfg.max_new_tokens, pad_id=self.tokenizer.pad_id,
                                        eos_id=self.tokenizer.eos_id, vocab=self.tokenizer.vocab_size,
                                        temperature=self.cfg.temperature)
            return self._trim(toks.tolist(), lps.tolist())
        b, max_new, eos = len(prompts), self.cfg.max_new_tokens, self.tokenizer.eos_id
        logits, cache = self.lm.prefill(ids, mask, max_new)
        vocab = drawable(logits, self.tokenizer.vocab_size)
        toks = torch.full((b, max_new), self.tokenizer.pad_id, dtype=torch.long, device=self.device)
        lps = torch.zeros((b, max_new), dtype=torch.float32, device=self.device)
        live = torch.arange(b, device=self.device)  # the batch row of each row still decoding
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        for step in range(max_new):
            if u is None:
                tok, lp = greedy(logits, vocab=vocab)
            else:
                tok, lp = draw(logits, u[live, step], vocab=vocab, temperature=self.cfg.temperature)
            toks[live, step], lps[live, step] = tok, lp
            if step == max_new - 1:
                break
            going = tok != eos
            if not compact:  # the reference: finished rows stay, fed padding
                done = done | ~going
                if bool(done.all()):
                    break
                tok = torch.where(done, self.tokenizer.pad_id, tok)
            elif not bool(going.all()):
                keep = going.nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                live, tok, mask = live[keep], tok[keep], mask[keep]
                cache = self.lm.keep_rows(cache, keep)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits, cache = self.lm.decode(tok, mask, cache)
        return self._trim(toks.tolist(), lps.tolist())

    def _trim(self, toks: list[list[int]], lps: list[list[float]]
              ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        out_t: list[list[int]] = []
        out_l: list[list[float]] = []
        fin: list[bool] = []
        for t, lp in zip(toks, lps):
            n = t.index(self.tokenizer.eos_id) + 1 if self.tokenizer.eos_id in t else len(t)
            out_t.append(t[:n])
            out_l.append(lp[:n])
            fin.append(n <= len(t) and t[n - 1] == self.tokenizer.eos_id)
        return out_t, out_l, fin

    def _encode(self, problems: Sequence[Problem]) -> list[list[int]]:
        check_prompts(self.tokenizer, problems, context=self.lm.context,
                      max_new_tokens=self.cfg.max_new_tokens)
        return [self.tokenizer.encode(p.prompt) for p in problems]

    def generate(self, problems: Sequence[Problem], *, key: BatchKey,
                 rows_per_pass: int | None = None) -> list[Rollout]:
        """Batch ``key``: ``group_size`` scored rollouts per problem, drawn by the seeded sampler.

        ``rows_per_pass`` bounds how many rows are decoded together (memory); the rollouts are
        the same for any value, since each row's draws depend only on (key, sample, step).
        """
        if self.version < 0:
            raise RuntimeError("RolloutWorker.set_weights must be called before generate")
        if key.version != self.version:
            raise ValueError(f"batch key is for version {key.version}, the worker holds {self.version}")
        g = self.cfg.group_size
        encoded = self._encode(problems)
        prompts = [p for p in encoded for _ in range(g)]
        digest, step_rows = key.digest(), rows_per_pass or len(prompts)
        toks, lps, fin = [], [], []
        for start in range(0, len(prompts), step_rows):
            rows = range(start, min(start + step_rows, len(prompts)))
            t, lp, f = self._sample([prompts[i] for i in rows], u=uniforms(digest, rows, self.cfg.max_new_tokens))
            toks += t
            lps += lp
            fin += f
        return [self._rollout(problems[i // g], prompts[i], t, lp, f, key=key, sample=i)
                for i, (t, lp, f) in enumerate(zip(toks, lps, fin))]

    def generate_batch(self, task: TaskSource, key: BatchKey, *, rows_per_pass: int | None = None) -> list[Rollout]:
        """Batch ``key`` as trainers expect it: its assigned problems, answered by the seeded sampler."""
        problems = assigned_problems(task, key, self.cfg.prompts_per_batch)
        return self.generate(problems, key=key, rows_per_pass=rows_per_pass)

    def _rollout(self, prob: Problem, prompt: list[int], toks: list[int], lps: list[float], finished: bool,
                 *, key: BatchKey, sample: int) -> Rollout:
        text = self.tokenizer.decode(toks)
        return Rollout(prompt_ids=prompt, completion_ids=toks, logprobs=lps,
                       reward=float(self.reward_fn(text, prob.answer)), version=self.version,
                       problem_id=prob.id[:256], group_id=key.group_id(sample // self.cfg.group_size),
                       finished=finished, batch=key.batch, sample=sample, text=text, local=True,
                       precision=self.compute)

    def greedy(self, problems: Sequence[Problem]) -> list[str]:
        """Greedy completions (text), batched."""
        encoded = self._encode(problems)
        texts: list[str] = []
        for start in range(0, len(encoded), EVAL_CHUNK):
            toks, _, _ = self._sample(encoded[start:start + EVAL_CHUNK], u=None)
            texts.extend(self.tokenizer.decode(t) for t in toks)
        return texts
