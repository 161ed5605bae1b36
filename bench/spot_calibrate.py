"""Calibrates spot recomputation: the check's statistics for honest trainers vs each cheat.

Trainers ("producers", one process each) run two rounds of a preset on the default tiny model
(warm-started, configs/solo.toml's model and task) from the same base and the same seeded batches:
honest ones on 1 and 2 torch threads and two micro-batch budgets (8192 tokens: one micro-batch;
256: ~8), and one process per cheat (``pulse_node/testing/spot_harness.py``: advantage flip,
a quarter of the groups flipped, free rider, copier, lazy copier, scaled payload, error
feedback inflated between rounds) plus an honest trainer computing its forward in FP32 instead
of the swarm's BF16. Each dumps its round 0 (commitment, opening at 8 drawn leaves, every
step's batch and BF16 patch, payload) and round 1's start. Verifiers (one process each, 1 and 2
threads, both micro-batch budgets) then check every step of every dump with
``SpotChecker.check``. Printed per producer kind: the verdicts, the gradient's relative error
(min / median / max) and the replay mismatches, then the margins of the tolerance
(``SpotTolerance``) to the largest honest value and to the smallest cheating one.

    python bench/spot_calibrate.py [--preset default|realistic] [--seeds 2] [--out /tmp/spot-cal]

``default``: lr 3e-4, H = 10 (configs/swarm.toml); ``realistic``: lr 1e-6, H = 3
(configs/realistic.toml). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

ROOT = Path(__file__).resolve().parents[1]
RUN = "spot-cal"
LEAVES = 8
HONEST = [(1, 8192), (2, 8192), (1, 256), (2, 256)]
CHEATS = ["flip", "flip_quarter", "free_rider", "copier", "lazy_copier", "scaled", "ef_inflate", "fp32_compute"]
CHECKERS = [(1, 8192), (2, 256)]


def preset(name: str, *, micro: int = 8192, bf16: bool = True):
    from pulse_node.configload import load_config
    from pulse_node.loco.config import LocoConfig
    from pulse_node.rl.config import SoloConfig

    solo = load_config(SoloConfig, ROOT / "configs" / "solo.toml")
    lr, loco = (3e-4, LocoConfig(inner_steps=10)) if name == "default" else \
        (1e-6, LocoConfig(inner_steps=3, outer_lr=1.0, outer_momentum=0.0))
    grpo = solo.grpo.model_copy(update={"lr": lr, "micro_batch_tokens": micro, "bf16_compute": bf16})
    return solo.model_copy(update={"grpo": grpo}), loco


def _trainer(solo, loco, name: str, *, claim_settings: bytes | None = None):
    from pulse_node.chain.identity import Identity, peer_id_of_key
    from pulse_node.testing.spot_harness import RoundTrainer

    key = Identity.from_private_bytes(bytes([ord(name[0])]) * 32)
    return RoundTrainer(solo, loco, trainer_id=peer_id_of_key(key.public_key_hex), identity=key, run_id=RUN,
                        claim_settings=claim_settings)


def produce(args: argparse.Namespace) -> None:
    """One trainer's two rounds (``args.cheat``), dumped for the verifiers."""
    import torch

    from pulse_node.loco.payload import encode_payload
    from pulse_node.loco.spotdraw import draw_check
    from pulse_node.rl.sampler import RolloutWorker
    from pulse_node.rl.tasks import make_task_source
    from pulse_node.testing.spot_harness import make_batches

    torch.set_num_threads(args.threads)
    solo, loco = preset(args.preset, micro=args.micro, bf16=args.cheat != "fp32_compute")
    task, victim = make_task_source(solo.task), _trainer(solo, loco, "victim")
    swarm = _trainer(*preset(args.preset, micro=args.micro), "victim").settings  # fp32_compute claims the swarm's
    me = _trainer(solo, loco, "alice", claim_settings=swarm)
    gen = RolloutWorker(victim.policy, solo.sampling)
    base0 = victim.base(0)

    def batches(version: int, base, who: str):
        gen.set_weights(base.bf16, version)
        return make_batches(gen, task, run_id=RUN, version=version, producer=f"infer-{who}-{args.seed}",
                            count=loco.inner_steps)

    copied = victim.run_round(batches(0, base0, "victim"), version=0).payload
    cheat = "honest" if args.cheat == "fp32_compute" else args.cheat
    t0 = time.perf_counter()
    m0 = me.run_round(batches(0, base0, "alice"), version=0, cheat=cheat, copy_of=copied)
    round_s = time.perf_counter() - t0
    me.finish_round([m0.payload], included=True, mine=m0.payload)
    m1 = me.run_round(batches(1, me.base(1), "alice"), version=1)
    c = m0.commitment
    leaves = draw_check(b"calibrate", round=0, target=c.trainer, verifier="v", steps=len(c.steps), params=c.params,
                        leaf=c.leaf, leaves=LEAVES).leaves
    log = me.log
    dump = {"commitment": _enc(c), "next": _enc(m1.commitment), "leaves": list(leaves),
            "opening": _open(log, 0, leaves), "next_opening": _open(log, 1, leaves, start=True),
            "batches": [log.batch_bytes(0, k)[0] for k in range(len(c.steps))],
            "patches": [None] + [log.weights_patch(0, k) for k in range(1, len(c.steps))],
            "payload": encode_payload(m0.payload, base=None), "round_s": round_s}
    Path(args.out).write_bytes(msgpack.packb(dump, use_bin_type=True))


