"""A Hugging Face causal LM from a local directory: load, sample, one GRPO step, bad dirs."""

from __future__ import annotations

import pytest
import torch

from pulse_node.errors import DataError
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.config import GRPOConfig, ModelConfig, SamplingConfig, task_config
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source

pytestmark = pytest.mark.slow  # a Hugging Face model: transformers import and a model dir per module

CHARS = list("0123456789+-*=")


def save_tiny_hf(path) -> None:
    """A 2-layer Llama with a character WordLevel tokenizer, saved as a local model directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    fast.save_pretrained(path)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_hf(path)
    return path


def test_local_hf_model_samples_and_trains(hf_dir) -> None:
    task_cfg = task_config(digits=2, eval_size=10)
    policy = build_policy(ModelConfig(kind="hf", path=str(hf_dir), device="cpu"), task_cfg, seed=0)
    assert policy.tokenizer.encode("12+3=")[0] == 1 and policy.lm.context == 64
    sampling = SamplingConfig(max_new_tokens=4, group_size=4, prompts_per_batch=3)
    worker = RolloutWorker(policy, sampling)
    worker.set_weights(policy.bf16_state(), version=2)
    task = make_task_source(task_cfg)
    key = BatchKey("hf", 2, "peer", 0)
    a = worker.generate(assigned_problems(task, key, 3), key=key)
    b = worker.generate(assigned_problems(task, key, 3), key=key, rows_per_pass=5)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    assert all(r.version == 2 and max(r.completion_ids) < policy.tokenizer.vocab_size for r in a)
    for i, r in enumerate(a):
        r.reward = float(i % 2)
    learner = GRPOLearner(policy, GRPOConfig(lr=1e-2))
    stats = learner.step(a, current_version=2)
    assert stats["stepped"] == 1.0 and stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert 0 < stats["bf16_changed"] <= 1 and torch.isfinite(torch.tensor(stats["loss"]))
    assert 0.0 <= evaluate(policy, task.eval_set(), max_new_tokens=4) <= 1.0


def test_model_dir_without_weights(tmp_path, hf_dir) -> None:
    empty = tmp_path / "noweights"
    empty.mkdir()
    for f in hf_dir.iterdir():
        if not f.name.endswith(".safetensors"):
            (empty / f.name).write_bytes(f.read_bytes())
    with pytest.raises(DataError, match=f"{empty}.*safetensors"):
        build_policy(ModelConfig(kind="hf", path=str(empty), device="cpu"), task_config(), seed=0)
    with pytest.raises(DataError, match="not found"):
        build_policy(ModelConfig(kind="hf", path=str(tmp_path / "missing"), device="cpu"), task_config(), seed=0)


def test_corrupt_weights_are_a_data_error(tmp_path, hf_dir) -> None:
    bad = tmp_path / "corrupt"
    bad.mkdir()
    for f in hf_dir.iterdir():
        (bad / f.name).write_bytes(b"garbage" if f.name.endswith(".safetensors") else f.read_bytes())
    with pytest.raises(DataError, match=str(bad)):
        build_policy(ModelConfig(kind="hf", path=str(bad), device="cpu"), task_config(), seed=0)


def test_hf_sampler_compacts_its_cache_without_deprecated_calls(hf_dir) -> None:
    """The sampler uses the cache API transformers recommends (no FutureWarning or
    DeprecationWarning from our calls), and rows that finished leave the ``DynamicCache``
    without changing any rollout."""
    import warnings

    from pulse_node.rl.seeded import uniforms

    policy = build_policy(ModelConfig(kind="hf", path=str(hf_dir), device="cpu"), task_config(digits=2, eval_size=10), seed=0)
    worker = RolloutWorker(policy, SamplingConfig(max_new_tokens=12, group_size=4, prompts_per_batch=4))
    worker.set_weights(policy.bf16_state(), version=0)
    key = BatchKey("hf", 0, "peer", 1)
    prompts = [p for p in worker._encode(assigned_problems(make_task_source(task_config(digits=2, eval_size=10)), key, 4))
               for _ in range(4)]
    u = uniforms(key.digest(), range(16), 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        kept = worker._sample(prompts, u=u, compact=True)
        ref = worker._sample(prompts, u=u, compact=False)
        worker.greedy(assigned_problems(make_task_source(task_config(digits=2, eval_size=10)), key, 2))
    assert any(f and len(t) < 11 for t, f in zip(kept[0], kept[2]))  # some rows left early
    assert kept[0] == ref[0] and kept[2] == ref[2]
    assert [x for lp in kept[1] for x in lp] == pytest.approx([x for lp in ref[1] for x in lp], abs=1e-5)


def test_hf_static_cache_draws_what_the_dynamic_cache_draws(hf_dir) -> None:
    """``decode = "static"`` on a Hugging Face model (``transformers.StaticCache``, fixed-shape
    steps) and the same step compiled as one graph (dynamo's eager backend: the trace): the
    eager sampler's tokens, log-probs within 1e-6 (FP32)."""
    from pulse_node.rl.seeded import uniforms
    from pulse_node.rl.static_decode import StaticDecoder

    task_cfg = task_config(digits=2, eval_size=10)
    policy = build_policy(ModelConfig(kind="hf", path=str(hf_dir), device="cpu"), task_cfg, seed=0)
    sampling = SamplingConfig(max_new_tokens=12, group_size=4, prompts_per_batch=4)
    workers = {mode: RolloutWorker(policy, sampling, decode=mode) for mode in ("eager", "static", "compiled")}
    workers["compiled"].static = StaticDecoder(workers["compiled"].lm, device=policy.device, compiled=True,
                                               backend="eager")
    for w in workers.values():
        w.set_weights(policy.bf16_state(), version=0)
    key = BatchKey("hf", 0, "peer", 1)
    prompts = [p for p in workers["eager"]._encode(assigned_problems(make_task_source(task_cfg), key, 4))
               for _ in range(4)]
    u = uniforms(key.digest(), range(16), 12)
    ref = workers["eager"]._sample(prompts, u=u)
    assert any(f and len(t) < 11 for t, f in zip(ref[0], ref[2]))  # some rows ended early
    torch._dynamo.reset()
    for mode in ("static", "compiled"):
        got = workers[mode]._sample(prompts, u=u)
        assert got[0] == ref[0] and got[2] == ref[2], mode
        assert max(abs(a - b) for x, y in zip(got[1], ref[1]) for a, b in zip(x, y)) <= 1e-6, mode
