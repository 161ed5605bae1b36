"""Does the default swarm learn and keep it? ``pulse-node swarm`` for M minutes against ``pulse-node solo``.

For each seed:

1. warm-start the embedded model once in this process (cached under ``model.cache_dir``, the
   same file the nodes load), so the warm start does not eat the swarm's minutes;
2. run the local swarm (``swarm/launcher.LocalSwarm``: bootstrap + trainers + inference nodes as
   processes, exactly what ``pulse-node swarm`` starts) for ``--minutes`` of wall clock from
   launch (process start-up included, as a user sees it), reading
   the trainers' per-version held-out accuracy from their ``status.json`` every 2 s (so the
   files' bounded history never loses the start);
3. run ``pulse-node solo`` on the same model, task, GRPO settings and seed (hence the same warm
   start and held-out set) for as many GRPO steps as it takes to consume the rollouts the swarm's
   trainers consumed (``rollouts_used`` summed over trainers), evaluating ~40 times on the way.

Start, peak and end, per run: start is the accuracy of version 0 (solo: before GRPO). Single
evaluations of a policy that moves every version flip borderline problems, so peak and end are
read from the running mean over ``--window`` consecutive evaluations (peak = the highest running
mean, end = the last one); the raw maximum and last value are printed next to them. Targets
(issue 16): end >= start + 0.15 and end >= peak - 0.05, for every swarm run.

    nice -n 10 python bench/swarm_learning.py                     # 10 minutes x seeds 0,1,2 (+ solo)
    nice -n 10 python bench/swarm_learning.py --minutes 30 --seeds 0
    python bench/swarm_learning.py --minutes 2 --seeds 0 --no-solo # a quick look

Prints a table and, as the last line, JSON with start/peak/end per run and pass/fail. Curves
(every evaluation) go to ``<run-dir>/swarm_learning.json``. Report the machine's load with the
numbers: a loaded machine makes fewer versions (and solo steps) in the same minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from pulse_node.config import SwarmConfig
from pulse_node.configload import load_config
from pulse_node.errors import PulseError
from pulse_node.swarm.launcher import LocalSwarm

GAIN_MIN, DROP_MAX = 0.15, 0.05
COUNTERS = ("rollouts_used", "rollouts_in", "rollouts_own", "rollouts_refused", "patch_bytes_total",
            "dense_bytes_total")


def log(msg: str) -> None:
    print(f"[swarm_learning {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def warm_start(cfg: SwarmConfig) -> None:
    """Train (or load) the cached warm start the nodes will load, once, in this process."""
    import torch

    from pulse_node.rl.policy import build_policy

    torch.set_num_threads(1)
    build_policy(cfg.model.model_copy(update={"device": "cpu"}), cfg.task, seed=cfg.seed,
                 grpo_cfg=cfg.grpo, progress=True)


def curve_stats(points: list[tuple[float, float]], window: int) -> dict:
    """start / smoothed peak and end / raw peak and end of ``(x, accuracy)`` points sorted by x."""
    acc = [a for _, a in points]
    if not acc:
        return {"start": None, "peak": None, "end": None, "peak_raw": None, "end_raw": None, "evals": 0}
    w = max(1, min(window, len(acc)))
    smooth = [sum(acc[i - w + 1:i + 1]) / w for i in range(w - 1, len(acc))]
    return {"start": acc[0], "peak": max(smooth), "end": smooth[-1], "peak_raw": max(acc),
            "end_raw": acc[-1], "evals": len(acc)}


def verdict(stats: dict) -> dict:
    if stats["start"] is None:
        return {"gain": None, "drop": None, "pass": False}
    gain, drop = round(stats["end"] - stats["start"], 4), round(stats["peak"] - stats["end"], 4)
    return {"gain": gain, "drop": drop, "pass": gain >= GAIN_MIN and drop <= DROP_MAX}


class Watch:
    """Accumulates the trainers' per-version history and summed counters from their status.json."""

    def __init__(self, swarm: LocalSwarm) -> None:
        self.swarm = swarm
        self.history: dict[int, dict] = {}
        self.counters: dict[str, float] = {}

    def poll(self) -> None:
        trainers = [st for c, st in self.swarm.statuses() if c.role == "trainer" and st is not None]
        if not trainers:
            return
        for status in trainers:  # every trainer holds the same state per version; only one evaluated genesis
            for h in status.history:
                self.history.setdefault(h.version, {}).update(h.model_dump(exclude_none=True))
        for key in COUNTERS:
            self.counters[key] = sum(getattr(s.trainer, key) for s in trainers if s.trainer is not None)

    def evals(self) -> list[tuple[float, float]]:
        return [(v, h["eval"]) for v, h in sorted(self.history.items()) if "eval" in h]