def _enc(c) -> bytes:
    from pulse_node.loco.commit import encode_commitment

    return encode_commitment(c)


def _open(log, round_no: int, leaves, *, start: bool = False) -> bytes:
    from pulse_node.loco.opening import encode_opening

    return encode_opening(log.open(round_no, tuple(leaves), start_only=start))


def check(args: argparse.Namespace) -> None:
    """Every step of every dump in ``args.dumps``, checked with this process's settings (JSON lines)."""
    import torch

    from pulse_node.loco.bound import max_payload_bytes
    from pulse_node.loco.commit import decode_commitment
    from pulse_node.loco.opening import decode_opening
    from pulse_node.loco.payload import decode_payload
    from pulse_node.loco.spotdraw import SpotDraw
    from pulse_node.rl.config import VerifyConfig
    from pulse_node.rl.tasks import make_task_source
    from pulse_node.testing.spot_harness import verifier_parts
    from pulse_node.trainer.recompute import SpotCase, SpotChecker

    torch.set_num_threads(args.threads)
    solo, loco = preset(args.preset, micro=args.micro)
    learner, worker = verifier_parts(solo)
    checker = SpotChecker(learner, worker, make_task_source(solo.task), run_id=RUN, loco=loco, verify=VerifyConfig())
    base = _trainer(solo, loco, "victim").base(0)
    rows = []
    for path in sorted(Path(args.dumps).glob("*.dump")):
        d = msgpack.unpackb(path.read_bytes(), raw=False)
        c = decode_commitment(d["commitment"])
        payload = decode_payload(d["payload"], shapes=checker.shapes, max_bytes=max_payload_bytes(checker.shapes,
                                                                                               cap=1 << 30))
        for k in range(len(c.steps)):
            case = SpotCase(c, decode_opening(d["opening"]), [d["batches"][k]], d["patches"][k], payload, True,
                            decode_commitment(d["next"]), decode_opening(d["next_opening"]))
            t0 = time.perf_counter()
            v = checker.check(SpotDraw(0, c.trainer, "v", k, tuple(d["leaves"])), case, base)
            rows.append({"dump": path.stem, "checker": f"t{args.threads}/m{args.micro}", "step": k,
                         "reason": v.reason.value if v.reason else "", "grad": v.gradient_error,
                         "weights": v.weights_off, "payload": v.payload_off, "link": v.link_off,
                         "check_s": time.perf_counter() - t0})
    Path(args.out).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _run(*argv: str) -> None:
    cmd = ["nice", "-n", "10", sys.executable, __file__, *argv]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})


