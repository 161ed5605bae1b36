"""Catch-up patch size vs the sum of per-version patches, and store replay cost.

A peer k versions behind can fetch either the k patches a+1..a+k or one catch-up patch a->a+k
(``pulse_node.chain.catchup.make_catchup``). This prints both sizes side by side for several k,
for the synthetic Adam-like sequence (random +-1 ulp steps on ~1% of entries per step, 75% of
them on entries that changed before) and, with ``--adamw``, for real AdamW steps of the small
transformer in ``bench/workload.py`` (torch, slower).

Run: ``/work/venv/bin/python bench/chain_catchup.py [--numel 4000000] [--adamw]``
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic generator lives with the chain tests
sys.path.insert(0, str(ROOT))

from pulse_node.chain.catchup import make_catchup  # noqa: E402
from pulse_node.codec.patch import make_patch  # noqa: E402
from pulse_node.codec.state import State  # noqa: E402

KS = (1, 2, 4, 8, 16, 32)


def synthetic_states(numel: int, steps: int, seed: int = 0) -> list[State]:
    from test_chain_synth import adam_like_chain

    rows = max(1, numel // 1024)
    shapes = {f"layer{i}.weight": (rows // 4, 1024) for i in range(4)}
    return adam_like_chain(seed, steps, shapes=shapes)


def adamw_states(steps: int, lr: float) -> list[State]:
    from bench.workload import adamw_bf16_states

    return [state for _, state in adamw_bf16_states(lr=lr, steps=steps)]


def changed_entries(a: State, b: State) -> int:
    return int(sum((a[n].bits != b[n].bits).sum() for n in a))


def measure(states: list[State], mode: str) -> list[dict]:
    """For each k: bytes of patches 1..k summed vs one catch-up patch 0->k."""
    patches = [make_patch(states[v - 1], states[v], mode=mode) for v in range(1, len(states))]
    rows = []
    for k in (k for k in KS if k < len(states)):
        t0 = time.perf_counter()
        single = make_catchup(states[0], states[k], from_version=0, to_version=k, mode=mode)
        seconds = time.perf_counter() - t0
        summed = sum(len(p) for p in patches[:k])
        entries_sum = sum(changed_entries(states[v - 1], states[v]) for v in range(1, k + 1))
        rows.append({"mode": mode, "k": k, "sum_bytes": summed, "catchup_bytes": len(single),
                     "ratio": round(len(single) / summed, 4),
                     "entries_union": changed_entries(states[0], states[k]),
                     "entries_sum": entries_sum, "make_s": round(seconds, 4)})
    return rows


def print_rows(label: str, rows: list[dict]) -> None:
    print(f"\n{label}")
    print(f"{'mode':9} {'k':>3} {'sum of k patches':>17} {'catch-up':>10} {'ratio':>7} "
          f"{'union/sum entries':>18} {'make s':>7}")
    for r in rows:
        print(f"{r['mode']:9} {r['k']:>3} {r['sum_bytes']:>17,} {r['catchup_bytes']:>10,} "
              f"{r['ratio']:>7.3f} {r['entries_union'] / r['entries_sum']:>18.3f} {r['make_s']:>7.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=4_000_000, help="synthetic state size (BF16)")
    ap.add_argument("--adamw", action="store_true", help="also run real AdamW steps (torch)")
    ap.add_argument("--lr", type=float, default=3e-6)
    args = ap.parse_args()
    result: dict = {"bench": "chain_catchup", "numel": args.numel}
    states = synthetic_states(args.numel, max(KS))
    for mode in ("compact", "overwrite"):
        rows = measure(states, mode)
        print_rows(f"synthetic Adam-like, {args.numel:,} BF16 entries, 1%/step, 75% locality", rows)
        result[f"synthetic_{mode}"] = rows
    if args.adamw:
        states = adamw_states(max(KS), args.lr)
        rows = measure(states, "compact")
        print_rows(f"AdamW lr={args.lr} (bench/workload.py)", rows)
        result["adamw_compact"] = rows
    print(json.dumps(result))


if __name__ == "__main__":
    main()
