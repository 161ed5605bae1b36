"""Byzantine trainers (issue 32): a third of the trainers hostile, the robust rule against the plain mean.

    python bench/byzantine.py [--quick] [--attacks sign_flip,alie,...] [--seeds 3] [--rounds 10]
                              [--prompts 16] [--rules robust,mean] [--jobs 2] [--set KEY=VALUE ...]
                              [--today] [--trace]

Six trainers on the swarm's default model and task (``configs/trainer.toml``: embedded tiny
model, 2-digit arithmetic, GRPO lr 3e-4, H = 10, BF16 gate, outer Nesterov 0.7 / 0.9), of which
two are Byzantine, in one process per job (``pulse_node/testing/byzantine``): real GRPO inner
steps on batches the real sampler makes from each round's global weights, the real gate and
error feedback, the real payload codec and value bound, real signed round decisions, and the
real ``OuterOptimizer`` with ``loco.aggregate``. Each attack is run with each rule of ``--rules``
(the first is the rule under test, ``mean`` the plain mean of main before it) and each seed,
next to an honest-only run (the same four honest trainers with the same seeds, no Byzantine
key). The rule under test runs with the protocol's defences (``Defences.protocol``: signed
round commitments before any reveal, commit lists naming every commitment held in time, spot
checks drawn in the rounds (a member every round until it passed one, ``Ledger.unproven``; a
target's answer published, so a verifier's "it did not answer" of one that did is refused),
run-id-scoped evidence; the Sybil flood with ``chain.open_trainers``,
where Sybils share the newcomers' capped weight); the other rules with today's (``Defences.today``:
rushing, keyed trainer set, any decision of the coordinator in turn, no spot checks; the Sybil
flood with the open swarm, where Sybils are members). ``--today``: today's defences for every rule.

Per attack and rule: held-out greedy accuracy of the final global weights (the task's 1000
eval problems, the mean over seeds), ``delta`` = that minus the honest-only run's with the same
rule, in points; ``held`` = delta >= -3 for the rule under test; keys caught (Byzantine keys a
defence excluded) and false bans (honest keys excluded), means over seeds; the mean weight the
rule gave honest and Byzantine payloads. ``honest_gain`` = the honest-only run's held-out
accuracy with the rule under test minus the starting weights' (points). ``overhead`` = the
rule's weighing plus spot checks (recording the inner steps, answering checks, the checks and
re-checks), per round, as a fraction of one honest trainer's own CPU time per round in a swarm:
its inner steps and gate plus verifying the batches it trains on (measured on the first honest
trainer, ``InnerTrainer.verify_batches``; not the sampler: inference nodes make the rollouts),
over every run of the rule under test; ``overhead_inner_steps`` the same over the inner steps and
gate alone; ``overhead_wide`` the same over a wider basis: the swarm round plus the trainer's part
of the round's payload exchange, which a swarm's trainer also does every round (encoding its
payload, decoding and checking the others', the outer step; measured on the first honest trainer,
``exchange_s``). ``overhead_proving`` and ``overhead_steady``: the same over the rounds in which an
honest member had passed no check yet (each is checked by two verifiers until it passes one, a
one-off cost per key) and over the rounds after every live member passed one (what a long run
pays per round), per run, then the mean over runs (``testing/byzantine/overhead.py``); the steady
rounds' checks per trainer and round are printed next to the rate ``loco/spotdraw.max_rate``
allows at the CPU of a check measured in them.

What a run costs (2026-11-28 profile of one 10-round run, ~40 s of CPU on one core): the
trainers' inner steps (~55%: GRPO forward and backward) and the sampler making their batches
(~40%: in a swarm the inference nodes' work, so outside ``trainer_s``); the held-out eval of the
final weights is ~2 s, the robust weighing and the spot checks a few seconds. So nothing but the
measurement is left to cut: the eval runs once, at the end; each trainer's first round (same
base weights, key, seed and batches in every scenario and rule) is computed once per process and
copied; the honest-only run is one per rule and seed, shared by every attack; the codec's and
the robust rule's compiled kernels are warmed before any job (their compilation is not a
per-round cost); the jobs run seed by seed, the longest first, so no worker is left alone at the
end (the whole default run: 25-27 min on 2 cores, 2026-12-07). ``--trace`` prints, per round of
each protocol run, the share each Byzantine payload got, the keys out of the rounds, the round's
phase, checks and overhead.

Payloads are coded without the base context (``loco.base_coding = false``: lossless like the
base coder, 10x cheaper here; only the bytes differ). Trainer batches have
``--prompts`` x 8 rollouts (the swarm's 32 x 8 would not fit 2 cores). Jobs run in ``--jobs``
processes with one torch thread each. Last line: JSON ``{"attacks", "byzantine_fraction",
"honest_gain", "overhead", "overhead_steady", "overhead_proving", "overhead_wide", "overhead_steady_wide",
"overhead_proving_wide", "per_attack": {name: {"delta_points", "held", "caught",
"false_bans"}}}``; the line before it, JSON with everything per attack and rule.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
BYZANTINE_NAMES = ("b0", "b1")
HONEST = 4
HELD_POINTS = 3.0
ALL_ATTACKS = ("sign_flip", "scaled_bound", "alie", "ipm_0.1", "ipm_100", "constant", "stale_replay",
               "free_rider", "copier", "advantage_flip", "sleeper", "ef_dump", "coordinator_drop", "sybil_flood",
               "evidence_replay")
OPEN_SWARM = {"sybil_flood"}
PHASES = ("steady", "proving")
_WORLD: Any = None
_TRACE = False


def _config(overrides: list[str]):
    from pulse_node.config import load_node_config

    return load_node_config(ROOT / "configs" / "trainer.toml", overrides, role="trainer")


def _init(overrides: list[str], trace: bool = False) -> None:
    import torch

    from pulse_node.codec.warmup import warm_up
    from pulse_node.loco import clip_kernel
    from pulse_node.testing.byzantine.world import World

    torch.set_num_threads(1)
    warm_up()  # the codec's compiled kernels (spot checks patch weights): once per process, before any timing
    clip_kernel.warm()  # the robust rule's, likewise
    global _WORLD, _TRACE  # a pool worker's world, built once by its initializer
    _WORLD, _TRACE = World(_config(overrides)), trace


def _byzantine() -> list[str]:
    from pulse_node.testing.byzantine.world import peer_of

    return [peer_of(n) for n in BYZANTINE_NAMES]


def _trace(rows: list[dict], costs: list[Any]) -> str:
    """Per round: the applied share of each Byzantine payload, the honest ones' least, who is out; its
    phase, checks per trainer and overhead (``testing/byzantine/overhead.py``)."""
    out = []
    for t, c in zip(rows, costs, strict=True):
        over = (c.weigh_s + c.record_s + c.answer_s + c.check_s) / max(c.trainer_s + c.batches_s, 1e-9)
        byz = " ".join(f"{k}={v:.2f}" for k, v in sorted(t["share"].items()) if not k.startswith("h") and v > 0)
        honest = [v for k, v in t["share"].items() if k.startswith("h")]
        out.append(f"    r{t['round']}: byz {byz or '-'}; honest {len(honest)} (min {min(honest, default=0):.2f}); "
                   f"out {','.join(t.get('out', [])) or '-'}; {c.phase}, {c.checks:.2f} checks, overhead {over:.1%} "
                   f"of {c.trainer_s + c.batches_s:.3f} s")
    return "\n".join(out)


def _job(job: tuple[str, str, int, int, bool]) -> tuple[tuple[str, str, int], dict]:
    from pulse_node.testing.byzantine import candidates, harness
    from pulse_node.testing.byzantine.attacks import Attack, attacks
    from pulse_node.testing.byzantine.stages import Defences

    scenario, rule, seed, rounds, protocol = job
    world = _WORLD
    if scenario == "base":
        return (scenario, rule, seed), {"accuracy": world.accuracy(world.base)}
    ids = _byzantine()
    attack = Attack([]) if scenario == "honest" else attacks(ids)[scenario]  # honest-only: no Byzantine key at all
    loco, cls = candidates.parse(rule, world.cfg.loco)
    defences = (Defences.protocol(world.run_id, open_trainers=scenario in OPEN_SWARM) if protocol
                else Defences.today(world.run_id, open_swarm=scenario in OPEN_SWARM))
    t0 = time.monotonic()
    out = harness.run(world, attack, loco=loco, seed=seed, rounds=rounds, outer_cls=cls, defences=defences)
    row = {**out.__dict__, "wall_s": time.monotonic() - t0}
    trace = row.pop("trace")
    print(f"  {scenario:<17} {rule:<14} seed {seed}: acc {out.accuracy:.3f}  keep h/b {out.keep_honest:.2f}/"
          f"{out.keep_byzantine:.2f}  caught {len(out.caught)} false bans {len(out.false_bans)}  "
          f"{row['wall_s']:.0f} s" + (f"\n{_trace(trace, out.per_round)}" if _TRACE and protocol else ""), flush=True)
    return (scenario, rule, seed), row


def _cost(job: tuple[str, str, int, int, bool]) -> float:
    """A job's rough CPU cost, to start the longest first (no worker left alone at the end)."""
    scenario, _, _, rounds, protocol = job
    trains = scenario in ("sign_flip", "advantage_flip", "sleeper", "ef_dump")
    return rounds * (1.0 + 0.5 * trains + 0.3 * protocol + 0.3 * (scenario in OPEN_SWARM))


