"""Our Hugging Face paths raise no deprecation warning: load, sample with ``RolloutWorker``,
one GRPO step, with FutureWarning and DeprecationWarning turned into errors.

transformers announces removals with FutureWarning (``past_key_values`` ... removed in 5.40) or
DeprecationWarning; one from our calls fails here, before an upgrade inside the allowed range
(pyproject.toml) breaks a node. Imports happen first: a third-party module's import-time
warnings are not our calls.
"""

from __future__ import annotations

import warnings

import pytest

from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.config import GRPOConfig, ModelConfig, SamplingConfig, task_config
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from tests.hf_fixtures import HF_TASK

pytestmark = pytest.mark.slow  # the session's local HF model (built once, ~5 s)


def test_hf_load_generate_and_grpo_step_raise_no_deprecation(hf_model_dir) -> None:
    import transformers  # noqa: F401  (import-time warnings of dependencies are not ours)
    from transformers import Qwen2ForCausalLM  # noqa: F401

    task_cfg = task_config(**HF_TASK)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        policy = build_policy(ModelConfig(kind="hf", path=str(hf_model_dir), device="cpu"), task_cfg, seed=0)
        worker = RolloutWorker(policy, SamplingConfig(max_new_tokens=4, group_size=4, prompts_per_batch=2))
        worker.set_weights(policy.bf16_state(), version=1)
        key = BatchKey("dep", 1, "peer", 0)
        rollouts = worker.generate(assigned_problems(make_task_source(task_cfg), key, 2), key=key)
        for i, r in enumerate(rollouts):
            r.reward = float(i % 2)
        stats = GRPOLearner(policy, GRPOConfig(lr=1e-3)).step(rollouts, current_version=1)
    assert stats["stepped"] == 1.0 and len(rollouts) == 8
