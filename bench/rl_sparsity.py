"""BF16 sparsity of real GRPO steps at realistic learning rates, next to the authors' data.

Starts from the warm-started default model (configs/solo.toml, cached warm start), runs
on-policy GRPO inner steps at lr 1e-6 and 3e-6, and measures the fraction of BF16 elements
that are bit-identical between versions t and t+k for k = 1, 8, 32 (k-step sparsity), the FP32
change fraction, and per-step sparsity by |w| quartile. Compares with
/work/shared/reference/data/sparsity_k_step_combined.csv at lr 3e-6 (iteration_num 1).

    /work/venv/bin/python bench/rl_sparsity.py [--steps 48] [--prompts 16] [--lrs 1e-6,3e-6]
        [--set model.d_model=256 --set task.ops=+-* ...]

``--set`` overrides any key of ``configs/solo.toml`` (other models, tasks, warm starts), to probe
which workloads have LLM-like k-step sparsity.

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from pulse_node.configload import load_config
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import SoloConfig
from pulse_node.rl.grpo import GRPOLearner, bf16_bits
from pulse_node.rl.policy import build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source

ROOT = Path(__file__).resolve().parents[1]
CSV = Path("/work/shared/reference/data/sparsity_k_step_combined.csv")
KS = (1, 8, 32)


def reference(lr: str = "3e-06") -> dict[str, dict[int, float]]:
    """Mean sparsity (%) per model and k at ``lr``, on-policy rows (iteration_num 1)."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    with CSV.open() as fh:
        for row in csv.DictReader(fh):
            if row["learning_rate"] == lr and row["iteration_num"] == "1" and int(row["k"]) in KS:
                acc[f"{row['model_family']}-{row['model_size']}"][int(row["k"])].append(float(row["sparsity"]))
    return {m: {k: statistics.fmean(v) for k, v in ks.items()} for m, ks in sorted(acc.items())}


def k_sparsity(snaps: list[dict[str, torch.Tensor]], k: int) -> float | None:
    vals = []
    for t in range(k, len(snaps)):
        same = sum(int((snaps[t][n] == snaps[t - k][n]).sum()) for n in snaps[t])
        vals.append(100.0 * same / sum(x.numel() for x in snaps[t].values()))
    return statistics.fmean(vals) if vals else None


def quartile_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                    weights: torch.Tensor) -> list[float]:
    changed = torch.cat([(before[n] != after[n]).flatten() for n in before])
    order = weights.abs().argsort()
    return [100.0 * float(changed[q].float().mean()) for q in order.chunk(4)]


def run_lr(cfg: SoloConfig, lr: float, *, steps: int) -> dict:
    cfg = cfg.model_copy(update={"grpo": cfg.grpo.model_copy(update={"lr": lr})})
    policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo)
    worker, learner = RolloutWorker(policy, cfg.sampling), GRPOLearner(policy, cfg.grpo)
    task, rng = make_task_source(cfg.task), random.Random(f"sparsity:{lr}")
    snaps, fp32_changed, quart = [bf16_bits(policy.model)], [], []
    t0 = time.monotonic()
    for v in range(steps):
        worker.set_weights(policy.bf16_state(), v)
        rollouts = worker.generate(task.sample(cfg.sampling.prompts_per_batch, rng),
                                   key=BatchKey(f"sparsity-{lr}", v, "bench", 0))
        before32 = torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])
        learner.step(rollouts, current_version=v)
        after32 = torch.cat([p.detach().flatten() for p in policy.model.parameters()])
        fp32_changed.append(100.0 * float((before32 != after32).float().mean()))
        snaps.append(bf16_bits(policy.model))
        quart.append(quartile_change(snaps[-2], snaps[-1], before32))
    out = {f"k{k}": k_sparsity(snaps, k) for k in KS}
    out["fp32_changed_pct"] = statistics.fmean(fp32_changed)
    out["changed_pct_by_abs_w_quartile"] = [statistics.fmean(q[i] for q in quart) for i in range(4)]
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--lrs", default="1e-6,3e-6", help="inner GRPO lrs (3e-6 is compared with the authors)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of configs/solo.toml (repeatable)")
    args = ap.parse_args()
    cfg = load_config(SoloConfig, ROOT / "configs" / "solo.toml",
                      [f"sampling.prompts_per_batch={args.prompts}", *args.set])
    torch.set_num_threads(cfg.threads or 1)
    policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo, progress=True)
    w = torch.cat([p.detach().abs().flatten() for p in policy.model.parameters()])
    mats = torch.cat([p.detach().abs().flatten() for p in policy.model.parameters() if p.dim() == 2])
    medians = {"median_abs_w_all": float(w.median()), "median_abs_w_matrices": float(mats.median())}
    print(f"params {w.numel()}, median |w| all {medians['median_abs_w_all']:.4f}, "
          f"2-D matrices {medians['median_abs_w_matrices']:.4f} (real LLMs ~0.02)")
    ours = {}
    for lr in (float(x) for x in args.lrs.split(",")):
        ours[str(lr)] = r = run_lr(cfg, lr, steps=args.steps)
        growth = "  ".join(f"k={k}/k=1 {(100 - r[f'k{k}']) / max(1e-9, 100 - r['k1']):.2f}x"
                           for k in KS[1:] if r[f"k{k}"] is not None)
        print(f"ours lr {lr:g}: sparsity k=1 {r['k1']:.2f}%  k=8 {r['k8']:.2f}%  k=32 {r['k32']:.2f}%  ({growth})  "
              f"FP32 changed {r['fp32_changed_pct']:.1f}%  changed by |w| quartile (small..large) "
              + " ".join(f"{x:.2f}%" for x in r["changed_pct_by_abs_w_quartile"]) + f"  ({r['seconds']}s)")
    ref = reference()
    for model, ks in ref.items():
        print(f"authors {model:>10} lr 3e-6: " + "  ".join(f"k={k} {ks.get(k, float('nan')):.2f}%" for k in KS))
    mine = ours.get(str(3e-6))
    if mine is None:
        print(json.dumps({"bench": "rl_sparsity", "steps": args.steps, "set": args.set, **medians, "ours": ours}))
        return
    print("ratio of changed fractions ours/authors-mean at lr 3e-6: " + "  ".join(
        f"k={k} {(100 - mine[f'k{k}']) / (100 - statistics.fmean(m[k] for m in ref.values() if k in m)):.2f}x"
        for k in KS))
    print(json.dumps({"bench": "rl_sparsity", "steps": args.steps, "set": args.set, **medians, "ours": ours,
                      "authors_lr3e-6": ref}))


if __name__ == "__main__":
    main()