def orchestrate(args: argparse.Namespace) -> None:
    out = Path(args.out or tempfile.mkdtemp(prefix="spot-cal-"))
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(f"honest-t{t}-m{m}", "honest", t, m) for t, m in HONEST] + [(c, c, 1, 8192) for c in CHEATS]
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        for name, cheat, threads, micro in jobs:
            _run("--role", "produce", "--preset", args.preset, "--cheat", cheat, "--threads", str(threads),
                 "--micro", str(micro), "--seed", str(seed), "--out", str(out / f"{name}-s{seed}.dump"))
    for threads, micro in CHECKERS:
        _run("--role", "check", "--preset", args.preset, "--threads", str(threads), "--micro", str(micro),
             "--dumps", str(out), "--out", str(out / f"check-t{threads}-m{micro}.jsonl"))
    rows = [json.loads(line) for p in sorted(out.glob("check-*.jsonl")) for line in p.read_text().splitlines()]
    report(rows, args, seconds=time.perf_counter() - t0)


def _kind(dump: str) -> str:
    return "honest" if dump.startswith("honest") else dump.rsplit("-s", 1)[0]


def report(rows: list[dict], args: argparse.Namespace, *, seconds: float) -> None:
    from pulse_node.trainer.recompute import SpotTolerance

    tol, kinds = SpotTolerance(), {}
    for r in rows:
        kinds.setdefault(_kind(r["dump"]), []).append(r)
    print(f"preset {args.preset}, {args.seeds} seed(s), {len(rows)} checks, {seconds:.0f} s")
    print(f"{'producer':<14}{'checks':>7}  {'verdicts':<28}{'grad err min / median / max':>32}"
          f"{'payload max':>12}{'link max':>10}")
    per = {}
    for kind, rs in sorted(kinds.items()):
        grads = [r["grad"] for r in rs if r["grad"] == r["grad"]]
        verdicts: dict[str, int] = {}
        for r in rs:
            verdicts[r["reason"] or "pass"] = verdicts.get(r["reason"] or "pass", 0) + 1
        g = (min(grads), statistics.median(grads), max(grads)) if grads else (float("nan"),) * 3
        print(f"{kind:<14}{len(rs):>7}  {', '.join(f'{k} {n}' for k, n in sorted(verdicts.items())):<28}"
              f"{g[0]:>11.2e}{g[1]:>10.2e}{g[2]:>11.2e}{max(r['payload'] for r in rs):>12.3g}"
              f"{max(r['link'] for r in rs):>10.3g}")
        per[kind] = {"checks": len(rs), "verdicts": verdicts, "grad": g, "caught": sum(1 for r in rs if r["reason"])}
    honest = kinds.get("honest", [])
    worst = max((r["grad"] for r in honest), default=0.0)
    cheats = [r["grad"] for k, rs in kinds.items() if k in ("flip", "flip_quarter", "free_rider", "copier",
                                                            "fp32_compute") for r in rs]
    print(f"gradient tolerance {tol.gradient:g}: {tol.gradient / max(worst, 1e-30):.0f}x the largest honest error "
          f"({worst:.2e}); the smallest error of a gradient cheat is {min(cheats, default=0):.3g} "
          f"({min(cheats, default=0) / tol.gradient:.0f}x the tolerance)")
    print(json.dumps({"preset": args.preset, "checks": len(rows), "honest_refused": sum(1 for r in honest if r["reason"]),
                      "honest_grad_max": worst, "cheat_grad_min": min(cheats, default=0.0),
                      "tolerance": tol.gradient, "per_kind": per}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["all", "produce", "check"], default="all")
    ap.add_argument("--preset", choices=["default", "realistic"], default="default")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--cheat", default="honest")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dumps", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    {"all": orchestrate, "produce": produce, "check": check}[args.role](args)


if __name__ == "__main__":
    main()
