"""CPU a worker process spends importing before it can answer: today's start against the one before.

Each case is a fresh interpreter (``python -c``), run in turn (A B A B ...) so the machine's drift
hits both alike; CPU is the child's user + system time (``resource.RUSAGE_CHILDREN``).

- wire: the wire worker module (its codec now imported on the first catch-up) against the same
  module with ``chain.catchup_producer``'s codec imports forced first (what the import did before).

    python bench/worker_start.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys

CASES = {
    "wire": ("import pulse_node.net.wire.worker",
             "import pulse_node.chain.catchup, pulse_node.chain.store; import pulse_node.net.wire.worker"),
}


def cpu_of(code: str) -> float:
    """User + system seconds of one ``python -c code`` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    print(f"{'worker':6} {'now cpu s':>10} {'plain cpu s':>12} {'ratio':>6}")
    for name, (now, plain) in CASES.items():
        cpu_of(now), cpu_of(plain)  # warm the page cache for both
        pairs = [(cpu_of(now), cpu_of(plain)) for _ in range(args.runs)]
        a, b = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        out[name] = {"now_cpu_s": round(a, 3), "plain_cpu_s": round(b, 3), "ratio": round(ratio, 3)}
        print(f"{name:6} {a:10.2f} {b:12.2f} {ratio:6.2f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