def _run_jobs(args, jobs: list[tuple[str, str, int, int, bool]]) -> dict[tuple[str, str, int], dict]:
    import multiprocessing as mp

    jobs = sorted(jobs, key=lambda j: (j[2], -_cost(j)))  # seed by seed (a cut run keeps whole seeds), longest first
    if args.jobs <= 1:
        _init(args.set, args.trace)
        return dict(map(_job, jobs))
    with mp.get_context("spawn").Pool(args.jobs, initializer=_init, initargs=(args.set, args.trace)) as pool:
        return dict(pool.imap_unordered(_job, jobs))


def _mean(rows: list[dict], key: str) -> float:
    vals = [len(r[key]) if isinstance(r[key], list) else r[key] for r in rows]
    return statistics.mean(vals) if vals else 0.0


def summarize(results: dict, *, scenarios: list[str], rules: list[str], seeds: list[int]) -> dict:
    """Per scenario and rule: accuracy, delta to honest-only, caught, false bans, weights, cost."""
    out: dict[str, dict[str, dict]] = {}
    for sc in scenarios:
        out[sc] = {}
        for rule in rules:
            rows = [results[(sc, rule, s)] for s in seeds]
            honest = [results[("honest", rule, s)] for s in seeds]
            out[sc][rule] = {
                "accuracy": _mean(rows, "accuracy"),
                "delta_points": 100 * (_mean(rows, "accuracy") - _mean(honest, "accuracy")),
                "per_seed": [r["accuracy"] for r in rows], "caught": _mean(rows, "caught"),
                "false_bans": _mean(rows, "false_bans"), "keep_honest": _mean(rows, "keep_honest"),
                "keep_byzantine": _mean(rows, "keep_byzantine"), "refused": _mean(rows, "refused"),
                "trainer_s": _mean(rows, "trainer_s"), "weigh_s": _mean(rows, "weigh_s"),
                "verify_s": _mean(rows, "verify_s"), "record_s": _mean(rows, "record_s"),
                "answer_s": _mean(rows, "answer_s"), "batches_s": _mean(rows, "batches_s"),
                "checks": _mean(rows, "checks"), "exchange_s": _mean(rows, "exchange_s"),
                "overhead": statistics.mean(map(_overhead, rows)), **{f"overhead_{ph}": _phase(rows, ph) for ph in PHASES}}
    return out


