"""``pulse-node rollouts``: make a rollout batch as an inference node would, check one as a trainer would.

    pulse-node rollouts make --data-dir DIR --identity KEY [--version V] [--batch N] -o FILE [--config FILE]
    pulse-node rollouts check --data-dir DIR --sender PEER_ID FILE [--json] [--config FILE]

``make`` writes batch N (default 0) of version V (default: the newest version DIR holds), in the
rollout wire format, exactly as the inference node holding identity KEY would make it: the
prompts assigned to (run, V, its peer id, N) and the seeded sampler on V's weights. ``check``
verifies a batch file with the trainers' code (``rl/verify.py``) as if the transport had
authenticated PEER_ID as its sender, against the versions DIR holds (its newest version plays
the trainer's current one), and prints one line per rollout with its verdict and reason (one
JSON object per line with ``--json``); it exits 0 only if every rollout passes. DIR is the data
dir of any node (its ``store/`` is opened read-only, so the node may be running). A volunteer
runs ``check`` to see why trainers refuse its rollouts. The config (default: an inference
node's) must hold the run's model, task and sampling settings: both commands refuse a version
whose signed record declares other rollout settings, naming the differences.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.commands.common import add_config_flags, flag_overrides

if TYPE_CHECKING:
    from pulse_node.codec.state import State
    from pulse_node.config import InferenceConfig, TrainerConfig
    from pulse_node.rl.rollout import Rollout
    from pulse_node.rl.sampler import RolloutWorker
    from pulse_node.rl.verify import BatchVerdict


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rollouts", help="make or check a rollout batch (what trainers verify)",
                       description="Make a rollout batch as an inference node would, or check one as a trainer would.")
    acts = p.add_subparsers(dest="rollouts_command", metavar="ACTION", required=True)
    m = acts.add_parser("make", help="write one batch of rollouts in the wire format")
    m.add_argument("--identity", required=True, type=Path, metavar="KEY", help="the producing node's identity key file")
    m.add_argument("--version", type=int, metavar="V", help="version to make it from (default: the newest held)")
    m.add_argument("--batch", type=int, default=0, metavar="N", help="batch index (default 0)")
    m.add_argument("-o", "--output", required=True, type=Path, metavar="FILE", help="batch file to write")
    c = acts.add_parser("check", help="verify a batch as a trainer would; one line per rollout")
    c.add_argument("--sender", required=True, metavar="PEER_ID", help="the peer id the batch came from")
    c.add_argument("file", type=Path, metavar="FILE", help="batch file (rollout wire format)")
    c.add_argument("--json", action="store_true", help="one JSON object per rollout")
    for a in (m, c):
        a.add_argument("--data-dir", required=True, type=Path, metavar="DIR", help="a node's data dir (any role)")
        add_config_flags(a)  # the run's config (default: inference defaults)
    p.set_defaults(run=run)


def load_node_config(path: str | None, overrides: list[str], data_dir: Path) -> TrainerConfig | InferenceConfig:
    """The role config of ``path`` (its ``role``, default inference) with ``data_dir`` set."""
    from pulse_node import config

    return config.load_node_config(path, list(overrides) + flag_overrides({"data_dir": str(data_dir)}))


class VersionSource:
    """Versions of a node's store (read-only), with the settings check both commands need."""

    def __init__(self, cfg: TrainerConfig | InferenceConfig) -> None:
        from pulse_node.chain.store import VersionStore
        from pulse_node.rl.settings import settings_of

        self.cfg = cfg
        self.store = VersionStore(Path(cfg.data_dir) / "store", readonly=True)
        self.settings = settings_of(cfg)

    def newest(self) -> int:
        from pulse_node.errors import StoreError

        head = self.store.head()
        if head is None:
            raise StoreError(f"{self.cfg.data_dir}: holds no version")
        return head.version

    def state(self, version: int) -> State:
        """The BF16 state of ``version`` after checking its record's declared settings."""
        from pulse_node.errors import StoreError
        from pulse_node.rl.settings import check_settings

        record = self.store.record(version)
        if record is None:
            raise StoreError(f"{self.cfg.data_dir}: holds no record of version {version}")
        check_settings(record.rollout_settings, self.settings, version=version)
        return self.store.load_state(version)

    def worker(self) -> RolloutWorker:
        import torch

        from pulse_node.rl.config import GRPOConfig
        from pulse_node.rl.policy import build_policy
        from pulse_node.rl.sampler import RolloutWorker

        if self.cfg.torch_threads:
            torch.set_num_threads(self.cfg.torch_threads)
        policy = build_policy(self.cfg.model, self.cfg.task, seed=self.cfg.seed, grpo_cfg=GRPOConfig(warmstart_steps=0))
        return RolloutWorker(policy, self.cfg.sampling)


