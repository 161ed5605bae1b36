"""``pulse-node swarm``: run a bootstrap, T trainers and I inference nodes as local processes.

    pulse-node swarm                       # embedded default, runs until Ctrl+C
    pulse-node swarm --versions 10 --json  # stop once every node holds version 10; JSON summary last

On a terminal it shows the ``pulse-node status`` screen live; piped it prints one plain
progress line per version on stdout (on stderr with ``--json``). Exit code 2 when the run ends
with an alert that fails it (``FAILING_ALERTS``: a fork, a version without contributors, a round
closed without an update, a duplicated identity), 130 when stopped before ``--versions``.
"""

from __future__ import annotations

import argparse
import json
import threading
from typing import TYPE_CHECKING, Any

from pulse_node.commands.common import add_config_flags, flag_overrides
from pulse_node.signals import stop_on_signals

if TYPE_CHECKING:
    from pulse_node.config import SwarmConfig


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("swarm", help="run a whole local swarm (bootstrap + trainers + inference) as processes",
                       description="Start a bootstrap, T trainers and I inference nodes on 127.0.0.1 "
                       "with the embedded default model and task; Ctrl+C stops everything within 10 s.")
    p.add_argument("--trainers", type=int, help="number of trainer nodes (default 2)")
    p.add_argument("--inference", type=int, help="number of inference nodes (default 2)")
    p.add_argument("--versions", type=int, help="stop once every node holds this version (default: run forever)")
    p.add_argument("--run-dir", help="node data dirs and logs go here (default ./pulse-swarm)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line of stdout "
                   "(progress goes to stderr as plain lines)")
    add_config_flags(p)
    p.set_defaults(run=run)


def check_model(cfg: SwarmConfig) -> None:
    """``PulseError`` with the command that fixes it when the swarm's hub model is not here: said
    before any node starts, not by a node far away minutes later."""
    if cfg.model.kind != "hf":
        return
    from pulse_node.errors import PulseError
    from pulse_node.rl.model_source import model_report

    ok, detail, fix = model_report(cfg.model.path or "", revision=cfg.model.revision, chat_setting=cfg.task.chat_template)
    if not ok:
        raise PulseError(f"{detail}\n  next: {fix}")


def run(args: argparse.Namespace) -> int:
    from pulse_node.config import SwarmConfig
    from pulse_node.configload import dump_toml, load_config

    overrides = list(args.overrides) + flag_overrides({
        "trainers": args.trainers, "inference": args.inference, "versions": args.versions, "run_dir": args.run_dir})
    cfg = load_config(SwarmConfig, args.config, overrides)
    if args.print_config:
        print(dump_toml(cfg), end="")
        return 0
    check_model(cfg)
    from pulse_node.swarm.launcher import LocalSwarm
    from pulse_node.swarm.view import SwarmView

    stop = threading.Event()
    stop_on_signals(stop)
    swarm = LocalSwarm(cfg)
    view = SwarmView(swarm, plain=args.json)
    swarm.log = view.say
    try:
        swarm.start(stop=stop.is_set)
        view.started()
        swarm.wait_versions(cfg.versions, on_tick=view.tick, stop=stop.is_set)
    finally:
        summary = swarm.summary()
        swarm.stop()
        view.close()
    if args.json:
        print(json.dumps(summary))
    else:
        view.final(summary)
    return exit_code(summary, stopped=stop.is_set(), versions=cfg.versions)


def exit_code(summary: dict[str, Any], *, stopped: bool, versions: int | None) -> int:
    """2 when the run ends with an alert that fails it (``summary["failed"]``), 130 when stopped
    before ``versions``, else 0."""
    if summary["failed"]:
        return 2
    return 130 if stopped and versions is not None else 0