def _overhead(r: dict) -> float:
    """One run's overhead (the headline's, module docstring): the checks' and weighing's CPU over a
    trainer's swarm round."""
    return (r["weigh_s"] + r["verify_s"]) / max(r["trainer_s"] + r["batches_s"], 1e-9)


def _phase(rows: list[dict], ph: str) -> float | None:
    """The mean over runs of one phase's overhead (``testing/byzantine/overhead.py``); None: no such round."""
    from pulse_node.testing.byzantine.overhead import split

    vals = [s[ph].overhead for s in (split(r["per_round"]) for r in rows) if ph in s]
    return statistics.mean(vals) if vals else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def report_phases(runs: list[dict]) -> dict[str, dict]:
    """Per phase (``testing/byzantine/overhead.py``: rounds proving members, steady rounds after):
    the overhead, its parts and checks per trainer and round (means over the runs with such rounds),
    its rounds in all; for the steady rounds, the CPU of one check (with its answer) and the rate
    ``loco/spotdraw.max_rate`` allows at these costs (10% budget, record and weighing fixed). Printed."""
    from pulse_node.loco.spotdraw import max_rate
    from pulse_node.testing.byzantine.overhead import split

    splits = [split(r["per_round"]) for r in runs]
    out: dict[str, dict] = {}
    for ph in PHASES:
        got = [s[ph] for s in splits if ph in s]
        if not got:
            continue
        out[ph] = {"overhead": statistics.mean(g.overhead for g in got), "wide": statistics.mean(g.wide for g in got),
                   "rounds": sum(g.rounds for g in got),
                   "runs": len(got), "checks": statistics.mean(g.checks for g in got),
                   "parts": {p: statistics.mean(g.parts[p] for g in got) for p in got[0].parts}}
        parts = out[ph]["parts"]
        print(f"{ph} rounds ({out[ph]['rounds']} in {len(got)} runs): overhead {out[ph]['overhead']:.1%} (weighing "
              f"{parts['weigh_s']:.1%}, recording {parts['record_s']:.1%}, answering {parts['answer_s']:.1%}, checks "
              f"{parts['check_s']:.1%}); {out[ph]['checks']:.3f} checks recomputed per trainer and round; "
              f"{out[ph]['wide']:.1%} of the round with its payload exchange")
    rows = [c for r in runs for c in r["per_round"] if c.phase == "steady"]
    if rows and sum(c.checks for c in rows) > 0:
        check_s = sum(c.check_s + c.answer_s for c in rows) / sum(c.checks for c in rows)
        round_s = sum(c.trainer_s + c.batches_s for c in rows) / len(rows)
        fixed_s = sum(c.record_s + c.weigh_s for c in rows) / len(rows)
        allowed = max_rate(check_s=check_s, round_s=round_s, commit_s=fixed_s, trainers=HONEST + len(BYZANTINE_NAMES))
        out["steady"].update(check_cpu_s=check_s, round_s=round_s, fixed_s=fixed_s, max_rate=allowed)
        print(f"steady rounds: a check (with its answer) {check_s * 1e3:.0f} ms of CPU, a swarm round {round_s:.3f} s, "
              f"record and weighing {fixed_s * 1e3:.1f} ms a round: loco/spotdraw.max_rate allows {allowed:.3f} checks "
              f"per trainer and round (10% budget, {HONEST + len(BYZANTINE_NAMES)} trainers)")
    return out


