"""The ``pulse-node`` command line: parses arguments, then imports the one command that runs.

Each subcommand lives in ``pulse_node/commands/<name>.py`` and exposes
``register(subparsers)`` (argparse only, no heavy imports) and ``run(args) -> int``.
Heavy libraries (torch, hivemind, libp2p) are imported inside ``run``, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pulse_node import __version__
from pulse_node.errors import PulseError

#: subcommand modules, in the order ``--help`` lists them
COMMANDS = ("swarm", "join", "bootstrap", "solo", "patch", "rollouts", "export", "status", "doctor", "keygen",
            "trainers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulse-node",
        description="Peer-to-peer node for decentralized RL post-training "
        "(PULSESync weight patches, PULSELoCo trainer sync).",
    )
    parser.add_argument("--version", action="version", version=f"pulse-node {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"pulse_node.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"pulse_node.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except PulseError as exc:
        print(f"pulse-node {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"pulse-node {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
