"""Real shapes: seeded sampling and verification of a random-init Llama at Qwen2.5-0.5B's widths.

The model is built locally from a ``transformers`` ``LlamaConfig`` (random init, nothing
downloaded): ``--full`` gives Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14 heads, 2 KV heads,
MLP 4864) for a GPU; the default is a CPU-sized one (4 layers, hidden 256). Each vocabulary of
``--vocabs`` (default 32,000 and 151,936) is measured side by side on one machine, one batch of
``--rows`` rows x ``--new`` new tokens (random prompts of ``--prompt`` tokens, EOS never drawn):

- sampler tokens/s: the project's ``RolloutWorker`` seeded draw vs the same worker's greedy decode
  of the same rows (the keyed randomness and the draw should be nearly free: ratio >= 0.9) and vs
  HF ``generate`` (multinomial sampling, same dtype, batch and machine);
- the share of each generated token's time spent on the keyed randomness (``uniforms``) and the
  draw (``draw`` on the logits), timed alone over the same shapes;
- verification (``RolloutVerifier.recompute``: teacher-forced FP32 forward, CDF intervals,
  log-probs) vs a plain FP32 teacher-forced forward of the same batch in the same row chunks
  (logits from the first completion position on, as the verifier takes them; ratio <= 1.15),
  and how many honest rollouts it refused;
- on CUDA: the sampler with BF16 and with TF32 compute, and whether those rollouts pass the FP32
  verifier (largest gap and log-prob difference);
- ``grpo``: ``bench.grpo_scale.measure(...)`` when that module exists.

    python bench/real_scale.py [--json] [--device auto] [--full] [--new 256 | --long] [--rows 4] [--repeats 2]

Runs on the old sampler too (``rl/seeded.py`` with ``SampleNoise``), to measure a baseline on an
older commit. Prints one table and a final JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for ``bench.grpo_scale``; PYTHONPATH decides which pulse_node is measured
    sys.path.append(str(ROOT))

FULL = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "mlp": 4864}
CPU = {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "mlp": 688}


def build(vocab: int, shape: dict, *, context: int, device: str, seed: int = 0):
    """A random-init ``LlamaForCausalLM`` and a ``RolloutWorker`` holding its BF16 weights (FP32 compute)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pulse_node.rl.models import HFLM
    from pulse_node.rl.sampler import RolloutWorker
    from pulse_node.torchbits import module_state

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
                      num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                      num_key_value_heads=shape["kv_heads"], max_position_embeddings=context,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=vocab - 1, pad_token_id=0)
    module = LlamaForCausalLM(cfg).to(device).eval()
    tokenizer = SimpleNamespace(pad_id=0, eos_id=vocab - 1, vocab_size=vocab,
                                encode=lambda s: [1 + ord(c) % 200 for c in s], decode=lambda ids: "")
    policy = SimpleNamespace(tokenizer=tokenizer, device=torch.device(device), lm=HFLM(module, context),
                             task=SimpleNamespace(reward="exact"))
    return module, policy, lambda sampling: _worker(RolloutWorker, policy, sampling, module_state)


def _worker(cls, policy, sampling, module_state):
    from pulse_node.rl.rewards import reward

    w = cls(policy, sampling, reward_fn=reward("exact"))
    w.set_weights(module_state(policy.lm.module.named_parameters()), 0)
    return w


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def seeded_sample(worker, prompts, digest: bytes):
    """The seeded decode of ``prompts`` (rows 0..n-1 of the batch), on this or an older sampler."""
    seeded = importlib.import_module("pulse_node.rl.seeded")
    if hasattr(seeded, "uniforms"):
        return worker._sample(prompts, u=seeded.uniforms(digest, range(len(prompts)), worker.cfg.max_new_tokens))
    return worker._sample(prompts, noise=[seeded.SampleNoise(digest, i) for i in range(len(prompts))])


def greedy_sample(worker, prompts):
    return worker._sample(prompts, u=None) if _new_api() else worker._sample(prompts, noise=None)


def _new_api() -> bool:
    return hasattr(importlib.import_module("pulse_node.rl.seeded"), "uniforms")


def draw_share(worker, rows: int, steps: int, vocab: int, digest: bytes, device: str) -> dict:
    """Seconds of the keyed randomness and of the draw alone, for ``rows`` x ``steps`` tokens."""
    import torch

    seeded = importlib.import_module("pulse_node.rl.seeded")
    logits = torch.randn(rows, vocab, device=device) * 2
    if _new_api():
        u, t_key = timed(lambda: seeded.uniforms(digest, range(rows), steps).to(device), device)
        _, t_draw = timed(lambda: [seeded.draw(logits, u[:, k], vocab=vocab, temperature=1.0) for k in range(steps)],
                          device)
        return {"keyed_s": t_key, "draw_s": t_draw}
    noises = [seeded.SampleNoise(digest, i) for i in range(rows)]
    t_key = t_draw = 0.0
    for k in range(steps):
        g, dt = timed(lambda k=k: seeded.noise_rows(noises, k, vocab), device)
        _, dd = timed(lambda g=g: seeded.draw(logits, g, 1.0), device)
        t_key, t_draw = t_key + dt, t_draw + dd
    return {"keyed_s": t_key, "draw_s": t_draw}


