"""The GRPO RL workload of ``bench/pulseloco.py``: inner trainers, DDP, and the held-out metric.

Every trainer starts from the same warm-started policy (``configs/solo.toml``: tiny transformer,
d_model 64, 4 layers, 208k parameters, 2-digit addition, 700 supervised steps, seed 0; cached
under ``~/.cache/pulse-node``) and takes on-policy GRPO inner steps at a realistic LLM learning
rate (1e-6 .. 3e-6): before each step its rollout worker loads the BF16 cast of its own local
FP32 weights, samples ``prompts x group`` completions from its own prompt stream, and the
learner takes one AdamW step (betas 0.9/0.95, grad clip 1.0, BF16 straight-through forward).

Metric (higher is better), on the task's fixed held-out split (500 problems, disjoint from
training), on the BF16 cast of the global weights:

- ``expected reward``: the mean over held-out problems of P(answer followed by <eos>) under
  temperature-1 sampling -- the exact-match reward GRPO maximises, computed exactly by teacher
  forcing (smooth, so small RL improvements are visible where greedy accuracy is too coarse);
- greedy accuracy (reported alongside).

Not runnable on its own: ``bench/pulseloco.py --workload rl`` (the default) runs ``main_rl``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from loco_common import (
    N_TRAINERS,
    BF16Changes,
    CodecTally,
    Curve,
    codec_report,
    print_table,
    ratio,
    ratio_to_target,
    rss_run,
    run_loco,
    summarize,
    sweep,
)

from pulse_node.configload import load_config
from pulse_node.loco.config import LocoConfig
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.batch import bf16_params, pack, token_logprobs
from pulse_node.rl.config import SoloConfig
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.grpo import GRPOLearner, group_advantages
from pulse_node.rl.policy import Policy, build_policy
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class RLSetup:
    """One RL sweep: inner lr, rounds, rollouts per inner step."""

    lr: float
    rounds: int
    inner_steps: int = 10
    prompts: int = 16
    group: int = 8
    overrides: tuple[str, ...] = ()
    outer: tuple[tuple[str, float], ...] = ()
    """Outer-optimizer overrides for DiLoCo and PULSELoCo alike (``--outer-lr``, ``--outer-momentum``)."""
    """Extra ``KEY=VALUE`` overrides of ``configs/solo.toml`` (``--set``: other models, tasks)."""


class RLWorkload:
    """The shared pieces: config, warm-started base weights, held-out problems and their packing."""

    def __init__(self, setup: RLSetup) -> None:
        overrides = [f"grpo.lr={setup.lr}", f"sampling.prompts_per_batch={setup.prompts}",
                     f"sampling.group_size={setup.group}", *setup.overrides]
        self.cfg = load_config(SoloConfig, ROOT / "configs" / "solo.toml", overrides)
        self.setup = setup
        self.task = make_task_source(self.cfg.task)
        base = build_policy(self.cfg.model, self.cfg.task, seed=self.cfg.seed, grpo_cfg=self.cfg.grpo)
        self.base = {n: p.detach().clone() for n, p in base.model.named_parameters()}
        self.evals = self.task.eval_set()
        tok = base.tokenizer
        self.eval_packed = pack([(tok.encode(p.prompt), tok.encode_target(p.answer)) for p in self.evals],
                                pad_id=tok.pad_id, device=torch.device("cpu"))

    def policy(self) -> Policy:
        """A fresh policy holding the base weights (no warm-start training: loaded from memory)."""
        cfg = self.cfg.model_copy(update={"grpo": self.cfg.grpo.model_copy(update={"warmstart_steps": 0})})
        p = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo)
        with torch.no_grad():
            for n, t in p.model.named_parameters():
                t.copy_(self.base[n])
        return p

    @torch.no_grad()
    def metric(self, policy: Policy) -> tuple[float, float]:
        """(held-out expected exact-match reward at temperature 1, greedy accuracy), BF16 weights."""
        lp = token_logprobs(policy.lm, self.eval_packed, params=bf16_params(policy.model))
        seq = (lp * self.eval_packed.target).sum(dim=1)
        return float(seq.exp().mean()), evaluate(policy, self.evals)


class GRPOTrainer:
    """``InnerTrainer`` of ``pulse_node.testing.loco_harness``: on-policy GRPO steps on own prompts."""

    def __init__(self, work: RLWorkload, *, seed: int, rank: int) -> None:
        self.policy = work.policy()
        self.worker = RolloutWorker(self.policy, work.cfg.sampling)
        self.learner = GRPOLearner(self.policy, work.cfg.grpo, temperature=work.cfg.sampling.temperature)
        self.task, self.prompts = work.task, work.setup.prompts
        self.rng = random.Random(f"loco-rl:{seed}:{rank}")
        self.name = f"loco-rl:{seed}:{rank}"
        self.version = 0
        self._params = dict(self.policy.model.named_parameters())

    def local_params(self) -> Mapping[str, torch.Tensor]:
        return self._params

    def rollouts(self) -> list:
        """A fresh on-policy batch from the BF16 cast of the current local weights."""
        self.worker.set_weights(self.policy.bf16_state(), self.version)
        return self.worker.generate(self.task.sample(self.prompts, self.rng), key=self._key())

    def _key(self) -> BatchKey:
        """A fresh batch key (seeds this batch's token draws; the prompts come from ``self.rng``)."""
        return BatchKey("loco-rl", self.worker.version, self.name, self.rng.getrandbits(31))

    def inner_step(self) -> float:
        """One GRPO step; returns the batch's mean reward (the harness logs it as 'loss')."""
        stats = self.learner.step(self.rollouts(), current_version=self.version)
        self.version += 1
        return stats["reward_mean"]


def ddp_step(trainers: list[GRPOTrainer], main: GRPOTrainer) -> None:
    """One DDP step: every trainer's GRPO gradient on its own rollouts of the shared model, averaged.

    All trainers sample from ``main``'s weights (one model, replicated); the gradient of each
    trainer's loss is computed on ``main`` and the mean is applied with ``main``'s AdamW.
    """
    model, learner = main.policy.model, main.learner
    model.train()
    learner.opt.zero_grad(set_to_none=True)
    for t in trainers:
        t.worker.set_weights(main.policy.bf16_state(), main.version)
        rollouts = t.worker.generate(t.task.sample(t.prompts, t.rng), key=t._key())
        adv = group_advantages(rollouts)
        useful = [i for i, a in enumerate(adv) if a != 0.0]
        if useful:
            loss, _ = learner.loss([rollouts[i] for i in useful], [adv[i] for i in useful])
            (loss / len(trainers)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), learner.cfg.max_grad_norm)
    learner.opt.step()
    main.version += 1


