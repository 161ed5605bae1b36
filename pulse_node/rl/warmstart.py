"""Supervised warm start of the embedded model, cached on disk keyed by a config hash.

Nodes of one local swarm share ``model.cache_dir``, so only the first one trains; the others
load the cached FP32 master weights (safetensors, written atomically). ``pulse-node swarm`` warms
up once before it starts any trainer (``python -m pulse_node.commands.warmup NODE_TOML``, its
progress on the terminal). The result is the same wherever it runs: it trains on
``WARMSTART_THREADS`` intra-op threads whatever the process uses (a CPU matmul's reduction order,
so its rounding, follows the thread count), with deterministic algorithms. The key covers
everything else that changes the result: model dims, task, warm-start settings, seed, torch
release, code version.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from pulse_node.codec.state import load_safetensors, save_safetensors_atomic
from pulse_node.errors import PatchError
from pulse_node.rl.batch import masked_mean, pack, token_logprobs
from pulse_node.rl.config import GRPOConfig, ModelConfig, TaskConfig
from pulse_node.rl.models import HFLM, TinyLM
from pulse_node.rl.tasks import Problem, make_task_source
from pulse_node.rl.tokenizer import Tokenizer
from pulse_node.rl.warmstart_key import CODE_VERSION, WARMSTART_THREADS, cached_file
from pulse_node.torchbits import load_state, module_state


class Learner(Protocol):
    """What a warm start reads of the ``rl.policy.Policy`` it trains (which imports this module)."""

    @property
    def lm(self) -> TinyLM | HFLM: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def task(self) -> TaskConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def model(self) -> torch.nn.Module: ...


def cache_path(policy: Learner, *, model_cfg: ModelConfig, grpo_cfg: GRPOConfig, seed: int) -> Path:
    return cached_file(policy.task, model_cfg=model_cfg, grpo_cfg=grpo_cfg, seed=seed)


def sft_loss(policy: Learner, problems: Sequence[Problem]) -> torch.Tensor:
    tok = policy.tokenizer
    pairs = [(tok.encode(p.prompt), tok.encode_target(p.answer)) for p in problems]
    packed = pack(pairs, pad_id=tok.pad_id, device=policy.device)
    return -masked_mean(token_logprobs(policy.lm, packed), packed.target)


def train_sft(policy: Learner, grpo_cfg: GRPOConfig, *, seed: int, progress: bool) -> None:
    """``warmstart_steps`` AdamW steps of teacher forcing on training problems."""
    task = make_task_source(policy.task)
    rng = random.Random(f"warmstart:{seed}")
    steps = grpo_cfg.warmstart_steps
    opt = torch.optim.AdamW(policy.model.parameters(), lr=grpo_cfg.warmstart_lr,
                            betas=(0.9, 0.95), weight_decay=0.0)
    t0, report_every = time.monotonic(), max(1, steps // 10)
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = grpo_cfg.warmstart_lr * min(1.0, step / max(1, steps // 10))
        loss = sft_loss(policy, task.sample(grpo_cfg.warmstart_batch, rng))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        opt.step()
        if progress and (step % report_every == 0 or step == steps):
            print(f"[warm start] step {step}/{steps} loss {loss.item():.3f} "
                  f"({time.monotonic() - t0:.0f}s)", file=sys.stderr, flush=True)


def warm_start(policy: Learner, *, model_cfg: ModelConfig, grpo_cfg: GRPOConfig, seed: int,
               progress: bool = False) -> Path | None:
    """Load the cached warm start or train and cache it; returns the cache file used."""
    if grpo_cfg.warmstart_steps == 0:
        return None
    path = cache_path(policy, model_cfg=model_cfg, grpo_cfg=grpo_cfg, seed=seed)
    named = dict(policy.model.named_parameters())
    if path.exists():
        try:
            state = load_safetensors(path)
            if {k: (t.dtype, t.shape) for k, t in state.items()} != {
                    k: ("F32", tuple(p.shape)) for k, p in named.items()}:
                raise PatchError("tensor names or shapes differ from the model")
            load_state(named, state)
            if progress:
                print(f"[warm start] loaded cached weights {path}", file=sys.stderr, flush=True)
            return path
        except (PatchError, KeyError, RuntimeError) as exc:
            print(f"[warm start] ignoring unusable cache {path}: {exc}", file=sys.stderr)
    if progress:
        print(f"[warm start] training {grpo_cfg.warmstart_steps} steps (cached at {path})",
              file=sys.stderr, flush=True)
    policy.model.train()
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(WARMSTART_THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        train_sft(policy, grpo_cfg, seed=seed, progress=progress)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    save_safetensors_atomic(module_state(policy.model.named_parameters(), cast=None), path,
                            metadata={"kind": "pulse-node warm start", "code": CODE_VERSION})
    return path

