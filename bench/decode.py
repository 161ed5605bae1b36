"""Rollout decode speed: the eager sampler vs static decode vs compiled decode vs HF ``generate``.

Side by side in one process, interleaved, best of ``--repeats``: the project's ``RolloutWorker``
with ``decode = "eager"`` (finished rows leave the batch), ``"static"`` (preallocated KV cache,
fixed-shape steps) and ``"compiled"`` (the step under ``torch.compile``; CUDA graphs on a GPU), all
making the same seeded draws, and HF ``generate`` (multinomial sampling, exactly the same number of
new tokens, its default cache) in the same compute dtype. Every mode's tokens are compared with
the eager mode's (rows that differ: ``rows_differ``), and in FP32 each mode's draws are checked by
the FP32 verifier (``verified``: tokens outside their interval by more than the tolerance, 0 for
an honest producer; largest gap).

Models are random-init Llamas built locally (nothing downloaded; EOS never drawn, so every row
decodes every token):
- ``--shapes cpu`` (default): hidden 256, 4 layers, ``--rows`` 32 x ``--new`` 32, vocabularies 32,000
  and 151,936, plus the default solo tiny model (``TinyGPT``, 256 rows x 5 new tokens);
- ``--shapes gpu``: Qwen2.5-0.5B's widths (hidden 896, 24 layers, 14 / 2 heads, MLP 4864), 256
  rows x 256 new tokens, the issue's shapes (#35), vocabularies 32,000 and 151,936.

    python bench/decode.py                                                   # CPU, FP32
    python bench/decode.py --device cuda --shapes gpu --compute bf16         # the GPU check (#35)

The first call of ``compiled`` compiles (its time is printed apart and not in the rate). Ends
with one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from bench.real_scale import CPU, FULL, as_rollouts, build, hf_generate, sync  # noqa: E402

SHAPES = {"cpu": {"llama": CPU, "rows": 32, "new": 32, "prompt": 16},
          "gpu": {"llama": FULL, "rows": 256, "new": 256, "prompt": 32}}
MODES = ("eager", "static", "compiled")


def workers(policy: Any, sampling: Any, modes: list[str], compute: str) -> dict[str, Any]:
    """One ``RolloutWorker`` per decode mode, holding the same BF16 weights (version 0)."""
    from pulse_node.rl.rewards import reward
    from pulse_node.rl.sampler import RolloutWorker
    from pulse_node.torchbits import module_state

    state = module_state(policy.lm.module.named_parameters())
    out = {}
    for mode in modes:
        out[mode] = RolloutWorker(policy, sampling, reward_fn=reward("exact"), compute=compute, decode=mode)
        out[mode].set_weights(state, 0)
    return out


def run_modes(ws: dict[str, Any], prompts: list[list[int]], repeats: int, device: str,
              hf: Any | None, new: int, *, verify: bool = False) -> dict[str, Any]:
    """Seconds (best of ``repeats``, interleaved) and tokens of each mode on ``prompts``."""
    from pulse_node.rl.assign import BatchKey
    from pulse_node.rl.seeded import uniforms

    u = uniforms(BatchKey("decode-bench", 0, "peer", 0).digest(), range(len(prompts)), new)
    first: dict[str, float] = {}
    out: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for mode, w in list(ws.items()):  # warm-up (compiles): timed apart; a mode that fails is left out
        t0 = time.perf_counter()
        try:
            out[mode] = w._sample(prompts, u=u)
        except Exception as exc:  # a one-shot device run keeps the other modes' figures
            errors[mode] = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"{mode} failed: {errors[mode]}", file=sys.stderr, flush=True)
            del ws[mode]
            continue
        sync(device)
        first[mode] = time.perf_counter() - t0
    best = {m: float("inf") for m in [*ws, *(["hf_generate"] if hf is not None else [])]}
    for _ in range(repeats):
        for mode, w in ws.items():
            sync(device)
            t0 = time.perf_counter()
            out[mode] = w._sample(prompts, u=u)
            sync(device)
            best[mode] = min(best[mode], time.perf_counter() - t0)
        if hf is not None:
            best["hf_generate"] = min(best["hf_generate"], hf_generate(hf, prompts, new, device))
    tokens = {m: sum(len(t) for t in out[m][0]) for m in ws}
    tokens["hf_generate"] = len(prompts) * new
    ref = out[next(iter(ws))][0]
    if verify:  # the eager worker (FP32) as the verifier's model, each mode's draws checked
        check = {m: verified(ws[next(iter(ws))], prompts, out[m], device) for m in ws}
        print(f"verified: {check}", file=sys.stderr, flush=True)
    return {"verified": check if verify else None, "seconds": best, "first_call_s": first, "tok_s": {m: tokens[m] / s for m, s in best.items()},
            "rows_differ": {m: sum(a != b for a, b in zip(ref, out[m][0])) for m in ws}, "errors": errors}


def verified(worker: Any, prompts: list[list[int]], out: Any, device: str) -> dict[str, Any]:
    """The FP32 verifier's recomputation (``RolloutVerifier.recompute``) of one mode's draws: how
    many tokens lie outside their interval by more than ``verify.score_tolerance``, the largest
    gap and the largest log-prob difference."""
    from pulse_node.rl.assign import BatchKey
    from pulse_node.rl.config import ArithmeticTaskConfig, VerifyConfig
    from pulse_node.rl.tasks import make_task_source
    from pulse_node.rl.verify import RolloutVerifier

    key = BatchKey("decode-bench", 0, "peer", 0)
    verifier = RolloutVerifier(worker, make_task_source(ArithmeticTaskConfig(eval_size=10)), run_id=key.run_id,
                               batches_per_version=1, max_staleness=0, cfg=VerifyConfig())
    rollouts = as_rollouts(prompts, out, key)
    rec = verifier.recompute(rollouts, key)
    return {"refused_tokens": int(sum(g > verifier.cfg.score_tolerance for g in rec.gap)),
            "max_gap": float(max(rec.gap)),
            "max_logprob_diff": max(abs(a - b) for r, ours in zip(rollouts, rec.logprobs)
                                    for a, b in zip(r.logprobs, ours))}


def llama_case(vocab: int, shape: dict, args: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    from pulse_node.rl.config import SamplingConfig

    module, policy, _ = build(vocab, shape["llama"], context=shape["prompt"] + shape["new"] + 80, device=device)
    sampling = SamplingConfig(max_new_tokens=shape["new"], group_size=2, prompts_per_batch=1, temperature=1.0)
    ws = workers(policy, sampling, args.modes, args.compute)
    hf = module if args.compute == "fp32" else copy.deepcopy(module).to(torch.bfloat16 if args.compute == "bf16"
                                                                       else torch.float16)
    gen = torch.Generator().manual_seed(vocab)
    prompts = torch.randint(1, vocab - 1, (shape["rows"], shape["prompt"]), generator=gen).tolist()
    res = run_modes(ws, prompts, args.repeats, device, None if args.no_hf else hf, shape["new"],
                    verify=args.compute == "fp32")
    return {"model": f"llama hidden {shape['llama']['hidden']} x{shape['llama']['layers']}", "vocab": vocab,
            "rows": shape["rows"], "new": shape["new"], **res}


def tiny_case(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """The default solo model (``configs/solo.toml``, its warm start from the cache), 256 rows of
    its held-out prompts: rows end early here (the eager path's compaction at work)."""
    from pulse_node.configload import load_config
    from pulse_node.rl.config import SoloConfig
    from pulse_node.rl.policy import build_policy
    from pulse_node.rl.tasks import make_task_source

    cfg = load_config(SoloConfig, ROOT / "configs" / "solo.toml", [f"model.device={device}"])
    policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo, progress=True)
    ws = workers(policy, cfg.sampling, args.modes, args.compute)
    problems = make_task_source(cfg.task).eval_set()[:256 // cfg.sampling.group_size]
    prompts = [p for p in ws[args.modes[0]]._encode(problems) for _ in range(cfg.sampling.group_size)]
    res = run_modes(ws, prompts, args.repeats, device, None, cfg.sampling.max_new_tokens)
    return {"model": "tiny (solo default)", "vocab": policy.tokenizer.vocab_size, "rows": len(prompts),
            "new": cfg.sampling.max_new_tokens, **res}


def table(cases: list[dict[str, Any]], args: argparse.Namespace, device: str) -> None:
    import torch

    name = torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"\ndecode on {device} ({name}), {args.compute} compute, best of {args.repeats}")
    cols = [*args.modes, *([] if args.no_hf else ["hf_generate"])]
    print("| model | vocab | rows x new | " + " | ".join(f"{c} tok/s" for c in cols)
          + " | static / eager | compiled / eager | compiled / HF | static / HF | rows differ (static, compiled) | "
          "FP32 verifier: tokens refused, largest gap (static, compiled) | compile s |\n|" + "---|" * (len(cols) + 10))
    for c in cases:
        r = c["tok_s"]

        def ratio(a: str, b: str, r: dict[str, float] = r) -> str:
            return f"{r[a] / r[b]:.2f}" if a in r and b in r else "-"
        differ = ", ".join(str(c["rows_differ"].get(m, "-")) for m in ("static", "compiled"))
        v = c["verified"] or {}
        checked = "; ".join(f"{v[m]['refused_tokens']}, {v[m]['max_gap']:.2g}" if m in v else "-"
                            for m in ("static", "compiled"))
        compile_s = c["first_call_s"].get("compiled", 0.0) - c["seconds"].get("compiled", 0.0)
        print(f"| {c['model']} | {c['vocab']:,} | {c['rows']} x {c['new']} | "
              + " | ".join(f"{r[m]:,.0f}" if m in r else "-" for m in cols)
              + f" | {ratio('static', 'eager')} | {ratio('compiled', 'eager')} | {ratio('compiled', 'hf_generate')} | "
              f"{ratio('static', 'hf_generate')} | {differ} | {checked} | {compile_s:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="cpu")
    ap.add_argument("--compute", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    ap.add_argument("--vocabs", type=lambda s: [int(x) for x in s.split(",")], default=[32000, 151936])
    ap.add_argument("--rows", type=int, default=None, help="override the shapes' rows")
    ap.add_argument("--new", type=int, default=None, help="override the shapes' new tokens")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true", help="leave HF generate out")
    ap.add_argument("--no-tiny", action="store_true", help="leave the solo tiny model out (CPU shapes)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU default: 1)")
    args = ap.parse_args()
    import torch

    if args.threads or args.device == "cpu":  # one thread on the shared CPU, as configs/solo.toml
        torch.set_num_threads(args.threads or 1)
    shape = dict(SHAPES[args.shapes])
    shape.update({k: v for k, v in (("rows", args.rows), ("new", args.new)) if v})
    t0 = time.monotonic()
    cases = [] if args.no_tiny or args.shapes == "gpu" else [tiny_case(args, args.device)]
    for vocab in args.vocabs:
        cases.append(llama_case(vocab, shape, args, args.device))
        print(json.dumps({"case": cases[-1]}), file=sys.stderr, flush=True)  # kept if a later case times out
    table(cases, args, args.device)
    print(f"{time.monotonic() - t0:.0f} s")
    print(json.dumps({"bench": "decode", "device": args.device, "compute": args.compute,
                      "threads": torch.get_num_threads(), "cases": cases}))


if __name__ == "__main__":
    main()
