"""A locally built Qwen2-architecture model (tied embeddings, BPE tokenizer) through a process swarm
whose trainers run on different numbers of processes.

Bootstrap, a trainer on 2 processes (``torchrun``, FSDP2 over gloo), a one-process trainer
(PULSELoCo rounds between the two), an inference node and a late inference joiner (the genesis
anchor, then one catch-up patch made on demand by a peer) as real ``pulse-node join`` processes.
Both trainers must publish the same state at every version (the sharded outer step gives the
same FP32 bits), every node must hold it, the weights must really move, and ``pulse-node
export`` of the late joiner's newest version and of an older version rebuilt from a trainer's
store must load back into transformers bit-identically. One swarm serves both to keep the
suite short.
"""

from __future__ import annotations

import json

import pytest
from helpers import wait_for

from pulse_node.cli import main
from pulse_node.config import SwarmConfig
from pulse_node.swarm.launcher import LocalSwarm
from tests.hf_fixtures import HF_SAMPLING, HF_TASK

pytestmark = pytest.mark.slow
SHARED = 3  # versions both trainers must publish together (the 2-process one starts later: torchrun)


@pytest.fixture
def swarm(tmp_path, hf_model_dir):
    cfg = SwarmConfig.model_validate({
        "trainers": 2, "trainer_ranks": [2], "inference": 1, "run_dir": str(tmp_path / "swarm"), "run_id": "hf-swarm",
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


def _history(status) -> dict[int, str]:
    return {h.version: h.state_hash for h in status.history} if status is not None else {}


def _loaded_hash(out) -> str:
    from transformers import AutoModelForCausalLM

    from pulse_node.codec.statehash import state_hash
    from pulse_node.torchbits import module_state

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return state_hash(module_state(model.named_parameters()))


def test_fsdp_and_one_process_trainers_agree_on_an_hf_model_late_joiner_and_export(swarm, tmp_path, capsys) -> None:
    trainer_0, trainer_1 = (c for c in swarm.children if c.role == "trainer")

    def published(child) -> dict[int, str]:
        swarm.check_alive()
        return _history(child.status())

    # the 2-process trainer may join after the other published a few versions alone: it adopts
    # that state, then both publish every version (each its own, from the same round)
    wait_for(lambda: len(published(trainer_0)) >= SHARED, timeout=300, interval=0.5,
             what=f"the 2-process trainer publishing {SHARED} versions")
    late = swarm.add_node("inference-late", "inference")
    target = max(published(trainer_1)) + 2
    wait_for(lambda: (swarm.check_alive() or True) and (s := late.status()) is not None and s.version >= target,
             timeout=240, interval=0.5, what=f"the late joiner at v{target}")
    swarm.stop()  # a still store to export from
    stats = {c.name: s for c, s in swarm.statuses()}
    assert stats["trainer-0"].ranks == 2 and stats["trainer-1"].ranks is None
    assert len(stats["trainer-0"].rank_peak_rss_mb) == 2
    fsdp, single = _history(stats["trainer-0"]), _history(stats["trainer-1"])
    # either trainer may publish genesis (the other adopts it); from the later start on, both
    # publish every version, and they agree on each
    first, last = max(min(fsdp), min(single)), min(max(fsdp), max(single))
    both = set(range(first + 1, last + 1))
    assert len(both) >= SHARED and both <= set(fsdp) & set(single), (sorted(fsdp), sorted(single))
    for v in set(fsdp) & set(single):
        assert single[v] == fsdp[v], f"the 2-process and the 1-process trainer disagree at version {v}"
    signed = single | fsdp
    for name in ("trainer-0", "trainer-1"):
        assert stats[name].contributors == 2, f"{name}: the last round did not average both trainers"
    assert len(set(signed.values())) == len(signed), "the weights did not change every version"
    for name in ("inference-0", "inference-late"):
        for v, h in _history(stats[name]).items():
            assert signed[v] == h, f"{name} holds another state at version {v}"
    late_now = stats["inference-late"]
    assert late_now.inference.catchups >= 1, "the late joiner did not use a catch-up patch"

    out = tmp_path / "export-late"
    assert main(["export", "--data-dir", str(late.data_dir), "-o", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == late_now.version
    assert _loaded_hash(out) == signed[late_now.version]
    v_fsdp = min(fsdp)  # rebuilt from the 2-process trainer's store: the anchor it adopted + patches
    assert main(["export", "--data-dir", str(trainer_0.data_dir), "--version", str(v_fsdp),
                 "-o", str(tmp_path / "export-fsdp")]) == 0
    assert _loaded_hash(tmp_path / "export-fsdp") == signed[v_fsdp]
