"""``pulse-node export``: a version held by a node, as a Hugging Face checkpoint directory.

    pulse-node export --data-dir pulse-swarm/inference-0 -o exported/          # the newest version
    pulse-node export --data-dir DIR --version 12 -o OUT --config configs/trainer.toml

The version is rebuilt from the node's store (an anchor or the current state, then patches),
every state hash checked against its signed record (``chain/store.py``); the store is opened
read-only, so a running node's store can be exported and is never changed. The model comes
from the node's config (``--config``, default ``<data-dir>/node.toml`` as ``pulse-node swarm``
writes it): a local HF model's config and tokenizer, or the embedded tiny model as GPT-2
(``rl/hf_checkpoint.py``). ``AutoModelForCausalLM.from_pretrained(OUT)`` then loads weights
bit-identical to the version.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.commands.common import add_config_flags, flag_overrides
from pulse_node.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from pulse_node.chain.record import VersionRecord
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.state import State
    from pulse_node.config import InferenceConfig, TrainerConfig


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write a version as a Hugging Face checkpoint directory",
                       description="Rebuild a version from a node's store (verified against its signed records) "
                       "and write it as a directory AutoModelForCausalLM.from_pretrained loads.")
    p.add_argument("--data-dir", required=True, help="the node's data dir (holds store/)")
    p.add_argument("--version", type=int, help="version to export (default: the newest the store rebuilds)")
    p.add_argument("-o", "--out", required=True, help="new directory to write (must not exist, or be empty)")
    p.add_argument("--max-shard-size", default="5GB", help="split weights into shards above this size (default 5GB)")
    add_config_flags(p)
    p.set_defaults(run=run)


def resolve_config(args: argparse.Namespace) -> TrainerConfig | InferenceConfig:
    """The node's config: ``--config``, else ``<data-dir>/node.toml`` if present, else defaults."""
    from pulse_node.config import load_node_config

    path = args.config or (str(Path(args.data_dir) / "node.toml") if (Path(args.data_dir) / "node.toml").is_file()
                           else None)
    return load_node_config(path, list(args.overrides) + flag_overrides({"data_dir": args.data_dir}))


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: already exists and is not an empty directory; choose a new path")


def run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    if args.print_config:
        from pulse_node.configload import dump_toml

        print(dump_toml(cfg), end="")
        return 0
    out = Path(args.out)
    _check_out(out)
    from pulse_node.chain.store import VersionStore
    from pulse_node.rl.hf_checkpoint import write_checkpoint

    store = VersionStore(Path(cfg.data_dir) / "store", readonly=True,
                         trusted_signers=cfg.chain.trusted_trainers or None)
    record, state = _rebuild(store, args.version)
    files = write_checkpoint(out, state, model_cfg=cfg.model, max_shard_size=args.max_shard_size,
                             metadata={"pulse.run_id": record.run_id, "pulse.version": str(record.version),
                                       "pulse.state_hash": record.state_hash})
    print(json.dumps({"out": str(out), "version": record.version, "state_hash": record.state_hash,
                      "model": cfg.model.kind, "files": files}))
    return 0


def _rebuild(store: VersionStore, version: int | None) -> tuple[VersionRecord, State]:
    """The record and verified state of ``version`` (default: the newest rebuildable one)."""
    from pulse_node.errors import GapError, IntegrityError

    versions = store.versions()
    if not versions:
        raise StoreError(f"{store.root}: the store holds no version")
    if version is None:
        head = store.head()
        if head is None:
            raise StoreError(f"{store.root}: no stored version can be rebuilt (no anchor or current state)")
        version = head.version
    if version not in versions:
        raise StoreError(f"{store.root}: v{version} is not in the store (it holds v{versions[0]}..v{versions[-1]})")
    try:
        record, state = store.record(version), store.load_state(version)
    except (GapError, IntegrityError) as exc:
        raise StoreError(f"{store.root}: cannot rebuild v{version}: {exc}") from None
    if record is None:
        raise StoreError(f"{store.root}: v{version} has no record")
    return record, state
