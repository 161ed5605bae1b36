"""Chaos, long: trainers and inference nodes on a faulty data plane, nodes killed and restarted,
and a peer forging versions. Reports what was faulted, what recovered, and whether any node
ever used a wrong state (must be 0).

    python bench/chaos.py [--minutes 5] [--trainers 2] [--inference 3] [--seed 0]
    python bench/chaos.py --processes [--minutes 5] [--trainers 2] [--inference 3] [--run-dir DIR]

``--processes``: the real thing (``pulse_node/node/chaos.py``): a local swarm of separate
processes (role + hivemind DHT worker + py-libp2p wire worker per node) on 127.0.0.1, every node
faulting its own fetches and pushes of every kind, PULSELoCo payloads and round decisions
included (the testing option ``[net.faults]``); every ``--kill-every`` s (jittered) one node, a
trainer too, is SIGKILLed (its role process only, the whole node, or its DHT or wire worker
alone) and restarted on its data dir once its processes are gone; a forging peer with its own
DHT and wire workers serves a self-signed chain and garbage patches and pushes its forged head.

Default mode: nodes run in one process (``InProcessSwarm``, the real roles over ``MemoryTransport``) wrapped
by ``FaultyTransport``: each fetch/push may be dropped, duplicated, reordered, delayed or
corrupted. Trainer-to-trainer PULSELoCo payloads are spared (they ride an authenticated
stream; losing them forks trainers, which the re-sync path handles but which this bench
does not measure). Every ``--kill-every`` seconds a random inference node is stopped and
restarted on its store. A rogue peer announces version 10**6 and serves self-signed records
and garbage patches. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulse_node.chain.identity import Identity
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.testing.faults import FaultRates, FaultyTransport, start_forging_peer
from pulse_node.testing.inprocess import InProcessSwarm, node_status, node_version

RATES = FaultRates(drop=0.1, duplicate=0.1, reorder=0.1, delay=0.1, corrupt=0.05, max_delay_s=0.1,
                   spare_kinds=("loco",))
SMALL = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2}, "task": {"digits": 2},
         "sampling": {"prompts_per_batch": 8, "group_size": 4}}


def configs(tmp: Path, args) -> tuple[list, list, str]:
    keys, trainers, infs = [], [], []
    for i in range(args.trainers):
        d = tmp / f"trainer-{i}"
        keys.append(Identity.load_or_create(d / "identity.key").public_key_hex)
        trainers.append(TrainerConfig.model_validate({**SMALL, "data_dir": str(d), "seed": args.seed,
                        "run_id": "chaos", "grpo": {"warmstart_steps": 50}, "loco": {"inner_steps": 2, "deadline_s": 10},
                        "rollout_wait_s": 0.5, "eval_every": 0, "genesis_wait_s": 2.0,
                        "chain": {"anchor_every": 5, "keep_versions": 8}}))
    infs.extend(InferenceConfig.model_validate({**SMALL, "data_dir": str(tmp / f"inference-{i}"), "seed": args.seed,
                "run_id": "chaos", "rollout_batches_per_version": 1,
                "chain": {"trusted_trainers": keys, "anchor_every": 5, "keep_versions": 8}})
                for i in range(args.inference))
    return trainers, infs, "chaos"


def run(args) -> dict:
    rng = random.Random(args.seed)
    faulty: dict[str, FaultyTransport] = {}

    def wrap(name, transport):
        faulty[f"{name}#{len(faulty)}"] = f = FaultyTransport(transport, RATES, seed=rng.randrange(1 << 30))
        return f

    tmp = Path(tempfile.mkdtemp(prefix="pulse-chaos-"))
    swarm = InProcessSwarm(wrap=wrap)
    trainers, infs, run_id = configs(tmp, args)
    served = start_forging_peer(swarm.hub, tmp / "rogue", run_id=run_id)
    for i, c in enumerate(trainers):
        swarm.start(f"trainer-{i}", c)
    for i, c in enumerate(infs):
        swarm.start(f"inference-{i}", c)
    t0, kills, max_lag = time.monotonic(), 0, 0
    next_kill = t0 + args.kill_every
    try:
        while time.monotonic() - t0 < args.minutes * 60 and not swarm.errors:
            time.sleep(1.0)
            head = max(node_version(Path(c.data_dir)) for c in trainers)
            lags = [head - node_version(Path(c.data_dir)) for c in infs]
            max_lag = max([max_lag, *lags]) if head >= 0 else max_lag
            if time.monotonic() > next_kill:
                i = rng.randrange(len(infs))
                swarm.stop(Path(infs[i].data_dir))
                swarm.start(f"inference-{i}", infs[i])
                kills, next_kill = kills + 1, time.monotonic() + args.kill_every
    finally:
        swarm.stop_all()
    return summarize(trainers, infs, faulty, served, kills, max_lag, swarm.errors)


def summarize(trainers, infs, faulty, served, kills, max_lag, errors) -> dict:
    truth: dict[int, str] = {}
    for c in trainers:
        for h in (s.history if (s := node_status(Path(c.data_dir))) else []):
            truth.setdefault(h.version, h.state_hash)
    wrong = applied = 0
    stats = [s for c in infs if (s := node_status(Path(c.data_dir))) is not None and s.inference is not None]
    for s in stats:
        for h in s.history:
            applied += 1
            wrong += truth.get(h.version) != h.state_hash
    faults = Counter()
    for f in faulty.values():
        faults.update(f.faults)
    return {"versions_published": max(truth, default=-1), "applied_checked": applied,
            "corrupted_states_used": wrong, "faults_by_kind": dict(faults), "restarts": kills,
            "recoveries": {k: sum(getattr(s.inference, k) for s in stats) for k in ("anchor_loads", "catchups", "gaps")},
            "rejected_inputs": sum(s.counters.rejected for s in stats),
            "rogue_requests_served": dict(served), "max_lag_versions": max_lag, "node_errors": errors[:3]}


def process_config(args):
    """The process swarm: the small model of the in-process mode, faults on every kind."""
    from pulse_node.config import SwarmConfig

    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="pulse-chaos-proc-"))
    faults = {"enabled": True, "seed": args.seed, "drop": RATES.drop, "duplicate": RATES.duplicate,
              "reorder": RATES.reorder, "delay": RATES.delay, "corrupt": RATES.corrupt,
              "max_delay_s": RATES.max_delay_s}
    return SwarmConfig.model_validate({
        **SMALL, "trainers": args.trainers, "inference": args.inference, "run_dir": str(run_dir),
        "run_id": "chaos", "seed": args.seed, "model": {**SMALL["model"], "cache_dir": str(run_dir / "cache")},
        "grpo": {"warmstart_steps": 50}, "loco": {"inner_steps": 2, "deadline_s": 10},
        "rollout_wait_s": 0.5, "eval_every": 0, "rollout_batches_per_version": 1,
        "chain": {"anchor_every": 5, "keep_versions": 8}, "net": {"faults": faults}})


def run_processes(args) -> dict:
    from pulse_node.testing.chaos import ChaosPlan, ProcessChaos

    cfg = process_config(args)
    chaos = ProcessChaos(cfg, ChaosPlan(kill_every_s=args.kill_every, seed=args.seed,
                                        forged_versions=args.forged_versions))
    try:
        chaos.start()
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            chaos.tick()
            time.sleep(1.0)
    finally:
        chaos.close()
    return {"run_dir": str(cfg.run_dir), **chaos.summary()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--inference", type=int, default=3)
    ap.add_argument("--kill-every", type=float, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", action="store_true", help="separate processes on the real data plane")
    ap.add_argument("--run-dir", help="--processes: node data dirs and logs (default: a new temp dir)")
    ap.add_argument("--forged-versions", type=int, default=3000, help="--processes: forged chain length")
    args = ap.parse_args()
    res = run_processes(args) if args.processes else run(args)
    for k, v in res.items():
        print(f"{k}: {v}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
