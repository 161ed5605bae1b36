"""Benchmark of the PULSESync patch codec on real AdamW steps (bench/workload.py).

For lr 1e-6 and 3e-6, 1-step and k-step patches, prints: density, bytes per changed element
of (1) naive int32 index + BF16 value, (2) the reference codec v3.1 (bench/ref_codec_v31.py),
(3) ours in overwrite and compact mode (compact with and without position context), (4) order-0 entropy of positions + ulp deltas and the
exponent-conditioned bound; then speed ratios measured side by side in this run
(diff+encode / bare compare, decode+apply / bare copy, also in place: ``codec/inplace.py``) and the state-hash throughput of
xxh3-128, BLAKE3 and SHA-256 on ~500 MB. The last line is one JSON object.

Run: ``/work/venv/bin/python bench/codec.py [--steps 30] [--k 8]`` (about 10 minutes on 2 cores).

At about 1 G parameters (issue 15), where AdamW does not fit beside the codec:
``python bench/codec.py --size 1b --emulate --lean --lrs 3e-6 --steps 1 --k 1 --repeat 3``
(``--size``: a bench/workload.py preset; ``--emulate``: bench/emulated_steps.py; ``--lean``: only
the default compact patch, no entropy bounds or reference codec, which need several int64 passes
over the whole model; ``--repeat``: rounds of the round-robin timing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import ref_codec_v31 as ref
from bench.emulated_steps import states
from bench.workload import SIZES, param_count
from pulse_node.codec.inplace import apply_patch_inplace
from pulse_node.codec.patch import apply_patch, make_patch
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import _tensor_prefix, state_hash
from pulse_node.codec.values import exponent_labels, ordered_key
from pulse_node.codec.warmup import clear_stale_cache


def _hb(n: np.ndarray, m: np.ndarray) -> float:
    """Sum of n * H(m / n) in bits."""
    n, m = np.asarray(n, float), np.asarray(m, float)
    ok = (m > 0) & (m < n)
    p = m[ok] / n[ok]
    return float(-(n[ok] * (p * np.log2(p) + (1 - p) * np.log2(1 - p))).sum())


def _h_counts(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(float)
    return float(-(c * np.log2(c / c.sum())).sum()) if c.size else 0.0


def entropy_bounds(base: State, new: State) -> tuple[float, float, int]:
    """(order-0 bits, exponent-conditioned bits, changed) for positions + ulp deltas."""
    pos0 = posc = 0.0
    deltas, labels = [], []
    changed = 0
    for name, t in base.items():
        a, b = t.bits, new[name].bits
        ch = a != b
        m = int(ch.sum())
        changed += m
        pos0 += _hb(np.array([a.size]), np.array([m]))
        e = exponent_labels(t.dtype, a)
        posc += _hb(np.bincount(e, minlength=256), np.bincount(e[ch], minlength=256))
        d = (ordered_key(t.dtype, b[ch]).astype(np.int64) - ordered_key(t.dtype, a[ch]).astype(np.int64))
        deltas.append(d)
        labels.append(e[ch])
    d, lab = np.concatenate(deltas), np.concatenate(labels)
    _, cnt = np.unique(d, return_counts=True)
    val0 = _h_counts(cnt)
    valc = sum(_h_counts(np.unique(d[lab == u], return_counts=True)[1]) for u in np.unique(lab))
    return pos0 + val0, posc + valc, changed


#: patch variants measured: name -> (mode, position_context)
VARIANTS = {"overwrite": ("overwrite", False), "compact": ("compact", False), "compact_ctx": ("compact", True)}


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


#: what ``--lean`` keeps (large models): the default patch only
LEAN = {"compact": ("compact", False)}
OPTS = {"lean": False, "repeat": 7}


def _variants() -> dict[str, tuple[str, bool]]:
    return LEAN if OPTS["lean"] else VARIANTS


def sizes(base: State, new: State) -> dict[str, float]:
    numel = sum(t.numel for t in base.values())
    if OPTS["lean"]:
        m = sum(int(np.count_nonzero(base[k].bits != new[k].bits)) for k in base)
        out = {"density": m / numel, "changed": m, "naive": 6.0}
    else:
        bound0, boundc, m = entropy_bounds(base, new)
        out = {"density": m / numel, "changed": m, "naive": 6.0, "ref_v31": len(ref.encode(base, new)) / m,
               "entropy_order0": bound0 / 8 / m, "entropy_exp_cond": boundc / 8 / m}
    for name, (mode, ctx) in _variants().items():
        out[name] = len(make_patch(base, new, mode=mode, position_context=ctx)) / m
    return out


def round_robin(fns: dict[str, Callable[[], object]], repeat: int = 7) -> dict[str, float]:
    """Min seconds of each function, all timed in turn ``repeat`` times (same noise, same allocator state)."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def speeds(base: State, new: State) -> dict[str, float]:
    """Seconds of each operation, min of 7 timed round-robin in one run (so a bare copy and an
    apply see the same load and allocator state); a first untimed call compiles the kernels."""
    names = sorted(base)
    bh, nh = state_hash(base), state_hash(new)
    patches = {name: make_patch(base, new, mode=mode, base_hash=bh, new_hash=nh, position_context=ctx)
               for name, (mode, ctx) in _variants().items()}
    dst = {k: base[k].bits.copy() for k in names}  # touched once: a copy into them has no page faults
    fns: dict[str, Callable[[], object]] = {
        "bare_compare": lambda: [np.flatnonzero(np.not_equal(base[k].bits, new[k].bits)) for k in names],
        "bare_copy": lambda: [base[k].bits.copy() for k in names],
        "bare_copy_warm": lambda: [np.copyto(dst[k], base[k].bits) for k in names],
        "state_hash": lambda: state_hash(new),
    }
    if not OPTS["lean"]:
        rp = ref.encode(base, new)
        fns["ref_encode"] = lambda: ref.encode(base, new)
        fns["ref_apply"] = lambda: ref.decode_apply(base, rp)
    for name, (mode, ctx) in _variants().items():
        fns[f"{name}_encode"] = lambda mode=mode, ctx=ctx: make_patch(base, new, mode=mode, base_hash=bh,
                                                                      new_hash=nh, position_context=ctx)
        fns[f"{name}_apply"] = lambda name=name: apply_patch(base, patches[name], verify=False)
        fns[f"{name}_apply_verified"] = lambda name=name: apply_patch(base, patches[name], base_hash=bh)
        own = {k: t.copy() for k, t in base.items()}  # the node's own state, patched in place and undone
        fns[f"{name}_apply_inplace"] = lambda name=name, own=own: apply_patch_inplace(
            own, patches[name], verify=False, base_hash=bh).undo(own)
    for fn in fns.values():
        fn()
    return round_robin(fns, repeat=OPTS["repeat"])