def run_swarm(cfg: SwarmConfig, minutes: float) -> dict:
    swarm = LocalSwarm(cfg, log=log)
    watch = Watch(swarm)
    t0 = time.monotonic()
    next_note = t0 + 30
    try:
        swarm.start()
        while time.monotonic() < t0 + minutes * 60:
            swarm.check_alive()
            watch.poll()
            if time.monotonic() >= next_note:
                ev = watch.evals()
                log(f"swarm seed {cfg.seed}: {time.monotonic() - t0:.0f}s, version {max(watch.history, default=-1)}, "
                    f"eval {ev[-1][1] if ev else '-'}, load {load()}")
                next_note += 30
            time.sleep(2.0)
        watch.poll()
    finally:
        swarm.stop()
    changed = [h["changed"] for v, h in watch.history.items() if v > 0 and "changed" in h]
    return {"versions": max(watch.history, default=-1), "seconds": round(time.monotonic() - t0, 1),
            "evals": watch.evals(), "changed_mean": sum(changed) / len(changed) if changed else None,
            **{k: int(v) for k, v in watch.counters.items()}}


def solo_config(cfg: SwarmConfig, *, steps: int, minutes: float) -> dict:
    """The solo run matching ``cfg``: same model, task, sampling, GRPO and seed; ``steps`` steps."""
    tree = cfg.model_dump(mode="json", include={"model", "task", "sampling", "grpo", "seed"}, exclude_none=True)
    tree.update(max_steps=steps, minutes=minutes, threads=1, eval_every=max(1, steps // 40), sync_every=1)
    return tree


def run_solo(cfg: SwarmConfig, *, rollouts: int, minutes_cap: float, workdir: Path) -> dict:
    per_step = cfg.sampling.prompts_per_batch * cfg.sampling.group_size
    steps = max(1, math.ceil(rollouts / per_step))
    conf = workdir / f"solo-seed{cfg.seed}.toml"
    conf.write_text(tomli_w.dumps(solo_config(cfg, steps=steps, minutes=minutes_cap)))
    log(f"solo seed {cfg.seed}: {steps} GRPO steps ({steps * per_step} rollouts), load {load()}")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pulse_node", "solo", "--config", str(conf), "--json", "--quiet"],
                         stdout=subprocess.PIPE, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    evals = [(0, res["eval_before"])] + [(h["step"], h["eval"]) for h in res["history"]]
    if not res["history"] or res["history"][-1]["step"] != res["steps"]:
        evals.append((res["steps"], res["eval_after"]))
    return {"steps": res["steps"], "rollouts": res["rollouts"], "evals": evals,
            "seconds": round(time.monotonic() - t0, 1), "capped": res["steps"] < steps}


def attempt(kind: str, seed: int, run) -> dict:
    """``run()``, or a failed run carrying the error (a dead node or solo process) so the other
    seeds still run and the JSON says what went wrong."""
    try:
        return run()
    except (PulseError, subprocess.CalledProcessError, OSError, ValueError) as exc:
        log(f"{kind} seed {seed} FAILED: {exc}")
        return {"evals": [], "error": f"{type(exc).__name__}: {exc}"}


def row(kind: str, seed: int, run: dict, window: int) -> dict:
    stats = curve_stats(run["evals"], window)
    out = {"kind": kind, "seed": seed, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()},
           **verdict(stats)}
    keep = ("versions", "steps", "rollouts", "rollouts_used", "rollouts_in", "rollouts_own", "rollouts_refused",
            "seconds", "changed_mean", "patch_bytes_total", "dense_bytes_total", "capped", "error")
    out.update({k: (round(run[k], 4) if isinstance(run[k], float) else run[k]) for k in keep if k in run})
    return out


def print_table(rows: list[dict], file=sys.stdout) -> None:
    head = f"{'run':<6} {'seed':>4} {'versions/steps':>14} {'rollouts':>9} {'start':>6} {'peak':>6} {'end':>6} " \
           f"{'gain':>6} {'drop':>6} {'peak raw':>8} {'end raw':>7}  pass"
    print(head, file=file)

    def fmt(x: object) -> str:
        return f"{x:.3f}" if isinstance(x, float) else "-"

    for r in rows:
        n = r.get("versions", r.get("steps", "-"))
        rollouts = r.get("rollouts_used", r.get("rollouts", "-"))
        print(f"{r['kind']:<6} {r['seed']:>4} {n:>14} {rollouts:>9} {fmt(r['start']):>6} {fmt(r['peak']):>6} "
              f"{fmt(r['end']):>6} {fmt(r['gain']):>6} {fmt(r['drop']):>6} {fmt(r['peak_raw']):>8} "
              f"{fmt(r['end_raw']):>7}  {'yes' if r['pass'] else 'NO'}", file=file)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="wall clock of each swarm run (default 10)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (default 0,1,2)")
    ap.add_argument("--config", default=None, help="swarm TOML (default: the embedded default, as `pulse-node swarm`)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--window", type=int, default=5, help="running-mean window (evaluations) for peak and end")
    ap.add_argument("--no-solo", action="store_true", help="skip the solo runs")
    ap.add_argument("--run-dir", default=None, help="node dirs and curves (default: a fresh temp dir)")
    args = ap.parse_args()
    root = Path(args.run_dir or tempfile.mkdtemp(prefix="swarm-learning-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    loads, rows, curves = [load()], [], {}
    log(f"{args.minutes} min x seeds {seeds}, run dir {root}, load {loads[0]}")
    for seed in seeds:
        cfg = load_config(SwarmConfig, args.config,
                          args.overrides + [f"seed={seed}", f"run_dir={json.dumps(str(root / f'seed{seed}'))}"])
        warm_start(cfg)
        swarm = attempt("swarm", seed, functools.partial(run_swarm, cfg, args.minutes))
        loads.append(load())
        rows.append(row("swarm", seed, swarm, args.window))
        curves[f"swarm-{seed}"] = swarm["evals"]
        if not args.no_solo and swarm.get("rollouts_used"):
            solo = attempt("solo", seed, functools.partial(run_solo, cfg, rollouts=swarm["rollouts_used"],
                                                                 minutes_cap=6 * args.minutes, workdir=root))
            loads.append(load())
            rows.append(row("solo", seed, solo, args.window))
            curves[f"solo-{seed}"] = solo["evals"]
        print_table(rows, file=sys.stderr)  # so far
        (root / "swarm_learning.json").write_text(json.dumps({"rows": rows, "curves": curves}, indent=1))
    print_table(rows)
    swarm_rows = [r for r in rows if r["kind"] == "swarm"]
    result = {"minutes": args.minutes, "seeds": seeds, "config": args.config, "overrides": args.overrides,
              "window": args.window, "targets": {"gain_min": GAIN_MIN, "drop_max": DROP_MAX},
              "load_1min": loads, "runs": rows, "pass": bool(swarm_rows) and all(r["pass"] for r in swarm_rows),
              "curves_file": str(root / "swarm_learning.json")}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
