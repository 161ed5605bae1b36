"""Which step of a trainer's round raises its peak memory, in bytes per parameter.

One process, synthetic FP32 weights (``--params``, in 10 tensors), one round of what a trainer
does after its inner steps: the BF16 version state, the PULSELoCo payload (gate + error
feedback) and its coding against the round's base, the outer step, the next BF16 state, its
patch, and the trainer-state file. After each step the process's peak RSS (``ru_maxrss``) is
read; the increase over the previous peak, divided by the parameters, is that step's extra
transient memory (0 means it fit in memory an earlier step had already used). ``--noise``
sets how far the local weights move (so what fraction of entries fire).

Run: ``python bench/trainer_memory.py [--params 40e6] [--noise 2e-5]``; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=40e6)
    p.add_argument("--noise", type=float, default=2e-5, help="std of local - global (weights have std 0.02)")
    args = p.parse_args()
    import torch

    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import make_record
    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.statehash import state_hash
    from pulse_node.loco.config import LocoConfig
    from pulse_node.loco.outer import OuterOptimizer
    from pulse_node.loco.payload import encode_payload
    from pulse_node.loco.sparsify import ErrorFeedback
    from pulse_node.torchbits import module_state
    from pulse_node.trainer.state import export_trainer_state

    n = int(args.params) // 10
    shapes = {f"layer{i}.weight": (n // 4000, 4000) for i in range(10)}
    params_n = sum(a * b for a, b in shapes.values())
    torch.manual_seed(0)
    outer = OuterOptimizer({k: torch.randn(s) * 0.02 for k, s in shapes.items()}, LocoConfig())
    ef = ErrorFeedback(shapes, cfg=LocoConfig())
    local = {k: t + torch.randn(t.shape) * args.noise for k, t in outer.params.items()}
    steps: dict[str, float] = {}
    last = _peak_mb()

    def mark(what: str) -> None:
        nonlocal last
        now = _peak_mb()
        steps[what] = (now - last) * 2**20 / params_n
        print(f"{what:32s} +{steps[what]:6.1f} B/param", flush=True)
        last = now

    prev = module_state(outer.params.items())
    mark("BF16 state (module_state)")
    payload = ef.make_payload(outer.params, local, round=0, trainer_id="bench", base_hash=outer.state_hash())
    mark("make_payload (gate, EF)")
    data = encode_payload(payload, base=outer.params)
    mark("encode_payload (base coding)")
    outer.apply([payload])
    mark("outer step")
    new = module_state(outer.params.items())
    patch = make_patch(prev, new, mode="compact", base_hash=state_hash(prev), new_hash=state_hash(new))
    mark("next BF16 state + make_patch")
    record = make_record(Identity.generate(), run_id="bench", version=0, parent=None, state_hash=state_hash(new),
                         patch=None, anchor_version=0, is_anchor=True, codec="anchor/safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        export_trainer_state(Path(tmp), params=outer.params, momentum=outer.momentum, record=record,
                             ledger=outer.ledger, outer_hash=outer.state_hash())
    mark("trainer-state file")
    fired = payload.count / params_n
    print(f"{params_n / 1e6:.1f} M parameters; {fired:.1%} fired; payload {len(data) / 1e6:.1f} MB, "
          f"patch {len(patch) / 1e6:.1f} MB; per fired entry, encode_payload peaked at "
          f"{steps['encode_payload (base coding)'] / max(fired, 1e-9):.0f} B")
    print(json.dumps({"bench": "trainer_memory", "params": params_n, "fired": fired, "payload_bytes": len(data),
                      "patch_bytes": len(patch), "bytes_per_param": steps}))


if __name__ == "__main__":
    main()
