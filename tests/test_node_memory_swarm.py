"""Role logic end to end over the in-memory transport: 2 trainers, 2 inference nodes as threads.

Every inference node must hold exactly the trainers' state at every version, rollouts must
reach the trainers, and a node that joins late must catch up from its peers.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.node.runtime import run_node
from pulse_node.chain.serving import store_resolver
from pulse_node.node.transport import MemoryHub
from tests.conftest import tiny_overrides, wait_for


class MemorySwarm:
    """Starts nodes as threads on one MemoryHub and stops them all."""

    def __init__(self, tmp: Path, wrap=None) -> None:
        self.hub = MemoryHub()
        self.wrap = wrap or (lambda name, transport: transport)
        self.tmp = tmp
        self.nodes: list[tuple[threading.Thread, threading.Event, Path]] = []
        self.errors: list[BaseException] = []

    def factory(self, name: str):
        def make(cfg, identity, store_root):
            return self.wrap(name, self.hub.join(name, store_resolver(store_root)))
        return make

    def start(self, name: str, cfg) -> Path:
        stop = threading.Event()

        def target() -> None:
            try:
                run_node(cfg, self.factory(name), stop=stop, install_signals=False)
            except BaseException as exc:  # surfaced by the test, with its traceback
                import traceback

                self.errors.append(f"{name}: {exc!r}\n{traceback.format_exc()}")

        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self.nodes.append((t, stop, Path(cfg.data_dir)))
        return Path(cfg.data_dir)

    def stop(self, data_dir: Path) -> None:
        """Stop one node (its thread returns and releases its store)."""
        for t, stop, d in self.nodes:
            if d == data_dir:
                stop.set()
                t.join(timeout=60)

    def stop_all(self) -> None:
        for _, stop, _ in self.nodes:
            stop.set()
        for t, _, _ in self.nodes:
            t.join(timeout=30)


def _status(data_dir: Path) -> dict:
    import json

    try:
        return json.loads((data_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture
def swarm(tmp_path):
    s = MemorySwarm(tmp_path)
    yield s
    s.stop_all()
    assert not s.errors, s.errors


def _cfg(cls, tmp: Path, name: str, **extra):
    base = tiny_overrides(str(tmp / "cache"))
    base.update(data_dir=str(tmp / name), seed=3, **extra)
    if cls is TrainerConfig:
        base.update(grpo={"warmstart_steps": 30, "lr": 1e-3}, loco={"inner_steps": 2, "deadline_s": 20},
                    rollout_wait_s=0.5, eval_every=0, genesis_wait_s=1.0)
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
