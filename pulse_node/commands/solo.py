"""``pulse-node solo``: run trainer and inference in one process (no network) and report.

    pulse-node solo --config configs/solo.toml [--minutes M] [--json] [--set key=value ...]
                    [--print-config]

With ``--json`` the last line on stdout is a JSON object (eval_before, eval_after, steps,
rollouts, bf16_change_density, seconds, ...). Progress goes to stderr.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("solo", help="train and sample in one process (no network)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="TOML file (SoloConfig); defaults apply without one")
    p.add_argument("--minutes", type=float, help="wall-clock budget of the GRPO phase")
    p.add_argument("--seed", type=int, help="run seed (init, warm start, sampling)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set grpo.lr=3e-4 (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json

    from pulse_node.configload import dump_toml, load_config
    from pulse_node.rl.config import SoloConfig

    overrides = list(args.overrides)
    if args.minutes is not None:
        overrides.append(f"minutes={args.minutes}")
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    cfg = load_config(SoloConfig, args.config, overrides)
    if args.print_config:
        print(dump_toml(cfg), end="")
        return 0
    from pulse_node.rl.solo import run_solo

    result = run_solo(cfg, progress=not args.quiet)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"held-out accuracy {result['eval_before']:.3f} -> {result['eval_after']:.3f} "
              f"after {result['steps']} GRPO steps ({result['rollouts']} rollouts, "
              f"{result['seconds']:.0f}s); mean BF16 change density per step "
              f"{result['bf16_change_density']:.4f}")
    return 0