# ---------------------------------------------------------------- methods and phases of the RL sweep


def evaluator(work: RLWorkload):
    """``evaluate(params)``: copies the global FP32 weights into a scratch policy and scores it."""
    scratch = work.policy()

    def evaluate(params: Mapping[str, torch.Tensor]) -> tuple[float, float]:
        with torch.no_grad():
            for n, p in scratch.model.named_parameters():
                p.copy_(params[n])
        return work.metric(scratch)

    return evaluate


def numel_of(work: RLWorkload) -> int:
    return sum(int(t.numel()) for t in work.base.values())


def run_ddp(work: RLWorkload, seed: int) -> Curve:
    """DDP: one replicated model, gradients of the 4 trainers' rollouts averaged every inner step."""
    trainers = [GRPOTrainer(work, seed=seed, rank=r) for r in range(N_TRAINERS)]
    main, evaluate, numel = trainers[0], evaluator(work), numel_of(work)
    curve, t0, changes = Curve(), time.monotonic(), BF16Changes()
    changes(work.base)
    for _ in range(work.setup.rounds):
        for _ in range(work.setup.inner_steps):
            ddp_step(trainers, main)
        params = dict(main.policy.model.named_parameters())
        curve.changed.append(changes(params))
        metric, acc = evaluate(params)
        curve.metric.append(metric)
        curve.acc.append(acc)
        curve.bytes.append(4 * numel * work.setup.inner_steps)
        curve.density.append(1.0)
    curve.seconds = time.monotonic() - t0
    return curve


