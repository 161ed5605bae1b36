"""Chaos, short: a swarm whose data plane drops, duplicates, reorders, delays and corrupts
messages, with an inference node stopped and restarted mid-run. No corrupted state may ever be
used: every state an inference node applied must equal the trainers' state at that version.

(``bench/chaos.py`` runs the long version with more nodes, kills and a forging peer.)
"""

from __future__ import annotations

from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.node.faults import FaultRates, FaultyTransport
from tests.conftest import wait_for
from pulse_node.node.inprocess import InProcessSwarm
from tests.test_node_memory_swarm import _cfg, _status

RATES = FaultRates(drop=0.1, duplicate=0.1, reorder=0.1, delay=0.1, corrupt=0.05, max_delay_s=0.05,
                   spare_kinds=("loco",))


def test_faulty_links_and_restart_never_use_a_corrupt_state(tmp_path):
    faulty: dict[str, FaultyTransport] = {}

    def wrap(name, transport):
        faulty[name] = FaultyTransport(transport, RATES, seed=len(faulty) + 1)
        return faulty[name]

    swarm = InProcessSwarm(wrap=wrap)
    try:
        t1 = swarm.start("trainer-a", _cfg(TrainerConfig, tmp_path, "t1"))
        i1 = swarm.start("infer-a", _cfg(InferenceConfig, tmp_path, "i1"))
        i2 = swarm.start("infer-b", _cfg(InferenceConfig, tmp_path, "i2"))
        wait_for(lambda: _status(i2).get("version", -1) >= 3, timeout=240, what="infer-b at version 3")
        swarm.stop(i2)
        before = _status(i2)["version"]
        swarm.start("infer-b", _cfg(InferenceConfig, tmp_path, "i2"))
        wait_for(lambda: not swarm.errors and min(_status(i1).get("version", -1),
                                                  _status(i2).get("version", -1)) >= before + 4 or bool(swarm.errors),
                 timeout=240, what="both inference nodes 4 versions past the restart")
        top = max(_status(i1)["version"], _status(i2)["version"])
        wait_for(lambda: any(h["version"] >= top for h in _status(t1).get("history", [])), timeout=30,
                 what="trainer status")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    trainer = {h["version"]: h["state_hash"] for h in _status(t1)["history"]}
    for node in (i1, i2):
        applied = _status(node)["history"]
        assert applied
        bad = [h["version"] for h in applied if trainer[h["version"]] != h["state_hash"]]
        assert not bad, f"{node.name} used wrong states at versions {bad}"
    injected = sum(sum(f.faults.values()) for f in faulty.values())
    assert injected > 0, "no faults were injected"
