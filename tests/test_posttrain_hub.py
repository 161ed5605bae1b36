"""Post-training a model named by its hub id: a local model in the HF cache layout, with a chat
template, on a GSM8K-format task: ``solo``, ``rollouts make``/``check``, and a node on another
revision refused with both models named."""

from __future__ import annotations

import json

import pytest

from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.cli import main
from pulse_node.config import InferenceConfig
from pulse_node.configload import load_config
from pulse_node.net.dht.validator import peer_id_of
from pulse_node.rl.config import GRPOConfig, TaskConfig, task_config
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rewards import reward_for
from pulse_node.rl.rollout import decode_rollouts
from pulse_node.rl.settings import settings_of
from pulse_node.rl.tasks import make_task_source
from pulse_node.trainer.publisher import VersionPublisher

pytestmark = pytest.mark.slow  # a Hugging Face model built and pre-trained per module (~15-25 s)

HUB_ID = "Org/Tiny-Instruct"
REV_A, REV_B = "a" * 40, "b" * 40


def gsm8k_rows() -> list[dict]:
    """Single-digit additions written as GSM8K lines (a question; a worked answer ending in #### N)."""
    return [{"question": f"What is {a} plus {b}?", "answer": f"{a} plus {b} is {a}+{b}={a + b}.\n#### {a + b}"}
            for a in range(10) for b in range(10)]


def pretrain(model_dir, task: TaskConfig, steps: int = 150) -> None:
    """Teacher forcing on the task's chat-rendered prompts, so some sampled answers are right."""
    from pulse_node.rl.config import ModelConfig
    from pulse_node.rl.warmstart import train_sft

    policy = build_policy(ModelConfig(kind="hf", path=str(model_dir), device="cpu"), task, seed=0)
    policy.model.train()
    train_sft(policy, GRPOConfig(warmstart_steps=steps, warmstart_lr=1e-2), seed=0, progress=False)
    policy.model.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """HF_HOME with ``Org/Tiny-Instruct`` cached at two commits (main = A), and the task file."""
    from pulse_node.testing.hf_cache import add_chat_template, put_in_hub_cache
    from pulse_node.testing.hf_models import build_hf_model

    root = tmp_path_factory.mktemp("posttrain")
    task_file = root / "gsm8k.jsonl"
    task_file.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows()))
    task = task_config(kind="jsonl", path=str(task_file), reward="gsm8k", eval_size=8)
    model = build_hf_model(root / "built", task=task, hidden=32, vocab_size=384, context=1280)
    add_chat_template(model)
    pretrain(model, task.model_copy(update={"chat_template": True}))
    home = root / "hf-home"
    put_in_hub_cache(model, home / "hub", HUB_ID, commit=REV_B, ref=None)
    put_in_hub_cache(model, home / "hub", HUB_ID, commit=REV_A)
    return {"home": home, "task": task_file, "snapshot": home / "hub" / "models--Org--Tiny-Instruct"}


@pytest.fixture()
def hf_home(hub, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(hub["home"]))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


def sets(hub, *extra: str, new_tokens: int = 12, node: bool = True) -> list[str]:
    pairs = ["model.kind=hf", f"model.path={HUB_ID}", "task.kind=jsonl", f"task.path={hub['task']}",
             "task.reward=gsm8k", "task.eval_size=8", "sampling.prompts_per_batch=4", "sampling.group_size=4",
             f"sampling.max_new_tokens={new_tokens}", *extra]
    pairs += ["rollout_batches_per_version=2", "torch_threads=1"] if node else []
    return [x for p in pairs for x in ("--set", p)]


def node_dir(tmp_path, hub, *extra: str, new_tokens: int = 12, babble: bool = False):
    """A data dir holding version 0 published with these settings, and a producer key; with
    ``babble`` version 0 is a random model that (almost) never emits EOS."""
    pairs = sets(hub, *extra, new_tokens=new_tokens)[1::2]
    cfg = load_config(InferenceConfig, None, pairs + [f"data_dir={json.dumps(str(tmp_path))}"])
    policy = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
    if babble:
        import torch

        torch.manual_seed(0)
        with torch.no_grad():  # tied head: large random rows, a zero EOS row -> EOS logit ~30 sigma below the top
            emb = policy.model.get_input_embeddings().weight
            emb.normal_(0.0, 2.0)
            emb[policy.tokenizer.eos_id] = 0.0
    with VersionStore(tmp_path / "store") as store:
        VersionPublisher(store, Identity.generate(), run_id=cfg.run_id, chain=cfg.chain,
                         rollout_settings=settings_of(cfg)).publish(policy.bf16_state())
    key = tmp_path / "producer.key"  # a fixed producer: its peer id picks the batch's prompts and draws
    key.write_bytes(Identity.from_private_bytes(bytes(range(32))).private_pem())
    key.chmod(0o600)
    return cfg, policy