def print_table(summary: dict, *, rules: list[str], needs: dict[str, str]) -> None:
    head, before = rules[0], "mean" if "mean" in rules else rules[-1]
    others = [r for r in rules if r != head]
    print(f"\n{'attack':<17} | {head + ' acc':>13} {'delta':>6} {'held':>5} {'caught':>6} {'false bans':>10} "
          f"{'keep h/b':>9} {'overhead':>8} {'steady':>7} {'proving':>7} | " + " | ".join(f"{r[:14] + ' acc':>18} {'delta':>6}" for r in others)
          + " | needs beyond the rule")
    for sc, by_rule in summary.items():
        r = by_rule[head]
        held = "yes" if r["delta_points"] >= -HELD_POINTS else "NO"
        print(f"{sc:<17} | {r['accuracy']:>13.3f} {r['delta_points']:>+6.1f} {held:>5} {r['caught']:>6.1f} "
              f"{r['false_bans']:>10.1f} {r['keep_honest']:>4.2f}/{r['keep_byzantine']:<4.2f} "
              f"{_pct(r['overhead']):>8} {_pct(r['overhead_steady']):>7} "
              f"{_pct(r['overhead_proving']):>7} | "
              + " | ".join(f"{by_rule[o]['accuracy']:>18.3f} {by_rule[o]['delta_points']:>+6.1f}" for o in others)
              + f" | {needs.get(sc, '') if sc != 'honest' else ''}")
    print(f"(delta: points against the honest-only run with the same rule, mean of seeds; before = {before})")


