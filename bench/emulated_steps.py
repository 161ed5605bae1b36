"""Emulated RL optimizer steps at sizes where AdamW does not fit: BF16 states with a realistic change pattern.

AdamW on a 1 G-parameter model needs ~16 B/param (FP32 weights, gradients, two moments) plus
activations: more than this machine can spare beside the codec. What the codec and the link
see of a step is only which BF16 entries change and by how many ulps, and that is set by the
FP32 master weights and the size of the update, not by where the update came from. So this
keeps FP32 master weights with the same pretrained-like magnitudes as ``bench/workload.py``
(``pretrained_like_``: linear rows N(0, 0.03) x log-normal(0, 0.5), norm weights ~1, biases
0.01) and adds, per step, ``lr x u`` with ``u`` an Adam-like normalized update: i.i.d.
N(0, ``update_std``^2) per element. A BF16 entry changes when its FP32 master crosses a BF16
rounding midpoint, as in real training. ``update_std`` (default 0.33) was calibrated so the
34 M preset matches real AdamW at lr 3e-6 (bench/RESULTS.md "About 1B parameters"); real
updates are also correlated across steps (momentum), which k-step patches would show and
one-step patches do not.

Memory: the FP32 master (4 B/param) plus the BF16 states the caller keeps (2 B/param each).

    python bench/emulated_steps.py --size 34m --compare-adamw    # calibration: density + B/change, both
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from bench.workload import SIZES, ModelSize, TinyLM, pretrained_like_
from pulse_node.codec.state import State
from pulse_node.torchbits import module_state


def master_weights(size: ModelSize, seed: int = 0) -> dict[str, torch.Tensor]:
    """FP32 master weights of ``TinyLM(size)`` with pretrained-like magnitudes, built tensor by tensor."""
    with torch.device("meta"):
        shapes = [(n, p.shape) for n, p in TinyLM(size).named_parameters()]
    gen = torch.Generator().manual_seed(seed)
    master = {}
    for name, shape in shapes:
        one, p = torch.nn.Module(), torch.nn.Parameter(torch.empty(shape))
        one.register_parameter(name.replace(".", "_"), p)  # pretrained_like_ picks the init by name and ndim
        pretrained_like_(one, gen)
        master[name] = p.data
    return master


def emulated_bf16_states(*, size: ModelSize, lr: float, steps: int, seed: int = 0,
                         update_std: float = 0.33) -> Iterator[tuple[int, State]]:
    """Yield ``(step, bf16_state)`` for step 0 and after each emulated step (lr x N(0, update_std^2))."""
    master = master_weights(size, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    yield 0, module_state(master.items())
    for step in range(1, steps + 1):
        for t in master.values():
            t.add_(torch.randn(t.shape, generator=gen), alpha=lr * update_std)
        yield step, module_state(master.items())


def states(*, size: str, lr: float, steps: int, emulate: bool, seed: int = 0) -> Iterator[tuple[int, State]]:
    """The bench workload at a named size: real AdamW (``bench/workload.py``) or emulated steps."""
    from bench.workload import adamw_bf16_states

    if emulate:
        return emulated_bf16_states(size=SIZES[size], lr=lr, steps=steps, seed=seed)
    return adamw_bf16_states(lr=lr, steps=steps, seed=seed, size=SIZES[size], warmup_steps=3 if size != "34m" else 20)


def _density_and_bytes(gen: Iterator[tuple[int, State]]) -> list[dict]:
    import numpy as np

    from pulse_node.codec.patch import make_patch

    rows, prev = [], None
    for step, state in gen:
        if prev is not None:
            changed = sum(int(np.count_nonzero(state[k].bits != prev[k].bits)) for k in state)
            total = sum(t.numel for t in state.values())
            rows.append({"step": step, "density": changed / total,
                         "bytes_per_change": len(make_patch(prev, state)) / max(changed, 1)})
        prev = state
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="34m")
    ap.add_argument("--lr", type=float, default=3e-6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--update-std", type=float, default=0.33)
    ap.add_argument("--compare-adamw", action="store_true", help="also real AdamW at this size (small sizes only)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    out = {"size": args.size, "lr": args.lr, "update_std": args.update_std,
           "emulated": _density_and_bytes(emulated_bf16_states(size=SIZES[args.size], lr=args.lr, steps=args.steps,
                                                               update_std=args.update_std))}
    if args.compare_adamw:
        out["adamw"] = _density_and_bytes(states(size=args.size, lr=args.lr, steps=args.steps, emulate=False))
    for kind in ("emulated", "adamw"):
        for r in out.get(kind, []):
            print(f"{kind:8s} step {r['step']}: density {r['density']:.3%}, compact {r['bytes_per_change']:.3f} B/change")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