def make_batch(cfg: TrainerConfig | InferenceConfig, *, identity: Path, version: int | None, batch: int
               ) -> tuple[bytes, list[Rollout]]:
    """Wire bytes and rollouts of ``batch`` of ``version`` by the node holding ``identity``."""
    from pulse_node.chain.identity import Identity
    from pulse_node.errors import ConfigError
    from pulse_node.net.dht.validator import peer_id_of
    from pulse_node.rl.assign import BatchKey
    from pulse_node.rl.rollout import encode_rollouts
    from pulse_node.rl.tasks import make_task_source

    if not 0 <= batch < cfg.rollout_batches_per_version:
        raise ConfigError(f"--batch {batch}: trainers accept batch indices 0..{cfg.rollout_batches_per_version - 1}")
    source = VersionSource(cfg)
    v = source.newest() if version is None else version
    state = source.state(v)
    worker = source.worker()
    worker.set_weights(state, v)
    key = BatchKey(cfg.run_id, v, peer_id_of(Identity.load(identity)), batch)
    rollouts = worker.generate_batch(make_task_source(cfg.task), key)
    return encode_rollouts(rollouts), rollouts


def check_batch(cfg: TrainerConfig | InferenceConfig, *, sender: str, data: bytes) -> BatchVerdict:
    """The trainers' verdict (``rl/verify.BatchVerdict``) on a batch from ``sender``."""
    from pulse_node.config import TrainerConfig
    from pulse_node.errors import WireError
    from pulse_node.rl.config import GRPOConfig
    from pulse_node.rl.rollout import decode_rollouts
    from pulse_node.rl.tasks import make_task_source
    from pulse_node.rl.verify import BatchVerdict, RolloutCheck, RolloutVerifier
    from pulse_node.vocab import BatchRefusal

    try:
        rollouts = decode_rollouts(data)
    except WireError as exc:
        return BatchVerdict(BatchRefusal.MALFORMED, str(exc), [RolloutCheck(0, BatchRefusal.MALFORMED, str(exc))])
    source = VersionSource(cfg)
    held = set(source.store.versions())
    verifier = RolloutVerifier(source.worker(), make_task_source(cfg.task), run_id=cfg.run_id, cfg=cfg.verify,
                               batches_per_version=cfg.rollout_batches_per_version,
                               max_staleness=(cfg.grpo if isinstance(cfg, TrainerConfig) else GRPOConfig()).max_staleness)
    return verifier.check(rollouts, sender=sender, current_version=source.newest(), full=True,
                          state_of=lambda v: source.state(v) if v in held else None)


def _make(args: argparse.Namespace) -> int:
    from pulse_node.fsutil import write_atomic

    cfg = load_node_config(args.config, args.overrides, args.data_dir)
    data, rollouts = make_batch(cfg, identity=args.identity, version=args.version, batch=args.batch)
    write_atomic(args.output, data)
    reward = sum(r.reward for r in rollouts) / max(1, len(rollouts))
    print(f"{args.output}: batch {args.batch} of version {rollouts[0].version}, {len(rollouts)} rollouts, "
          f"{len(data)} bytes, mean reward {reward:.3f}")
    return 0


def _check(args: argparse.Namespace) -> int:
    import json

    from pulse_node.errors import DataError

    cfg = load_node_config(args.config, args.overrides, args.data_dir)
    try:
        data = args.file.read_bytes()
    except OSError as exc:
        raise DataError(f"{args.file}: cannot read ({exc.strerror})") from None
    verdict = check_batch(cfg, sender=args.sender, data=data)
    for c in verdict.checks:
        if args.json:
            print(json.dumps({"sample": c.sample, "verdict": "ok" if c.ok else "refused", "reason": c.reason,
                              "detail": c.detail, "gap": None if c.gap != c.gap else c.gap}))
        else:
            gap = "" if c.gap != c.gap else f" (largest gap {c.gap:.3g}, tolerance {verdict.tolerance:.3g})"
            print(f"sample {c.sample}: " + ("ok" if c.ok else f"REFUSED {c.reason}: {c.detail}") + gap)
    if not args.json:
        print(f"batch: {'accepted' if verdict.ok else 'refused: ' + verdict.reason + ' (' + verdict.detail + ')'}")
    return 0 if verdict.ok else 1


def run(args: argparse.Namespace) -> int:
    if args.print_config:
        from pulse_node.configload import dump_toml

        print(dump_toml(load_node_config(args.config, args.overrides, args.data_dir)), end="")
        return 0
    return {"make": _make, "check": _check}[args.rollouts_command](args)