def verify_vs_forward(worker, rollouts, key, device: str, repeats: int = 2) -> dict:
    """``RolloutVerifier.recompute`` of the batch vs a plain FP32 forward in the same row chunks."""
    import torch

    from pulse_node.rl.batch import pack
    from pulse_node.rl.config import ArithmeticTaskConfig, VerifyConfig
    from pulse_node.rl.tasks import make_task_source
    from pulse_node.rl.verify import RolloutVerifier

    verifier = RolloutVerifier(worker, make_task_source(ArithmeticTaskConfig(eval_size=10)), run_id=key.run_id,
                               batches_per_version=1, max_staleness=0, cfg=VerifyConfig())
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    per = verifier.rows_per_forward(width)  # the verifier's chunks: the trunk's work is the same
    new = _new_api()

    def plain() -> None:
        with torch.no_grad():
            for s in range(0, len(rollouts), per):
                chunk = rollouts[s:s + per]
                packed = pack([(r.prompt_ids, r.completion_ids) for r in chunk], pad_id=0, device=worker.device)
                first = min(len(r.prompt_ids) for r in chunk) - 1
                worker.lm.logits(packed.ids, packed.mask, **({"last": packed.ids.shape[1] - first} if new else {}))

    t_verify = t_plain = float("inf")
    for _ in range(repeats):  # interleaved, best of each
        t_plain = min(t_plain, timed(plain, device)[1])
        rec, dt = timed(lambda: verifier.recompute(rollouts, key), device)
        t_verify = min(t_verify, dt)
    tol = verifier.cfg.score_tolerance
    off = max(abs(a - b) for r, ours in zip(rollouts, rec.logprobs) for a, b in zip(r.logprobs, ours))
    return {"verify_s": t_verify, "forward_s": t_plain, "ratio": t_verify / t_plain, "refused": int(sum(g > tol for g in rec.gap)),
            "max_gap": float(max(rec.gap)), "max_logprob_diff": off}


def as_rollouts(prompts, out, key):
    from pulse_node.rl.rollout import Rollout

    toks, lps, fin = out
    return [Rollout(prompt_ids=p, completion_ids=t, logprobs=lp, reward=0.0, version=key.version, problem_id="x",
                    group_id=key.group_id(i), finished=f, batch=key.batch, sample=i)
            for i, (p, t, lp, f) in enumerate(zip(prompts, toks, lps, fin))]


def hf_generate(module, prompts, new: int, device: str) -> float:
    """Seconds of HF ``generate`` (multinomial sampling, exactly ``new`` tokens) on the same rows."""
    import torch

    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        _, dt = timed(lambda: module.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                              min_new_tokens=new, do_sample=True, top_k=0, top_p=1.0,
                                              temperature=1.0, pad_token_id=0), device)
    return dt


def measure_vocab(vocab: int, args, device: str) -> dict:
    import torch

    from pulse_node.rl.assign import BatchKey
    from pulse_node.rl.config import SamplingConfig

    shape = FULL if args.full else CPU
    _, _, make = build(vocab, shape, context=args.prompt + args.new + 8, device=device)
    sampling = SamplingConfig(max_new_tokens=args.new, group_size=2, prompts_per_batch=1, temperature=1.0)
    worker = make(sampling)
    gen = torch.Generator().manual_seed(vocab)
    prompts = torch.randint(1, vocab - 1, (args.rows, args.prompt), generator=gen).tolist()
    key = BatchKey("real-scale", 0, "peer", 0)
    seeded_sample(worker, prompts[:2], key.digest())  # warm up
    t_seeded = t_greedy = t_hf = float("inf")
    for _ in range(args.repeats):  # interleaved, best of each: a shared machine's load spikes drop out
        out, dt = timed(lambda worker=worker: seeded_sample(worker, prompts, key.digest()), device)
        t_seeded = min(t_seeded, dt)
        greedy, dt = timed(lambda: greedy_sample(worker, prompts), device)
        t_greedy = min(t_greedy, dt)
        t_hf = min(t_hf, hf_generate(worker.lm.module, prompts, args.new, device))
    tokens = sum(len(t) for t in out[0])
    g_tokens = sum(len(t) for t in greedy[0])
    share = draw_share(worker, args.rows, args.new, vocab, key.digest(), device)
    row = {"vocab": vocab, "tokens": tokens, "seeded_tok_s": tokens / t_seeded, "greedy_tok_s": g_tokens / t_greedy,
           "hf_generate_tok_s": args.rows * args.new / t_hf}
    row["seeded_vs_greedy"] = row["seeded_tok_s"] / row["greedy_tok_s"]
    row["seeded_vs_hf"] = row["seeded_tok_s"] / row["hf_generate_tok_s"]
    print(f"vocab {vocab}: seeded {row['seeded_tok_s']:.1f} tok/s, greedy {row['greedy_tok_s']:.1f}, "
          f"HF generate {row['hf_generate_tok_s']:.1f}", file=sys.stderr, flush=True)
    row["keyed_share"] = share["keyed_s"] / t_seeded
    row["draw_share"] = share["draw_s"] / t_seeded
    row["verify"] = verify_vs_forward(worker, as_rollouts(prompts, out, key), key, device, args.repeats)
    if device.startswith("cuda"):
        row["compute"] = other_compute(make, sampling, prompts, key, device, t_seeded / tokens)
    return row


