"""Locally built HF models: the BPE tokenizer loads back as trained, tied and untied heads are
versioned as the parameters they are, persistent buffers are refused, and ``solo`` trains one."""

from __future__ import annotations

import pytest
import torch

from pulse_node.errors import DataError
from pulse_node.rl.config import ModelConfig, SamplingConfig, SoloConfig, task_config
from pulse_node.rl.policy import build_policy, check_versionable
from pulse_node.rl.solo import run_solo
from pulse_node.testing.hf_models import build_hf_model, task_texts, train_tokenizer
from tests.hf_fixtures import HF_SAMPLING, HF_TASK


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tokenizer_loads_back_as_trained(tmp_path, arch) -> None:
    """``AutoTokenizer`` rebuilds a qwen2 tokenizer with its own class; the ids must not change."""
    from transformers import AutoTokenizer

    texts = task_texts(task_config(kind="jsonl", path="configs/examples/gsm8k-sample.jsonl", eval_size=1,
                                  reward="gsm8k"))
    tok = train_tokenizer(texts, vocab_size=400, arch=arch)
    assert len(tok) == 400 and any(len(t.lstrip("Ġ")) > 2 for t in tok.tokenize(texts[0]))  # real merges
    build_hf_model(tmp_path / arch, arch=arch, task=task_config(kind="jsonl", path="configs/examples/gsm8k-sample.jsonl",
                                                                eval_size=1, reward="gsm8k"), vocab_size=400)
    loaded = AutoTokenizer.from_pretrained(tmp_path / arch)
    for text in texts:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text


def test_tied_and_untied_heads_are_versioned_once(tmp_path, hf_model_dir) -> None:
    tied = build_policy(ModelConfig(kind="hf", path=str(hf_model_dir), device="cpu"), task_config(**HF_TASK), seed=0)
    assert "model.embed_tokens.weight" in tied.bf16_state() and "lm_head.weight" not in tied.bf16_state()
    assert tied.model.lm_head.weight is tied.model.model.embed_tokens.weight
    assert not any("inv_freq" in n for n in tied.bf16_state())  # derived from the config, not versioned
    build_hf_model(tmp_path / "llama", arch="llama", task=task_config(**HF_TASK), tie=False)
    untied = build_policy(ModelConfig(kind="hf", path=str(tmp_path / "llama"), device="cpu"), task_config(**HF_TASK),
                          seed=0)
    state = untied.bf16_state()
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(state)
    assert set(state) == {n for n, _ in untied.model.named_parameters()}


def test_persistent_buffers_are_refused(hf_model_dir) -> None:
    policy = build_policy(ModelConfig(kind="hf", path=str(hf_model_dir), device="cpu"), task_config(**HF_TASK), seed=0)
    check_versionable(policy.model, where="ok")
    policy.model.model.register_buffer("step_count", torch.zeros(1))
    with pytest.raises(DataError, match="persistent buffers.*step_count"):
        check_versionable(policy.model, where="m")


def test_solo_trains_a_local_hf_model(hf_model_dir) -> None:
    cfg = SoloConfig(model=ModelConfig(kind="hf", path=str(hf_model_dir), device="cpu"), task=task_config(**HF_TASK),
                     sampling=SamplingConfig(**HF_SAMPLING), max_steps=3, minutes=5, threads=1)
    out = run_solo(cfg, progress=False)
    assert out["steps"] == 3 and out["rollouts"] == 3 * 4 * 4 and out["eval_problems"] == HF_TASK["eval_size"]
    assert 0.0 < out["eval_before"] < 1.0  # mixed rewards: GRPO has a signal
