"""Inference side: a rollout worker that generates on exactly the versioned BF16 weights.

The worker owns its own copy of the network. ``set_weights`` loads a BF16 State; on CPU the
values are held upcast to FP32 (BF16 -> FP32 is exact, and CPU BF16 matmuls are slow), on CUDA
the copy is kept in BF16. Generation is batched (left padding), uses the KV cache, samples at
``sampling.temperature`` with a seeded generator, and records the behaviour log-prob of every
sampled token (under the temperature-scaled distribution) and the weights' version.
"""

from __future__ import annotations

import copy
import random
from typing import Callable, Sequence

import torch

from pulse_node.codec.state import State
from pulse_node.rl.config import SamplingConfig
from pulse_node.rl.models import HFLM, TinyLM
from pulse_node.rl.policy import check_prompts
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.tasks import Problem, reward
from pulse_node.rl.tokenizer import Tokenizer
from pulse_node.torchbits import load_state

EVAL_CHUNK = 256


class RolloutWorker:
    """Generates scored rollouts with the BF16 weights of one policy version."""

    def __init__(self, policy_like, sampling_cfg: SamplingConfig, *,
                 reward_fn: Callable[[str, str], float] | None = None) -> None:
        self.cfg = sampling_cfg
        self.tokenizer: Tokenizer = policy_like.tokenizer
        self.device = policy_like.device
        self.lm: TinyLM | HFLM = copy.copy(policy_like.lm)
        self.lm.module = copy.deepcopy(policy_like.lm.module).eval().requires_grad_(False)
        if self.device.type == "cuda":
            self.lm.module.to(torch.bfloat16)
        self.reward_fn = reward_fn or reward(policy_like.task.reward)
        self.version = -1

    def set_weights(self, state: State, version: int) -> None:
        """Load a BF16 State (all parameters) as policy ``version``."""
        load_state(dict(self.lm.module.named_parameters()), state)
        self.version = int(version)

    def _prompt_batch(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = True
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def _sample(self, prompts: list[list[int]], *, temperature: float | None,
                gen: torch.Generator | None) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Token ids, log-probs and finished flags; ``temperature=None`` means greedy."""
        ids, mask = self._prompt_batch(prompts)
        b, max_new = len(prompts), self.cfg.max_new_tokens
        logits, cache = self.lm.prefill(ids, mask, max_new)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        toks, lps = [], []
        for step in range(max_new):
            logp = torch.log_softmax(logits.float() / (temperature or 1.0), dim=-1)
            if temperature is None:
                tok = logp.argmax(-1)
            else:
                tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, self.tokenizer.pad_id), tok)
            toks.append(tok)
            lps.append(logp.gather(-1, tok[:, None]).squeeze(-1))
            done = done | (tok == self.tokenizer.eos_id)
            if bool(done.all()) or step == max_new - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits, cache = self.lm.decode(tok, mask, cache)
        return self._trim(torch.stack(toks, 1).tolist(), torch.stack(lps, 1).tolist())

    def _trim(self, toks: list[list[int]], lps: list[list[float]]) -> tuple[list, list, list]:
        out_t, out_l, fin = [], [], []
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

    def generate(self, problems: Sequence[Problem], *, rng: random.Random) -> list[Rollout]:
        """``group_size`` scored rollouts per problem, tagged with this worker's version."""
        if self.version < 0:
            raise RuntimeError("RolloutWorker.set_weights must be called before generate")
        g = self.cfg.group_size
        encoded = self._encode(problems)
        prompts = [p for p in encoded for _ in range(g)]
        gen = torch.Generator(device=self.device).manual_seed(rng.getrandbits(63))
        toks, lps, fin = self._sample(prompts, temperature=self.cfg.temperature, gen=gen)
        nonce = rng.getrandbits(32)
        out = []
        for i, (t, lp, f) in enumerate(zip(toks, lps, fin)):
            prob = problems[i // g]
            text = self.tokenizer.decode(t)
            out.append(Rollout(prompt_ids=prompts[i], completion_ids=t, logprobs=lp,
                               reward=float(self.reward_fn(text, prob.answer)), version=self.version,
                               problem_id=prob.id[:256], group_id=f"{self.version}:{nonce:08x}:{i // g}",
                               finished=f, text=text))
        return out

    def greedy(self, problems: Sequence[Problem]) -> list[str]:
        """Greedy completions (text), batched."""
        encoded = self._encode(problems)
        texts: list[str] = []
        for start in range(0, len(encoded), EVAL_CHUNK):
            toks, _, _ = self._sample(encoded[start:start + EVAL_CHUNK], temperature=None, gen=None)
            texts.extend(self.tokenizer.decode(t) for t in toks)
        return texts
