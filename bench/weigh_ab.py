"""What the robust rule's weighing costs, this tree against another checkout, in one process.

``robust_weights`` (``loco/aggregate.py``) of ``--old`` (a checkout of the code to compare with,
e.g. a worktree at an older commit) against this tree's, on the byzantine bench's model
(``configs/trainer.toml``: 52 tensors, 208,448 parameters) with six payloads of the density the
bench's rounds have (80% of entries fired at lr 3e-4; one payload five times the others, so it is
clipped) and an outer momentum, alternating old and new. Both must give the same FP32 weights.
CPU is ``time.process_time``.

    python bench/weigh_ab.py --old /path/to/old/checkout [--repeats 30]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]


def _old(old: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("old_aggregate", old / "pulse_node" / "loco" / "aggregate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_aggregate"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="a checkout of the code to compare with")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()

    from pulse_node.config import load_node_config
    from pulse_node.loco import aggregate, clip_kernel
    from pulse_node.loco.payload import LocoPayload
    from pulse_node.testing.byzantine.world import World

    clip_kernel.warm()
    old = _old(args.old)
    cfg = load_node_config(ROOT / "configs" / "trainer.toml", ["sampling.prompts_per_batch=16"], role="trainer")
    numel = {n: int(np.prod(s)) for n, s in World(cfg).shapes.items()}
    rng = np.random.default_rng(0)
    payloads = []
    for k in range(6):
        tensors = {}
        for name, size in numel.items():
            idx = np.flatnonzero(rng.random(size) < 0.8).astype(np.int64)
            tensors[name] = (idx, (rng.standard_normal(idx.size) * 1e-4 * (5 if k == 5 else 1)).astype(np.float32))
        payloads.append(LocoPayload(0, f"t{k}", b"", tensors, numel))
    momentum = {n: (rng.standard_normal(size) * 1e-4).astype(np.float32) for n, size in numel.items()}
    times: dict[str, list[float]] = {"old": [], "new": []}
    keeps = {}
    for _ in range(args.repeats):
        for label, mod in (("old", old), ("new", aggregate)):
            t0 = time.process_time()
            w = mod.robust_weights(payloads, momentum=momentum, scale=0.1, numel=numel, cfg=cfg.loco.aggregate)
            times[label].append(time.process_time() - t0)
            keeps[label] = w.keep
    assert keeps["old"] == keeps["new"], keeps
    old_ms, new_ms = (1e3 * statistics.median(times[k]) for k in ("old", "new"))
    print(f"{len(numel)} tensors, {sum(numel.values()):,} parameters, 6 payloads; weights {keeps['new']}")
    print(f"robust_weights, median of {args.repeats}: old {old_ms:.1f} ms, new {new_ms:.1f} ms, "
          f"new/old {new_ms / old_ms:.2f}")


if __name__ == "__main__":
    main()
