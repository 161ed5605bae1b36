"""What recording its inner steps costs a trainer on 2 processes (torchrun, FSDP2), beside one process.

Rank 0 holds a ``DistributedEngine`` (rank 1 serves it) and a one-process ``LocalEngine`` of the
same config (a trainer of ``configs/swarm.toml``, in a swarm that runs spot checks: the sharded
trainer runs a one-process trainer's arithmetic, ``trainer/distributed.py``). Rounds of ``H`` inner
steps on the same batches (seeded rollouts of the version, rewards set so every group has a
signal) then the payload, interleaved round by round over four arms: each engine with and without
its ``InnerStepLog``. Printed per arm: rank 0's wall and CPU seconds per round (median); and the
bytes the record holds per round on each trainer (the same arrays), with the largest transient
the sharded record adds (one bucket of gathered rows, ``shards.gather_flat``). ``--checks off`` runs the sharded trainer
as in a swarm without checks (FSDP2's BF16 mixed precision), unrecorded, beside the one-process one.

    torchrun --standalone --nproc-per-node 2 bench/shard_record_cost.py [--rounds 4] [--checks on|off]

Ends (rank 0) with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pulse_node.config import SwarmConfig, TrainerConfig
from pulse_node.configload import load_config
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.swarm.launcher import node_config
from pulse_node.torchbits import module_state
from pulse_node.trainer.distributed import DistributedEngine, serve_rank
from pulse_node.trainer.engine import Engine, LocalEngine
from pulse_node.trainer.shards import BUCKET_NUMEL
from pulse_node.trainer.spot_record import InnerStepLog

ROOT = Path(__file__).resolve().parents[1]
RUN = "shard-record-cost"


def trainer_config(data_dir: str, *, checks: bool) -> TrainerConfig:
    """A trainer of the default swarm, as the launcher makes it; ``checks``: spot checks keyed."""
    swarm = load_config(SwarmConfig, ROOT / "configs" / "swarm.toml")
    tree = node_config(swarm, role="trainer", data_dir=Path(data_dir), trusted=[])
    tree["loco"] = {**tree.get("loco", {}), "spot": {**tree.get("loco", {}).get("spot", {}), "keyed": checks}}
    return TrainerConfig.model_validate(tree | {"run_id": RUN, "torch_threads": 1})


def batches(engine: LocalEngine, cfg: TrainerConfig, *, count: int) -> list[list[Rollout]]:
    """``count`` seeded batches of the base; rewards alternate within each group (every group informative)."""
    worker = RolloutWorker(engine.policy, cfg.sampling)
    worker.set_weights(module_state(engine.outer.params.items()), version=0)
    task, out = make_task_source(cfg.task), []
    for b in range(count):
        key = BatchKey(RUN, 0, "infer", b)
        rs = worker.generate(assigned_problems(task, key, cfg.sampling.prompts_per_batch), key=key)
        for i, r in enumerate(rs):
            r.reward, r.local = float(i % 2), True
        out.append(rs)
    return out


def one_round(engine: Engine, r: int, steps: list[list[Rollout]]) -> tuple[float, float]:
    """Wall and CPU seconds (this process) of one round: reset, H steps, the payload (left in the error feedback)."""
    wall, cpu = time.perf_counter(), time.process_time()
    engine.reset_local()
    engine.begin_inner_log(round=r, base_hash=engine.outer.state_hash())
    for rollouts in steps:
        engine.step(rollouts, current_version=0, producer="infer")
    engine.restore(engine.make_payload(round=r, trainer_id="t", base_hash=engine.outer.state_hash()))
    return time.perf_counter() - wall, time.process_time() - cpu


def held(log: InnerStepLog) -> int:
    """Bytes the log holds for its rounds (start state, gradients, BF16 base and changes)."""
    total = 0
    for rnd in log.rounds.values():
        total += sum(a.nbytes for a in rnd.arrays) + rnd.base_bits.nbytes
        for s in rnd.steps:
            total += (s.grad.nbytes if s.grad is not None else 0) + sum(x.nbytes for x in s.diff if x is not None)
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--checks", choices=["on", "off"], default="on")
    args = ap.parse_args()
    cfg = trainer_config(tempfile.mkdtemp(prefix="shard-record-"), checks=args.checks == "on")
    torch.set_num_threads(1)
    if int(os.environ.get("RANK", "0")) > 0:
        return serve_rank(cfg)
    sharded = DistributedEngine(cfg)
    try:
        one = LocalEngine(cfg)
        n = sum(int(np.prod(s)) for s in one.shapes.values())
        steps = batches(one, cfg, count=cfg.loco.inner_steps)
        logs = {"sharded": InnerStepLog(one.shapes, keep=2), "one": InnerStepLog(one.shapes, keep=2)}
        engines: dict[str, Engine] = {"sharded": sharded, "one": one}
        arms = [(name, rec) for name in engines for rec in ((False, True) if args.checks == "on" else (False,))]
        times: dict[str, list[tuple[float, float]]] = {f"{name} {'recorded' if rec else 'plain'}": [] for name, rec in arms}
        for r in range(args.rounds + 1):  # round 0 warms every arm up (FSDP's lazy init, allocations)
            for name, rec in arms:
                engines[name].inner_log = logs[name] if rec else None
                t = one_round(engines[name], r, steps)
                if r:
                    times[f"{name} {'recorded' if rec else 'plain'}"].append(t)
        med = {k: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v)}
               for k, v in times.items()}
        layout = sharded.work.layout
        chunks = sum(layout.chunk_numel(name) for name in layout.shapes)
        largest = max(min(chunks, BUCKET_NUMEL), *(layout.chunk_numel(name) for name in layout.shapes))
        transient = largest * layout.world * 4  # one FP32 bucket of every rank, on rank 0
        report = {"params": n, "inner_steps": cfg.loco.inner_steps, "checks": args.checks, "rounds": args.rounds,
                  "per_round": med}
        if args.checks == "on":
            report |= {"held_B_per_param_per_round": {k: held(v) / n / len(v.rounds) for k, v in logs.items()},
                       "gather_transient_bytes": transient}
        for k, v in med.items():
            print(f"{k:>18}: {v['wall_s']:.3f} s wall, {v['cpu_s']:.3f} s CPU (rank 0) per round")
        print(json.dumps(report))
    finally:
        sharded.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
