"""``pulse-node join``: run one daemon (trainer or inference) that joins a swarm via a bootstrap.

    pulse-node join --bootstrap /ip4/1.2.3.4/tcp/31337/p2p/Qm... --role inference
    pulse-node join --role trainer --config configs/trainer.toml --print-config
    torchrun --nproc-per-node 4 -m pulse_node join --role trainer --config configs/trainer-fsdp.toml ...

Under torchrun (``WORLD_SIZE`` > 1) a trainer runs on every process: rank 0 is the node and
the other ranks compute for it (``trainer/distributed.py``).
"""

from __future__ import annotations

import argparse
import os

from pulse_node.commands.common import add_config_flags, flag_overrides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("join", help="run a trainer or inference daemon in a swarm",
                       description="Run a trainer or inference daemon that joins a swarm through a DHT bootstrap.")
    p.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="multiaddr of a bootstrap peer (repeatable)")
    p.add_argument("--role", choices=("trainer", "inference"), default=None, help="node role (default: from --config, else inference)")
    p.add_argument("--data-dir", help="identity, version store and status.json live here")
    p.add_argument("--announce", action="append", default=[], metavar="MULTIADDR",
                   help="publicly reachable DHT address to announce (repeatable)")
    p.add_argument("--wire-announce", action="append", default=[], metavar="MULTIADDR",
                   help="publicly reachable data-plane address to announce (repeatable)")
    p.add_argument("--metrics-port", type=int, help="port of /metrics, /health, /status (0 = any)")
    p.add_argument("--max-versions", type=int, help="stop advancing after this version")
    add_config_flags(p)
    p.set_defaults(run=run)


def resolve_config(args: argparse.Namespace):
    """The validated role config: defaults < file < --set < explicit flags."""
    from pulse_node.config import ROLE_CONFIGS
    from pulse_node.configload import load_config, read_toml

    role = args.role or (read_toml(args.config).get("role") if args.config else None) or "inference"
    overrides = list(args.overrides) + flag_overrides({
        "role": role, "data_dir": args.data_dir, "metrics_port": args.metrics_port,
        "max_versions": args.max_versions, "net.bootstrap": args.bootstrap or None,
        "net.announce": args.announce or None, "net.wire_announce": args.wire_announce or None,
    })
    return load_config(ROLE_CONFIGS[role], args.config, overrides)


def run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    if args.print_config:
        from pulse_node.configload import dump_toml

        print(dump_toml(cfg), end="")
        return 0
    from pulse_node.trainer import world_size

    if world_size() > 1:
        if cfg.role != "trainer":
            from pulse_node.errors import ConfigError

            raise ConfigError(f"only a trainer runs on several processes (WORLD_SIZE={world_size()}); "
                              f"start an {cfg.role} node without torchrun")
        if int(os.environ.get("RANK", "0")) > 0:
            from pulse_node.trainer.distributed import serve_rank

            return serve_rank(cfg)
    from pulse_node.daemon.p2p import P2PTransport
    from pulse_node.daemon.runtime import run_node

    factory = P2PTransport.create
    if cfg.net.faults.enabled:  # testing only: chaos runs fault this node's own data plane
        from pulse_node.testing.faults import faulty_factory

        factory = faulty_factory(factory, cfg.net.faults)
    return run_node(cfg, factory)
