"""One GRPO step at real shapes: seconds and peak memory at a batch of n and of 4n rollouts.

A random-init Llama-family model at Qwen2.5-0.5B's proportions (tied embeddings, 64-wide
heads, 2 KV heads, MLP 38/7 x hidden; ``--qwen`` gives its full shapes: hidden 896, 24
layers, 151,936 vocabulary), rollouts of ``--completion`` new tokens after a 32-token prompt
(random tokens, rewards mixed in every group of 4, so every rollout carries signal), the
project's own ``GRPOLearner.step``. Each batch size runs in a fresh child process: it builds
the model, runs one 1-rollout step (so AdamW's state exists and is not counted), then measures
the step on the batch:

- CPU: peak RSS during the step (``VmHWM`` after resetting it through ``/proc/self/clear_refs``,
  after ``malloc_trim``) minus the RSS just before it;
- CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before it.

Also reported: the whole process's peak (model, AdamW state and the step). The step's own
memory is one FP32 copy of the masters (the BF16-rounded values are in place during the
micro-batches), the gradients, AdamW's temporaries and one micro-batch's activations plus one
chunk's logits: the same at n and 4n.

The micro-batch budget defaults to the smaller batch's tokens, so n rollouts are one micro-batch
and 4n are four: the learner's memory should then be flat (target: peak at 4n <= 1.2x peak at
n). The learner before micro-batching builds the whole batch's logits: its ratio is ~4x.

    python bench/grpo_scale.py --json                 # CPU shapes: 4 layers, hidden 256, 152k vocab
    python bench/grpo_scale.py --qwen --device cuda    # Qwen2.5-0.5B shapes

``measure`` is also called by ``bench/real_scale.py``. Last line: JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPT = 32
QWEN = {"hidden": 896, "layers": 24, "vocab": 151_936}
CPU = {"hidden": 256, "layers": 4, "vocab": 151_936}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _policy(*, hidden: int, layers: int, vocab: int, completion: int, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pulse_node.rl.config import task_config
    from pulse_node.rl.models import HFLM
    from pulse_node.rl.policy import Policy

    heads = max(1, hidden // 64)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=-(-hidden * 38 // 7 // 64) * 64,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2 if heads % 2 == 0 else 1,
                      max_position_embeddings=PROMPT + completion + 8, tie_word_embeddings=True,
                      pad_token_id=0, bos_token_id=None, eos_token_id=1)
    torch.manual_seed(0)
    module = LlamaForCausalLM(cfg).to(device)

    class Vocab:  # the learner reads the vocabulary size and the padding id only
        vocab_size, pad_id = vocab, 0

    return Policy(HFLM(module, cfg.max_position_embeddings), Vocab(), task_config(), torch.device(device))


def _rollouts(n: int, *, vocab: int, completion: int, seed: int):
    import random

    from pulse_node.rl.rollout import Rollout

    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [rng.randrange(2, vocab) for _ in range(PROMPT + completion)]
        lps = [-12.0 + rng.gauss(0.0, 0.05) for _ in range(completion)]  # ~ -log(vocab) at random init
        out.append(Rollout(ids[:PROMPT], ids[PROMPT:], lps, float(i % 2), 0, f"p{i // 4}", f"g{i // 4}", local=True))
    return out


def child(spec: dict) -> dict:
    """One batch size in this (fresh) process."""
    import torch

    from pulse_node.rl.config import GRPOConfig
    from pulse_node.rl.grpo import GRPOLearner

    device = spec["device"]
    policy = _policy(hidden=spec["hidden"], layers=spec["layers"], vocab=spec["vocab"],
                     completion=spec["completion"], device=device)
    extra = {"micro_batch_tokens": spec["micro_batch_tokens"], "activation_checkpointing": spec["checkpointing"]}
    cfg = GRPOConfig(**{k: v for k, v in extra.items() if k in GRPOConfig.model_fields})  # also the learner before
    learner = GRPOLearner(policy, cfg)
    warm = _rollouts(2, vocab=spec["vocab"], completion=spec["completion"], seed=1)
    for r in warm:
        r.group_id = "w"
    learner.step(warm, current_version=0)  # AdamW state allocated (not the step's memory)
    batch = _rollouts(spec["rows"], vocab=spec["vocab"], completion=spec["completion"], seed=2)
    cuda = device.startswith("cuda")
    learner.opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = _status_mb("VmRSS")
    t0 = time.perf_counter()
    stats = learner.step(batch, current_version=0)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    total = torch.cuda.max_memory_allocated() / 2**20 if cuda else _status_mb("VmHWM")
    peak = total - (before / 2**20 if cuda else before)
    return {"rows": spec["rows"], "seconds": seconds, "peak_mb": peak, "process_peak_mb": total, "tokens": stats["tokens"],
            "stepped": stats["stepped"], "micro_batch_tokens": spec["micro_batch_tokens"]}


def _run_child(spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                          text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child for {spec['rows']} rows failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(*, hidden: int, layers: int, vocab: int, completion: int, batches: tuple[int, int], device: str,
            micro_batch_tokens: int | None = None, checkpointing: bool = False) -> dict:
    """Step seconds and peak step memory (MB) at ``batches`` = (n, 4n) rollouts, and their ratios.

    ``micro_batch_tokens`` defaults to the smaller batch's tokens (n rows = one micro-batch)."""
    small, large = batches
    budget = micro_batch_tokens or small * (PROMPT + completion)
    runs = [_run_child({"hidden": hidden, "layers": layers, "vocab": vocab, "completion": completion,
                        "rows": rows, "device": device, "micro_batch_tokens": budget,
                        "checkpointing": checkpointing}) for rows in (small, large)]
    a, b = runs
    return {"hidden": hidden, "layers": layers, "vocab": vocab, "completion": completion, "device": device,
            "batches": [small, large], "micro_batch_tokens": budget, "checkpointing": checkpointing,
            "step_s": [a["seconds"], b["seconds"]], "peak_mb": [a["peak_mb"], b["peak_mb"]],
            "peak_ratio": b["peak_mb"] / max(a["peak_mb"], 1e-9), "time_ratio": b["seconds"] / a["seconds"],
            "process_peak_mb": [a["process_peak_mb"], b["process_peak_mb"]],
            "process_peak_ratio": b["process_peak_mb"] / a["process_peak_mb"],
            "mb_per_rollout": [a["peak_mb"] / small, b["peak_mb"] / large]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--qwen", action="store_true", help="Qwen2.5-0.5B shapes (hidden 896, 24 layers, 151,936 vocabulary)")
    p.add_argument("--hidden", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--completion", type=int, default=256)
    p.add_argument("--batches", type=int, nargs=2, default=(2, 8), metavar=("N", "4N"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--micro-batch-tokens", type=int, help="default: the smaller batch's tokens")
    p.add_argument("--checkpointing", action="store_true", help="grpo.activation_checkpointing")
    p.add_argument("--json", action="store_true", help="only the JSON line")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    shape = dict(QWEN if args.qwen else CPU)
    shape.update({k: v for k, v in (("hidden", args.hidden), ("layers", args.layers), ("vocab", args.vocab)) if v})
    out = measure(**shape, completion=args.completion, batches=tuple(args.batches), device=args.device,
                  micro_batch_tokens=args.micro_batch_tokens, checkpointing=args.checkpointing)
    if not args.json:
        print(f"{'rollouts':>9} {'step s':>8} {'peak MB':>9} {'MB/rollout':>11}")
        for i in range(2):
            print(f"{out['batches'][i]:>9} {out['step_s'][i]:>8.2f} {out['peak_mb'][i]:>9.0f} {out['mb_per_rollout'][i]:>11.1f}")
        print(f"step peak at {out['batches'][1]} / at {out['batches'][0]}: {out['peak_ratio']:.2f}x (target <= 1.2x); "
              f"time {out['time_ratio']:.2f}x; whole process (model, AdamW state, step) "
              f"{out['process_peak_mb'][0]:.0f} -> {out['process_peak_mb'][1]:.0f} MB, {out['process_peak_ratio']:.2f}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