def other_compute(make, sampling, prompts, key, device: str, fp32_s_per_token: float) -> dict:
    """The sampler with TF32 and BF16 compute (same weights), and the FP32 verifier's verdict on it."""
    import torch

    res = {}
    for name in ("tf32", "bf16"):
        worker = make(sampling)
        if name == "bf16":
            worker.lm.module.to(torch.bfloat16)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = name == "tf32"
        out, dt = timed(lambda worker=worker: seeded_sample(worker, prompts, key.digest()), device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        tokens = sum(len(t) for t in out[0])
        checker = make(sampling)
        v = verify_vs_forward(checker, as_rollouts(prompts, out, key), key, device)
        res[name] = {"tok_s": tokens / dt, "vs_fp32": (tokens / dt) * fp32_s_per_token, "refused_tokens": v["refused"],
                     "max_gap": v["max_gap"], "max_logprob_diff": v["max_logprob_diff"]}
    return res


def grpo_section(args, device: str):
    try:
        mod = importlib.import_module("bench.grpo_scale")
    except ModuleNotFoundError:
        print("grpo: bench/grpo_scale.py not present")
        return None
    shape = FULL if args.full else CPU
    return mod.measure(hidden=shape["hidden"], layers=shape["layers"], vocab=max(args.vocabs), completion=args.new,
                       batches=(args.grpo_batch, 4 * args.grpo_batch), device=device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the final JSON line (no table)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--full", action="store_true", help="Qwen2.5-0.5B shapes (hidden 896, 24 layers): for a GPU")
    ap.add_argument("--vocabs", type=lambda s: [int(x) for x in s.split(",")], default=[32000, 151936])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repetitions (the best of each is kept)")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--long", action="store_true", help="1,024 new tokens")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--grpo-batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.long:
        args.new = 1024
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    t0 = time.monotonic()
    rows = [measure_vocab(v, args, device) for v in args.vocabs]
    grpo = grpo_section(args, device)
    shape = FULL if args.full else CPU
    if not args.json:
        table(rows, args, device, shape)
    print(f"{time.monotonic() - t0:.0f} s")
    print(json.dumps({"bench": "real_scale", "device": device, "threads": torch.get_num_threads(),
                      "shape": shape, "rows": args.rows, "new_tokens": args.new, "old_sampler": not _new_api(),
                      "per_vocab": rows, "grpo": grpo}))


def table(rows: list[dict], args, device: str, shape: dict) -> None:
    import torch

    print(f"\nreal_scale on {device} ({torch.get_num_threads()} threads): Llama hidden {shape['hidden']}, "
          f"{shape['layers']} layers, {args.rows} rows x {args.new} new tokens, FP32 compute")
    print("| vocab | seeded tok/s | greedy tok/s | seeded/greedy | HF generate tok/s | seeded/HF | keyed share | "
          "draw share | verify s | forward s | verify/forward | honest rollouts refused |\n|" + "---|" * 12)
    for r in rows:
        v = r["verify"]
        print(f"| {r['vocab']:,} | {r['seeded_tok_s']:.0f} | {r['greedy_tok_s']:.0f} | {r['seeded_vs_greedy']:.2f} | "
              f"{r['hf_generate_tok_s']:.0f} | {r['seeded_vs_hf']:.2f} | {r['keyed_share']:.1%} | {r['draw_share']:.1%} | "
              f"{v['verify_s']:.2f} | {v['forward_s']:.2f} | {v['ratio']:.2f} | {v['refused']} |")
        for name, c in r.get("compute", {}).items():
            print(f"|   {name} compute | {c['tok_s']:.0f} ({c['vs_fp32']:.2f}x FP32) | FP32 verifier refused "
                  f"{c['refused_tokens']} rollouts, gap {c['max_gap']:.3g}, logprob diff {c['max_logprob_diff']:.3g} |")


if __name__ == "__main__":
    main()