def gate_scales(spec: str) -> dict[str, tuple[float, str]]:
    """``--gate-scales`` -> {method label: (gate scale, outer placement)}. Items are numbers or
    ``outer`` (= outer lr x (1 + momentum), the outer step's long-run gain) or ``outer/n`` (that
    over the 4 trainers: the gain of an entry only one trainer sends), optionally prefixed
    ``trainer:`` for ``loco.outer_placement = "trainer"``. Scale 1 keeps the labels ``pulseloco``
    and ``pulseloco_trainer``."""
    cfg = LocoConfig()
    named = {"outer": cfg.outer_lr * (1 + cfg.outer_momentum)}
    named["outer/n"] = named["outer"] / N_TRAINERS
    out: dict[str, tuple[float, str]] = {}
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        placement, _, item = item.rpartition(":")
        placement = placement or "global"
        c = named[item] if item in named else float(item)
        label = "pulseloco" + ("" if placement == "global" else f"_{placement}")
        out[label if c == 1.0 else f"{label}_c{c:.4g}"] = (c, placement)
    return out


def rl_methods(work: RLWorkload, scales: dict[str, tuple[float, str]] | None = None) -> dict[str, Callable[[int], Curve]]:
    s = work.setup

    def loco(seed: int, **kw) -> Curve:
        return run_loco(rounds=s.rounds, inner_steps=s.inner_steps, evaluate=evaluator(work),
                        make_trainer=lambda r: GRPOTrainer(work, seed=seed, rank=r), numel=numel_of(work),
                        base=work.base, outer=dict(s.outer), **kw)

    out = {"ddp": lambda seed: run_ddp(work, seed),
           "diloco": lambda seed: loco(seed, gate="none"),
           "diloco_fp16": lambda seed: loco(seed, gate="none", fp16=True),
           "pulseloco": lambda seed: loco(seed, gate="bf16", tally=True),
           "pulseloco_trainer": lambda seed: loco(seed, gate="bf16", placement="trainer")}
    if scales:
        del out["pulseloco"]
        for label, (c, placement) in scales.items():
            out[label] = lambda seed, c=c, pl=placement: loco(seed, gate="bf16", tally=pl == "global", gate_scale=c,
                                                              placement=pl)
    return out


def bf16_change(work: RLWorkload, steps: int = 20) -> tuple[float, float]:
    """Plain GRPO on one trainer: BF16 change fraction per step and over an H-step window."""
    t = GRPOTrainer(work, seed=999, rank=0)
    params = list(t.policy.model.parameters())
    bits = lambda: torch.cat([p.detach().reshape(-1).to(torch.bfloat16).view(torch.int16) for p in params])  # noqa: E731
    start = prev = bits()
    per_step, window = [], 0.0
    for k in range(1, steps + 1):
        t.inner_step()
        now = bits()
        per_step.append(float((now != prev).float().mean()))
        if k == work.setup.inner_steps:
            window = float((now != start).float().mean())
        prev = now
    return statistics.mean(per_step), window


def weight_stats(work: RLWorkload) -> dict[str, float]:
    w = torch.cat([t.abs().reshape(-1) for t in work.base.values()])
    return {"params": int(w.numel()), "median_abs_w": float(w.median())}


def outer_overrides(args) -> tuple[tuple[str, float], ...]:
    """``--outer-lr`` / ``--outer-momentum`` as LocoConfig overrides (empty: the reference 0.7 / 0.9)."""
    out = []
    if args.outer_lr is not None:
        out.append(("outer_lr", args.outer_lr))
    if args.outer_momentum is not None:
        out.append(("outer_momentum", args.outer_momentum))
    return tuple(out)


