"""A tiny local Qwen2-architecture model (tied embeddings, BPE tokenizer trained on the task),
built once per test session (``conftest.py`` imports the fixture), and its task settings."""

from __future__ import annotations

import pytest
from helpers import locked, session_dir

from pulse_node.rl.config import task_config

#: single-digit addition: a model this small learns it in ~80 supervised steps (~35% held-out),
#: so GRPO groups get mixed rewards and the weights really move
HF_TASK = {"digits": 1, "eval_size": 20}
HF_SAMPLING = {"max_new_tokens": 3, "group_size": 4, "prompts_per_batch": 4}


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
    """Built once per run: the first worker builds it, the others wait for it and read it."""
    from pulse_node.testing.hf_models import build_hf_model

    root = session_dir(tmp_path_factory, "tiny-qwen2")
    with locked(root):
        if not (root / "built").exists():
            build_hf_model(root / "model", arch="qwen2", task=task_config(**HF_TASK), hidden=32,
                           vocab_size=384, pretrain_steps=80, pretrain_lr=1e-2)
            (root / "built").touch()
    return root / "model"
