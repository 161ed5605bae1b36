"""TESTING ONLY: a trainer that cheats on purpose, selected by ``[faults]`` in a trainer's config.

``flip_advantages``: the trainer takes verified rollout batches as an honest one does, but trains
on them with every reward turned upside down (``1 - reward``, so every advantage negated: the
byzantine harness's ``advantage_flip``), and records the verified batches and its real (flipped)
gradients in its inner-step log: its commitments, payloads and answers all look honest, and only
a spot check that re-runs a step finds the gradient wrong (``trainer/recompute.py``). The role
installs it only when ``faults.advantage_flip`` is on (off by default) and says so at start.
"""

from __future__ import annotations

import dataclasses
import logging

from pulse_node.rl.rollout import Rollout
from pulse_node.trainer.engine import Engine, LocalEngine


def flip_advantages(engine: Engine, *, log: logging.Logger) -> None:
    """Make ``engine`` (a ``LocalEngine``) train on inverted advantages (module docstring)."""
    if not isinstance(engine, LocalEngine):
        raise ValueError("faults.advantage_flip needs a trainer on one process")
    log.warning("TESTING ONLY: faults.advantage_flip is on: this trainer trains on inverted advantages")
    local = engine

    def step(rollouts: list[Rollout], *, current_version: int, producer: str = "") -> dict[str, float]:
        flipped = [dataclasses.replace(r, reward=1.0 - r.reward) for r in rollouts]
        if local.inner_log is None:
            return local.learner.step(flipped, current_version=current_version)
        stats, norm = local.learner.gradient(flipped, current_version=current_version)
        local.inner_log.record(local.learner, rollouts, producer=producer, grad_norm=norm)  # commits the verified ones
        return local.learner.apply(stats, norm)

    engine.step = step  # type: ignore[method-assign]
