"""``pulse-node rollouts make`` / ``check`` on a node data dir: the operator's view of verification."""

from __future__ import annotations

import json

import pytest

from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.cli import main
from pulse_node.config import InferenceConfig
from pulse_node.configload import load_config
from pulse_node.net.dht.validator import peer_id_of
from pulse_node.rl.config import GRPOConfig
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import decode_rollouts, encode_rollouts
from pulse_node.rl.settings import settings_of
from pulse_node.trainer.publisher import VersionPublisher

SETS = ["--set", "model.d_model=32", "--set", "model.n_layers=2", "--set", "model.n_heads=2",
        "--set", "sampling.prompts_per_batch=4", "--set", "sampling.group_size=4",
        "--set", "sampling.max_new_tokens=6", "--set", "rollout_batches_per_version=2"]


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory):
    """A data dir holding version 0, published with the run's rollout settings, and a producer key."""
    d = tmp_path_factory.mktemp("node")
    cfg = load_config(InferenceConfig, None, SETS[1::2] + [f"data_dir={json.dumps(str(d))}"])
    policy = build_policy(cfg.model, cfg.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
    with VersionStore(d / "store") as store:
        VersionPublisher(store, Identity.generate(), run_id=cfg.run_id, chain=cfg.chain,
                         rollout_settings=settings_of(cfg)).publish(policy.bf16_state())
    Identity.load_or_create(d / "producer.key")
    return d


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["rollouts", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_make_then_check_as_the_sender_and_as_another(node_dir, capsys) -> None:
    batch = node_dir / "batch.bin"
    code, out, err = _cli(capsys, "make", "--data-dir", str(node_dir), "--identity", str(node_dir / "producer.key"),
                          "--batch", "1", "-o", str(batch), *SETS)
    assert code == 0, err
    assert "batch 1 of version 0, 16 rollouts" in out
    sender = peer_id_of(Identity.load(node_dir / "producer.key"))
    code, out, _ = _cli(capsys, "check", "--data-dir", str(node_dir), "--sender", sender, str(batch), "--json", *SETS)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == 16 and all(x["verdict"] == "ok" and x["gap"] == 0.0 for x in lines)
    code, out, _ = _cli(capsys, "check", "--data-dir", str(node_dir), "--sender", "someone-else", str(batch), *SETS)
    assert code == 1 and out.count("REFUSED prompt_not_assigned") == 16 and "batch: refused" in out


def test_check_names_the_refused_rollout_and_the_reason(node_dir, capsys) -> None:
    batch = node_dir / "batch0.bin"
    assert _cli(capsys, "make", "--data-dir", str(node_dir), "--identity", str(node_dir / "producer.key"),
                "-o", str(batch), *SETS)[0] == 0
    rollouts = decode_rollouts(batch.read_bytes())
    rollouts[3].reward = 1.0 - rollouts[3].reward
    batch.write_bytes(encode_rollouts(rollouts))
    sender = peer_id_of(Identity.load(node_dir / "producer.key"))
    code, out, _ = _cli(capsys, "check", "--data-dir", str(node_dir), "--sender", sender, str(batch), *SETS)
    assert code == 1 and "sample 3: REFUSED wrong_reward" in out and out.count(": ok") == 15
    batch.write_bytes(b"\x93garbage")
    code, out, _ = _cli(capsys, "check", "--data-dir", str(node_dir), "--sender", sender, str(batch), *SETS)
    assert code == 1 and "REFUSED malformed" in out


def test_other_settings_and_bad_batch_index_are_clear_errors(node_dir, capsys) -> None:
    code, _, err = _cli(capsys, "make", "--data-dir", str(node_dir), "--identity", str(node_dir / "producer.key"),
                        "-o", str(node_dir / "x"), *SETS, "--set", "sampling.temperature=0.5")
    assert code == 1 and "declares other rollout settings" in err and "temperature" in err
    code, _, err = _cli(capsys, "make", "--data-dir", str(node_dir), "--identity", str(node_dir / "producer.key"),
                        "-o", str(node_dir / "x"), "--batch", "2", *SETS)
    assert code == 1 and "batch indices 0..1" in err and not (node_dir / "x").exists()
