"""Shared fixtures and session hooks of the tests; plain helpers are in ``helpers.py``.

Lanes: ``python -m pytest -m "not slow"`` is the day-to-day lane (well under 2 minutes alone);
tests marked ``slow`` (separate processes, docker-like swarms, in-process swarms of training
nodes, anything over ~5 s) run in CI's full ``python -m pytest -n 2 --dist loadfile`` (two
pytest-xdist workers taking whole files, longest first: ``pytest_collection_modifyitems``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import node_config, session_dir

from pulse_node.testing.contain_guard import contained, no_contained_bug  # noqa: F401 (fixtures: bugs stay loud)
from pulse_node.testing.inprocess import InProcessSwarm
from tests.hf_fixtures import hf_model_dir  # noqa: F401 (session fixture: one local HF model for every test)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Drop compiled codec kernels whose sources changed before any test loads one."""
    from pulse_node.codec.warmup import clear_stale_cache

    clear_stale_cache()


#: the files that take longest (the whole suite's ``--durations``, 2026-11-28), started first: with
#: ``-n 2 --dist loadfile`` a long file started last would run alone at the end
LONGEST_FIRST = ("test_node_chaos.py", "test_swarm_rerun.py", "test_swarm_processes.py", "test_hf_swarm.py",
                 "test_node_adversary.py", "test_net_dht_newcomers.py", "test_ops_compose.py",
                 "test_node_commit_reveal_swarm.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order files longest first (``LONGEST_FIRST``, then the other files with a slow test, then the
    rest), keeping each file's own order: the workers of ``pytest -n 2 --dist loadfile`` take files in
    this order, so the short ones fill in at the end instead of a long one running alone."""
    slow_files = {item.path.name for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST) + (0 if name in slow_files else 1)

    items[:] = [item for _, item in sorted(enumerate(items), key=lambda pair: (rank(pair[1]), pair[0]))]


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """Torch on one intra-op thread, as a node runs it by default (``torch_threads = 1``): with one
    thread per core, tiny models spend their time contending for the cores (the PULSELoCo
    harness test took 9-23 s instead of 1.2-1.5 s on 2 busy cores). Only if a test module
    imported torch: a torch-free run stays torch-free."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's one warm-start cache (``model.cache_dir``): each tiny model's supervised warm
    start is trained at most once per session, whichever tests, workers and processes need it
    (entries are written atomically; two workers needing one at once both train it)."""
    return session_dir(tmp_path_factory, "warmstart-cache")


@pytest.fixture
def node_cfg(tmp_path: Path, warm_cache: Path) -> Callable:
    """``node_cfg(TrainerConfig | InferenceConfig, name, **overrides)``: a tiny node config with its
    data dir ``tmp_path / name`` and the session's warm-start cache."""
    return lambda cls, name, **extra: node_config(cls, tmp_path, name, cache_dir=warm_cache, **extra)


@pytest.fixture
def inprocess_swarm():
    """An in-process swarm (nodes as threads on one in-memory hub), stopped after the test; no
    node may have raised."""
    swarm = InProcessSwarm()
    yield swarm
    swarm.stop_all()
    assert not swarm.errors, swarm.errors