def phase_lr(args, lr: float, seeds: list[int], rounds: int) -> dict:
    work = RLWorkload(RLSetup(lr=lr, rounds=rounds, prompts=args.prompts, overrides=tuple(args.set),
                              inner_steps=args.inner_steps, outer=outer_overrides(args)))
    base_metric, base_acc = work.metric(work.policy())
    step_rate, window_rate = bf16_change(work)
    print(f"\n# RL, inner lr {lr:g}: base expected reward {base_metric:.5f}, greedy acc {base_acc:.3f}; "
          f"plain GRPO changes {step_rate:.4f} of BF16 weights per step, {window_rate:.4f} over "
          f"{work.setup.inner_steps} steps", flush=True)
    CodecTally.tally = {}
    scales = gate_scales(args.gate_scales) if args.gate_scales else {}
    wanted = args.methods.split(",") + (list(scales) if "pulseloco" in args.methods.split(",") else [])
    if "diloco" not in wanted or not any(m.startswith("pulseloco") for m in wanted):
        raise SystemExit("--methods needs diloco and a pulseloco method")
    methods = {m: run for m, run in rl_methods(work, scales).items() if m in wanted}
    curves = sweep(methods, seeds, "exp.reward")
    if args.curves:
        with open(f"{args.curves}.lr{lr:g}.json", "w") as fh:
            json.dump({m: [dataclasses.asdict(c) for c in cs] for m, cs in curves.items()}, fh)
    s = summarize(curves, higher_better=True)
    print_table(f"RL GRPO, lr {lr:g}", s, "exp.reward")
    per_entry = codec_report(CodecTally.tally)
    head = "pulseloco" if "pulseloco" in s else next(iter(scales or [m for m in s if m.startswith("pulseloco")]))
    p, d = s[head], s["diloco"]
    by_scale = {}
    for label, (c, placement) in scales.items():
        r = s[label]
        by_scale[label] = {
            "gate_scale": c, "outer_placement": placement, "bytes_per_outer_step": r["bytes_per_outer_step"],
            "bytes_ratio_vs_diloco": ratio(s, "diloco", label), "fired_fraction": r["density"],
            "metric_mean": r["metric_mean"], "metric_std": r["metric_std"], "acc_mean": r["acc_mean"],
            "share_of_diloco_gain": (r["metric_mean"] - base_metric) / (d["metric_mean"] - base_metric),
            "within_one_std": abs(r["metric_mean"] - d["metric_mean"]) <= d["metric_std"]}
    if scales:
        print(f"\n## gate scale sweep, lr {lr:g} (base {base_metric:.5f}, DiLoCo {d['metric_mean']:.5f} "
              f"± {d['metric_std']:.5f})")
        print(f"{'method':<26} {'c':>6} {'B/outer step':>13} {'vs DiLoCo':>9} {'fired':>7} {'exp.reward':>10} "
              f"{'std':>8} {'gain share':>10}")
        for label, r in by_scale.items():
            print(f"{label:<26} {r['gate_scale']:>6.3f} {r['bytes_per_outer_step']:>13.0f} "
                  f"{r['bytes_ratio_vs_diloco']:>8.1f}x {r['fired_fraction']:>7.4f} {r['metric_mean']:>10.5f} "
                  f"{r['metric_std']:>8.5f} {r['share_of_diloco_gain']:>10.3f}", flush=True)
    numel = numel_of(work)
    dense = {"ddp": {"bytes_per_outer_step": 4 * numel * work.setup.inner_steps, "bytes_to_target": None},
             "diloco_fp16": {"bytes_per_outer_step": 2 * numel, "bytes_to_target": None}}
    s2 = {**dense, **s}  # a subset run still reports the byte ratios against the dense methods
    return {
        "lr": lr, "metric_pulseloco": p["metric_mean"], "metric_diloco": d["metric_mean"],
        "metric_std": d["metric_std"], "metric_std_pulseloco": p["metric_std"],
        "metric_ddp": s.get("ddp", {}).get("metric_mean"),
        "metric_diloco_fp16": s.get("diloco_fp16", {}).get("metric_mean"),
        "metric_base": base_metric, "acc_base": base_acc,
        "acc": {m: r["acc_mean"] for m, r in s.items() if not m.startswith("_")},
        "within_one_std": abs(p["metric_mean"] - d["metric_mean"]) <= d["metric_std"],
        "headline": head,
        "bytes_ratio_vs_diloco": ratio(s, "diloco", head), "bytes_ratio_vs_ddp": ratio(s2, "ddp", head),
        "bytes_ratio_vs_diloco_fp16": ratio(s2, "diloco_fp16", head),
        "bytes_to_target_ratio_vs_diloco": ratio_to_target(s, "diloco", head),
        "bytes_to_target_ratio_vs_ddp": ratio_to_target(s2, "ddp", head),
        "bytes_per_outer_step": {m: s[m]["bytes_per_outer_step"] for m in s if not m.startswith("_")},
        "fired_fraction": p["density"], "fired_fraction_first": p["density_first"],
        "fired_fraction_last": p["density_last"], "bytes_per_fired_entry": per_entry,
        "grpo_bf16_change_per_step": step_rate, "grpo_bf16_change_per_window": window_rate,
        **({"headline_method": head, "gate_scales": by_scale} if scales else {}),
        **({"trainer_placement": {
            "metric_mean": s["pulseloco_trainer"]["metric_mean"], "metric_std": s["pulseloco_trainer"]["metric_std"],
            "bytes_ratio_vs_diloco": ratio(s, "diloco", "pulseloco_trainer"),
            "fired_fraction": s["pulseloco_trainer"]["density"],
            "share_of_diloco_gain": (s["pulseloco_trainer"]["metric_mean"] - base_metric)
            / (d["metric_mean"] - base_metric),
            "within_one_std": abs(s["pulseloco_trainer"]["metric_mean"] - d["metric_mean"]) <= d["metric_std"]}}
           if "pulseloco_trainer" in s else {}),
        "summary": s,
    }


