"""Where the embedded model's warm start is cached: a key over everything that changes its weights.

Torch-free (the torch release is read from the package's metadata), so ``pulse-node swarm`` tells
a cached warm start before it starts any process (``swarm/launcher.py``); ``rl/warmstart.py``
trains and loads it under the same key.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path

from pulse_node.rl.config import GRPOConfig, ModelConfig, TaskConfig

CODE_VERSION = "warmstart-2"
WARMSTART_THREADS = 1

#: the fields every task dumped while ``TaskConfig`` was one flat class: kept in the key so the
#: discriminated union (issue 31) finds the warm starts cached before it
_FLAT_TASK = {"kind": "arithmetic", "digits": 2, "min_digits": 1, "ops": "+", "path": None, "eval_path": None}


def torch_release() -> str:
    """The installed torch's release without its local tag (``2.13.0+cpu`` -> ``2.13.0``)."""
    return importlib.metadata.version("torch").split("+")[0]


def cache_key(policy_task: dict[str, object], model_cfg: ModelConfig, grpo_cfg: GRPOConfig, seed: int) -> str:
    model = model_cfg.model_dump(mode="json", exclude={"device", "cache_dir"})
    ws = {k: v for k, v in grpo_cfg.model_dump(mode="json").items() if k.startswith("warmstart")}
    blob = json.dumps({"code": CODE_VERSION, "model": model, "task": {**_FLAT_TASK, **policy_task}, "ws": ws,
                       "seed": seed, "torch": torch_release(), "threads": WARMSTART_THREADS},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cached_file(task: TaskConfig, *, model_cfg: ModelConfig, grpo_cfg: GRPOConfig, seed: int) -> Path:
    """The warm start's file in ``model.cache_dir`` (it may not exist yet)."""
    key = cache_key(task.model_dump(mode="json"), model_cfg, grpo_cfg, seed)
    return Path(model_cfg.cache_dir).expanduser() / f"warmstart-{key}.safetensors"
