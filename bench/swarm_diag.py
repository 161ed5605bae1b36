"""Why does the default swarm learn or forget? The real roles as threads, one config knob at a time.

Runs ``pulse-node swarm``'s exact node configs (``swarm/launcher.node_config``) as an in-process
swarm (``testing/inprocess.py``: trainers and inference nodes as threads over the in-memory
transport) for ``--versions`` versions and prints, per version: held-out accuracy, the mean
reward, staleness, importance ratio and clip fraction of the batches the trainers stepped on,
and the share of batches the trainers generated themselves. Each trainer step is observed by
wrapping ``GRPOLearner.step`` (read-only: the statistics it already returns).

    python bench/swarm_diag.py --versions 40
    python bench/swarm_diag.py --versions 40 --set loco.outer_lr=0.3 --set grpo.lr=1e-4

The last line is JSON: the settings, the per-version rows and a summary (start/peak/end).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from pulse_node.config import InferenceConfig, SwarmConfig, TrainerConfig
from pulse_node.configload import load_config
from pulse_node.swarm.launcher import node_config

_local = threading.local()


def observe_steps(log: list[dict]) -> None:
    """Record every trainer inner step's statistics (and whether the batch was the trainer's own)."""
    from pulse_node.rl.grpo import GRPOLearner
    from pulse_node.trainer.role import TrainerRole

    step, own_batch = GRPOLearner.step, TrainerRole._own_batch

    def traced_step(self, rollouts, *, current_version):
        stats = step(self, rollouts, current_version=current_version)
        own = getattr(_local, "own", False)
        _local.own = False
        log.append(dict(stats, version=current_version, own=own, thread=threading.current_thread().name))
        return stats

    def traced_own(self):
        _local.own = True
        return own_batch(self)

    GRPOLearner.step, TrainerRole._own_batch = traced_step, traced_own


def per_version(steps: list[dict], evals: dict[int, float]) -> list[dict]:
    """One row per version: eval of that version, and the means over the steps that produced it."""
    by = defaultdict(list)
    for s in steps:
        by[s["version"]].append(s)  # steps taken while holding version v produce version v+1
    rows = []
    for v in sorted(set(evals) | {k + 1 for k in by}):
        st = by.get(v - 1, [])
        stepped = [s for s in st if s["stepped"]]

        def mean(key: str, xs: list = stepped) -> float | None:
            return sum(s[key] for s in xs) / len(xs) if xs else None

        rows.append({"version": v, "eval": evals.get(v), "steps": len(st), "stepped": len(stepped),
                     "reward": sum(s["reward_mean"] for s in st) / len(st) if st else None,
                     "staleness": sum(s["staleness_mean"] for s in st) / len(st) if st else None,
                     "own": sum(s["own"] for s in st) / len(st) if st else None,
                     "ratio": mean("ratio_mean"), "clip": mean("clip_frac"), "informative": mean("informative"),
                     "kept": sum(s["kept"] for s in st)})
    return rows


def summarize(evals: dict[int, float], window: int) -> dict:
    vs = sorted(evals)
    acc = [evals[v] for v in vs]
    smooth = [sum(acc[max(0, i - window + 1):i + 1]) / len(acc[max(0, i - window + 1):i + 1]) for i in range(len(acc))]
    return {"start": acc[0] if acc else None, "peak_raw": max(acc, default=None),
            "peak_version": vs[acc.index(max(acc))] if acc else None,
            "peak_smooth": max(smooth[window - 1:] or smooth, default=None),
            "end_smooth": smooth[-1] if smooth else None, "end_raw": acc[-1] if acc else None,
            "versions": vs[-1] if vs else None}


def patch_stats(hist: dict[int, dict]) -> dict:
    """Per-version BF16 changed fraction and patch size against dense BF16 (versions >= 1)."""
    vs = [v for v in sorted(hist) if v > 0 and "changed" in hist[v]]
    if not vs:
        return {}
    changed = [hist[v]["changed"] for v in vs]
    patch = sum(hist[v]["patch_bytes"] for v in vs)
    dense = sum(hist[v]["dense_bytes"] for v in vs)
    return {"changed_mean": round(sum(changed) / len(changed), 5), "changed_max": round(max(changed), 5),
            "changed_last": round(changed[-1], 5), "dense_over_patch": round(dense / max(patch, 1), 2),
            "changed_by_version": [round(c, 4) for c in changed]}


def run(cfg: SwarmConfig, root: Path, *, versions: int, timeout_s: float) -> tuple[dict[int, float], list[dict], dict]:
    from pulse_node.rl.policy import build_policy
    from pulse_node.testing.inprocess import InProcessSwarm, node_status, node_version

    # warm start once here: trainer threads warming up together race on torch's global seed
    build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo)
    steps: list[dict] = []
    observe_steps(steps)
    swarm = InProcessSwarm()
    trainers = []
    for i in range(cfg.trainers):
        tree = node_config(cfg, role="trainer", data_dir=root / f"trainer-{i}", trusted=[])
        trainers.append(swarm.start(f"trainer-{i}", TrainerConfig.model_validate(tree)))
    for i in range(cfg.inference):
        tree = node_config(cfg, role="inference", data_dir=root / f"inference-{i}", trusted=[])
        swarm.start(f"inference-{i}", InferenceConfig.model_validate(tree))
    evals: dict[int, float] = {}
    hist: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    t0 = time.monotonic()
    try:
        while time.monotonic() < deadline and not swarm.errors:
            _take_history(hist, node_status(trainers[0]))
            if min(node_version(t) for t in trainers) >= versions:
                break
            time.sleep(1.0)
        st = node_status(trainers[0])
        _take_history(hist, st)
    finally:
        swarm.stop_all()
    if swarm.errors:
        raise SystemExit("\n".join(swarm.errors))
    evals.update({v: h["eval"] for v, h in hist.items() if "eval" in h})
    counters = {k: getattr(st.trainer, k) if st is not None and st.trainer is not None else 0
                for k in ("rollouts_in", "rollouts_own", "rollouts_refused", "rollouts_used")}
    counters["seconds"] = round(time.monotonic() - t0, 1)
    counters.update(patch_stats(hist))
    return evals, steps, counters


def _take_history(hist: dict[int, dict], st) -> None:
    """Add a trainer status's version history (as plain dicts) to ``hist``."""
    if st is not None:
        hist.update({h.version: h.model_dump(exclude_none=True) for h in st.history})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=40)
    ap.add_argument("--config", default=None, help="a swarm TOML (default: the embedded default)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="key=value on SwarmConfig")
    ap.add_argument("--timeout-min", type=float, default=30.0)
    ap.add_argument("--window", type=int, default=5, help="running-mean window for peak/end")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    cfg = load_config(SwarmConfig, args.config, args.overrides)
    with tempfile.TemporaryDirectory(prefix="swarm-diag-") as tmp:
        evals, steps, counters = run(cfg, Path(tmp), versions=args.versions, timeout_s=args.timeout_min * 60)
    rows = per_version(steps, evals)
    print(f"{'ver':>4} {'eval':>6} {'reward':>6} {'stale':>5} {'own':>4} {'ratio':>6} {'clip':>5} {'steps':>5}",
          file=sys.stderr)

    def fmt(x: float | None, f: str) -> str:
        return format(x, f) if x is not None else "-"

    for r in rows:
        print(f"{r['version']:>4} {fmt(r['eval'], '6.3f')} {fmt(r['reward'], '6.3f')} {fmt(r['staleness'], '5.2f')} "
              f"{fmt(r['own'], '4.2f')} {fmt(r['ratio'], '6.3f')} {fmt(r['clip'], '5.3f')} {r['stepped']:>2}/{r['steps']:<2}",
              file=sys.stderr)
    summary = summarize(evals, args.window)
    print(json.dumps({"label": args.label, "overrides": args.overrides, "summary": summary,
                      "counters": counters, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
