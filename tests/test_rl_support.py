"""Shared builders for the RL tests (no tests here): tiny dims so each test runs in seconds."""

from __future__ import annotations

from pathlib import Path

from pulse_node.rl.config import GRPOConfig, ModelConfig, SamplingConfig, SoloConfig, TaskConfig


def tiny_solo(tmp_path: Path, **grpo: object) -> SoloConfig:
    return SoloConfig(
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=24, device="cpu",
                          cache_dir=str(tmp_path / "cache")),
        task=TaskConfig(digits=2, eval_size=20),
        sampling=SamplingConfig(max_new_tokens=4, group_size=4, prompts_per_batch=4),
        grpo=GRPOConfig(**({"warmstart_steps": 0, "lr": 1e-2} | grpo)),
        minutes=1.0, max_steps=2, threads=1,
    )
