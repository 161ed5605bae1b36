"""``pulse-node bootstrap``: run a swarm entry point (a DHT node with a role=bootstrap record).

    pulse-node bootstrap [--host-maddrs /ip4/0.0.0.0/tcp/31337] [--announce-maddrs MADDR ...]
                         [--identity bootstrap.key] [--run-id RUN] [--print-maddrs-file PATH]

Without ``--run-id`` it serves the default run (``vocab.DEFAULT_RUN_ID``, ``pulse-local``), the
run every node config joins unless it names another, so ``pulse-node bootstrap`` and ``pulse-node
join`` form one swarm as written. When ready it prints each full multiaddr (``.../p2p/<peer id>``) on its own stdout line and
nothing else on stdout, so ``--initial-peers $(cat maddrs.txt)`` works; ``--print-maddrs-file``
writes the same lines atomically. Status goes to stderr: a peer census every ``--status-every``
seconds. With ``--identity`` (created if missing) the peer id, hence the address, survives
restarts. SIGINT/SIGTERM stop it within 10 s.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.fsutil import write_atomic
from pulse_node.signals import stop_on_signals
from pulse_node.vocab import DEFAULT_RUN_ID

if TYPE_CHECKING:
    from pulse_node.net.dht.client import DhtClient, DhtConfig

STOP_TIMEOUT_S = 6.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("bootstrap", help="run a swarm entry point (DHT bootstrap node)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/31337"], metavar="MADDR",
                   help="addresses to listen on (default /ip4/0.0.0.0/tcp/31337)")
    p.add_argument("--announce-maddrs", nargs="+", default=[], metavar="MADDR",
                   help="public addresses to announce (behind NAT: the forwarded address)")
    p.add_argument("--identity", type=Path, help="Ed25519 key file, created if missing; keeps the address stable")
    p.add_argument("--run-id", default=DEFAULT_RUN_ID,
                   help=f"swarm run id; nodes must use the same (default {DEFAULT_RUN_ID}, as node configs)")
    p.add_argument("--initial-peers", nargs="+", default=[], metavar="MADDR",
                   help="other bootstrap nodes to join (for redundant entry points)")
    p.add_argument("--print-maddrs-file", type=Path, help="also write the multiaddrs to this file")
    p.add_argument("--status-every", type=float, default=60.0, metavar="S", help="peer census period on stderr")
    p.add_argument("--log", type=Path, help="DHT worker log file (default: stderr)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pulse_node import __version__
    from pulse_node.chain.peer import PeerStatus
    from pulse_node.net.dht.client import DhtClient

    config = build_config(args)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    if args.identity is None:
        print("pulse-node bootstrap: no --identity given: the peer id (and address) changes on every "
              "restart", file=sys.stderr)
    try:
        client = DhtClient.start(config, log_path=args.log)
        try:
            client.publish_peer(PeerStatus(role="bootstrap", software=f"pulse-node {__version__}"))
            info = client.info()
            announce(info.visible_maddrs, info.peer_id, args)
            return serve_until_stopped(client, stop, args.status_every)
        finally:
            client.stop(timeout=STOP_TIMEOUT_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def build_config(args: argparse.Namespace) -> DhtConfig:
    import pydantic

    from pulse_node.errors import ConfigError
    from pulse_node.net.dht.client import DhtConfig

    try:
        return DhtConfig(run_id=args.run_id, host_maddrs=args.host_maddrs, announce_maddrs=args.announce_maddrs,
                         identity=args.identity, initial_peers=args.initial_peers)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-")
        raise ConfigError(f"{flag}: {first['msg'].removeprefix('Value error, ')}") from None


def announce(maddrs: list[str], peer_id: str, args: argparse.Namespace) -> None:
    print(f"pulse-node bootstrap: ready, run {args.run_id}, peer id {peer_id}; give nodes these "
          "addresses with --initial-peers:", file=sys.stderr, flush=True)
    text = "".join(f"{m}\n" for m in maddrs)
    if args.print_maddrs_file:  # the file first: whoever reads stdout may look for it at once
        write_atomic(args.print_maddrs_file, text.encode(), durable=False)
    sys.stdout.write(text)
    sys.stdout.flush()


def serve_until_stopped(client: DhtClient, stop: threading.Event, status_every: float) -> int:
    """Wait for a signal; print a census now and then; fail if the worker dies."""
    next_status = time.monotonic() + status_every
    while not stop.wait(0.2):
        if not client.alive():
            print("pulse-node bootstrap: error: the DHT worker exited; see its log above", file=sys.stderr)
            return 1
        if time.monotonic() >= next_status:
            next_status = time.monotonic() + status_every
            census(client)
    print("pulse-node bootstrap: stopping", file=sys.stderr, flush=True)
    return 0


def census(client: DhtClient) -> None:
    try:
        peers = client.peers()
    except Exception as exc:  # status is best effort; the next round may work
        print(f"pulse-node bootstrap: census failed: {exc}", file=sys.stderr, flush=True)
        return
    roles = Counter(p.role for p in peers)
    parts = ", ".join(f"{n} {role}" for role, n in sorted(roles.items())) or "none"
    print(f"pulse-node bootstrap: {len(peers)} live peer(s): {parts}", file=sys.stderr, flush=True)
