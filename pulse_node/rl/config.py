"""Pydantic configs of the RL workload (torch-free so the CLI can validate without torch).

One section per concern: ``model``, ``task``, ``sampling``, ``grpo``, ``verify``; ``SoloConfig``
wires them for ``pulse-node solo``. The trainer and inference roles reuse the same sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pydantic

from pulse_node.configload import StrictModel


def default_cache_dir() -> str:
    return str(Path.home() / ".cache" / "pulse-node")


class ModelConfig(StrictModel):
    """Which policy model: the embedded tiny transformer or a Hugging Face causal LM."""

    kind: Literal["tiny", "hf"] = "tiny"
    path: str | None = None  # kind="hf": a local directory or a hub id found in the local HF cache
    revision: str | None = None  # hub id: branch, tag or commit (default: the cached "main")
    d_model: int = pydantic.Field(64, ge=8, le=4096)
    n_layers: int = pydantic.Field(4, ge=1, le=64)
    n_heads: int = pydantic.Field(4, ge=1, le=64)
    max_len: int = pydantic.Field(32, ge=8, le=8192)  # context of the tiny model (tokens)
    init_std: float = pydantic.Field(0.02, gt=0)
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    cache_dir: str = pydantic.Field(default_factory=default_cache_dir)  # warm-start cache

    @pydantic.model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.kind == "hf" and not self.path:
            raise ValueError("model.kind='hf' needs model.path (a local directory or a hub id like Org/Name)")
        if self.d_model % self.n_heads:
            raise ValueError("model.d_model must be divisible by model.n_heads")
        return self


Precision = Literal["fp32", "bf16", "fp16"]
"""What a node computes logits in (``rl/precision.py``): a producer declares it in each batch."""
DecodeMode = Literal["eager", "static", "compiled"]
"""How a rollout worker decodes (``rl/static_decode.py``): "eager" (finished rows leave the batch),
"static" (a preallocated KV cache, fixed-shape steps) or "compiled" (static, the step compiled)."""
RewardName = Literal["exact", "gsm8k", "math"]
"""The rewards of ``rl/rewards.py`` (``REWARDS``): "exact" match, "gsm8k" numbers, "math" (math-verify)."""


class _TaskBase(StrictModel):
    """What every task has: its held-out split and how completions are rewarded."""

    eval_size: int = pydantic.Field(1000, ge=1)  # held-out problems (1000: +-1.5 points at 60%, see bench/RESULTS.md)
    reward: RewardName = "exact"
    format_reward: float = pydantic.Field(0.0, ge=0, lt=1)  # added when the completion ends in a
    # marked answer (\boxed{..} or #### ..); < 1 so only a correct answer scores >= 1 (solved)
    format_think: bool = False  # the format reward also needs a closed <think>...</think> first
    chat_template: bool | None = None  # hf: render prompts with the tokenizer's chat template
    # (None: on for an instruct/chat model whose tokenizer has one)
    system_prompt: str | None = pydantic.Field(None, max_length=4096)  # with chat_template
    seed: int = 1234  # fixes the held-out split; independent of the run seed


class ArithmeticTaskConfig(_TaskBase):
    """Procedural problems ``a<op>b=`` (``rl/tasks.ArithmeticTask``)."""

    kind: Literal["arithmetic"] = "arithmetic"
    digits: int = pydantic.Field(2, ge=1, le=9)  # max digits per operand
    min_digits: int = pydantic.Field(1, ge=1, le=9)
    ops: str = "+"  # subset of "+-*"

    @pydantic.model_validator(mode="after")
    def _check(self) -> ArithmeticTaskConfig:
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError("task.ops must be a non-empty subset of '+-*'")
        if self.min_digits > self.digits:
            raise ValueError("task.min_digits must be <= task.digits")
        return self


class JsonlTaskConfig(_TaskBase):
    """Problems of a local JSONL file (``rl/tasks.JsonlTask``)."""

    kind: Literal["jsonl"] = "jsonl"
    path: str = pydantic.Field(min_length=1)  # training problems
    eval_path: str | None = None  # held-out problems (default: split off `path`)


def _task_kind(value: object) -> str:
    """The union's tag: ``kind``, "arithmetic" when a TOML leaves it out."""
    kind = value.get("kind", "arithmetic") if isinstance(value, dict) else getattr(value, "kind", "arithmetic")
    return str(kind)


TaskConfig = Annotated[
    Annotated[ArithmeticTaskConfig, pydantic.Tag("arithmetic")] | Annotated[JsonlTaskConfig, pydantic.Tag("jsonl")],
    pydantic.Discriminator(_task_kind, custom_error_type="task_kind",
                           custom_error_message="task.kind must be 'arithmetic' or 'jsonl'"),
]
"""Where problems come from and how completions are rewarded: one config per ``task.kind``."""


class SamplingConfig(StrictModel):
    """Rollout generation on the inference side."""

    temperature: float = pydantic.Field(1.0, gt=0, le=10)
    max_new_tokens: int = pydantic.Field(5, ge=1, le=4096)
    group_size: int = pydantic.Field(8, ge=2, le=1024)  # completions per prompt (GRPO group)
    prompts_per_batch: int = pydantic.Field(32, ge=1, le=4096)


