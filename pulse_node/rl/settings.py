"""The rollout settings a version declares: what every honest batch for it is made with.

A trainer puts ``rollout_settings(...)`` into the signed record of every version it publishes
(``VersionRecord.rollout_settings``): canonical JSON of the sampler rule, temperature,
``max_new_tokens``, group size, prompts per batch, batches per version and the task with its
parameters (a JSONL task by the SHA-256 of its files, not their paths, which differ between
machines). An inference node refuses to generate for a version whose declared settings differ
from its own config, and a trainer verifies a batch under its own settings, which are the ones
it declared. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pulse_node.errors import ConfigError, DataError
from pulse_node.rl.config import SamplingConfig, TaskConfig

#: names the draw rule of ``rl/seeded.py``; a new rule must change it
SAMPLER = "inverse-cdf/blake3/2"
MAX_SETTINGS_CHARS = 1024


class SettingsMismatch(ConfigError):
    """A version declares other rollout settings than this node's config."""


def _file_digest(path: str | None) -> str:
    if not path:
        return ""
    try:
        with Path(path).open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the task file ({exc.strerror})") from None


def task_settings(task: TaskConfig) -> dict:
    """The task part: every parameter that changes the problems or the reward."""
    out = task.model_dump(mode="json", exclude={"path", "eval_path"})
    if task.kind == "jsonl":
        out.update(data=_file_digest(task.path), eval_data=_file_digest(task.eval_path))
    return out


def rollout_settings(*, sampling: SamplingConfig, task: TaskConfig, batches_per_version: int) -> str:
    """Canonical JSON (sorted keys, no spaces) of the settings rollouts of a version depend on."""
    body = {"sampler": SAMPLER, "temperature": sampling.temperature,
            "max_new_tokens": sampling.max_new_tokens, "group_size": sampling.group_size,
            "prompts_per_batch": sampling.prompts_per_batch, "batches_per_version": batches_per_version,
            "task": task_settings(task)}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SETTINGS_CHARS:
        raise ConfigError(f"rollout settings are {len(text)} characters, limit {MAX_SETTINGS_CHARS}")
    return text


def settings_of(cfg) -> str:
    """``rollout_settings`` of a node config (any role: the sections are shared)."""
    return rollout_settings(sampling=cfg.sampling, task=cfg.task,
                            batches_per_version=cfg.rollout_batches_per_version)


def check_settings(declared: str, mine: str, *, version: int) -> None:
    """``SettingsMismatch`` naming the differing keys unless ``declared == mine``."""
    if declared == mine:
        return
    if not declared:
        raise SettingsMismatch(f"version {version} declares no rollout settings (made by an older trainer?)")
    try:
        theirs = json.loads(declared)
    except ValueError:
        raise SettingsMismatch(f"version {version} declares unreadable rollout settings") from None
    ours = json.loads(mine)
    diff = [f"{k}: version {theirs.get(k)!r} vs config {ours.get(k)!r}"
            for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
    raise SettingsMismatch(f"version {version} declares other rollout settings than this node's config "
                           f"({'; '.join(diff)}); use the run's sampling/task settings")
