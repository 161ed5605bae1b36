"""PULSELoCo vs DDP vs DiLoCo (FP32 and FP16 pseudo-gradients): bytes and quality, side by side.

Run (1 torch thread; about 45 min for the RL default on 2 busy cores, ``--quick`` for a smoke run)::

    /work/venv/bin/python bench/pulseloco.py                         # RL workload (GRPO), the default
    /work/venv/bin/python bench/pulseloco.py --workload supervised   # the older supervised stage

``--workload rl`` (``bench/loco_rl.py``): 4 trainers start from the warm-started GRPO policy of
``configs/solo.toml`` (208k parameters, 2-digit addition) and take on-policy GRPO inner steps
(16 prompts x 8 samples, AdamW betas 0.9/0.95) at realistic LLM learning rates (``--rl-lrs``,
default 3e-6 and 1e-6). Metric: held-out expected exact-match reward (temperature 1, computed
exactly by teacher forcing; higher is better) and greedy accuracy, on the BF16 cast of the
global weights. The first lr of ``--rl-lrs`` is the headline of the JSON line.

``--workload supervised``: the tiny transformer (``TinyGPT``, 2 layers, 107k parameters) learns
1-2 digit addition by next-token loss, each trainer on its own data shard; metric: held-out
answer-token loss (lower is better). Phase 2 repeats pulseloco vs diloco at lr 3e-6 from a
pre-trained base. This is the workload of the 2026-11-21 results.

Methods, same inner compute (H inner steps per outer step on each of 4 trainers):
- ddp: dense FP32 gradient all-reduced every inner step -> 4 B/param x H per outer step;
- diloco: dense FP32 pseudo-gradient, outer Nesterov SGD -> 4 B/param per outer step;
- diloco_fp16: the same with pseudo-gradients rounded to FP16 -> 2 B/param;
- pulseloco: the BF16-gated error-feedback payloads of ``pulse_node.loco`` -> measured encoded
  payload bytes (the real wire bytes, format 2, coded against the round's global weights).
Bytes are what one trainer sends per outer step (message size, as in an all-gather; a ring
all-reduce moves about 2x the message size for every method alike). Every PULSELoCo payload is
also encoded with the alternative coders (format 1 of 2026-11-21, base-free format 2, and the
pieces) to report bytes per fired entry per coder. The last phase records RSS over 50 rounds.
The last printed line is a JSON summary.

``--gate-scales 0.5,1,2,outer/n,outer`` (RL only) runs the pulseloco method once per gate scale c
(``LocoConfig.gate_scale``: fire iff ``bf16(w) != bf16(w - c*s)``), labelled ``pulseloco_c<c>``
(c = 1 keeps the label ``pulseloco``), and prints a per-scale table; without it nothing changes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loco_common import (
    N_TRAINERS,
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

from pulse_node.loco.payload import POSITION_CODER
from pulse_node.rl.batch import bf16_params, pack
from pulse_node.rl.config import task_config
from pulse_node.rl.models import TinyGPT, TinyLM
from pulse_node.rl.tasks import ArithmeticTask
from pulse_node.rl.tokenizer import CharTokenizer

WIDTH = 12  # <bos> + 'ab+cd=' + up to 3 answer digits + <eos>
TOK = CharTokenizer()


@dataclass
class Setup:
    lr: float
    rounds: int
    inner_steps: int = 10
    batch: int = 64
    d_model: int = 64
    n_layers: int = 2
    init: dict[str, torch.Tensor] | None = None  # start weights (phase 2); else seeded init


# ---------------------------------------------------------------- data and model


def packed_problems(problems) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    pairs = [(TOK.encode(p.prompt), TOK.encode_target(p.answer)) for p in problems]
    pk = pack(pairs, pad_id=TOK.pad_id, device=torch.device("cpu"))
    grow = WIDTH - pk.ids.shape[1]  # one width for every shard, so shards can be concatenated
    pad = lambda t, v: torch.nn.functional.pad(t, (0, grow), value=v)  # noqa: E731
    return pad(pk.ids, TOK.pad_id), pad(pk.mask, False), pad(pk.target, False)


def shard(task: ArithmeticTask, rank: int, n: int, seed: int) -> tuple[torch.Tensor, ...]:
    """All training problems whose crc32 falls in this trainer's shard."""
    import random

    seen: dict[str, object] = {}
    rng = random.Random(f"pool:{seed}")
    for p in task.sample(12000, rng):
        if zlib.crc32(p.id.encode()) % n == rank:
            seen.setdefault(p.id, p)
    return packed_problems(list(seen.values()))


