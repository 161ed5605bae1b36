"""Local Hugging Face models for tests, benches and trying pulse-node without the hub.

``build_hf_model`` writes a model directory that ``model.kind = "hf"`` loads: a Qwen2- or
Llama-architecture causal LM made from a ``transformers`` config (seeded init, tied embeddings
by default, as small Qwen2 models have), a byte-level BPE tokenizer trained with the
``tokenizers`` library on the task's own text (``rl/tasks.py``: arithmetic problems or a JSONL
file), and optionally a short supervised pre-training on the task (the same teacher forcing as
the tiny model's warm start), so GRPO gets rewards to learn from. Nothing is downloaded.

    python -m pulse_node.testing.hf_models models/tiny-qwen2 --pretrain-steps 300
    pulse-node solo --config configs/hf-tiny-qwen2.toml
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.rl.config import GRPOConfig, ModelConfig, TaskConfig, task_config
from pulse_node.rl.tasks import make_task_source

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedTokenizerFast

ARCHS = ("qwen2", "llama")
EOS = "<|endoftext|>"


def task_texts(task_cfg: TaskConfig, *, n: int = 4000, seed: int = 0) -> list[str]:
    """Prompt + answer texts of the task, the corpus the tokenizer is trained on."""
    task = make_task_source(task_cfg)
    problems = task.all_problems() if hasattr(task, "all_problems") else \
        task.sample(n, random.Random(f"corpus:{seed}")) + task.eval_set()
    return [p.prompt + p.answer for p in problems]


def train_tokenizer(texts: list[str], *, vocab_size: int, arch: str = "qwen2") -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (the scheme of GPT-2, Llama 3 and Qwen2) trained on ``texts``,
    with ``<|endoftext|>`` as EOS and padding.

    It is trained with the pre-tokenizer the architecture's own tokenizer class applies when
    ``AutoTokenizer`` loads it back (transformers 5 rebuilds a ``qwen2`` model's tokenizer as
    ``Qwen2Tokenizer``, whose pre-tokenizer splits every digit), so the loaded tokenizer is the
    trained one; for ``llama`` the file's own (GPT-2) pre-tokenizer is used as is.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = (Qwen2Tokenizer().backend_tokenizer.pre_tokenizer if arch == "qwen2"
                         else pre_tokenizers.ByteLevel(add_prefix_space=False))
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if arch == "qwen2":
        bpe = json.loads(tok.to_str())["model"]
        # the merges go to tokenizers' BPE, which takes pairs; transformers annotates them list[str]
        return Qwen2Tokenizer(vocab=bpe["vocab"], merges=[tuple(m) for m in bpe["merges"]])  # type: ignore[misc]
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def model_config(arch: str, *, vocab_size: int, eos_id: int, hidden: int, layers: int, heads: int,
                 kv_heads: int, context: int, tie: bool) -> PreTrainedConfig:
    """A ``transformers`` config of the architecture ``arch`` ("qwen2" or "llama")."""
    from transformers import LlamaConfig, Qwen2Config

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; one of {', '.join(ARCHS)}")
    cls = Qwen2Config if arch == "qwen2" else LlamaConfig
    return cls(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
               num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
               max_position_embeddings=context, tie_word_embeddings=tie, eos_token_id=eos_id,
               pad_token_id=eos_id, bos_token_id=None)


def build_hf_model(out: str | Path, *, arch: str = "qwen2", task: TaskConfig | None = None,
                   hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                   context: int = 64, tie: bool = True, vocab_size: int = 300, seed: int = 0,
                   pretrain_steps: int = 0, pretrain_lr: float = 3e-3, progress: bool = False) -> Path:
    """Write a local model directory (config, safetensors weights, tokenizer) to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    task = task or task_config()
    out = Path(out)
    tokenizer = train_tokenizer(task_texts(task, seed=seed), vocab_size=vocab_size, arch=arch)
    cfg = model_config(arch, vocab_size=len(tokenizer), eos_id=tokenizer.eos_token_id, hidden=hidden,
                       layers=layers, heads=heads, kv_heads=kv_heads, context=context, tie=tie)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tokenizer.save_pretrained(out)
    if pretrain_steps:
        _pretrain(out, task, steps=pretrain_steps, lr=pretrain_lr, seed=seed, progress=progress)
    return out


def _pretrain(out: Path, task: TaskConfig, *, steps: int, lr: float, seed: int, progress: bool) -> None:
    """Teacher forcing on the task (``rl/warmstart.train_sft``), saved back into ``out``."""
    from pulse_node.rl.models import HFLM
    from pulse_node.rl.policy import build_policy
    from pulse_node.rl.warmstart import train_sft

    policy = build_policy(ModelConfig(kind="hf", path=str(out), device="cpu"), task, seed=seed)
    policy.model.train()
    train_sft(policy, GRPOConfig(warmstart_steps=steps, warmstart_lr=lr), seed=seed, progress=progress)
    if not isinstance(policy.lm, HFLM):
        raise TypeError(f"{out}: expected an HF model, got {type(policy.lm).__name__}")
    policy.lm.module.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pulse_node.testing.hf_models",
                                description="Write a small local HF model directory (no hub) for model.kind='hf'.")
    p.add_argument("out", help="directory to write (config.json, model.safetensors, tokenizer files)")
    p.add_argument("--arch", choices=ARCHS, default="qwen2")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=300, help="BPE vocabulary (>= 257: bytes + EOS)")
    p.add_argument("--untied", action="store_true", help="separate lm_head (default: tied embeddings)")
    p.add_argument("--task-jsonl", help="train the tokenizer (and pre-train) on this JSONL task instead of arithmetic")
    p.add_argument("--pretrain-steps", type=int, default=300, help="supervised steps on the task (0 = random init)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        print(f"{args.out}: exists and is not empty", file=sys.stderr)
        return 1
    task = task_config(kind="jsonl", path=args.task_jsonl, reward="gsm8k") if args.task_jsonl else task_config()
    build_hf_model(args.out, arch=args.arch, task=task, hidden=args.hidden, layers=args.layers, heads=args.heads,
                   kv_heads=args.kv_heads, context=args.context, tie=not args.untied, vocab_size=args.vocab_size,
                   seed=args.seed, pretrain_steps=args.pretrain_steps, progress=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
