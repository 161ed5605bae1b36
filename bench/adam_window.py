"""How much more of a BF16 model changes over k AdamW steps than over one, on synthetic gradients.

PULSELoCo's bytes per outer step follow the fraction of BF16 entries that change over the H
inner steps of a round. The authors' LLM data (PULSE.md) has the k=8 change only 1.6-1.7x the
k=1 change; our GRPO workload has ~5x (bench/rl_sparsity.py). This bench asks whether any
simple gradient model gives the authors' ratio under the reference inner optimizer (AdamW,
betas 0.9/0.95): per-coordinate gradients that are pure noise, noise plus a persistent drift,
sparse in time, or pulled back to the start (a basin); with beta1 = 0 for comparison.

Weights ~ N(0, 0.02^2) (median |w| 0.0135), lr 3e-6, FP32 master weights, measured after a
warm-up of 100 steps so Adam's moments are settled.

    /work/venv/bin/python bench/adam_window.py [--params 1000000] [--steps 40]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Case:
    """One synthetic gradient model: g = drift*mu + noise, masked to ``active``, plus ``pull``*(w - w0)."""

    label: str
    drift: float = 0.0
    active: float = 1.0
    pull: float = 0.0
    beta1: float = 0.9


CASES = (
    Case("pure noise"),
    Case("noise + drift (SNR 1)", drift=1.0),
    Case("noise, 1% of coordinates active per step", active=0.01),
    Case("noise + pull to start (basin, K=1)", pull=1.0),
    Case("pure noise, beta1 = 0", beta1=0.0),
)


def bf16_bits(p: torch.Tensor) -> torch.Tensor:
    return p.detach().to(torch.bfloat16).view(torch.int16).clone()


def run(case: Case, *, n: int, steps: int, warmup: int, lr: float, seed: int) -> dict[str, float]:
    """Mean fraction of BF16 entries changed between steps t and t+k, k = 1, 8, 32."""
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(n, generator=gen) * 0.02
    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([p], lr=lr, betas=(case.beta1, 0.95), weight_decay=0.0)
    mu = torch.randn(n, generator=gen) * case.drift
    snaps = []
    for t in range(warmup + steps):
        g = mu + torch.randn(n, generator=gen)
        if case.active < 1.0:
            g *= torch.rand(n, generator=gen) < case.active
        g = g * 1e-4 + case.pull * 1e-4 * (p.detach() - w0) / lr
        p.grad = g
        opt.step()
        if t >= warmup - 1:
            snaps.append(bf16_bits(p))

    def changed(k: int) -> float:
        return sum(float((snaps[t] != snaps[t - k]).float().mean()) for t in range(k, len(snaps))) / (len(snaps) - k)

    out = {f"k{k}": changed(k) for k in (1, 8, 32)}
    out["k8_over_k1"] = out["k8"] / out["k1"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    results, t0 = {}, time.monotonic()
    for i, case in enumerate(CASES):
        r = results[case.label] = run(case, n=args.params, steps=args.steps, warmup=args.warmup, lr=args.lr, seed=i)
        print(f"{case.label:<42} changed k=1 {100 * r['k1']:.2f}%  k=8 {100 * r['k8']:.2f}%  "
              f"k=32 {100 * r['k32']:.2f}%  k=8/k=1 {r['k8_over_k1']:.2f}x", flush=True)
    print("authors (PULSE.md, six LLMs, lr 3e-6): k=8/k=1 1.6-1.7x", flush=True)
    print(json.dumps({"bench": "adam_window", "params": args.params, "lr": args.lr, "results": results,
                      "seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
