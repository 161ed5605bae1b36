"""``pulse-node doctor``: check this machine and the way to the swarm; each failure says what to do next.

    pulse-node doctor                                       # environment + p2p daemon
    pulse-node doctor --bootstrap /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...   # + bootstrap, NAT, clocks, identity
    pulse-node doctor --json | jq '.[] | select(.status == "FAIL")'
    pulse-node doctor --config configs/qwen2.5-0.5b-gsm8k-swarm.toml --only model   # a node or a swarm config

Exit code 0 when no check FAILs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from pulse_node.commands.common import add_config_flags
from pulse_node.vocab import DEFAULT_RUN_ID

if TYPE_CHECKING:
    from pulse_node.config import InferenceConfig, SwarmConfig, TrainerConfig
    from pulse_node.ops.checks import Check
    from pulse_node.rl.config import SoloConfig

CHECK_NAMES = ("python", "torch", "hivemind", "libp2p", "dependencies", "accelerator", "disk", "model",
               "daemon", "bootstrap", "reachable", "clocks", "identity")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="diagnose this machine and its way to the swarm (PASS/WARN/FAIL + next step)",
                       description="Check Python, torch/hivemind/libp2p imports, dependency pins, disk, CUDA, that "
                       "the p2p daemon starts, that the bootstrap answers, reachability (public vs private "
                       "addresses), peers' clocks and whether this node's identity is already live. "
                       "Exit code 0 when no check FAILs.")
    p.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="bootstrap peer to test (repeatable); without it the swarm checks are skipped")
    p.add_argument("--run-id", default=DEFAULT_RUN_ID, help=f"run id whose peer records to read (default {DEFAULT_RUN_ID})")
    p.add_argument("--data-dir", default="./pulse-data", help="the node's data dir (disk space, identity.key)")
    p.add_argument("--identity", help="identity key to check (default DATA_DIR/identity.key)")
    p.add_argument("--listen", action="append", default=[], metavar="MULTIADDR",
                   help="address the test daemon listens on (default /ip4/0.0.0.0/tcp/0)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to reach the bootstrap (default 15)")
    p.add_argument("--only", action="append", choices=CHECK_NAMES, metavar="CHECK",
                   help=f"run only these checks (repeatable): {', '.join(CHECK_NAMES)}")
    add_config_flags(p)  # a node's or a swarm's config: the model it would load (default DATA_DIR/node.toml)
    p.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    p.set_defaults(run=run)


def load_any_config(path: str | None, overrides: list[str]
                    ) -> SwarmConfig | SoloConfig | TrainerConfig | InferenceConfig:
    """The config at ``path`` (+ ``overrides``) as the command it is for reads it: ``pulse-node swarm``
    when it names a key only a swarm has (``trainers``, ``run_dir``, ...), ``pulse-node solo`` when it
    names one only solo has (``minutes``, ...), else ``pulse-node join`` (a node of its ``role``)."""
    from pulse_node.config import NodeConfig, SwarmConfig, TrainerConfig, load_node_config
    from pulse_node.configload import load_config, load_tree
    from pulse_node.rl.config import SoloConfig

    keys, node = set(load_tree(path, overrides)), set(TrainerConfig.model_fields) | set(NodeConfig.model_fields)
    if keys & (set(SwarmConfig.model_fields) - node):
        return load_config(SwarmConfig, path, overrides)
    if keys & (set(SoloConfig.model_fields) - node):
        return load_config(SoloConfig, path, overrides)
    return load_node_config(path, overrides)


def model_check(config: str | None, overrides: list[str] | None = None) -> Callable[[], Check]:
    """The doctor's ``model`` check for the node or swarm config ``config`` (hub id, revision, local path)."""
    from pulse_node.ops.checks import Check

    def check() -> Check:
        cfg = load_any_config(config, overrides or [])
        if cfg.model.kind != "hf":
            return Check(name="model", status="PASS", detail="the embedded tiny model (built from the config)")
        from pulse_node.rl.model_source import model_report

        ok, detail, fix = model_report(cfg.model.path or "", revision=cfg.model.revision,
                                       chat_setting=cfg.task.chat_template)
        return Check(name="model", status="PASS" if ok else "FAIL", detail=detail, fix=fix)

    return check


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from pulse_node.ops.doctor import DoctorOptions, run_doctor

    opts = DoctorOptions(bootstrap=args.bootstrap, run_id=args.run_id, data_dir=Path(args.data_dir),
                         identity=Path(args.identity) if args.identity else None, timeout=args.timeout,
                         listen=args.listen or ["/ip4/0.0.0.0/tcp/0"],
                         only=frozenset(args.only) if args.only else None)
    config = args.config or (str(Path(args.data_dir) / "node.toml") if (Path(args.data_dir) / "node.toml").is_file()
                             else None)
    if args.print_config:
        from pulse_node.configload import dump_toml

        print(dump_toml(load_any_config(config, args.overrides)), end="")
        return 0
    if config or args.overrides:
        opts.model_check = model_check(config, args.overrides)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    style = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}

    def show(c: Check) -> None:
        row = Table.grid(padding=(0, 1))
        row.add_column(width=4, no_wrap=True)
        row.add_column(width=12, no_wrap=True)
        row.add_column(overflow="fold")
        body = Text(c.detail)
        if c.fix and c.status != "PASS":
            body.append(f"\nnext: {c.fix}", style="cyan")
        row.add_row(Text(c.status, style=style[c.status]), c.name, body)
        console.print(row)

    checks = run_doctor(opts, on_check=None if args.json else show)
    failed = [c for c in checks if c.status == "FAIL"]
    if args.json:
        print(json.dumps([c.model_dump(mode="json") for c in checks]))
    else:
        console.print(f"{len(checks)} checks: {len(failed)} failed, "
                      f"{sum(c.status == 'WARN' for c in checks)} warnings")
    return 1 if failed else 0
