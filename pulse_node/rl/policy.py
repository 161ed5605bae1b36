"""The trainer's policy: FP32 master model + tokenizer, and its versioned BF16 cast.

``build_policy`` makes the embedded tiny model (seeded init, then the cached supervised warm
start) or loads a Hugging Face causal LM from a local directory or a hub id found in the local
HF cache (``rl/model_source.py``; ``local_files_only``, safetensors weights only), its tokenizer
rendering prompts through the chat template when the task asks for it (``rl/tokenizer.py``).
``Policy.bf16_state()`` is the State that gets versioned and shipped; ``Policy.load_bf16_state``
loads one into the FP32 masters (exact upcast).

What is versioned, and why: exactly the model's parameters, each once, under the name
``named_parameters()`` gives it. Tied weights are one parameter (a Qwen2 model with
``tie_word_embeddings`` has ``model.embed_tokens.weight`` and no ``lm_head.weight``: the head
is the same tensor), so a tied tensor is diffed, shipped and hashed once and every node that
loads it ties it the same way; the Hugging Face checkpoint layout omits the tied name too
(``commands/export.py``). Buffers are not versioned: the non-persistent ones (rotary
``inv_freq``, causal masks) are derived from the config, which every node loads from the same
model directory, and never trained. A model with persistent buffers (state that is saved but
not trained) is refused, because nodes could silently hold different values of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from pulse_node.codec.state import State
from pulse_node.errors import DataError
from pulse_node.rl.config import GRPOConfig, ModelConfig, TaskConfig
from pulse_node.rl.device import resolve_device
from pulse_node.rl.model_source import resolve_model, use_chat_template
from pulse_node.rl.models import HFLM, TinyGPT, TinyLM
from pulse_node.rl.tasks import Problem
from pulse_node.rl.tokenizer import CharTokenizer, HFTokenizer, Tokenizer
from pulse_node.torchbits import load_state, module_state


@dataclass
class Policy:
    """FP32 master model behind an ``LM`` adapter, with its tokenizer and task settings."""

    lm: TinyLM | HFLM
    tokenizer: Tokenizer
    task: TaskConfig
    device: torch.device

    @property
    def model(self) -> torch.nn.Module:
        return self.lm.module

    def bf16_state(self) -> State:
        """The BF16 cast of the master weights (the versioned compute copy)."""
        return module_state(self.model.named_parameters())

    def load_bf16_state(self, state: State) -> None:
        """Set the master weights to a BF16 state (BF16 -> FP32 is exact)."""
        load_state(dict(self.model.named_parameters()), state)


def build_tiny(model_cfg: ModelConfig, *, seed: int, device: torch.device) -> TinyLM:
    torch.manual_seed(seed)
    module = TinyGPT(vocab_size=CharTokenizer().vocab_size, d_model=model_cfg.d_model,
                     n_layers=model_cfg.n_layers, n_heads=model_cfg.n_heads,
                     max_len=model_cfg.max_len, init_std=model_cfg.init_std)
    return TinyLM(module.to(device))


def load_hf(model_cfg: ModelConfig, task_cfg: TaskConfig, *, device: torch.device) -> tuple[HFLM, HFTokenizer]:
    """A causal LM and tokenizer from ``model.path`` (directory or cached hub id); typed errors name it."""
    source = resolve_model(model_cfg.path or "", revision=model_cfg.revision)
    root = source.path
    if not any(root.glob("*.safetensors")):
        raise DataError(f"{root}: no *.safetensors weights in the model directory")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load in every node's log says nothing

    try:
        tok = AutoTokenizer.from_pretrained(root, local_files_only=True)
        module = AutoModelForCausalLM.from_pretrained(root, local_files_only=True, dtype=torch.float32,
                                                      use_safetensors=True)
    except Exception as exc:  # transformers/safetensors raise assorted types for bad files
        raise DataError(f"{root}: cannot load the model: {type(exc).__name__}: {exc}") from None
    try:
        tokenizer = HFTokenizer(tok, chat=use_chat_template(task_cfg.chat_template, source),
                                system_prompt=task_cfg.system_prompt)
    except ValueError as exc:
        raise DataError(f"{root}: {exc}") from None
    check_versionable(module, where=str(root))
    context = int(getattr(module.config, "max_position_embeddings", 2048) or 2048)
    # in place; transformers wraps ``to`` with functools.wraps, whose stub does not bind ``self``
    module.to(device)  # type: ignore[arg-type]
    return HFLM(module, context), tokenizer


def check_versionable(module: torch.nn.Module, *, where: str) -> None:
    """``DataError`` unless the parameters are the model's whole saved state (see the module doc)."""
    persistent = sorted({n for n, _ in module.named_buffers()} & set(module.state_dict()))
    if persistent:
        raise DataError(f"{where}: the model has persistent buffers ({', '.join(persistent[:3])}), state "
                        "that is saved but not versioned; pulse-node versions parameters only")


def build_policy(model_cfg: ModelConfig, task_cfg: TaskConfig, *, seed: int,
                 grpo_cfg: GRPOConfig | None = None, progress: bool = False) -> Policy:
    """The policy a trainer starts from (the tiny model comes warm-started, from cache if possible)."""
    device = resolve_device(model_cfg.device)
    if model_cfg.kind == "hf":
        lm, tokenizer = load_hf(model_cfg, task_cfg, device=device)
        return Policy(lm, tokenizer, task_cfg, device)
    policy = Policy(build_tiny(model_cfg, seed=seed, device=device), CharTokenizer(), task_cfg, device)
    from pulse_node.rl.warmstart import warm_start

    warm_start(policy, model_cfg=model_cfg, grpo_cfg=grpo_cfg or GRPOConfig(), seed=seed,
               progress=progress)
    return policy


def check_prompts(tokenizer: Tokenizer, problems: Iterable[Problem], *, context: int,
                  max_new_tokens: int) -> None:
    """Raise ``DataError`` (naming file:line) for a prompt that cannot be encoded or does not fit."""
    for p in problems:
        try:
            n = len(tokenizer.encode(p.prompt))
        except ValueError as exc:
            raise DataError(f"{p.source or p.id}: {exc}") from None
        if n + max_new_tokens > context:
            raise DataError(f"{p.source or p.id}: prompt is {n} tokens; with max_new_tokens="
                            f"{max_new_tokens} it exceeds the model context of {context}")