class VerifyConfig(StrictModel):
    """How a trainer checks the rollout batches peers send it, and how many it queues per sender.

    The tolerances are in the units of the check (``rl/verify.py``, ``rl/seeded.py``):
    ``score_tolerance`` in probability (how far a token's keyed uniform may lie outside its
    recomputed CDF interval), ``logprob_tolerance`` in nats. Measured (bench/rollout_honest.py,
    bench/RESULTS.md "Real shapes (issue 20)"): honest FP32 producers on other thread counts,
    rows per pass and batch shapes, a Hugging Face Llama and 256-token completions gave gap 0 and
    log-prob differences ~1e-6; CPU vs CUDA log-probs differ by ~1e-5 (issue 20), which moves an
    interval boundary by at most that much. A forger can raise a token's probability by at most
    ``2 * score_tolerance`` (absolute) per token. Raise them only for producers whose numerics
    differ more (``pulse-node rollouts check`` prints the gap seen).
    """

    score_tolerance: float = pydantic.Field(
        1e-4, gt=0, le=0.5, description="largest gap (how far a token's keyed uniform lies outside the token's "
        "recomputed CDF interval, in units of probability) still taken as the seeded draw")
    logprob_tolerance: float = pydantic.Field(
        0.02, gt=0, le=10, description="largest |claimed - recomputed| behaviour log-prob of a token (claims are "
        "only compared, never used)")
    compute: Precision = pydantic.Field(
        "fp32", description="what the trainer's verifier (and its own sampler) computes in: 'bf16' on a GPU saves "
        "memory and time; its rounding error is added to the producer's in the tolerances (rl/precision.py)")
    checker_cpu_s: float = pydantic.Field(
        16.0, gt=0, le=600, description="CPU seconds the answer checker (math-verify, rl/checker.py) may spend on "
        "one batch's rewards, each call at most 1 s; past it an answer scores 0 and is not compared with the claim")
    max_queued_batches: int = pydantic.Field(4, ge=1, le=4096, description="queued batches per sender "
                                             "(the oldest is dropped for a new one)")
    max_queued_bytes: int = pydantic.Field(16 << 20, ge=1 << 16, description="queued bytes per sender")
    max_total_bytes: int = pydantic.Field(256 << 20, ge=1 << 16, description="queued bytes of all senders "
                                          "(when full, the largest queue loses its oldest batch)")


class GRPOConfig(StrictModel):
    """The trainer: supervised warm start, then GRPO inner steps with AdamW on FP32 masters."""

    lr: float = pydantic.Field(3e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = pydantic.Field(0.0, ge=0)
    eps_low: float = pydantic.Field(0.2, ge=0, lt=1)
    eps_high: float = pydantic.Field(0.28, ge=0)
    max_staleness: int = pydantic.Field(0, ge=0)
    """Drop rollouts made more than this many versions before the one being trained. 0 (only
    rollouts of the current version, corrected within the round by the importance ratio): with 4
    the default swarm trained on 4-version-old rollouts and lost what it had learned
    (bench/RESULTS.md, "Why the default swarm forgot")."""
    max_grad_norm: float = pydantic.Field(1.0, gt=0)
    bf16_compute: bool = True  # forward on the BF16-rounded weights (straight-through)
    micro_batch_tokens: int = pydantic.Field(8192, ge=1)
    """Token budget of one micro-batch (rows x padded length): a step runs its batch in
    micro-batches of at most this many tokens (one row at least) and accumulates their
    gradients, so its memory is one micro-batch's whatever the batch size."""
    logit_chunk_tokens: int = pydantic.Field(1024, ge=1)
    """Completion positions whose logits exist at once (forward, and recomputed in backward)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them (less memory,
    about one more forward of compute)."""
    warmstart_steps: int = pydantic.Field(700, ge=0)
    warmstart_lr: float = pydantic.Field(5e-3, gt=0)
    warmstart_batch: int = pydantic.Field(64, ge=1)


class SoloConfig(StrictModel):
    """``pulse-node solo``: trainer and inference in one process, no network."""

    model: ModelConfig = ModelConfig()
    task: TaskConfig = pydantic.Field(default_factory=ArithmeticTaskConfig)
    sampling: SamplingConfig = SamplingConfig()
    grpo: GRPOConfig = GRPOConfig()
    seed: int = 0
    minutes: float = pydantic.Field(10.0, gt=0)  # wall-clock budget of the GRPO phase
    max_steps: int | None = pydantic.Field(None, ge=0)  # optional cap on optimizer steps
    sync_every: int = pydantic.Field(1, ge=1)  # push the BF16 copy to the worker every N steps
    eval_every: int = pydantic.Field(0, ge=0)  # 0 = only before and after
    threads: int | None = pydantic.Field(None, ge=1)  # torch intra-op threads (None = default)

    @pydantic.model_validator(mode="after")
    def _check(self) -> SoloConfig:
        if self.sync_every - 1 > self.grpo.max_staleness:
            raise ValueError(f"sync_every={self.sync_every} makes rollouts up to {self.sync_every - 1} versions old, "
                             f"but grpo.max_staleness={self.grpo.max_staleness} drops them: raise grpo.max_staleness")
        return self


def task_config(**fields: object) -> ArithmeticTaskConfig | JsonlTaskConfig:
    """The ``TaskConfig`` of ``fields`` (the variant ``kind`` names; "arithmetic" by default)."""
    return pydantic.TypeAdapter(TaskConfig).validate_python(fields)
