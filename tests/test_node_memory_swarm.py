"""Role logic end to end over the in-memory transport: 2 trainers, 2 inference nodes as threads.

Every inference node must hold exactly the trainers' state at every version, rollouts must
reach the trainers, a node that joins late must catch up from its peers, and a node that was
down for k versions must recover them with one catch-up patch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pulse_node.chain.store import VersionStore
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.rl.verify import STRIKES
from pulse_node.testing.inprocess import InProcessSwarm, read_status
from tests.conftest import tiny_overrides, wait_for


_status = read_status


@pytest.fixture
def swarm(tmp_path):
    s = InProcessSwarm()
    yield s
    s.stop_all()
    assert not s.errors, s.errors


def _cfg(cls, tmp: Path, name: str, **extra):
    base = tiny_overrides(str(tmp / "cache"))
    base.update(data_dir=str(tmp / name), seed=3)
    if cls is TrainerConfig:
        base.update(grpo={"warmstart_steps": 30, "lr": 1e-3}, loco={"inner_steps": 2, "deadline_s": 20},
                    rollout_wait_s=0.5, eval_every=0, genesis_wait_s=1.0)
    base.update(extra)
    return cls.model_validate(base)


def test_two_trainers_two_inference_bit_identical(swarm, tmp_path):
    t1 = swarm.start("trainer-a", _cfg(TrainerConfig, tmp_path, "t1"))
    t2 = swarm.start("trainer-b", _cfg(TrainerConfig, tmp_path, "t2"))
    i1 = swarm.start("infer-a", _cfg(InferenceConfig, tmp_path, "i1"))
    wait_for(lambda: _status(i1).get("version", -1) >= 3, timeout=240, what="inference node at version 3")
    late = swarm.start("infer-late", _cfg(InferenceConfig, tmp_path, "i2"))
    wait_for(lambda: _status(late).get("version", -1) >= 5, timeout=240, what="late joiner at version 5")
    top = _status(late)["version"]
    wait_for(lambda: all(any(h["version"] >= top for h in _status(t).get("history", [])) for t in (t1, t2)),
             timeout=30, what="trainer status files")
    trainers = [_status(t1), _status(t2)]
    by_version = {}
    for st in trainers:
        for h in st["history"]:
            by_version.setdefault(h["version"], set()).add(h["state_hash"])
    assert all(len(hashes) == 1 for hashes in by_version.values()), "trainers diverged"
    for node in (i1, late):
        for h in _status(node)["history"]:
            assert {h["state_hash"]} == by_version[h["version"]]
    assert _status(t1).get("rollouts_in", 0) + _status(t2).get("rollouts_in", 0) > 0, "no rollouts reached trainers"
    senders = [s for t in (t1, t2) for s in _status(t).get("rollout_senders", {}).values()]
    assert sum(s["accepted"] for s in senders) > 0, "no verified batch was accepted"
    assert not {r for s in senders for r in s["rejected"]} & STRIKES, f"honest batches refused: {senders}"


def test_trainer_leaving_does_not_stall_and_returning_trainer_stays_identical(swarm, tmp_path):
    """The remaining trainer goes on past the deadline; the returning one adopts the swarm's state
    and, from its first round after that re-sync on, is bit-identical to the other at every version
    (the contributor agreement, ``trainer/agreement.py``, leaves no room for a fork)."""
    fast = {"loco": {"inner_steps": 2, "deadline_s": 3, "decision_wait_s": 2}}
    t1 = swarm.start("trainer-a", _cfg(TrainerConfig, tmp_path, "t1", **fast))
    t2 = swarm.start("trainer-b", _cfg(TrainerConfig, tmp_path, "t2", **fast))
    wait_for(lambda: min(_status(t1).get("version", -1), _status(t2).get("version", -1)) >= 3,
             timeout=240, what="both trainers at version 3")
    swarm.stop(t2)  # leaves mid-run
    left_at = _status(t1)["version"]
    wait_for(lambda: _status(t1).get("version", -1) >= left_at + 3, timeout=120,
             what="the remaining trainer to go on alone")
    returned_at = _status(t1)["version"]
    (t2 / "status.json").unlink()  # so only the returning run's status is read below
    swarm.start("trainer-b", _cfg(TrainerConfig, tmp_path, "t2", **fast))
    wait_for(lambda: _status(t2).get("resyncs", 0) >= 1, timeout=120, what="the returning trainer to re-sync")
    assert _status(t2)["version"] >= returned_at, "the returning trainer did not adopt the current version"
    wait_for(lambda: len(_status(t2).get("history", [])) >= 3, timeout=120, what="3 rounds after the re-sync")
    hashes = lambda d: {h["version"]: (h["state_hash"], h["global_hash"]) for h in _status(d)["history"]}  # noqa: E731
    back = hashes(t2)  # every version it published since it returned
    wait_for(lambda: set(back) <= set(hashes(t1)), timeout=30, what="the other trainer's status")
    stayed = hashes(t1)
    assert sorted(back) == list(range(min(back), min(back) + len(back))), "the returning trainer skipped versions"
    assert all(stayed[v] == h for v, h in back.items()), "trainers differ after the re-sync"
    assert _status(t2)["resyncs"] == 1 and not _status(t2).get("forks"), "the returning trainer forked again"


def test_node_k_versions_behind_recovers_with_one_catchup_patch(swarm, tmp_path):
    """A node that was down while k versions were published comes back with ONE catch-up patch
    (made on demand by a peer that holds both states), smaller than the k patches, bit-identical."""
    last = 12
    t1 = swarm.start("trainer-a", _cfg(TrainerConfig, tmp_path, "t1", max_versions=last))
    i1 = swarm.start("infer-a", _cfg(InferenceConfig, tmp_path, "i1"))
    i2 = swarm.start("infer-b", _cfg(InferenceConfig, tmp_path, "i2"))
    wait_for(lambda: _status(i2).get("version", -1) >= 0, timeout=240, what="the lagging node holding a version")
    swarm.stop(i2)
    with VersionStore(i2 / "store", readonly=True) as store:
        base = store.head().version
    wait_for(lambda: _status(i1).get("version", -1) >= last, timeout=240, what="a peer holding the last version")
    assert last - base >= 4, f"the node fell only {last - base} versions behind"
    (i2 / "status.json").unlink()
    swarm.start("infer-b", _cfg(InferenceConfig, tmp_path, "i2"))
    wait_for(lambda: _status(i2).get("version", -1) >= last, timeout=120, what="the returning node at the head")
    back = _status(i2)
    trainer = {h["version"]: h for h in _status(t1)["history"]}
    summed = sum(trainer[v]["patch_bytes"] for v in range(base + 1, last + 1))
    assert back["catchups"] == 1 and back["patches_applied"] == 0, back
    assert 0 < back["catchup_bytes_total"] < summed, (back["catchup_bytes_total"], summed)
    assert back["state_hash"] == trainer[last]["state_hash"], "the returning node holds a different state"


def test_inference_node_refuses_a_version_declaring_other_rollout_settings(swarm, tmp_path):
    """The trainer's records declare temperature 1.0; an inference node configured for 0.5 holds the
    versions but sends no rollouts, and says why in its status."""
    sampling = tiny_overrides("")["sampling"] | {"temperature": 0.5}
    swarm.start("trainer-a", _cfg(TrainerConfig, tmp_path, "t1", max_versions=2))
    node = swarm.start("infer-a", _cfg(InferenceConfig, tmp_path, "i1", sampling=sampling))
    wait_for(lambda: _status(node).get("version", -1) >= 1 and _status(node).get("rollout_settings_error"),
             timeout=240, what="the inference node to hold a version and refuse it")
    st = _status(node)
    assert "temperature: version 1.0 vs config 0.5" in st["rollout_settings_error"]
    assert not st.get("rollouts_sent")
