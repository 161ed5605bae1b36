"""What recording the reference codec's size costs the publisher per version.

Since the status model records, per published version, the bytes the reference codec (grail
v3.1, ``pulse_node/codec/reference_size.py``) would take for the same change, every version
pays one extra diff + zstd-1 frame. This measures it side by side (min of 5, round-robin in one
run) against the publisher's own per-version CPU work: ``make_patch`` (compact, the default),
the state hash and the changed-fraction count. Workloads: two consecutive AdamW steps
(``bench/workload.py``) of the ~30M model at lr 3e-6 (PULSE's regime, ~1-3% of BF16 entries
change) and 3e-4 (dense: most entries change, like the CPU demo swarm), and of a model the
size of the default swarm's.

Run: ``/work/venv/bin/python bench/reference_size.py`` (about 4 minutes on 2 busy cores: building the 30M states dominates). The last
line is one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.codec import round_robin
from bench.workload import ModelSize, adamw_bf16_states
from pulse_node.codec.patch import make_patch
from pulse_node.codec.reference_size import reference_size
from pulse_node.codec.state import State
from pulse_node.codec.statehash import state_hash
from pulse_node.trainer.publisher import _changed_fraction

WORKLOADS = {
    "30M lr 3e-6": (ModelSize(), 3e-6),
    "30M lr 3e-4": (ModelSize(), 3e-4),
    "default-size lr 3e-4": (ModelSize(vocab=64, d_model=64, n_layers=4, n_heads=4, seq_len=32), 3e-4),
}


def _pair(size: ModelSize, lr: float) -> tuple[State, State]:
    states = [s for step, s in adamw_bf16_states(lr=lr, steps=3, size=size) if step >= 2]
    return states[0], states[1]


def measure(base: State, new: State) -> dict[str, float]:
    bh, nh = state_hash(base), state_hash(new)
    fns: dict[str, Callable[[], object]] = {
        "make_patch": lambda: make_patch(base, new, base_hash=bh, new_hash=nh),
        "state_hash": lambda: state_hash(new),
        "changed_fraction": lambda: _changed_fraction(base, new),
        "reference_size": lambda: reference_size(base, new),
    }
    for fn in fns.values():
        fn()  # compile kernels, warm caches
    t = round_robin(fns, repeat=5)
    publish = t["make_patch"] + t["state_hash"] + t["changed_fraction"]
    return {**{f"{k}_s": round(v, 4) for k, v in t.items()}, "changed": round(_changed_fraction(base, new), 5),
            "patch_bytes": len(make_patch(base, new, base_hash=bh, new_hash=nh)),
            "reference_bytes": reference_size(base, new),
            "reference_over_publish_cpu": round(t["reference_size"] / publish, 3)}


def main() -> None:
    import torch

    torch.set_num_threads(2)
    out = {}
    for label, (size, lr) in WORKLOADS.items():
        r = out[label] = measure(*_pair(size, lr))
        print(f"{label:22s} changed {r['changed']:.2%}  patch {r['patch_bytes']} B  ref {r['reference_bytes']} B  | "
              f"make_patch {r['make_patch_s'] * 1e3:.1f} ms  hash {r['state_hash_s'] * 1e3:.1f} ms  "
              f"changed-count {r['changed_fraction_s'] * 1e3:.1f} ms  reference_size "
              f"{r['reference_size_s'] * 1e3:.1f} ms = {r['reference_over_publish_cpu']:.2f}x the publisher's CPU work")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
