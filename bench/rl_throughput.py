"""Rollouts per second (inference side) and trainer tokens per second on CPU.

Uses the default solo config (warm-started tiny model, cached). Interleaves 1 and 2 torch
threads round by round so the two are measured side by side on the same (shared, noisy)
machine. Trainer tokens = prompt+completion tokens of the rollouts a GRPO step trains on.

    /work/venv/bin/python bench/rl_throughput.py [--rounds 3]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from pulse_node.configload import load_config
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import SoloConfig
from pulse_node.rl.grpo import GRPOLearner, group_advantages
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source

ROOT = Path(__file__).resolve().parents[1]


def one_round(worker, learner, task, rng, cfg: SoloConfig, version: int) -> tuple[float, float]:
    problems = task.sample(cfg.sampling.prompts_per_batch, rng)
    t0 = time.perf_counter()
    rollouts = worker.generate(problems, key=BatchKey("throughput", worker.version, "bench", rng.getrandbits(31)))
    t1 = time.perf_counter()
    learner.step(rollouts, current_version=version)
    t2 = time.perf_counter()
    adv = group_advantages(rollouts)  # the learner trains only on rollouts with signal
    trained = [r for r, a in zip(rollouts, adv) if a != 0.0]
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in trained)
    return len(rollouts) / (t1 - t0), tokens / (t2 - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = load_config(SoloConfig, ROOT / "configs" / "solo.toml")
    policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo, progress=True)
    worker, learner = RolloutWorker(policy, cfg.sampling), GRPOLearner(policy, cfg.grpo)
    worker.set_weights(policy.bf16_state(), 0)
    task, rng = make_task_source(cfg.task), random.Random(0)
    results: dict[int, dict[str, list[float]]] = {1: {"rps": [], "tps": []}, 2: {"rps": [], "tps": []}}
    for r in range(args.rounds * 2):
        threads = 1 + r % 2
        torch.set_num_threads(threads)
        rps, tps = one_round(worker, learner, task, rng, cfg, version=0)
        results[threads]["rps"].append(rps)
        results[threads]["tps"].append(tps)
    summary = {f"threads{t}": {"rollouts_per_s": statistics.median(v["rps"]),
                               "trainer_tokens_per_s": statistics.median(v["tps"])}
               for t, v in results.items()}
    batch = cfg.sampling.prompts_per_batch * cfg.sampling.group_size
    for t, s in summary.items():
        print(f"{t}: {s['rollouts_per_s']:.0f} rollouts/s, {s['trainer_tokens_per_s']:.0f} trainer tokens/s "
              f"(batch {batch} rollouts, model {sum(p.numel() for p in policy.model.parameters())} params)")
    ratio = summary["threads2"]["rollouts_per_s"] / summary["threads1"]["rollouts_per_s"]
    print(f"2 threads / 1 thread: rollouts {ratio:.2f}x, trainer "
          f"{summary['threads2']['trainer_tokens_per_s'] / summary['threads1']['trainer_tokens_per_s']:.2f}x")
    print(json.dumps({"bench": "rl_throughput", "batch_rollouts": batch, **summary}))


if __name__ == "__main__":
    main()
