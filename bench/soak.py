"""Soak: a real local swarm (separate processes) for a long time, with RSS and open file
descriptors of every node process sampled; memory and FDs must stay flat within 10%.

    python bench/soak.py --minutes 30 [--out docs/soak.png]

Samples every ``--every`` seconds (psutil, the node process plus its worker children);
flatness compares the mean of the last 20% of samples with the mean of the 20% after warm-up
(the first 20% are start-up). Writes a plot (matplotlib, a bench-only dependency) and prints a
JSON summary as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulse_node.config import SwarmConfig
from pulse_node.swarm.launcher import LocalSwarm


def tree_usage(pid: int) -> tuple[float, int]:
    """RSS (MB) and open FDs of a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0
    rss, fds = 0.0, 0
    for p in procs:
        try:
            rss += p.memory_info().rss / 1e6
            fds += p.num_fds()
        except psutil.NoSuchProcess:
            pass
    return rss, fds


def flatness(values: list[float]) -> float:
    """Relative change between the early-steady and the final window."""
    n = len(values)
    early = values[n // 5: max(n // 5 + 1, 2 * n // 5)]
    late = values[-max(1, n // 5):]
    a, b = sum(early) / len(early), sum(late) / len(late)
    return (b - a) / a if a else 0.0


def plot(samples: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, rows in samples.items():
        t = [r[0] / 60 for r in rows]
        ax1.plot(t, [r[1] for r in rows], label=name)
        ax2.plot(t, [r[2] for r in rows], label=name)
    ax1.set_ylabel("RSS (MB, node + workers)")
    ax2.set_ylabel("open file descriptors")
    ax2.set_xlabel("minutes")
    ax1.legend(fontsize=7, ncol=3)
    ax1.set_title("pulse-node soak: local swarm, 2 trainers + 2 inference")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--every", type=float, default=10)
    ap.add_argument("--out", default="docs/soak.png")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pulse-soak-") as tmp:
        tree = {"trainers": 2, "inference": 2, "run_dir": tmp, "run_id": "soak",
                "model": {"d_model": 64, "n_layers": 4, "n_heads": 4, "max_len": 32},
                "task": {"digits": 2}, "grpo": {"lr": 3e-4, "warmstart_steps": 300}, "eval_every": 5}
        swarm = LocalSwarm(SwarmConfig.model_validate(tree), log=lambda m: None)
        samples: dict[str, list] = {}
        t0 = time.monotonic()
        try:
            swarm.start()
            while time.monotonic() - t0 < args.minutes * 60:
                swarm.check_alive()
                for c in swarm.children:
                    rss, fds = tree_usage(c.proc.pid)
                    samples.setdefault(c.name, []).append((time.monotonic() - t0, rss, fds))
                time.sleep(args.every)
            versions = swarm.min_version()
        finally:
            swarm.stop()
    plot(samples, Path(args.out))
    summary = {"minutes": args.minutes, "versions": versions, "samples": len(next(iter(samples.values()))),
               "rss_change": {n: round(flatness([r[1] for r in rows]), 4) for n, rows in samples.items()},
               "fd_change": {n: round(flatness([float(r[2]) for r in rows]), 4) for n, rows in samples.items()},
               "rss_mb_last": {n: round(rows[-1][1], 1) for n, rows in samples.items()},
               "fds_last": {n: rows[-1][2] for n, rows in samples.items()}, "plot": args.out}
    for n in samples:
        print(f"{n}: RSS {summary['rss_mb_last'][n]} MB ({summary['rss_change'][n]:+.1%}), "
              f"FDs {summary['fds_last'][n]} ({summary['fd_change'][n]:+.1%})")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
