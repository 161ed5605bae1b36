"""Honest rollouts are never refused: >= 10,000 made and verified across threads, shapes and models.

Producers use the seeded sampler with the KV cache (``RolloutWorker.generate_batch``), decoding
``rows_per_pass`` rows together (all 256, 64, 7 or 1) on 1 or 2 torch threads. The verifier is the
trainer's (``rl/verify.py``): one teacher-forced forward per batch, or one per sequence
(``logit_budget`` lowered), on the other thread count. Models: the default solo model (warm
started) at its warm start and after ``--grpo-steps`` GRPO steps (temperature 1.0 and 0.7), and a
tiny Hugging Face Llama (random init, HF's own KV cache and attention), and a wider one (vocabulary
300) with long completions (``--long`` new tokens, 32 rollouts per batch). Runs on the CPU.
``--parts bf16,fp16``: the same grid with producers computing in BF16 / FP16 (the module cast, as
engines run), each batch declaring its precision; the verifier (FP32) widens its checks by that
precision's measured error (``rl/precision.py``). The JSON line has ``precisions``: per producer
precision ``rollouts``, ``refused``, ``largest_gap`` and the largest tolerance applied.

Per configuration: rollouts, refused, the largest token gap seen (how far a token's keyed uniform
lay outside its recomputed CDF interval, in probability; 0 = the verifier's draw is the
producer's token exactly), the margin (tolerance - largest gap), the rollouts that had a draw
within the tolerance of an interval boundary (the only places a forger could pick the adjacent
token unnoticed), the closest such distance seen, and the largest |claimed - recomputed|
behaviour log-prob. Extra rows (not in the honest total): a
producer computing in BF16 that does not declare it (``--parts undeclared``) against the FP32 verifier.

    python bench/rollout_honest.py [--batches 2] [--grpo-steps 20] [--long 256]
    python bench/rollout_honest.py --parts bf16,fp16 --json     # BF16 and FP16 producers, >= 10,000 rollouts
    python bench/rollout_honest.py --parts cuda      # on a GPU machine: CUDA-made, CPU-checked and back
    python bench/rollout_honest.py ... --decode compiled   # producers decoding with rl/static_decode.py

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch
from rollout_common import ROOT, solo_versions

from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import GRPOConfig, ModelConfig, SoloConfig, VerifyConfig
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import decode_rollouts, encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.rl.verify import RolloutVerifier
from pulse_node.testing.hf_models import build_hf_model

sys.path.insert(0, str(ROOT / "tests"))
from test_rl_hf import save_tiny_hf

RUN = "bench-honest"
GPU = "cuda"  # the device the cross-device part pairs with the CPU


@dataclass
class Tally:
    rollouts: int = 0
    tokens: int = 0
    refused: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    max_gap: float = 0.0
    near_tie: int = 0
    max_logprob_diff: float = 0.0
    closest: float = math.inf
    max_tolerance: float = 0.0

    def add(self, rollouts, verdict, tol: float) -> None:
        self.max_tolerance = max(self.max_tolerance, tol)
        self.rollouts += len(rollouts)
        self.tokens += sum(len(r.completion_ids) for r in rollouts)
        if not verdict.ok:
            self.refused += sum(not c.ok for c in verdict.checks)
            for c in verdict.checks:
                if not c.ok:
                    self.reasons[c.reason] = self.reasons.get(c.reason, 0) + 1
        gaps = [c.gap for c in verdict.checks if c.gap == c.gap]
        self.max_gap = max([self.max_gap, *gaps])
        self.near_tie += sum(c.closest <= tol for c in verdict.checks)
        self.closest = min([self.closest, *(c.closest for c in verdict.checks if c.closest == c.closest)])
        for ours, claimed in zip(verdict.rollouts, rollouts):
            self.max_logprob_diff = max([self.max_logprob_diff, *(abs(a - b) for a, b in zip(ours.logprobs, claimed.logprobs))])


def run_config(policy, cfg: SoloConfig, state, version: int, *, p_threads: int, rows: int | None,
               v_threads: int, per_sequence: bool, batches: int, tally: Tally, compute: str = "fp32",
               undeclared: bool = False, verifier_policy=None, decode: str = "eager") -> None:
    """``batches`` batches made by ``policy`` computing in ``compute`` and checked by
    ``verifier_policy`` (default: the same policy object, so the same device); ``undeclared``: the
    batch says "fp32" whatever the producer computed in."""
    task = make_task_source(cfg.task)
    producer = RolloutWorker(policy, cfg.sampling, compute=compute, decode=decode)  # type: ignore[arg-type]
    producer.set_weights(state, version)
    verifier = RolloutVerifier(RolloutWorker(verifier_policy or policy, cfg.sampling), task, run_id=RUN, batches_per_version=1 << 20,
                               max_staleness=4, cfg=VerifyConfig())
    if per_sequence:
        verifier.logit_budget = 1
    for b in range(batches):
        sender = f"peer-{p_threads}-{rows}-{v_threads}-{per_sequence}-{b}"
        torch.set_num_threads(p_threads)
        rollouts = producer.generate_batch(task, BatchKey(RUN, version, sender, b), rows_per_pass=rows)
        for r in rollouts if undeclared else []:
            r.precision = "fp32"
        torch.set_num_threads(v_threads)
        verdict = verifier.check(decode_rollouts(encode_rollouts(rollouts)), sender=sender, current_version=version,
                                 state_of=lambda v: state, full=True)
        tally.add(rollouts, verdict, verifier.tol.widest)


def honest_grid(args) -> dict[str, Tally]:
    if "solo" not in args.parts:
        return hf_grid(args, solo_versions(0)[0]) if "hf" in args.parts else {}
    cfg, policy, states = solo_versions(args.grpo_steps)
    out: dict[str, Tally] = {}
    shapes = [(1, None), (2, 64), (1, 7), (2, 1)]
    for version in (0, 1):
        for p_threads, rows in shapes:
            for per_sequence in (False, True):
                name = f"solo v{version} gen {p_threads}t rows={rows or 256} | verify {3 - p_threads}t " \
                       f"{'per-sequence' if per_sequence else 'one forward'}"
                out[name] = Tally()
                run_config(policy, cfg, states[version], version, p_threads=p_threads, rows=rows,
                           v_threads=3 - p_threads, per_sequence=per_sequence, batches=args.batches, tally=out[name],
                           decode=args.decode)
                print(f"{name}: {out[name].rollouts} rollouts, refused {out[name].refused}, "
                      f"max gap {out[name].max_gap:.3g}", flush=True)
    cold = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"temperature": 0.7})})
    for p_threads, rows in shapes[:2]:
        name = f"solo v1 T=0.7 gen {p_threads}t rows={rows or 256} | verify {3 - p_threads}t one forward"
        out[name] = Tally()
        run_config(policy, cold, states[1], 1, p_threads=p_threads, rows=rows, v_threads=3 - p_threads,
                   per_sequence=False, batches=args.batches, tally=out[name], decode=args.decode)
    return out | (hf_grid(args, cfg) if "hf" in args.parts else {})


def hf_grid(args, cfg: SoloConfig) -> dict[str, Tally]:
    out: dict[str, Tally] = {}
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_hf(tmp)
        hf = cfg.model_copy(update={"model": ModelConfig(kind="hf", path=tmp, device="cpu")})
        policy = build_policy(hf.model, hf.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
        state = policy.bf16_state()
        for p_threads, rows in ((1, None), (2, 7), (2, None), (1, 64)):
            name = f"hf-llama gen {p_threads}t rows={rows or 256} | verify {3 - p_threads}t one forward"
            out[name] = Tally()
            run_config(policy, hf, state, 0, p_threads=p_threads, rows=rows, v_threads=3 - p_threads,
                       per_sequence=False, batches=args.batches, tally=out[name], decode=args.decode)
        long_dir = f"{tmp}/long"
        build_hf_model(long_dir, arch="llama", hidden=64, layers=2, context=args.long + 64, vocab_size=300, seed=1)
        sampling = cfg.sampling.model_copy(update={"max_new_tokens": args.long, "prompts_per_batch": 4})
        long = cfg.model_copy(update={"model": ModelConfig(kind="hf", path=long_dir, device="cpu"), "sampling": sampling})
        policy = build_policy(long.model, long.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
        state = policy.bf16_state()
        for p_threads, rows in ((1, None), (2, 5)):
            name = f"hf-llama long ({args.long} new tokens) gen {p_threads}t rows={rows or 32} | verify {3 - p_threads}t"
            out[name] = Tally()
            run_config(policy, long, state, 0, p_threads=p_threads, rows=rows, v_threads=3 - p_threads,
                       per_sequence=False, batches=args.batches, tally=out[name], decode=args.decode)
            print(f"{name}: {out[name].rollouts} rollouts, {out[name].tokens} tokens, refused {out[name].refused}, "
                  f"max gap {out[name].max_gap:.3g}", flush=True)
    return out


def undeclared_rows(args) -> dict[str, Tally]:
    cfg, policy, states = solo_versions(0)
    tally = Tally()
    run_config(policy, cfg, states[0], 0, p_threads=1, rows=None, v_threads=1, per_sequence=False,
               batches=args.batches, tally=tally, decode=args.decode, compute="bf16", undeclared=True)
    return {"solo v0 gen BF16 compute, declared fp32 | verify FP32": tally}


def precision_grid(args, precision: str) -> dict[str, Tally]:
    """Producers computing in ``precision`` (declared): the solo model at both versions on four
    shapes, the tiny HF Llama, and the long-completion Llama; ``--precision-batches`` per shape."""
    cfg, policy, states = solo_versions(args.grpo_steps)
    out: dict[str, Tally] = {}
    n = args.precision_batches
    shapes = ((1, None), (2, 64), (1, 7), (2, 1))[: args.precision_shapes]
    for version in (0, 1) if "solo" in args.precision_models else ():
        for p_threads, rows in shapes:
            name = f"{precision} solo v{version} gen {p_threads}t rows={rows or 256} | verify FP32 {3 - p_threads}t"
            out[name] = Tally()
            run_config(policy, cfg, states[version], version, p_threads=p_threads, rows=rows, v_threads=3 - p_threads,
                       per_sequence=False, batches=n, tally=out[name], decode=args.decode, compute=precision)
            print(f"{name}: {out[name].rollouts} rollouts, refused {out[name].refused} {out[name].reasons}, "
                  f"max gap {out[name].max_gap:.3g}, tolerance {out[name].max_tolerance:.3g}", flush=True)
    if "hf" not in args.precision_models:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_hf(tmp)
        hf = cfg.model_copy(update={"model": ModelConfig(kind="hf", path=tmp, device="cpu")})
        hf_policy = build_policy(hf.model, hf.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
        name = f"{precision} hf-llama gen 1t rows=256 | verify FP32 2t"
        out[name] = Tally()
        run_config(hf_policy, hf, hf_policy.bf16_state(), 0, p_threads=1, rows=None, v_threads=2, per_sequence=False,
                   batches=n, tally=out[name], decode=args.decode, compute=precision)
        long_dir = f"{tmp}/long"
        build_hf_model(long_dir, arch="llama", hidden=64, layers=2, context=args.long + 64, vocab_size=300, seed=1)
        sampling = cfg.sampling.model_copy(update={"max_new_tokens": args.long, "prompts_per_batch": 4})
        long = cfg.model_copy(update={"model": ModelConfig(kind="hf", path=long_dir, device="cpu"), "sampling": sampling})
        long_policy = build_policy(long.model, long.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
        name = f"{precision} hf-llama long ({args.long} new tokens) gen 1t rows=32 | verify FP32 2t"
        out[name] = Tally()
        run_config(long_policy, long, long_policy.bf16_state(), 0, p_threads=1, rows=None, v_threads=2,
                   per_sequence=False, batches=n, tally=out[name], decode=args.decode, compute=precision)
        print(f"{name}: {out[name].rollouts} rollouts, refused {out[name].refused}, max gap {out[name].max_gap:.3g}",
              flush=True)
    return out


def cross_device_rows(args) -> dict[str, Tally]:
    """Made on CUDA and verified on the CPU, and the other way round (FP32 compute on both sides,
    TF32 off, as the sampler sets it): the solo model at both versions and the two HF Llamas."""
    if GPU == "cuda" and not torch.cuda.is_available():
        print("cross-device: no CUDA device here, skipped", flush=True)
        return {}
    cfg, _, states = solo_versions(args.grpo_steps)
    out: dict[str, Tally] = {}

    def both_ways(label: str, run: SoloConfig, state, version: int) -> None:
        on = {d: build_policy(run.model.model_copy(update={"device": d}), run.task, seed=run.seed,
                              grpo_cfg=GRPOConfig(warmstart_steps=0)) for d in ("cpu", GPU)}
        for made, checked in ((GPU, "cpu"), ("cpu", GPU)):
            name = f"{label} gen {made} | verify {checked}"
            out[name] = Tally()
            run_config(on[made], run, state, version, p_threads=2, rows=None, v_threads=2, per_sequence=False,
                       batches=args.batches, tally=out[name], decode=args.decode, verifier_policy=on[checked])
            print(f"{name}: {out[name].rollouts} rollouts, refused {out[name].refused}, "
                  f"max gap {out[name].max_gap:.3g}", flush=True)

    for version in (0, 1):
        both_ways(f"solo v{version}", cfg, states[version], version)
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_hf(tmp)
        hf = cfg.model_copy(update={"model": ModelConfig(kind="hf", path=tmp, device="cpu")})
        both_ways("hf-llama", hf, build_policy(hf.model, hf.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0))
                  .bf16_state(), 0)
        long_dir = f"{tmp}/long"
        build_hf_model(long_dir, arch="llama", hidden=64, layers=2, context=args.long + 64, vocab_size=300, seed=1)
        sampling = cfg.sampling.model_copy(update={"max_new_tokens": args.long, "prompts_per_batch": 4})
        long = cfg.model_copy(update={"model": ModelConfig(kind="hf", path=long_dir, device="cpu"), "sampling": sampling})
        both_ways(f"hf-llama long ({args.long} new tokens)", long,
                  build_policy(long.model, long.task, seed=0, grpo_cfg=GRPOConfig(warmstart_steps=0)).bf16_state(), 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=2, help="batches of 256 rollouts per configuration")
    ap.add_argument("--grpo-steps", type=int, default=20)
    ap.add_argument("--parts", default="solo,hf,undeclared", help="which parts of the grid (comma-separated; "
                    "'cuda': made on CUDA and checked on the CPU and the other way round, counted as honest; "
                    "'bf16', 'fp16': producers computing in that precision, declared; 'undeclared': a BF16 producer "
                    "declaring fp32, not counted as honest)")
    ap.add_argument("--precision-batches", type=int, default=3, help="batches per shape of a bf16/fp16 grid")
    ap.add_argument("--precision-shapes", type=int, default=4, help="how many of the solo shapes (256, 64, 7, 1 "
                    "rows a pass) a bf16/fp16 grid runs (the narrow ones are slow on a loaded machine)")
    ap.add_argument("--precision-models", default="solo,hf", help="which models a bf16/fp16 grid runs")
    ap.add_argument("--decode", choices=("eager", "static", "compiled"), default="eager",
                    help="how the producers decode (rl/static_decode.py; the verifier is the same)")
    ap.add_argument("--json", action="store_true", help="(the last line is JSON in any case)")
    ap.add_argument("--long", type=int, default=256, help="new tokens per completion of the long HF configuration")
    args = ap.parse_args()
    t0 = time.monotonic()
    parts = set(args.parts.split(","))
    honest, extra = honest_grid(args), (undeclared_rows(args) if "undeclared" in parts else {})
    if "cuda" in parts:
        honest |= cross_device_rows(args)
    by_precision = {p: precision_grid(args, p) for p in ("bf16", "fp16") if p in parts}
    for grid in by_precision.values():
        honest |= grid
    tol = VerifyConfig().score_tolerance
    print("\n| configuration | rollouts | tokens | refused | largest gap | rollouts with a draw within tol of a "
          "boundary | closest | largest logprob diff |\n|---|---|---|---|---|---|---|---|")
    for name, t in {**honest, **extra}.items():
        lp = f"{t.max_logprob_diff:.3g}" if t.refused < t.rollouts else "- (all refused)"
        print(f"| {name} | {t.rollouts} | {t.tokens} | {t.refused} {t.reasons or ''} | {t.max_gap:.3g} | {t.near_tie} | "
              f"{t.closest:.3g} | {lp} |")
    total = sum(t.rollouts for t in honest.values())
    refused = sum(t.refused for t in honest.values())
    worst = max((t.max_gap for t in honest.values()), default=0.0)
    print(f"\nhonest: {total} rollouts, {refused} refused; largest gap {worst:.3g} vs tolerance {tol:g} "
          f"(smallest margin {tol - worst:.4g}); largest logprob diff "
          f"{max((t.max_logprob_diff for t in honest.values()), default=0.0):.3g} vs {VerifyConfig().logprob_tolerance:g}; "
          f"{time.monotonic() - t0:.0f} s")
    precisions = {p: {"rollouts": sum(t.rollouts for t in g.values()), "refused": sum(t.refused for t in g.values()),
                      "largest_gap": max(t.max_gap for t in g.values()),
                      "largest_tolerance": max(t.max_tolerance for t in g.values())} for p, g in by_precision.items()}
    for p, v in precisions.items():
        print(f"{p} producers: {v['rollouts']} rollouts, {v['refused']} refused, largest gap {v['largest_gap']:.3g}, "
              f"largest tolerance {v['largest_tolerance']:.3g}")
    print(json.dumps({"bench": "rollout_honest", "rollouts": total, "refused": refused, "max_gap": worst,
                      "score_tolerance": tol, "precisions": precisions,
                      "configs": {k: vars(v) for k, v in {**honest, **extra}.items()}}, default=str))


if __name__ == "__main__":
    main()