def hash_throughput(total_mb: int = 512) -> dict[str, float]:
    """MB/s of each candidate over the canonical encoding of a ~total_mb state."""
    import blake3
    import xxhash

    rng = np.random.default_rng(0)
    n_t = 64
    per = total_mb * (1 << 20) // 2 // n_t
    state = {f"t{i}": TensorBits("BF16", (per,), rng.integers(0, 1 << 16, per, dtype=np.uint16)) for i in range(n_t)}
    nbytes = sum(t.nbytes for t in state.values())

    def run(factory: Callable[[], object]) -> None:
        h = factory()
        for name in sorted(state):
            h.update(_tensor_prefix(name, state[name]))
            h.update(memoryview(state[name].bits.view(np.uint8)))
        h.hexdigest()

    cands = {
        "xxh3_128": xxhash.xxh3_128,
        "blake3_1thread": blake3.blake3,
        "blake3_auto": lambda: blake3.blake3(max_threads=blake3.blake3.AUTO),
        "sha256": hashlib.sha256,
    }
    return {k: nbytes / 1e6 / best_of(lambda f=f: run(f), repeat=2) for k, f in cands.items()}


def workload(lr: float, steps: int, k: int, size: str = "34m", emulate: bool = False) -> dict[str, object]:
    one, kstep = [], []
    timing = {}
    window: deque[State] = deque(maxlen=k + 1)
    sample_steps = {s for s in (1, steps // 2, steps) if s >= 1}
    for step, state in states(size=size, lr=lr, steps=steps, emulate=emulate):
        window.append(state)
        if step in sample_steps:
            one.append(sizes(window[-2], state))
            if step in (1, steps // 2):  # Adam's first step moves every entry; mid-run is typical
                timing["first_step" if step == 1 else "mid_run"] = speeds(window[-2], state)
        if step >= k and step % k == 0:
            kstep.append(sizes(window[0], state))
    mean = lambda rows: {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}  # noqa: E731
    return {"lr": lr, "one_step": mean(one), "k_step": mean(kstep), "k": k, "speed": timing}


def _print_sizes(label: str, s: dict[str, float]) -> None:
    if OPTS["lean"]:
        print(f"  {label:8s} density {s['density']:.3%}  B/change: compact {s['compact']:.3f}")
        return
    print(f"  {label:8s} density {s['density']:.3%}  B/change: naive {s['naive']:.2f}  ref-v3.1 {s['ref_v31']:.3f}  "
          f"overwrite {s['overwrite']:.3f}  compact {s['compact']:.3f} (+context {s['compact_ctx']:.3f})  | entropy order-0 "
          f"{s['entropy_order0']:.3f}  exp-conditioned {s['entropy_exp_cond']:.3f}")


def _print_speed(t: dict[str, float]) -> None:
    c, p = t["bare_compare"], t["bare_copy"]
    print(f"  speed (1-step, s): bare compare {c:.3f}, bare copy {p:.3f} (into touched buffers "
          f"{t['bare_copy_warm']:.3f}), state_hash {t['state_hash']:.3f}")
    for mode in _variants():
        print(f"    {mode:11s} diff+encode {t[f'{mode}_encode']:.3f} ({t[f'{mode}_encode'] / c:.1f}x compare)  "
              f"decode+apply {t[f'{mode}_apply']:.3f} ({t[f'{mode}_apply'] / p:.1f}x copy; "
              f"verified {t[f'{mode}_apply_verified'] / p:.1f}x); in place + undo "
              f"{t[f'{mode}_apply_inplace']:.3f} ({t[f'{mode}_apply_inplace'] / p:.1f}x copy, "
              f"{t[f'{mode}_apply_inplace'] / t['bare_copy_warm']:.1f}x a copy into touched buffers)")
    if OPTS["lean"]:
        return
    print(f"    ref-v3.1  diff+encode {t['ref_encode']:.3f} ({t['ref_encode'] / c:.1f}x compare)  "
          f"decode+apply {t['ref_apply']:.3f} ({t['ref_apply'] / p:.1f}x copy)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 3e-6])
    parser.add_argument("--size", choices=sorted(SIZES), default="34m")
    parser.add_argument("--emulate", action="store_true", help="emulated steps (bench/emulated_steps.py), not AdamW")
    parser.add_argument("--lean", action="store_true", help="compact only; no entropy bounds or reference codec")
    parser.add_argument("--repeat", type=int, default=7, help="rounds of the round-robin timing (min taken)")
    args = parser.parse_args()
    OPTS.update(lean=args.lean, repeat=args.repeat)
    clear_stale_cache()  # an edited kernel module must not be timed from an old compilation
    import torch

    torch.set_num_threads(2)
    n_params = param_count(SIZES[args.size])
    print(f"model: {n_params / 1e6:.1f} M params ({args.size}), "
          f"{'emulated steps' if args.emulate else 'AdamW (0.9, 0.95), wd 0.01'}, {args.steps} steps", flush=True)
    results = []
    for lr in args.lrs:
        r = workload(lr, args.steps, args.k, size=args.size, emulate=args.emulate)
        results.append(r)
        print(f"lr {lr:g}")
        _print_sizes("1-step", r["one_step"])
        _print_sizes(f"{args.k}-step", r["k_step"])
        for when, t in r["speed"].items():
            print(f"  [{when}]")
            _print_speed(t)
    hashes = hash_throughput()
    print("state hash MB/s on ~512 MB: " + ", ".join(f"{k} {v:.0f}" for k, v in hashes.items()))
    summary = {"params_m": round(n_params / 1e6, 1), "size": args.size, "emulate": args.emulate,
               "hash_mb_s": {k: round(v) for k, v in hashes.items()}}
    for r in results:
        key = f"lr{r['lr']:g}"
        summary[key] = {
            "one_step": {k: round(v, 4) for k, v in r["one_step"].items()},
            f"k{r['k']}_step": {k: round(v, 4) for k, v in r["k_step"].items()},
        }
        for when, t in r["speed"].items():
            summary[key][when] = {
                "encode_x_compare": {m: round(t[f"{m}_encode"] / t["bare_compare"], 2) for m in _variants()}
                | ({} if OPTS["lean"] else {"ref_v31": round(t["ref_encode"] / t["bare_compare"], 2)}),
                "apply_x_copy": {m: round(t[f"{m}_apply"] / t["bare_copy"], 2) for m in _variants()}
                | ({} if OPTS["lean"] else {"ref_v31": round(t["ref_apply"] / t["bare_copy"], 2)}),
                "apply_verified_x_copy": {m: round(t[f"{m}_apply_verified"] / t["bare_copy"], 2)
                                          for m in _variants()},
                "apply_x_warm_copy": {m: round(t[f"{m}_apply"] / t["bare_copy_warm"], 2) for m in _variants()},
                "seconds": {k: round(v, 3) for k, v in t.items()},
            }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
