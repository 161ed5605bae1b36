"""Where a Hugging Face model comes from, and its identity: a local directory or a hub id.

``model.path`` names either a directory (``./models/qwen``) or a hub id (``Qwen/Qwen2.5-0.5B-Instruct``,
optionally pinned by ``model.revision``: a branch, tag or commit hash). A hub id is resolved in
the local Hugging Face cache only (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``), never over the network: a swarm must not depend on every node
reaching a hub at the same moment. When the model is not cached the error says the one command
that caches it. A directory inside that cache (``models--Org--Name/snapshots/<commit>``) is
recognised as that hub id at that commit.

``model_identity`` is what a node binds into every version it signs (``rl/settings.py``): the
hub id and commit (when known) and a SHA-256 over ``config.json`` and the tokenizer files, the
files that decide how text becomes token ids and which architecture the weights fit. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pulse_node.errors import DataError

#: ``org/name``, as the hub spells repository ids (no ``..``, no leading or trailing separator)
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: files whose bytes decide the architecture and the prompt's token ids (absent ones are skipped)
IDENTITY_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
                  "chat_template.json")
_INSTRUCT = re.compile(r"instruct|chat|(^|[-_.])it($|[-_.])|sft|rlhf|dpo", re.IGNORECASE)


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: the local directory to load, and the hub id and commit when known."""

    path: Path
    hub_id: str = ""
    revision: str = ""  # the commit hash of a cached snapshot ("" for a plain directory)

    @property
    def name(self) -> str:
        return self.hub_id or self.path.name


def hub_cache_dir() -> Path:
    """The hub cache the environment names now (read at call time, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface")
    return Path(home).expanduser() / "hub"


def is_hub_id(text: str) -> bool:
    return bool(_HUB_ID.fullmatch(text)) and ".." not in text


def fetch_hint(hub_id: str, revision: str | None = None) -> str:
    """The command that caches ``hub_id`` (the ``hf`` CLI of huggingface_hub; older: huggingface-cli)."""
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {hub_id}{rev}  (older huggingface_hub: huggingface-cli download {hub_id}{rev})"


def _snapshot_identity(folder: Path) -> tuple[str, str]:
    """(hub id, commit) of a directory laid out as ``models--Org--Name/snapshots/<commit>``."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--") \
            and _COMMIT.fullmatch(parts[-1]):
        return parts[-3][len("models--"):].replace("--", "/"), parts[-1]
    return "", ""


def resolve_model(path: str, *, revision: str | None = None) -> ModelSource:
    """The model ``path`` names: an existing directory, else a hub id found in the local cache.

    ``DataError`` (with the command that fetches it) when neither; nothing is downloaded.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        hub_id, commit = _snapshot_identity(local)
        if revision and commit and revision != commit:
            raise DataError(f"{local}: is snapshot {commit} of {hub_id}, but model.revision={revision}")
        return ModelSource(path=local, hub_id=hub_id, revision=commit)
    if not is_hub_id(path):
        raise DataError(f"{path}: model directory not found (and not a hub id like Org/Name)")
    cache = hub_cache_dir()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(path, revision=revision, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        rev = f" at revision {revision}" if revision else ""
        raise DataError(f"model {path}{rev}: no such directory, and not in the local Hugging Face cache ({cache}) "
                        f"as a hub id; nodes never download at run time. Cache it once with: "
                        f"{fetch_hint(path, revision)}") from None
    return ModelSource(path=folder, hub_id=path, revision=folder.name if _COMMIT.fullmatch(folder.name) else "")


def files_digest(folder: Path) -> str:
    """SHA-256 over the names and bytes of the ``IDENTITY_FILES`` present in ``folder``."""
    h = hashlib.sha256(b"pulse/model-files/1\0")
    found = False
    for name in IDENTITY_FILES:
        f = folder / name
        if f.is_file():
            found = True
            h.update(f"{name}\0{sha256_file(f)}\n".encode())
    if not found:
        raise DataError(f"{folder}: no config.json or tokenizer files to identify the model by")
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_identity(source: ModelSource) -> dict[str, str]:
    """What versions bind: ``{"id", "revision", "digest"}`` ("" where unknown)."""
    return {"id": source.hub_id, "revision": source.revision, "digest": files_digest(source.path)}


def has_chat_template(folder: Path) -> bool:
    """Whether the tokenizer files in ``folder`` carry a chat template."""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and bool(cfg.get("chat_template"))


def use_chat_template(setting: bool | None, source: ModelSource) -> bool:
    """``task.chat_template`` resolved: explicit true/false, else on for an instruct/chat model
    (by its name) whose tokenizer has a template. ``DataError`` for true without a template."""
    has = has_chat_template(source.path)
    if setting is True and not has:
        raise DataError(f"{source.path}: task.chat_template = true, but the tokenizer has no chat template")
    if setting is not None:
        return setting
    return has and bool(_INSTRUCT.search(source.name))


def model_report(model_path: str, *, revision: str | None, chat_setting: bool | None) -> tuple[bool, str, str]:
    """(found, what a node would load, how to fix it) for ``pulse-node doctor``."""
    try:
        source = resolve_model(model_path, revision=revision)
        digest = files_digest(source.path)
        chat = use_chat_template(chat_setting, source)
    except DataError as exc:
        fix = (fetch_hint(model_path, revision) if is_hub_id(model_path) and not Path(model_path).exists()
               else "set model.path to a model directory or a cached hub id")
        return False, str(exc), fix
    name = source.hub_id or "a local directory"
    rev = source.revision or "(not a hub snapshot)"
    return True, (f"{name} revision {rev} at {source.path}; files digest {digest[:16]}; "
                  f"chat template {'on' if chat else 'off'}"), ""
