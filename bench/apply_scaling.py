"""Does applying a patch scale linearly with the model? Apply, copy and hash per parameter at several sizes.

For each preset size (``bench/workload.py`` SIZES) two consecutive versions from
``bench/emulated_steps.py`` and the compact patch between them; then, ``--repeat`` times in turn:
a bare copy of the state into new arrays (what apply does to every changed tensor), a copy into
buffers already touched (memory bandwidth alone), ``apply_patch`` without the result hash, the
same patch applied in place into a state of its own and undone (``codec/inplace.py``), and
the state hash. Each row: seconds, ns per parameter, minor page faults and the kernel's
transparent-huge-page and compaction counters (/proc/vmstat) during the operation. Last line: JSON.

    python bench/apply_scaling.py --sizes 166m 1b --repeat 5
    python bench/apply_scaling.py --sizes 1b --no-thp        # the same with transparent huge pages off for this process
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VMSTAT = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall")


def _counters() -> dict[str, int]:
    out = {"minflt": resource.getrusage(resource.RUSAGE_SELF).ru_minflt}
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in VMSTAT:
                out[k] = int(v)
    return out


def _timed(fn) -> dict[str, float]:
    c0, t0 = _counters(), time.perf_counter()
    res = fn()
    dt, c1 = time.perf_counter() - t0, _counters()
    del res
    return {"s": dt, **{k: c1[k] - c0[k] for k in c0}}


def one_size(size: str, repeat: int) -> dict:
    import numpy as np

    from bench.emulated_steps import states
    from pulse_node.codec.inplace import apply_patch_inplace
    from pulse_node.codec.patch import apply_patch, make_patch
    from pulse_node.codec.statehash import state_hash

    gen = states(size=size, lr=3e-6, steps=1, emulate=True)
    _, base = next(gen)
    _, new = next(gen)
    gen.close()
    bh = state_hash(base)
    patch = make_patch(base, new, base_hash=bh, new_hash=state_hash(new))
    del new
    n = sum(t.numel for t in base.values())
    dst = {k: t.bits.copy() for k, t in base.items()}
    own = {k: t.copy() for k, t in base.items()}
    ops = {
        "copy_new_arrays": lambda: [t.bits.copy() for t in base.values()],
        "copy_touched": lambda: [np.copyto(dst[k], t.bits) for k, t in base.items()],
        "apply_no_hash": lambda: apply_patch(base, patch, verify=False, base_hash=bh),
        # in place (codec/inplace.py) into the node's own state, then undone: no page faults
        "apply_inplace_and_undo": lambda: apply_patch_inplace(own, patch, verify=False, base_hash=bh).undo(own),
        "state_hash": lambda: state_hash(base),
    }
    apply_patch(base, patch, verify=False, base_hash=bh)  # kernels compiled / loaded
    rows: dict[str, list[dict]] = {k: [] for k in ops}
    for _ in range(repeat):
        for k, fn in ops.items():
            rows[k].append(_timed(fn))
    out = {"size": size, "params": n, "patch_bytes": len(patch), "ops": {}}
    for k, rs in rows.items():
        secs = sorted(r["s"] for r in rs)
        out["ops"][k] = {"min_s": secs[0], "median_s": secs[len(secs) // 2], "max_s": secs[-1],
                         "median_ns_per_param": secs[len(secs) // 2] / n * 1e9,
                         **{c: sorted(r[c] for r in rs)[len(rs) // 2] for c in ("minflt", *VMSTAT) if c in rs[0]}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["166m", "1b"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-thp", action="store_true", help="prctl(PR_SET_THP_DISABLE): 4 kB pages only")
    args = ap.parse_args()
    if args.no_thp:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) != 0:  # PR_SET_THP_DISABLE
            sys.exit("prctl(PR_SET_THP_DISABLE) failed")
    import torch

    from pulse_node.codec.warmup import warm_up

    torch.set_num_threads(2)
    warm_up()
    results = []
    for size in args.sizes:
        r = one_size(size, args.repeat)
        results.append(r)
        print(f"{size}: {r['params'] / 1e6:.0f} M params, patch {r['patch_bytes'] / 1e6:.2f} MB", flush=True)
        for k, o in r["ops"].items():
            extra = ", ".join(f"{c} {o[c]}" for c in ("minflt", *VMSTAT) if c in o)
            print(f"  {k:16s} median {o['median_s']:.3f} s (min {o['min_s']:.3f}, max {o['max_s']:.3f}) = "
                  f"{o['median_ns_per_param']:.2f} ns/param; {extra}", flush=True)
    print(json.dumps({"bench": "apply_scaling", "no_thp": args.no_thp, "results": results}))


if __name__ == "__main__":
    main()
