"""Shared test helpers: predicate waits with deadlines, small configs for fast role tests."""

from __future__ import annotations

import time
from typing import Callable

import pytest

from tests.hf_fixtures import hf_model_dir  # noqa: F401 (session fixture: one local HF model for every test)


def wait_for(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def tiny_overrides(cache_dir: str) -> dict:
    """A model and RL loop small enough for multi-node tests on 2 CPU cores."""
    return {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "cache_dir": cache_dir},
        "task": {"digits": 2},
        "sampling": {"prompts_per_batch": 4, "group_size": 4, "max_new_tokens": 6},
    }
