"""A catalogue of rollout forgeries against the trainers' verifier: caught / tried per kind.

The forgeries (``pulse_node/testing/forgery.py``) are made from honest material by a dishonest
inference node, on the default solo model (warm started) with two versions (the warm start and
``--grpo-steps`` GRPO steps later); the trainer holds both and is at the newer one. Each kind is
tried ``--trials`` times (different batches and picks); "caught" means refused with a strike
reason. Then a flood: one sender pushes ``--flood`` valid batches while an honest sender pushes
a few, and the trainer takes batches through its intake (``trainer/intake.py``).

    python bench/rollout_forgery.py [--trials 10] [--grpo-steps 20] [--flood 200]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from rollout_common import solo_versions

from pulse_node.rl.config import VerifyConfig
from pulse_node.rl.policy import build_tiny
from pulse_node.rl.tasks import make_task_source
from pulse_node.rl.verify import STRIKES
from pulse_node.testing.forgery import FORGERIES, HONEST, ForgeryLab, flood
from pulse_node.torchbits import module_state


def make_lab(steps: int) -> ForgeryLab:
    cfg, policy, states = solo_versions(steps)
    task = make_task_source(cfg.task)
    foreign = module_state(build_tiny(cfg.model, seed=cfg.seed + 1, device=policy.device).module.named_parameters())
    return ForgeryLab(policy=policy, states=states, foreign=foreign, task=task, sampling=cfg.sampling,
                      verify=VerifyConfig())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--grpo-steps", type=int, default=20)
    ap.add_argument("--flood", type=int, default=200)
    args = ap.parse_args()
    t0 = time.monotonic()
    lab = make_lab(args.grpo_steps)
    results: dict[str, dict] = {}
    for kind, forge in FORGERIES.items():
        reasons: Counter[str] = Counter()
        for trial in range(args.trials):
            lab.rng.seed(f"{kind}:{trial}")
            lab.verifier = lab.new_verifier()
            sender, rollouts = forge(lab)
            reasons[lab.judge(sender, rollouts).reason or "ACCEPTED"] += 1
        caught = sum(n for r, n in reasons.items() if r in STRIKES or (kind == "replayed_batch" and r == "replayed"))
        results[kind] = {"caught": caught, "tried": args.trials, "reasons": dict(reasons)}
        print(f"{kind}: caught {caught}/{args.trials} {dict(reasons)}", flush=True)
    honest = flood(lab, flood_batches=args.flood, honest_batches=4, takes=12)
    print("\n| forgery | caught / tried | reasons |\n|---|---|---|")
    for kind, r in results.items():
        print(f"| {kind} | {r['caught']}/{r['tried']} | {', '.join(f'{k} {v}' for k, v in r['reasons'].items())} |")
    print(f"| flood: {args.flood} valid batches from one sender, 4 from an honest one, 12 inner steps | honest "
          f"batches trained on {honest['honest_used']}/4, flooder's {honest['flood_used']} | flooder refused "
          f"{honest['flood_refused']}; turns {''.join('H' if s == HONEST else 'F' for s in honest['order'])} |")
    print(f"\n{time.monotonic() - t0:.0f} s")
    print(json.dumps({"bench": "rollout_forgery", "trials": args.trials, "results": results,
                      "flood": {k: v for k, v in honest.items()}}))


if __name__ == "__main__":
    main()