def test_solo_on_a_hub_id_with_chat_template_and_gsm8k_checker(hf_home, capsys) -> None:
    args = ["solo", "--json", "--quiet", *sets(hf_home, node=False), "--set", "max_steps=2", "--set", "minutes=1",
            "--set", "threads=1"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["steps"] == 2 and summary["rollouts"] == 32 and summary["eval_problems"] == 8


def test_rollouts_make_and_check_with_the_checker_and_rendered_prompts(hf_home, tmp_path, capsys) -> None:
    cfg, policy = node_dir(tmp_path, hf_home)
    assert policy.tokenizer.chat and str(policy.model.name_or_path).endswith(REV_A)  # main -> A
    batch = tmp_path / "batch.bin"
    assert main(["rollouts", "make", "--data-dir", str(tmp_path), "--identity", str(tmp_path / "producer.key"),
                 "-o", str(batch), *sets(hf_home)]) == 0
    sender = peer_id_of(Identity.load(tmp_path / "producer.key"))
    code = main(["rollouts", "check", "--data-dir", str(tmp_path), "--sender", sender, str(batch), *sets(hf_home)])
    out = capsys.readouterr().out
    assert code == 0 and "batch: accepted" in out
    rollouts = decode_rollouts(batch.read_bytes())
    task = make_task_source(cfg.task)
    answers = {p.id: p.answer for p in task.all_problems()}
    score = reward_for(cfg.task)
    tok = policy.tokenizer
    for r in rollouts:  # the reward is the checker's verdict on the decoded completion
        assert r.reward == score(tok.decode(r.completion_ids), answers[r.problem_id])
        prompt = tok.tok.decode(r.prompt_ids)
        assert prompt.startswith("<|im_start|>user\n") and prompt.endswith("<|im_start|>assistant\n")
    assert sum(r.reward for r in rollouts) > 0  # pre-trained enough that some answers are right


def test_a_node_on_another_revision_refuses_naming_both(hf_home, tmp_path, capsys) -> None:
    node_dir(tmp_path, hf_home)  # the swarm's versions: revision A (the cached main)
    code = main(["rollouts", "make", "--data-dir", str(tmp_path), "--identity", str(tmp_path / "producer.key"),
                 "-o", str(tmp_path / "x"), *sets(hf_home, f"model.revision={REV_B}")])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "x").exists()
    assert f"made with model {HUB_ID} revision {REV_A}" in err and f"loads {HUB_ID} revision {REV_B}" in err


def test_long_completions_flow_through_make_and_check(hf_home, tmp_path, capsys) -> None:
    node_dir(tmp_path, hf_home, "sampling.prompts_per_batch=1", "sampling.group_size=2", new_tokens=1024,
             babble=True)
    more = sets(hf_home, "sampling.prompts_per_batch=1", "sampling.group_size=2", new_tokens=1024)
    batch = tmp_path / "long.bin"
    assert main(["rollouts", "make", "--data-dir", str(tmp_path), "--identity", str(tmp_path / "producer.key"),
                 "-o", str(batch), *more]) == 0
    sender = peer_id_of(Identity.load(tmp_path / "producer.key"))
    assert main(["rollouts", "check", "--data-dir", str(tmp_path), "--sender", sender, str(batch), *more]) == 0
    assert [len(r.completion_ids) for r in decode_rollouts(batch.read_bytes())] == [1024, 1024]


def test_export_of_a_hub_model_renders_prompts_as_the_swarm_did(hf_home, tmp_path) -> None:
    from transformers import AutoTokenizer

    _, policy = node_dir(tmp_path / "node", hf_home)
    out = tmp_path / "exported"
    assert main(["export", "--data-dir", str(tmp_path / "node"), "-o", str(out), *sets(hf_home)]) == 0
    exported = AutoTokenizer.from_pretrained(out, local_files_only=True)
    question = gsm8k_rows()[0]["question"]
    text = exported.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                        add_generation_prompt=True)
    assert text == policy.tokenizer.render(question) and question in text


def test_system_prompt_and_explicit_chat_template_switch(hf_home) -> None:
    from pulse_node.rl.config import ModelConfig

    model = ModelConfig(kind="hf", path=HUB_ID, device="cpu")
    task = task_config(kind="jsonl", path=str(hf_home["task"]), reward="gsm8k", eval_size=8)
    q = gsm8k_rows()[5]["question"]
    with_system = build_policy(model, task.model_copy(update={"system_prompt": "Be brief."}), seed=0).tokenizer
    assert with_system.render(q) == f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n" \
        "<|im_start|>assistant\n"
    raw = build_policy(model, task.model_copy(update={"chat_template": False}), seed=0).tokenizer
    assert raw.render(q) == q and raw.encode(q) != with_system.encode(q)


def test_a_trainer_on_another_revision_refuses_to_join(hf_home, tmp_path) -> None:
    from helpers import wait_for

    from pulse_node.config import TrainerConfig
    from pulse_node.testing.inprocess import InProcessSwarm, node_version

    def trainer(name: str, **model) -> TrainerConfig:
        return TrainerConfig.model_validate({
            "data_dir": str(tmp_path / name), "seed": 3, "genesis_wait_s": 1.0, "rollout_wait_s": 0.5,
            "eval_every": 0, "torch_threads": 1, "model": {"kind": "hf", "path": HUB_ID, "device": "cpu", **model},
            "task": {"kind": "jsonl", "path": str(hf_home["task"]), "reward": "gsm8k", "eval_size": 8},
            "sampling": {"prompts_per_batch": 2, "group_size": 2, "max_new_tokens": 4},
            "grpo": {"warmstart_steps": 0}, "loco": {"inner_steps": 2, "deadline_s": 20}})

    swarm = InProcessSwarm()
    try:
        first = swarm.start("trainer-a", trainer("a"))
        wait_for(lambda: node_version(first) >= 0, timeout=120, what="the first trainer's genesis")
        swarm.start("trainer-b", trainer("b", revision=REV_B))
        wait_for(lambda: swarm.errors, timeout=120, what="the second trainer to refuse")
    finally:
        swarm.stop_all()
    assert len(swarm.errors) == 1 and swarm.errors[0].startswith("trainer-b: ModelMismatch")
    assert f"made with model {HUB_ID} revision {REV_A}" in swarm.errors[0]
    assert f"loads {HUB_ID} revision {REV_B}" in swarm.errors[0]