def main_rl(args) -> dict:
    lrs = [float(x) for x in args.rl_lrs.split(",")]
    seeds = list(range(1 if args.quick else args.seeds))
    rounds = 3 if args.quick else args.rounds
    print(f"# PULSELoCo bench (RL, GRPO): 4 trainers, H={args.inner_steps}, seeds {seeds}, rounds {rounds}, lrs {lrs}, "
          f"{args.prompts} prompts x 8 samples per inner step" + (f", overrides {args.set}" if args.set else "")
          + (f", outer {dict(outer_overrides(args))}" if outer_overrides(args) else ""),
          flush=True)
    by_lr = [phase_lr(args, lr, seeds, rounds) for lr in lrs]
    work = RLWorkload(RLSetup(lr=lrs[0], rounds=0, prompts=args.prompts, overrides=tuple(args.set),
                              inner_steps=args.inner_steps))
    n_rss = min(6, args.rss_rounds) if args.quick else args.rss_rounds
    mib = [0.0]
    if n_rss:
        print(f"\n# RSS over {n_rss} PULSELoCo rounds (RL, lr {lrs[0]:g})", flush=True)
        mib = rss_run(lambda r: GRPOTrainer(work, seed=0, rank=r), rounds=n_rss, inner_steps=work.setup.inner_steps)
        print("  RSS MiB by round: " + " ".join(f"{m:.0f}" for m in mib), flush=True)
    head = {k: v for k, v in by_lr[0].items() if k != "summary"}
    return {"workload": "GRPO RL (pulse_node.rl, configs/solo.toml policy)", "overrides": args.set,
            "inner_steps": args.inner_steps, "outer": dict(outer_overrides(args)),
            "metric": "held-out expected reward",
            **weight_stats(work), **head, "by_lr": [{k: v for k, v in r.items() if k != "summary"} for r in by_lr],
            "rss_mib_first": mib[0], "rss_mib_mid": mib[len(mib) // 2], "rss_mib_last": mib[-1],
            "rss_mib_max": max(mib)}