def probe(args, rules: list[str]) -> dict:
    """What each rule delivers of honest payloads alone, by learning rate: the aggregate's share of
    the honest mean, <g, mean> / |mean|^2, and the payloads' density, over ``--probe-rounds``
    rounds of 4 honest trainers (the plain mean applied between rounds). On sparse payloads
    (realistic learning rates) coordinate-wise rules deliver about nothing."""
    import numpy as np
    import torch

    from pulse_node.loco.outer import OuterOptimizer
    from pulse_node.testing.byzantine import candidates
    from pulse_node.testing.byzantine.attacks import dense
    from pulse_node.testing.byzantine.honest import InnerTrainer
    from pulse_node.testing.byzantine.world import World

    torch.set_num_threads(1)
    out: dict[str, dict] = {}
    for lr in (3e-4, 1e-6):
        world = World(_config([*args.set, f"grpo.lr={lr}"]))
        outer = OuterOptimizer({n: t.clone() for n, t in world.base.items()}, world.cfg.loco)
        trainers = [InnerTrainer(world, f"h{i}", seed=0) for i in range(HONEST)]
        shares: dict[str, list[float]] = {r: [] for r in rules}
        density = []
        for rnd in range(args.probe_rounds):
            world.load(outer.params, rnd)
            ps = []
            for tr in trainers:
                tr.train(rnd)
                ps.append(tr.payload(outer))
            density.append(sum(p.count for p in ps) / len(ps) / world.numel)
            flat = [np.concatenate([dense(p, world.shapes)[n] for n in sorted(world.shapes)]) for p in ps]
            mu = np.mean(flat, axis=0)
            mom = world.cfg.loco.outer_momentum
            for rule in rules:
                loco, cls = candidates.parse(rule, world.cfg.loco)
                opt = cls({n: t.clone() for n, t in outer.params.items()}, loco, round=outer.round)
                opt.momentum = {n: t.clone() for n, t in outer.momentum.items()}
                opt.apply(ps)  # g = m_new - mu * m_old
                g = np.concatenate([(opt.momentum[n].double() - mom * outer.momentum[n].double()).reshape(-1).numpy()
                                    for n in sorted(world.shapes)])
                shares[rule].append(float(g @ mu / (mu @ mu)))
            outer.apply(ps)
            for tr in trainers:
                tr.reset(outer)
        out[f"{lr:g}"] = {"density": float(np.mean(density)), **{r: float(np.mean(v)) for r, v in shares.items()}}
        print(f"  lr {lr:g}: payload density {out[f'{lr:g}']['density']:.4f}; share of the honest mean delivered: "
              + ", ".join(f"{r} {out[f'{lr:g}'][r]:.3f}" for r in rules), flush=True)
    return out


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 4 rounds, 4 attacks: a few minutes")
    ap.add_argument("--attacks", default=",".join(ALL_ATTACKS), help="comma-separated subset")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per trainer batch (x 8 rollouts)")
    ap.add_argument("--rules", default="robust,mean", help="rule specs (testing/byzantine/candidates.py); "
                    "the first is the rule under test")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--set", action="append", default=[], help="config override KEY=VALUE (configs/trainer.toml)")
    ap.add_argument("--probe", action="store_true", help="only what each rule delivers of honest payloads "
                    "at lr 3e-4 and 1e-6 (dense and sparse payloads; probe()), and honest error feedback under "
                    "the robust rule's powers (toy trainers on their own shards; toy.ef_growth)")
    ap.add_argument("--probe-rounds", type=int, default=3)
    ap.add_argument("--probe-toy-rounds", type=int, default=300)
    ap.add_argument("--today", action="store_true", help="today's defences for the rule under test too")
    ap.add_argument("--trace", action="store_true", help="per round of each protocol run: the share each "
                    "Byzantine payload got, the honest payloads' least, the keys out (owing or convicted)")
    return ap.parse_args()


def _probe_main(args: argparse.Namespace, rules: list[str]) -> int:
    from pulse_node.testing.byzantine.toy import ef_growth

    growth = {}
    for power in (1, 2, 3):
        growth[power] = ef_growth(power=power, lr=1e-3, rounds=args.probe_toy_rounds)
        print(f"  toy, {args.probe_toy_rounds} rounds, robust(power={power}): largest error feedback "
              f"{growth[power]['ef_max_over_median']:.1f}x the median one, smallest last weight "
              f"{growth[power]['min_weight']:.3f}", flush=True)
    print(json.dumps({"probe": probe(args, rules), "ef_growth": growth, "rules": rules, "overrides": args.set}))
    return 0


