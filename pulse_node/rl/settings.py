"""The rollout settings a version declares: what every honest batch for it is made with.

A trainer puts ``rollout_settings(...)`` into the signed record of every version it publishes
(``VersionRecord.rollout_settings``): canonical JSON of the sampler rule, temperature,
``max_new_tokens``, group size, prompts per batch, batches per version and the task with its
parameters (a JSONL task by the SHA-256 of its files, not their paths, which differ between
machines). An inference node refuses to generate for a version whose declared settings differ
from its own config, and a trainer verifies a batch under its own settings, which are the ones
it declared. Torch-free.

A Hugging Face model is bound here too (``model``: hub id, commit and the digest of its config
and tokenizer files, ``rl/model_source.py``), with the chat-template choice resolved for that
model, the system prompt's SHA-256 and, for the ``math`` reward, the checker's version: a node
whose model differs (another digest, or another known commit) is refused with
``ModelMismatch``, which names both models; a trainer refuses to join such a swarm.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol

from pulse_node.errors import ConfigError, DataError
from pulse_node.rl.config import JsonlTaskConfig, ModelConfig, SamplingConfig, TaskConfig

#: names the draw rule of ``rl/seeded.py``; a new rule must change it
SAMPLER = "inverse-cdf/blake3/2"
MAX_SETTINGS_CHARS = 1024


class SettingsMismatch(ConfigError):
    """A version declares other rollout settings than this node's config."""


class ModelMismatch(SettingsMismatch):
    """A version was made with another model (files or revision) than this node loads."""


def _file_digest(path: str | None) -> str:
    if not path:
        return ""
    from pulse_node.rl.model_source import sha256_file  # hashlib.file_digest is 3.11+; we support 3.10

    try:
        return sha256_file(Path(path))
    except OSError as exc:
        raise DataError(f"{path}: cannot read the task file ({exc.strerror})") from None


def task_settings(task: TaskConfig) -> dict[str, object]:
    """The task part: every parameter that changes the problems or the reward."""
    out: dict[str, object] = task.model_dump(mode="json", exclude={"path", "eval_path", "system_prompt", "chat_template"})
    if isinstance(task, JsonlTaskConfig):
        out.update(data=_file_digest(task.path), eval_data=_file_digest(task.eval_path))
    if task.system_prompt:
        out["system_prompt"] = hashlib.sha256(task.system_prompt.encode()).hexdigest()
    from pulse_node.rl.rewards import checker_version

    if (checker := checker_version(task.reward)) is not None:
        out["checker"] = checker
    return out


def model_settings(model: ModelConfig, task: TaskConfig) -> dict[str, str | bool] | None:
    """The model part (None for the embedded tiny model, fixed by the ``model`` dimensions)."""
    if model.kind != "hf":
        return None
    from pulse_node.rl.model_source import model_identity, resolve_model, use_chat_template

    source = resolve_model(model.path or "", revision=model.revision)
    return {**model_identity(source), "chat": use_chat_template(task.chat_template, source)}


def rollout_settings(*, sampling: SamplingConfig, task: TaskConfig, batches_per_version: int,
                     model: ModelConfig | None = None) -> str:
    """Canonical JSON (sorted keys, no spaces) of the settings rollouts of a version depend on."""
    body: dict[str, object] = {"sampler": SAMPLER, "temperature": sampling.temperature,
            "max_new_tokens": sampling.max_new_tokens, "group_size": sampling.group_size,
            "prompts_per_batch": sampling.prompts_per_batch, "batches_per_version": batches_per_version,
            "task": task_settings(task)}
    identity = model_settings(model, task) if model is not None else None
    if identity is not None:
        body["model"] = identity
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SETTINGS_CHARS:
        raise ConfigError(f"rollout settings are {len(text)} characters, limit {MAX_SETTINGS_CHARS}")
    return text


class RolloutSections(Protocol):
    """The sections of a node config (any role's: they are shared) that rollouts depend on."""

    @property
    def model(self) -> ModelConfig: ...

    @property
    def task(self) -> TaskConfig: ...

    @property
    def sampling(self) -> SamplingConfig: ...

    @property
    def rollout_batches_per_version(self) -> int: ...


def settings_of(cfg: RolloutSections) -> str:
    """``rollout_settings`` of a node config (any role: the sections are shared)."""
    return rollout_settings(sampling=cfg.sampling, task=cfg.task, model=cfg.model,
                            batches_per_version=cfg.rollout_batches_per_version)


def describe_model(m: object) -> str:
    if not isinstance(m, dict):
        return "no model identity (the embedded tiny model, or a trainer from before model identities)"
    return (f"{m.get('id') or 'a local directory'} revision {m.get('revision') or '(unknown)'} "
            f"digest {str(m.get('digest', ''))[:16]}")


def check_model(theirs: object, ours: object, *, version: int) -> None:
    """``ModelMismatch`` naming both models unless the declared model is ours: same file digest,
    and the same commit where both know it."""
    if theirs == ours:
        return
    t = theirs if isinstance(theirs, dict) else {}
    o = ours if isinstance(ours, dict) else {}
    same = bool(t) and bool(o) and t.get("digest") == o.get("digest") and t.get("chat") == o.get("chat") \
        and not (t.get("revision") and o.get("revision") and t.get("revision") != o.get("revision"))
    if not same:
        raise ModelMismatch(f"version {version} was made with model {describe_model(theirs)}, but this node "
                            f"loads {describe_model(ours)}; use the swarm's model (model.path/model.revision)")


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
    if not isinstance(theirs, dict):
        raise SettingsMismatch(f"version {version} declares unreadable rollout settings")
    check_model(theirs.get("model"), ours.get("model"), version=version)
    diff = [f"{k}: version {theirs.get(k)!r} vs config {ours.get(k)!r}"
            for k in sorted(set(theirs) | set(ours)) if k != "model" and theirs.get(k) != ours.get(k)]
    if not diff:
        return  # the same model under another name (a local copy of the cached snapshot)
    raise SettingsMismatch(f"version {version} declares other rollout settings than this node's config "
                           f"({'; '.join(diff)}); use the run's sampling/task settings")


def check_declared_model(declared: str, mine: str, *, version: int) -> None:
    """``ModelMismatch`` if ``declared`` (a record's settings) names another model than ``mine``
    (what a trainer checks before adopting a peer's state), or names none it can read: empty,
    not JSON or not an object, which says nothing of the model the state was made with."""
    if declared == mine:
        return
    theirs = _settings_object(declared)
    if theirs is None:
        raise ModelMismatch(f"version {version} declares {'no' if not declared else 'unreadable'} rollout "
                            "settings, so not the model it was made with; use the swarm's model and a trainer "
                            "that declares its settings")
    ours = _settings_object(mine) or {}
    check_model(theirs.get("model"), ours.get("model"), version=version)


def _settings_object(text: str) -> dict[str, object] | None:
    """The settings as a JSON object, or None (empty, not JSON, or not an object)."""
    try:
        body = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None
