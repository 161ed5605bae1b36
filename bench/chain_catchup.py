"""Catch-up patch size vs the sum of per-version patches, and store replay cost.

A peer k versions behind can fetch either the k patches a+1..a+k or one catch-up patch a->a+k
(``pulse_node.chain.catchup.make_catchup``). This prints both sizes side by side for several k,
for the synthetic Adam-like sequence (random +-1 ulp steps on ~1% of entries per step, 75% of
them on entries that changed before) and, with ``--adamw``, for real AdamW steps of the small
transformer in ``bench/workload.py`` (torch, slower).

``--produce`` instead times what a serving node pays to make one catch-up on demand
(``chain/catchup_producer.py`` on a signed store, anchor every 10): for the tiny default model
(208 K parameters, AdamW lr 3e-4 like GRPO) and for the 33.7 M-parameter AdamW workload
(``--states-dir`` reuses BF16 states saved as ``<step>.safetensors``, else they are generated).

Run: ``/work/venv/bin/python bench/chain_catchup.py [--numel 4000000] [--adamw] [--produce]``
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic generator lives with the chain tests
sys.path.insert(0, str(ROOT))

from pulse_node.chain.catchup import make_catchup  # noqa: E402
from pulse_node.codec.patch import make_patch  # noqa: E402
from pulse_node.codec.state import State  # noqa: E402
from pulse_node.codec.warmup import clear_stale_cache  # noqa: E402

KS = (1, 2, 4, 8, 16, 32)


def synthetic_states(numel: int, steps: int, seed: int = 0) -> list[State]:
    from test_chain_synth import adam_like_chain

    rows = max(1, numel // 1024)
    shapes = {f"layer{i}.weight": (rows // 4, 1024) for i in range(4)}
    return adam_like_chain(seed, steps, shapes=shapes)


def adamw_states(steps: int, lr: float) -> list[State]:
    from bench.workload import adamw_bf16_states

    return [state for _, state in adamw_bf16_states(lr=lr, steps=steps)]


def tiny_default_states(steps: int) -> list[State]:
    """A model the size of the default tiny policy (~0.2 M parameters) under AdamW lr 3e-4."""
    from bench.workload import ModelSize

    size = ModelSize(vocab=64, d_model=64, n_layers=4, n_heads=4, seq_len=32, batch=8)
    return [state for _, state in adamw_bf16_states_sized(size, lr=3e-4, steps=steps)]


def adamw_bf16_states_sized(size, *, lr: float, steps: int):
    from bench.workload import adamw_bf16_states

    return adamw_bf16_states(lr=lr, steps=steps, size=size, warmup_steps=5)


def saved_states(folder: Path, steps: int) -> list[State]:
    from pulse_node.codec.state import load_safetensors

    return [load_safetensors(folder / f"{v}.safetensors") for v in range(steps + 1)]


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, round(time.perf_counter() - t0, 3)


def measure_production(states: list[State], label: str) -> dict:
    """Seconds a serving node spends making catch-ups on demand from its store (anchor every 10)."""
    from test_chain_synth import build_chain, verified

    from pulse_node.chain.catchup_producer import CatchupProducer
    from pulse_node.chain.store import VersionStore

    chain = build_chain(states, anchor_every=10)
    top = len(states) - 1
    with tempfile.TemporaryDirectory() as tmp:
        with VersionStore(Path(tmp), trusted_signers=None) as store:
            for v, (record, patch) in enumerate(chain):
                if record.is_anchor:
                    store.put_anchor(verified(record, state=states[v]))
                if patch is not None:
                    store.put_patch(verified(record, patch))
            _, anchor_s = _timed(store.load_state, 20)
            _, replay9_s = _timed(store.load_state, 29)
            _, make_s = _timed(lambda: make_catchup(states[top - 24], states[top], from_version=top - 24,
                                                    to_version=top))
        producer = CatchupProducer(Path(tmp), wait_s=600)
        cases = [("cold: target anchor+1, base anchor+3", 3, top - 1),
                 ("next head: target from cached state, base anchor+8", 8, top),
                 ("same head, base anchor+4", 24, top),
                 ("same head, base is the newest anchor (a joiner)", top - top % 10, top),
                 ("cached file", 8, top)]
        rows = []
        for name, base, target in cases:
            path, seconds = _timed(producer.request, base, target)
            summed = sum(len(chain[v][1]) for v in range(base + 1, target + 1))
            rows.append({"case": name, "base": base, "target": target, "seconds": seconds,
                         "catchup_bytes": path.stat().st_size, "sum_patch_bytes": summed})
    return {"label": label, "params": sum(t.numel for t in states[0].values()),
            "load_anchor_s": anchor_s, "load_anchor_plus_9_patches_s": replay9_s,
            "make_catchup_k24_s": make_s, "requests": rows}


def print_production(r: dict) -> None:
    print(f"\nproduction on demand, {r['label']} ({r['params']:,} parameters): load anchor "
          f"{r['load_anchor_s']} s, anchor + 9 patches {r['load_anchor_plus_9_patches_s']} s, "
          f"make_catchup k=24 from memory {r['make_catchup_k24_s']} s")
    for row in r["requests"]:
        print(f"  {row['case']:52} v{row['base']:>2} -> v{row['target']:<2} {row['seconds']:>7.3f} s "
              f"{row['catchup_bytes']:>11,} B (patches: {row['sum_patch_bytes']:,} B)")


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
    ap.add_argument("--produce", action="store_true", help="time on-demand production instead")
    ap.add_argument("--states-dir", type=Path, help="saved 33.7M BF16 states <step>.safetensors (0..32)")
    args = ap.parse_args()
    clear_stale_cache()  # an edited kernel module must not be timed from an old compilation
    if args.produce:
        runs = [measure_production(tiny_default_states(32), "tiny default model")]
        big = saved_states(args.states_dir, 32) if args.states_dir else adamw_states(32, args.lr)
        runs.append(measure_production(big, f"33.7M AdamW lr {args.lr}"))
        for r in runs:
            print_production(r)
        print(json.dumps({"bench": "chain_catchup_production", "runs": runs}))
        return
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