def main() -> int:
    args = _parse()
    names = [a for a in args.attacks.split(",") if a]
    if args.quick:
        args.seeds, args.rounds = 1, 4
        names = [a for a in names if a in ("sign_flip", "scaled_bound", "alie", "ef_dump")] or names[:4]
    unknown = set(names) - set(ALL_ATTACKS)
    if unknown:
        raise SystemExit(f"unknown attacks: {sorted(unknown)} (known: {', '.join(ALL_ATTACKS)})")
    args.set = [f"sampling.prompts_per_batch={args.prompts}", "loco.base_coding=false", *args.set]
    rules = [r for r in args.rules.split(";" if "(" in args.rules else ",") if r]
    if args.probe:
        return _probe_main(args, rules)
    seeds = list(range(args.seeds))
    scenarios = ["honest", *names]
    print(f"# bench/byzantine.py: {HONEST} honest + {len(BYZANTINE_NAMES)} Byzantine trainers, {args.rounds} rounds, "
          f"seeds {seeds}, rules {rules}, attacks {names}, overrides {args.set}"
          + f", defences of the rule under test: {'today' if args.today else 'protocol'}", flush=True)
    jobs = [(sc, rule, s, args.rounds, rule == rules[0] and not args.today)
            for s in seeds for sc in scenarios for rule in rules]
    t0 = time.monotonic()
    results = _run_jobs(args, [("base", rules[0], 0, 0, False), *jobs])
    base = results[("base", rules[0], 0)]["accuracy"]
    summary = summarize(results, scenarios=scenarios, rules=rules, seeds=seeds)
    from pulse_node.testing.byzantine.attacks import attacks

    needs = {a.name: a.needs for a in attacks(_byzantine()).values()}
    print_table(summary, rules=rules, needs=needs)
    head = rules[0]
    runs = [results[(sc, head, s)] for sc in scenarios for s in seeds]
    inner = statistics.mean((r["weigh_s"] + r["verify_s"]) / max(r["trainer_s"], 1e-9) for r in runs)
    overhead = statistics.mean(map(_overhead, runs))
    parts = {k: statistics.mean(r[k] / max(r["trainer_s"] + r["batches_s"], 1e-9) for r in runs)
             for k in ("weigh_s", "record_s", "answer_s")}
    parts["checks_s"] = overhead - parts["weigh_s"] - parts["record_s"] - parts["answer_s"]
    per_trainer = statistics.mean(r["checks"] for r in runs)
    trainer_s = statistics.mean(r["trainer_s"] for r in runs)
    batches_s = statistics.mean(r["batches_s"] for r in runs)
    exchange_s = statistics.mean(r["exchange_s"] for r in runs)
    wide = statistics.mean((r["weigh_s"] + r["verify_s"]) / max(r["trainer_s"] + r["batches_s"] + r["exchange_s"], 1e-9)
                           for r in runs)
    gain = 100 * (summary["honest"][head]["accuracy"] - base)
    print(f"\nstart accuracy {base:.3f}; honest-only gain {gain:+.1f} points with {head}"
          + "".join(f", {100 * (summary['honest'][r]['accuracy'] - base):+.1f} with {r}" for r in rules[1:])
          + f"; {head}'s overhead {overhead:.1%} of a trainer's CPU time in a swarm round ({trainer_s:.3f} s of "
          f"inner steps and gate + {batches_s:.3f} s verifying its batches): weighing {parts['weigh_s']:.1%}, recording "
          f"inner steps {parts['record_s']:.1%}, answering checks {parts['answer_s']:.1%}, checks {parts['checks_s']:.1%} "
          f"({per_trainer:.2f} recomputed per trainer and round); {inner:.1%} of the inner steps and gate alone; "
          f"{wide:.1%} with the trainer's payload exchange ({exchange_s:.3f} s: encoding its payload, decoding and "
          f"checking the others', the outer step); {time.monotonic() - t0:.0f} s in all")
    phases = report_phases(runs)
    print(json.dumps({"base_accuracy": base, "rules": rules, "rounds": args.rounds, "seeds": seeds, "overhead_parts": parts,
                      "overhead_inner_steps": inner, "phases": phases,
                      "overrides": args.set, "needs": needs, "summary": summary}))
    print(json.dumps({"attacks": len(names), "byzantine_fraction": len(BYZANTINE_NAMES) / (HONEST + len(BYZANTINE_NAMES)),
                      "honest_gain": round(gain, 2), "overhead": round(overhead, 4),
                      **{f"overhead_{ph}": None if ph not in phases else round(phases[ph]["overhead"], 4)
                         for ph in PHASES},
                      "overhead_wide": round(wide, 4),
                      **{f"overhead_{ph}_wide": None if ph not in phases else round(phases[ph]["wide"], 4)
                         for ph in PHASES},
                      "per_attack": {sc: {"delta_points": round(summary[sc][head]["delta_points"], 2),
                                          "held": summary[sc][head]["delta_points"] >= -HELD_POINTS,
                                          "caught": summary[sc][head]["caught"],
                                          "false_bans": summary[sc][head]["false_bans"]} for sc in names}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
