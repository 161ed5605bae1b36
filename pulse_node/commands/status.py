"""``pulse-node status``: a live terminal dashboard of a swarm (or one JSON snapshot for scripts).

    pulse-node status                                   # the local swarm under ./pulse-swarm
    pulse-node status --bootstrap /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW... --run-id my-run
    pulse-node status --once --json | jq .alerts        # one snapshot, then exit (1 if an alert FAILs)
"""

from __future__ import annotations

import argparse

from pulse_node.signals import stop_on_signals
from pulse_node.vocab import DEFAULT_RUN_ID

DEFAULT_RUN_DIR = "./pulse-swarm"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="live dashboard of a swarm (peers, versions, hashes, bytes, reward, errors)",
                       description="Show every node's version and lag, whether state hashes agree, bytes moved and "
                       "saved, sparsity and compression per version, reward, and recent errors. Sources: the signed "
                       "DHT records and each node's /status (--bootstrap), and/or the status.json files of a local "
                       f"swarm (--run-dir, default {DEFAULT_RUN_DIR} when no --bootstrap is given). With --once the exit code is "
                       "1 when an alert FAILs (diverged state hashes, a duplicate identity).")
    p.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="read the swarm's DHT through this bootstrap peer (repeatable)")
    p.add_argument("--run-dir", help=f"a local swarm's run dir (default {DEFAULT_RUN_DIR} without --bootstrap)")
    p.add_argument("--run-id", help=f"the swarm's run id (DHT key namespace; default {DEFAULT_RUN_ID})")
    p.add_argument("--once", action="store_true", help="print one screen (or one JSON object with --json) and exit")
    p.add_argument("--json", action="store_true", help="with --once: print the snapshot as one JSON object")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--width", type=int, help="screen width for --once (default: terminal width, 120 if not a tty)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to reach the bootstrap (default 15)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    import threading
    from pathlib import Path

    from rich.console import Console

    from pulse_node.errors import ConfigError
    from pulse_node.ops.dashboard import Dashboard, run_live
    from pulse_node.ops.render import render

    if args.json and not args.once:
        raise ConfigError("--json prints one snapshot: use it with --once")
    run_dir = Path(args.run_dir) if args.run_dir else (None if args.bootstrap else Path(DEFAULT_RUN_DIR))
    if run_dir is not None and not run_dir.is_dir() and not args.bootstrap:
        raise ConfigError(f"run dir {run_dir} does not exist: start a local swarm (pulse-node swarm) "
                          "or pass --bootstrap MULTIADDR to read a remote swarm")
    dht = None
    if args.bootstrap:
        from pulse_node.ops.sources import DhtSource

        dht = DhtSource(args.bootstrap, run_id=args.run_id or DEFAULT_RUN_ID, timeout=args.timeout)
    dash = Dashboard(run_dir=run_dir, dht=dht, run_id=args.run_id,
                     bootstrap=args.bootstrap[0] if args.bootstrap else None)
    try:
        if args.once:
            snap = dash.snapshot()
            if args.json:
                print(json.dumps(snap.model_dump(mode="json")))
            else:
                width = args.width or (None if sys.stdout.isatty() else 120)
                Console(width=width, highlight=False).print(render(snap))
            return 1 if any(a.level == "fail" for a in snap.alerts) else 0
        stop = threading.Event()
        stop_on_signals(stop)
        print(f"pulse-node status: watching {run_dir or ''}{' + ' if run_dir and dht else ''}"
              f"{'DHT via ' + args.bootstrap[0] if dht else ''}; Ctrl+C to stop", file=sys.stderr, flush=True)
        run_live(dash, Console(highlight=False), interval_s=args.interval, stop=stop)
        return 0
    finally:
        dash.close()