def make_model(setup: Setup, seed: int) -> TinyLM:
    torch.manual_seed(seed)
    module = TinyGPT(vocab_size=TOK.vocab_size, d_model=setup.d_model, n_layers=setup.n_layers,
                     n_heads=4, max_len=16)
    if setup.init is not None:
        with torch.no_grad():
            for n, p in module.named_parameters():
                p.copy_(setup.init[n])
    return TinyLM(module)


def loss_and_acc(lm: TinyLM, data: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, float]:
    """Mean answer-token NLL (BF16 forward) and teacher-forced exact-match accuracy."""
    ids, mask, target = data
    logits = lm.logits(ids, mask, bf16_params(lm.module))[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    loss = (nll * target).sum() / target.sum()
    right = (logits.argmax(-1) == ids[:, 1:]) | ~target
    return loss, float(right.all(dim=1).float().mean())


class SupervisedTrainer:
    """``InnerTrainer`` for the harness: AdamW steps on one shard."""

    def __init__(self, setup: Setup, seed: int, rank: int, data: tuple[torch.Tensor, ...]) -> None:
        self.lm = make_model(setup, seed)
        self.data, self.batch = data, setup.batch
        self.gen = torch.Generator().manual_seed(seed * 100 + rank)
        self.opt = torch.optim.AdamW(self.lm.module.parameters(), lr=setup.lr, betas=(0.9, 0.95),
                                     weight_decay=0.0)
        self._params = dict(self.lm.module.named_parameters())

    def local_params(self):
        return self._params

    def sample(self) -> tuple[torch.Tensor, ...]:
        i = torch.randint(0, self.data[0].shape[0], (self.batch,), generator=self.gen)
        return tuple(t[i] for t in self.data)

    def grad_step_loss(self) -> torch.Tensor:
        loss, _ = loss_and_acc(self.lm, self.sample())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    def inner_step(self) -> float:
        loss = self.grad_step_loss()
        self.opt.step()
        return float(loss.detach())


# ---------------------------------------------------------------- supervised methods


def evaluator(setup: Setup, seed: int, evald):
    """``evaluate(params)`` of the supervised workload: held-out loss and teacher-forced accuracy."""
    eval_lm = make_model(setup, seed)

    def evaluate(params) -> tuple[float, float]:
        with torch.no_grad():
            for n, p in eval_lm.module.named_parameters():
                p.copy_(params[n])
            loss, acc = loss_and_acc(eval_lm, evald)
        return float(loss), acc

    return evaluate


def numel_of(setup: Setup) -> int:
    return sum(p.numel() for p in make_model(setup, 0).module.parameters())


def run_sup_loco(setup: Setup, seed: int, data, evald, **kw) -> Curve:
    return run_loco(rounds=setup.rounds, inner_steps=setup.inner_steps, evaluate=evaluator(setup, seed, evald),
                    make_trainer=lambda r: SupervisedTrainer(setup, seed, r, data[r]), numel=numel_of(setup), **kw)


def run_ddp(setup: Setup, seed: int, data, evald) -> Curve:
    """Dense FP32 gradient averaged over the 4 trainers every inner step (one shared model)."""
    trainers = [SupervisedTrainer(setup, seed, r, data[r]) for r in range(N_TRAINERS)]
    main = trainers[0]
    params = list(main.lm.module.parameters())
    numel = sum(p.numel() for p in params)
    curve, t0 = Curve(), time.monotonic()
    for _ in range(setup.rounds):
        for _ in range(setup.inner_steps):
            grads = []
            for t in trainers:  # replicas of one model: identical after every all-reduced step
                loss, _ = loss_and_acc(main.lm, t.sample())
                main.opt.zero_grad(set_to_none=True)
                loss.backward()
                grads.append([p.grad for p in params])
            for p, *gs in zip(params, *grads):
                p.grad = torch.stack(gs).mean(0)
            main.opt.step()
        with torch.no_grad():
            loss, acc = loss_and_acc(main.lm, evald)
        curve.metric.append(float(loss))
        curve.acc.append(acc)
        curve.bytes.append(4 * numel * setup.inner_steps)
        curve.density.append(1.0)
    curve.seconds = time.monotonic() - t0
    return curve


def sup_methods(setup: Setup, data, evald, names: list[str]) -> dict:
    all_methods = {
        "ddp": lambda seed: run_ddp(setup, seed, data, evald),
        "diloco": lambda seed: run_sup_loco(setup, seed, data, evald, gate="none"),
        "diloco_fp16": lambda seed: run_sup_loco(setup, seed, data, evald, gate="none", fp16=True),
        "pulseloco": lambda seed: run_sup_loco(setup, seed, data, evald, gate="bf16", tally=True),
    }
    return {n: all_methods[n] for n in names}


# ---------------------------------------------------------------- supervised phases


def pretrain(setup: Setup, seed: int, data, steps: int) -> dict[str, torch.Tensor]:
    """Phase 0: one model, plain AdamW at lr 3e-3 on all shards (the 'pre-trained base')."""
    pre = Setup(lr=3e-3, rounds=0, batch=setup.batch, d_model=setup.d_model, n_layers=setup.n_layers)
    t = SupervisedTrainer(pre, seed, 0, tuple(torch.cat([d[k] for d in data]) for k in range(3)))
    for _ in range(steps):
        t.inner_step()
    return {n: p.detach().clone() for n, p in t.lm.module.named_parameters()}


def bf16_change_rate(setup: Setup, data, steps: int = 20) -> tuple[float, float]:
    """Fraction of BF16 weights changed per plain AdamW step, and over a window of H steps."""
    t = SupervisedTrainer(setup, 0, 0, data[0])
    params = list(t.lm.module.parameters())
    bits = lambda: torch.cat([p.detach().reshape(-1).to(torch.bfloat16).view(torch.int16) for p in params])  # noqa: E731
    start, per_step, window = bits(), [], 0.0
    prev = start
    for k in range(1, steps + 1):
        t.inner_step()
        now = bits()
        per_step.append(float((now != prev).float().mean()))
        if k == setup.inner_steps:
            window = float((now != start).float().mean())
        prev = now
    return statistics.mean(per_step), window


def phase_main(args, seeds, rounds, data, evald) -> tuple[dict, dict]:
    print(f"\n# phase 1: supervised from scratch, inner lr {args.lr}", flush=True)
    CodecTally.tally = {}
    setup = Setup(lr=args.lr, rounds=rounds)
    s1 = summarize(sweep(sup_methods(setup, data, evald, ["ddp", "diloco", "diloco_fp16", "pulseloco"]), seeds,
                         "loss"), higher_better=False)
    print_table(f"phase 1: supervised, lr {args.lr}", s1, "loss")
    return s1, codec_report(CodecTally.tally)


def phase_rl_lr(args, seeds, rounds, data, evald) -> tuple[dict, dict, dict]:
    print(f"\n# phase 2: RL-like inner lr {args.rl_lr} from a pre-trained base", flush=True)
    base = pretrain(Setup(lr=args.lr, rounds=rounds), 1234, data, steps=50 if args.quick else 1500)
    rl_setup = Setup(lr=args.rl_lr, rounds=rounds, init=base)
    with torch.no_grad():
        base_loss, base_acc = loss_and_acc(make_model(rl_setup, 0), evald)
    step_rate, window_rate = bf16_change_rate(rl_setup, data)
    print(f"  base: held-out loss {float(base_loss):.4f} acc {base_acc:.3f}; plain AdamW at lr {args.rl_lr}: "
          f"{step_rate:.4f} of BF16 weights change per step, {window_rate:.4f} over {rl_setup.inner_steps} steps",
          flush=True)
    CodecTally.tally = {}
    s2 = summarize(sweep(sup_methods(rl_setup, data, evald, ["diloco", "pulseloco"]), seeds, "loss"),
                   higher_better=False)
    print_table(f"phase 2: lr {args.rl_lr} from pre-trained base", s2, "loss")
    extra = {"rl_base_loss": float(base_loss), "rl_base_acc": base_acc, "rl_adamw_bf16_change_per_step": step_rate,
             "rl_adamw_bf16_change_per_window": window_rate}
    return s2, codec_report(CodecTally.tally), extra


def phase_rss(args, data) -> list[float]:
    print(f"\n# phase 3: RSS over {args.rss_rounds} PULSELoCo rounds (lr {args.lr})", flush=True)
    setup = Setup(lr=args.lr, rounds=0)
    mib = rss_run(lambda r: SupervisedTrainer(setup, 0, r, data[r]), rounds=6 if args.quick else args.rss_rounds,
                  inner_steps=setup.inner_steps)
    print("  RSS MiB by round: " + " ".join(f"{m:.0f}" for m in mib), flush=True)
    return mib


def rss_fields(mib: list[float]) -> dict[str, float]:
    return {"rss_mib_first": mib[0], "rss_mib_mid": mib[len(mib) // 2], "rss_mib_last": mib[-1],
            "rss_mib_max": max(mib)}


def result_json(args, s1, codec1, s2, codec2, extra, mib) -> dict:
    p1, d1 = s1["pulseloco"], s1["diloco"]
    return {
        "workload": "supervised arithmetic LM (pulse_node.rl TinyGPT), not RL", "position_coder": POSITION_CODER,
        "bytes_ratio_vs_diloco": ratio(s1, "diloco"), "bytes_ratio_vs_diloco_fp16": ratio(s1, "diloco_fp16"),
        "bytes_ratio_vs_ddp": ratio(s1, "ddp"),
        "metric_pulseloco": p1["metric_mean"], "metric_diloco": d1["metric_mean"],
        "metric_std": d1["metric_std"], "metric_std_pulseloco": p1["metric_std"],
        "within_one_std": abs(p1["metric_mean"] - d1["metric_mean"]) <= d1["metric_std"],
        "metric": "held-out answer-token loss", "lr": args.lr, "density": p1["density"],
        "bytes_per_entry": codec1.get("wire_v2_base"), "bytes_per_entry_format1": codec1.get("wire_v1"),
        "bytes_to_target_ratio_vs_diloco": ratio_to_target(s1, "diloco"),
        "bytes_to_target_ratio_vs_ddp": ratio_to_target(s1, "ddp"),
        "rl_lr": args.rl_lr, "rl_bytes_ratio_vs_diloco": ratio(s2, "diloco"),
        "rl_bytes_ratio_vs_ddp": Setup(lr=args.lr, rounds=0).inner_steps * ratio(s2, "diloco"),
        "rl_metric_pulseloco": s2["pulseloco"]["metric_mean"], "rl_metric_diloco": s2["diloco"]["metric_mean"],
        "rl_metric_std": s2["diloco"]["metric_std"], "rl_density": s2["pulseloco"]["density"],
        "rl_bytes_per_entry": codec2.get("wire_v2_base"), **extra, **rss_fields(mib),
    }


def main_supervised(args) -> dict:
    seeds = list(range(1 if args.quick else args.seeds))
    rounds = 4 if args.quick else args.rounds
    task = ArithmeticTask(task_config(digits=2, min_digits=1, ops="+", eval_size=200))
    data = [shard(task, r, N_TRAINERS, seed=0) for r in range(N_TRAINERS)]
    evald = packed_problems(task.eval_set())
    print(f"# PULSELoCo bench (supervised): 4 trainers, H=10, seeds {seeds}, rounds {rounds}, "
          f"shards {[d[0].shape[0] for d in data]}", flush=True)
    s1, codec1 = phase_main(args, seeds, rounds, data, evald)
    s2, codec2, extra = phase_rl_lr(args, seeds, rounds, data, evald)
    mib = phase_rss(args, data)
    return result_json(args, s1, codec1, s2, codec2, extra, mib)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=["rl", "supervised"], default="rl")
    ap.add_argument("--quick", action="store_true", help="1 seed, few rounds (smoke run)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3, help="supervised: inner AdamW lr of the main sweep")
    ap.add_argument("--rl-lr", type=float, default=3e-6, help="supervised: lr of phase 2")
    ap.add_argument("--rl-lrs", default="3e-6,1e-6", help="rl: inner GRPO lrs; the first is the JSON headline")
    ap.add_argument("--prompts", type=int, default=16, help="rl: prompts per inner step (x 8 samples)")
    ap.add_argument("--inner-steps", type=int, default=10, help="rl: H, inner steps per outer step")
    ap.add_argument("--outer-lr", type=float, default=None, help="rl: outer lr (default the reference 0.7)")
    ap.add_argument("--outer-momentum", type=float, default=None,
                    help="rl: outer Nesterov momentum (default the reference 0.9; 0 = plain averaging step)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="rl: override a key of configs/solo.toml (other model sizes, tasks; repeatable)")
    ap.add_argument("--rss-rounds", type=int, default=50, help="0 skips the RSS phase")
    ap.add_argument("--methods", default="ddp,diloco,diloco_fp16,pulseloco",
                    help="rl: methods to run (diloco and a pulseloco method are required; also pulseloco_trainer)")
    ap.add_argument("--gate-scales", default="",
                    help="rl: run pulseloco once per gate scale c (LocoConfig.gate_scale), e.g. 0.5,1,2,outer/n,"
                         "outer (outer = outer lr x (1 + momentum)); labelled pulseloco_c<c>, c=1 stays pulseloco")
    ap.add_argument("--curves", default="", help="rl: write per-round curves to CURVES.lr<lr>.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.workload == "supervised":
        out = main_supervised(args)
    else:
        from loco_rl import main_rl
        out = main_rl(args)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
