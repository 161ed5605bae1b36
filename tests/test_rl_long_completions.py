"""1,000-token completions of a local HF model: ``rollouts make`` -> ``rollouts check`` -> one
micro-batched GRPO step (issue 20).

The model is a random-init Llama built here (no hub) with a context of 1,088 tokens whose
weights make EOS improbable, so every completion runs to ``max_new_tokens``: one residual
dimension carries a large constant from every token embedding (after the final RMSNorm it is
~sqrt(hidden) at every position) and EOS's row of the (untied) head points against it, so its
logit is ~ -500 while the others stay near 0 (near-uniform draws over the rest).
"""

from __future__ import annotations

import json

import pytest
import torch

from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.cli import main
from pulse_node.commands.rollouts import check_batch, load_node_config
from pulse_node.net.dht.validator import peer_id_of
from pulse_node.rl.config import GRPOConfig, ModelConfig, task_config
from pulse_node.rl.grpo import GRPOLearner, micro_batches
from pulse_node.rl.policy import build_policy
from pulse_node.rl.settings import settings_of
from pulse_node.trainer.publisher import VersionPublisher

NEW = 1000
TASK = {"digits": 1, "eval_size": 20}


def long_writer(out) -> None:
    """Rewrite the model in ``out`` so that EOS is never drawn (see the module doc)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    eos = AutoTokenizer.from_pretrained(out).eos_token_id
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 10.0
        model.get_output_embeddings().weight[eos] = 0.0
        model.get_output_embeddings().weight[eos, 0] = -100.0
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A data dir holding version 0 of the long-writing model, its overrides and a producer key."""
    from pulse_node.config import InferenceConfig
    from pulse_node.configload import load_config
    from pulse_node.testing.hf_models import build_hf_model

    root = tmp_path_factory.mktemp("long")
    model_dir = build_hf_model(root / "model", arch="llama", task=task_config(**TASK), hidden=32, layers=2,
                               context=NEW + 88, tie=False, vocab_size=300)
    long_writer(model_dir)
    sets = {"model.kind": "hf", "model.path": str(model_dir), "model.device": "cpu", "task.digits": 1,
            "task.eval_size": 20, "sampling.max_new_tokens": NEW, "sampling.group_size": 2,
            "sampling.prompts_per_batch": 2, "rollout_batches_per_version": 1}
    args = [x for k, v in sets.items() for x in ("--set", f"{k}={json.dumps(v)}")]
    d = root / "node"
    cfg = load_config(InferenceConfig, None, args[1::2] + [f"data_dir={json.dumps(str(d))}"])
    policy = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
    with VersionStore(d / "store") as store:
        VersionPublisher(store, Identity.generate(), run_id=cfg.run_id, chain=cfg.chain,
                         rollout_settings=settings_of(cfg)).publish(policy.bf16_state())
    Identity.load_or_create(d / "producer.key")
    return d, args


@pytest.mark.slow
def test_thousand_token_completions_make_check_and_train(node, capsys) -> None:
    d, sets = node
    batch, key = d / "long.bin", d / "producer.key"
    assert main(["rollouts", "make", "--data-dir", str(d), "--identity", str(key), "-o", str(batch), *sets]) == 0
    assert "4 rollouts" in capsys.readouterr().out
    sender = peer_id_of(Identity.load(key))
    assert main(["rollouts", "check", "--data-dir", str(d), "--sender", sender, str(batch), "--json", *sets]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == 4 and all(x["verdict"] == "ok" for x in lines)

    cfg = load_node_config(None, sets[1::2], d)
    verdict = check_batch(cfg, sender=sender, data=batch.read_bytes())  # the trainer's re-scored rollouts
    rollouts = verdict.rollouts
    assert verdict.ok and [len(r.completion_ids) for r in rollouts] == [NEW] * 4
    assert all(r.local and not r.finished for r in rollouts)
    for i, r in enumerate(rollouts):  # a random model earns no reward: give each group a winner
        r.reward = float(i % 2)

    policy = build_policy(ModelConfig(kind="hf", path=cfg.model.path, device="cpu"), cfg.task, seed=0)
    with VersionStore(d / "store", readonly=True) as store:
        policy.load_bf16_state(store.load_state(0))
    grpo = GRPOConfig(micro_batch_tokens=2 * (NEW + 40), logit_chunk_tokens=256, activation_checkpointing=True)
    assert len(micro_batches(rollouts, budget=grpo.micro_batch_tokens)) == 2  # it accumulates
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    stats = GRPOLearner(policy, grpo, temperature=cfg.sampling.temperature).step(rollouts, current_version=0)
    assert stats["stepped"] == 1.0 and stats["tokens"] == 4 * NEW and stats["informative"] == 4
    # the behaviour log-probs are the trainer's own recomputation: the importance ratio is ~1
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3) and stats["clip_frac"] == 0.0
    assert torch.isfinite(torch.tensor(stats["loss"])) and stats["grad_norm"] > 0
    assert any(not torch.equal(before[n], p) for n, p in policy.model.named_parameters())
