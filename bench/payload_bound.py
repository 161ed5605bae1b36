"""How close honest PULSELoCo payloads come to the payload value bound (``loco/bound.py``).

Runs the in-process harness (``testing/loco_harness.py``: N toy AdamW trainers, the real gate,
error feedback, codec and outer step) for both outer placements, with and without one trainer
left out of ``--left-out`` rounds in a row, and reports the largest ``|value| / limit`` of any
payload entry (without the sender's clipping: the raw honest maximum) and how many entries the
sender's clip at half the bound would have touched. The live trainers' own figure is the status
counter ``loco_bound_ratio_max`` (bench/RESULTS.md "Payload value bound").

    python bench/payload_bound.py [--rounds 60] [--trainers 4] [--lr 1e-3] [--inner-steps 10]
"""

from __future__ import annotations

import argparse
import json
import time


def run(args, placement: str, left_out: int) -> dict:
    import torch

    from pulse_node.loco.bound import SENDER_SHARE, PayloadBound
    from pulse_node.loco.config import LocoConfig
    from pulse_node.loco.sparsify import ErrorFeedback
    from pulse_node.testing.loco_harness import run_inprocess
    from pulse_node.testing.toy import ToyTrainer

    cfg = LocoConfig(inner_steps=args.inner_steps, outer_placement=placement)
    bound = PayloadBound.of(cfg, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    seen = {"max": 0.0, "over_half": 0, "entries": 0}

    class Measured(ErrorFeedback):
        def make_payload(self, global_params, local_params, **kw):
            p = super().make_payload(global_params, local_params, **kw)
            base = {n: t.numpy() for n, t in global_params.items()}
            seen["max"] = max(seen["max"], bound.ratio(p.tensors, base))
            for name, (idx, vals) in p.tensors.items():
                lim = bound.limit(base[name].reshape(-1)[idx])
                seen["over_half"] += int((abs(vals.astype("float64")) > SENDER_SHARE * lim).sum())
                seen["entries"] += int(idx.size)
            return p

    start = 10

    def drop(r: int) -> set[int]:
        return {0} if start <= r < start + left_out else set()

    torch.set_num_threads(1)
    run_inprocess(args.trainers, lambda rank: ToyTrainer(rank, lr=args.lr), rounds=args.rounds, cfg=cfg,
                  drop=drop, make_feedback=Measured)
    return {"placement": placement, "left_out_rounds": left_out, "max_ratio": round(seen["max"], 4),
            "entries": seen["entries"], "over_half_bound": seen["over_half"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--trainers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--left-out", type=int, default=20)
    args = ap.parse_args()
    t0 = time.time()
    rows = [run(args, placement, left) for placement in ("global", "trainer") for left in (0, args.left_out)]
    for r in rows:
        print(f"{r['placement']:8s} left out {r['left_out_rounds']:3d} rounds: max |value|/bound "
              f"{r['max_ratio']:.4f}, entries over half the bound {r['over_half_bound']} of {r['entries']}")
    print(json.dumps({"rows": rows, "seconds": round(time.time() - t0, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
