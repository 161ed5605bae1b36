"""A catalogue of rollout forgeries against the trainers' verifier: caught / tried per kind.

The forgeries (``pulse_node/testing/forgery.py``) are made from honest material by a dishonest
inference node, on the default solo model (warm started) with two versions (the warm start and
``--grpo-steps`` GRPO steps later); the trainer holds both and is at the newer one. Each kind is
tried ``--trials`` times (different batches and picks); "caught" means refused with a strike
reason. Then a flood: one sender pushes ``--flood`` valid batches while an honest sender pushes
a few, and the trainer takes batches through its intake (``trainer/intake.py``). Then the
steering forgery (``pulse_node/testing/steering.py``) per producer precision (fp32, bf16, fp16):
every draw moved toward the answer wherever the verifier's widened interval for that precision
admits it, with full knowledge of the key and the tolerance; reported: its reward gain per
rollout over honest sampling of the same batches (same keys, same precision), the tokens it moved,
and the fraction of its batches the verifier refuses.

    python bench/rollout_forgery.py [--trials 10] [--grpo-steps 20] [--flood 200] [--steer-trials 10]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from rollout_common import solo_versions

from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import VerifyConfig
from pulse_node.rl.policy import build_tiny
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.rl.verify import STRIKES
from pulse_node.testing.forgery import FORGER, FORGERIES, HONEST, ForgeryLab, flood
from pulse_node.testing.steering import steered_batch
from pulse_node.torchbits import module_state


def make_lab(steps: int) -> ForgeryLab:
    cfg, policy, states = solo_versions(steps)
    task = make_task_source(cfg.task)
    foreign = module_state(build_tiny(cfg.model, seed=cfg.seed + 1, device=policy.device).module.named_parameters())
    return ForgeryLab(policy=policy, states=states, foreign=foreign, task=task, sampling=cfg.sampling,
                      verify=VerifyConfig())


def steering(lab: ForgeryLab, trials: int) -> dict[str, dict]:
    """Per precision: the steering forger's reward gain per rollout and how often it is caught."""
    out: dict[str, dict] = {}
    for precision in ("fp32", "bf16", "fp16"):
        producer = RolloutWorker(lab.policy, lab.sampling, compute=precision)  # type: ignore[arg-type]
        producer.set_weights(lab.states[lab.current], lab.current)
        probe = lab.new_verifier()  # the forger learns the tolerance from an honest batch of its own
        honest0 = producer.generate_batch(lab.task, BatchKey(lab.run_id, lab.current, HONEST, 0))
        assert probe.check(honest0, sender=HONEST, current_version=lab.current, state_of=lab.states.get).ok
        tol = probe.tol
        tokens = sum(len(r.completion_ids) for r in honest0)
        careful = max(0, tol.near_limit(tokens) - int(tol.rate / 3 * tokens) - 1)  # room the batch test leaves
        row: dict = {"tolerance": tol.widest, "spread": tol.spread, "near_limit": tol.near_limit(tokens),
                     "rollouts_per_batch": len(honest0), "tried": trials}
        for name, cap in (("every_draw", None), ("careful", careful)):
            gain, moved, caught, honest_refused = [], 0, 0, 0
            for t in range(trials):
                key = BatchKey(lab.run_id, lab.current, FORGER, t % lab.batches_per_version)
                honest = producer.generate_batch(lab.task, key)
                forged, n = steered_batch(producer, lab.task, key, tol=tol, max_moves=cap)
                gain.append(sum(r.reward for r in forged) / len(forged) - sum(r.reward for r in honest) / len(honest))
                moved += n
                lab.verifier = lab.new_verifier()
                caught += lab.judge(FORGER, forged).strike
                lab.verifier = lab.new_verifier()
                honest_refused += not lab.judge(FORGER, honest).ok
            row[name] = {"gain_per_rollout": sum(gain) / len(gain), "tokens_moved": moved, "caught": caught,
                         "honest_refused": honest_refused, "max_moves": cap}
            print(f"steering {precision} {name}: widest tolerance {tol.widest:.3g}, reward gain "
                  f"{row[name]['gain_per_rollout']:+.4f} per rollout, {moved} tokens moved, caught {caught}/{trials} "
                  f"(honest refused {honest_refused})", flush=True)
        out[precision] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--grpo-steps", type=int, default=20)
    ap.add_argument("--flood", type=int, default=200)
    ap.add_argument("--steer-trials", type=int, default=10, help="steered batches per precision")
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
    steer = steering(lab, args.steer_trials)
    lab.verifier = lab.new_verifier()
    honest = flood(lab, flood_batches=args.flood, honest_batches=4, takes=12)
    print("\n| forgery | caught / tried | reasons |\n|---|---|---|")
    for kind, r in results.items():
        print(f"| {kind} | {r['caught']}/{r['tried']} | {', '.join(f'{k} {v}' for k, v in r['reasons'].items())} |")
    print(f"| flood: {args.flood} valid batches from one sender, 4 from an honest one, 12 inner steps | honest "
          f"batches trained on {honest['honest_used']}/4, flooder's {honest['flood_used']} | flooder refused "
          f"{honest['flood_refused']}; turns {''.join('H' if s == HONEST else 'F' for s in honest['order'])} |")
    print("\n| steering forger, producer precision | tolerance (probability) | reward gain per rollout | tokens moved | "
          "batches caught | honest batches refused |\n|---|---|---|---|---|---|")
    for p, r in steer.items():
        print(f"| {p} | {r['tolerance']:.3g} | {r['gain_per_rollout']:+.4f} | {r['tokens_moved']} | "
              f"{r['caught']}/{r['tried']} | {r['honest_refused']}/{r['tried']} |")
    print(f"\n{time.monotonic() - t0:.0f} s")
    print(json.dumps({"bench": "rollout_forgery", "trials": args.trials, "results": results, "steering": steer,
                      "flood": dict(honest.items())}))


if __name__ == "__main__":
    main()
