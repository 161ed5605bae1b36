"""``pulse-node join``: run one daemon (trainer or inference) that joins a swarm via a bootstrap.

    pulse-node join --bootstrap /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW... --role inference \
        --set 'chain.trusted_trainers=["<trainer key hex>", ...]'
    pulse-node join --role trainer --config configs/trainer.toml --print-config
    torchrun --nproc-per-node 4 -m pulse_node join --role trainer --config configs/trainer-fsdp.toml ...

Under torchrun (``WORLD_SIZE`` > 1) a trainer runs on every process: rank 0 is the node and
the other ranks compute for it (``trainer/distributed.py``).

Before anything starts, ``trust_gate`` checks the trainer set (``peers/trainerset.py``): a node
whose bootstrap is not on this machine refuses to start without trainer keys (anyone could then
sign the versions it applies) unless ``--open-swarm-trust-anyone`` (``chain.open_swarm``) says
so, which prints a warning banner; a trainer whose own key is neither configured nor admitted
refuses too (every node would ignore its versions). So does a trainer that cannot record its
inner steps in a swarm that runs spot checks (``config.recording_problem``: with
``grpo.bf16_compute`` off; every trainer would refuse its commitments).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from pulse_node.commands.common import add_config_flags, flag_overrides

if TYPE_CHECKING:
    from pulse_node.config import InferenceConfig, TrainerConfig

OPEN_SWARM_BANNER = """\
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!! OPEN SWARM: no trainer keys are configured and chain.open_swarm is set.
!!! ANY peer that announces the trainer role is trusted: it can sign the versions
!!! this node applies, decide training rounds and serve trainer state. Keys are
!!! free: equivocation bans, re-sync majorities and the version step bind nobody.
!!! Configure chain.trusted_trainers to trust only your trainers.
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"""
_LOCAL_HOSTS = ("/ip4/127.", "/ip6/::1/", "/dns/localhost/", "/dns4/localhost/", "/dns6/localhost/")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--open-swarm-trust-anyone", dest="open_swarm", action="store_true",
                   help="DANGEROUS: without trainer keys, trust any peer that announces the trainer role "
                   "(sets chain.open_swarm; needed to join a non-local bootstrap without keys)")
    add_config_flags(p)
    p.set_defaults(run=run)


def resolve_config(args: argparse.Namespace) -> TrainerConfig | InferenceConfig:
    """The validated role config: defaults < file < --set < explicit flags."""
    from pulse_node.config import load_node_config

    overrides = list(args.overrides) + flag_overrides({
        "data_dir": args.data_dir, "metrics_port": args.metrics_port,
        "max_versions": args.max_versions, "net.bootstrap": args.bootstrap or None,
        "net.announce": args.announce or None, "net.wire_announce": args.wire_announce or None,
        "chain.open_swarm": True if args.open_swarm else None,
    })
    return load_node_config(args.config, overrides, role=args.role)


def run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    if args.print_config:
        from pulse_node.configload import dump_toml

        print(dump_toml(cfg), end="")
        return 0
    from pulse_node.config import TrainerConfig, recording_problem
    from pulse_node.errors import ConfigError
    from pulse_node.trainer import world_size

    if isinstance(cfg, TrainerConfig) and (problem := recording_problem(cfg)) is not None:
        raise ConfigError(problem)  # every rank, before anything starts (trainer/role.py checks it too)
    if world_size() > 1:
        if cfg.role != "trainer":
            raise ConfigError(f"only a trainer runs on several processes (WORLD_SIZE={world_size()}); "
                              f"start an {cfg.role} node without torchrun")
        if int(os.environ.get("RANK", "0")) > 0:
            from pulse_node.trainer.distributed import serve_rank

            return serve_rank(cfg)

    banner = trust_gate(cfg)
    if banner:
        print(banner, file=sys.stderr, flush=True)
    from pulse_node.daemon.p2p import P2PTransport
    from pulse_node.daemon.runtime import TransportFactory
    from pulse_node.roles import run_node

    factory: TransportFactory = P2PTransport.create
    if cfg.net.faults.enabled:  # testing only: chaos runs fault this node's own data plane
        from pulse_node.testing.faults import faulty_factory

        factory = faulty_factory(factory, cfg.net.faults)
    return run_node(cfg, factory)


def is_local(maddr: str) -> bool:
    """Whether a bootstrap multiaddr names this machine (loopback)."""
    return maddr.startswith(_LOCAL_HOSTS)


def trust_gate(cfg: TrainerConfig | InferenceConfig) -> str | None:
    """``ConfigError`` if this node must not start with its trust settings; else a banner to print
    (None when there is nothing to warn about). See the module docstring."""
    from pathlib import Path

    from pulse_node.chain.identity import Identity
    from pulse_node.errors import ConfigError
    from pulse_node.peers.trainerset import TrainerSet

    trainers = TrainerSet.from_config(cfg.chain, run_id=cfg.run_id)
    if trainers.open:
        remote = [m for m in cfg.net.bootstrap if not is_local(m)]
        if remote and not cfg.chain.open_swarm:
            raise ConfigError(
                f"no trainer keys are configured, and the bootstrap {remote[0]} is not on this machine: any peer "
                "could sign the versions this node applies. Set chain.trusted_trainers (or "
                "chain.trusted_trainers_path) to your trainers' keys (`pulse-node keygen DATA_DIR/identity.key "
                "--show` on each trainer prints its key), or pass --open-swarm-trust-anyone to trust anyone")
        return OPEN_SWARM_BANNER if cfg.chain.open_swarm else (
            "pulse-node join: note: no trainer keys configured; trusting any peer announcing the trainer role "
            "(a local swarm)")
    if cfg.role != "trainer":
        return None
    key = Identity.load_or_create(Path(cfg.data_dir) / "identity.key").public_key_hex
    if key not in trainers.configured and cfg.chain.admission_file is None:
        if cfg.chain.open_trainers:  # a volunteer: payloads only, weight earned by spot checks passed
            return (f"pulse-node join: note: key {key[:16]} is in no trainer set; it joins as an open trainer "
                    "(chain.open_trainers): its payloads count at the newcomers' weight until spot checks earn it more")
        raise ConfigError(f"this trainer's key {key} is not in the trainer set: every node would ignore its "
                          "versions. Add it to chain.trusted_trainers on every node, or have members admit it "
                          "(`pulse-node trainers admit`) and set chain.admission_file, or set chain.open_trainers "
                          "on every node to let it train as an open trainer")
    return None
