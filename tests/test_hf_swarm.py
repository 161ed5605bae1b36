"""A locally built Qwen2-architecture model (tied embeddings, BPE tokenizer) through a process swarm.

Bootstrap, two trainers (PULSELoCo rounds), an inference node and a late inference joiner (the
genesis anchor, then one catch-up patch made on demand by a peer) as real ``pulse-node join``
processes; every node must hold the trainers' state at every version it has, the weights must
really move, and ``pulse-node export`` of the late joiner's newest version and of an older
version rebuilt from a trainer's store must load back into transformers bit-identically.
"""

from __future__ import annotations

import json

import pytest

from pulse_node.cli import main
from pulse_node.config import SwarmConfig
from pulse_node.swarm.launcher import LocalSwarm
from tests.conftest import wait_for
from tests.hf_fixtures import HF_SAMPLING, HF_TASK, hf_model_dir  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
VERSIONS = 4


@pytest.fixture
def swarm(tmp_path, hf_model_dir):  # noqa: F811
    cfg = SwarmConfig.model_validate({
        "trainers": 2, "inference": 1, "versions": VERSIONS, "run_dir": str(tmp_path / "swarm"), "run_id": "hf-swarm",
        "model": {"kind": "hf", "path": str(hf_model_dir), "device": "cpu"}, "task": HF_TASK, "sampling": HF_SAMPLING,
        "grpo": {"lr": 1e-3}, "loco": {"inner_steps": 2, "deadline_s": 20}, "eval_every": 0,
        "chain": {"anchor_every": 1000, "catchup_min_gap": 2}})  # only genesis is an anchor: the late
    # joiner loads it and needs a catch-up patch to reach the head
    s = LocalSwarm(cfg, log=lambda m: None)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _history(status: dict) -> dict[int, str]:
    return {h["version"]: h["state_hash"] for h in status.get("history", [])}


def _loaded_hash(out) -> str:
    from transformers import AutoModelForCausalLM

    from pulse_node.codec.statehash import state_hash
    from pulse_node.torchbits import module_state

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return state_hash(module_state(model.named_parameters()))


def test_hf_model_through_a_process_swarm_with_late_joiner_and_export(swarm, tmp_path, capsys) -> None:
    def alive_and(pred) -> bool:
        swarm.check_alive()
        return pred()

    wait_for(lambda: alive_and(lambda: swarm.min_version() >= 2), timeout=300, interval=0.5, what="every node at v2")
    late = swarm.add_node("inference-late", "inference")
    wait_for(lambda: alive_and(lambda: late.status().get("version", -1) >= VERSIONS and swarm.min_version() >= VERSIONS),
             timeout=240, interval=0.5, what=f"every node, the late joiner too, at v{VERSIONS}")
    stats = {c.name: s for c, s in swarm.statuses()}
    trainers: dict[int, str] = {}
    for name in ("trainer-0", "trainer-1"):
        for v, h in _history(stats[name]).items():
            assert trainers.setdefault(v, h) == h, f"trainers disagree at version {v}"
    assert set(trainers) >= set(range(1, VERSIONS + 1)) and len(set(trainers.values())) == len(trainers), \
        "the weights did not change every version"
    for name in ("inference-0", "inference-late"):
        for v, h in _history(stats[name]).items():
            assert trainers[v] == h, f"{name} holds another state at version {v}"
    assert stats["inference-late"]["state_hash"] == trainers[VERSIONS]
    assert stats["inference-late"].get("catchups", 0) >= 1, "the late joiner did not use a catch-up patch"

    out = tmp_path / "export-late"
    assert main(["export", "--data-dir", str(late.data_dir), "-o", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == VERSIONS
    assert _loaded_hash(out) == trainers[VERSIONS]
    trainer_dir = swarm.root / "trainer-1"
    assert main(["export", "--data-dir", str(trainer_dir), "--version", "1", "-o", str(tmp_path / "export-v1")]) == 0
    assert _loaded_hash(tmp_path / "export-v1") == trainers[1]
