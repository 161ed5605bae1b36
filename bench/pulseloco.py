"""PULSELoCo vs DDP vs DiLoCo (FP32 and FP16 pseudo-gradients): bytes and quality, side by side.

Run: ``/work/venv/bin/python bench/pulseloco.py`` (about 5-10 minutes on 2 busy cores;
``--quick`` for a smoke run).

Workload (stated plainly): a SUPERVISED stage, not RL. The project's tiny transformer
(``pulse_node.rl.models.TinyGPT``, char tokenizer, BF16 straight-through forward over FP32
master weights as in the RL trainer) learns 1-2 digit addition ("12+34=" -> "46<eos>") by
next-token loss on the answer tokens. 4 trainers, each on its own data shard (problems split by
crc32 of the problem text), AdamW (betas 0.9/0.95) as the inner optimizer, held-out loss and
exact-match accuracy (teacher forced) on the task's 200 held-out problems.

Methods, same inner compute (H inner steps per outer step on each of 4 trainers):
- ddp: dense FP32 gradient all-reduced every inner step -> 4 B/param x H per outer step;
- diloco: dense FP32 pseudo-gradient, outer Nesterov SGD -> 4 B/param per outer step;
- diloco_fp16: the same with pseudo-gradients rounded to FP16 -> 2 B/param;
- pulseloco: the BF16-gated error-feedback payloads of ``pulse_node.loco`` -> measured encoded
  payload bytes (the real msgpack/zstd wire bytes).
Bytes are what one trainer sends per outer step (message size, as in an all-gather; a ring
all-reduce moves about 2x the message size for every method alike).

Phase 2 repeats pulseloco vs diloco at an RL-like inner lr (3e-6) from a model pre-trained in
phase 0, to show the sparsity regime of post-training. Phase 3 records RSS over 50 rounds.
The last printed line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulse_node.loco import positions as loco_positions  # noqa: E402
from pulse_node.loco.config import LocoConfig  # noqa: E402
from pulse_node.loco.harness import run_inprocess  # noqa: E402
from pulse_node.loco.payload import POSITION_CODER, POSITION_CODERS, LocoPayload, encode_values  # noqa: E402
from pulse_node.loco.sparsify import ErrorFeedback  # noqa: E402
from pulse_node.rl.batch import bf16_params, pack  # noqa: E402
from pulse_node.rl.config import TaskConfig  # noqa: E402
from pulse_node.rl.models import TinyGPT, TinyLM  # noqa: E402
from pulse_node.rl.tasks import ArithmeticTask  # noqa: E402
from pulse_node.rl.tokenizer import CharTokenizer  # noqa: E402

N_TRAINERS = 4
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


# ---------------------------------------------------------------- methods


@dataclass
class Curve:
    """Held-out metric after every outer step and bytes one trainer sent per outer step."""

    loss: list[float] = field(default_factory=list)
    acc: list[float] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)
    density: list[float] = field(default_factory=list)
    seconds: float = 0.0


class Fp16DenseFeedback(ErrorFeedback):
    """DiLoCo with FP16 pseudo-gradients: every entry sent, rounded to FP16 (no error feedback)."""

    def make_payload(self, global_params, local_params, *, round, trainer_id, base_hash=b""):
        p = super().make_payload(global_params, local_params, round=round, trainer_id=trainer_id,
                                 base_hash=base_hash)
        for name, (idx, vals) in p.tensors.items():
            p.tensors[name] = (idx, vals.astype(np.float16).astype(np.float32))
        return p


class CodecTally(ErrorFeedback):
    """ErrorFeedback that also tallies payload sizes under alternative value/position codings."""

    tally: dict[str, float] = {}

    def make_payload(self, *args, **kwargs):
        p = super().make_payload(*args, **kwargs)
        codec_breakdown(p, CodecTally.tally)
        return p


def codec_breakdown(p: LocoPayload, tally: dict[str, float]) -> None:
    vals = np.concatenate([v for _, v in p.tensors.values()]) if p.tensors else np.zeros(0, np.float32)
    if vals.size == 0:
        return
    zc = zstandard.ZstdCompressor(level=3)
    planes = np.ascontiguousarray(vals.view(np.uint8).reshape(-1, 4).T).tobytes()
    pos_v = sum(len(loco_positions.encode_positions(i, p.numel[n])) for n, (i, _) in p.tensors.items())
    enc = POSITION_CODERS[POSITION_CODER][0]
    pos_wire = sum(len(enc(i, p.numel[n])) for n, (i, _) in p.tensors.items() if i.size)
    pos_i32 = sum(len(zc.compress(i.astype(np.int32).tobytes())) for i, _ in p.tensors.values())
    add = {"entries": vals.size, "val_raw": 4 * vals.size, "val_zstd": len(zc.compress(vals.tobytes())),
           "val_planes_zstd": len(zc.compress(planes)), "val_rot_planes_zstd": len(encode_values(vals)),
           "pos_int64_raw": 8 * vals.size, "pos_int32_zstd": pos_i32, "pos_varint_zstd": pos_v,
           "pos_wire": pos_wire}
    for k, v in add.items():
        tally[k] = tally.get(k, 0) + v


def run_loco(setup: Setup, seed: int, data, evald, *, gate: str, fp16: bool = False,
             tally: bool = False) -> Curve:
    cfg = LocoConfig(inner_steps=setup.inner_steps, gate=gate)
    curve, numel = Curve(), 0
    eval_lm = make_model(setup, seed)

    def on_round(rec, replicas):
        with torch.no_grad():
            for n, p in eval_lm.module.named_parameters():
                p.copy_(replicas[0].outer.params[n])
            loss, acc = loss_and_acc(eval_lm, evald)
        curve.loss.append(float(loss))
        curve.acc.append(acc)
        fired = statistics.mean(rec.fired.values())
        curve.density.append(fired / numel)
        sent = rec.payload_bytes.values() if gate == "bf16" else [(2 if fp16 else 4) * numel]
        curve.bytes.append(statistics.mean(sent))

    numel = sum(p.numel() for p in eval_lm.module.parameters())
    feedback = Fp16DenseFeedback if fp16 else CodecTally if tally else ErrorFeedback
    t0 = time.monotonic()
    run_inprocess(N_TRAINERS, lambda r: SupervisedTrainer(setup, seed, r, data[r]), rounds=setup.rounds,
                  cfg=cfg, make_feedback=feedback, on_round=on_round)
    curve.seconds = time.monotonic() - t0
    return curve


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
        curve.loss.append(float(loss))
        curve.acc.append(acc)
        curve.bytes.append(4 * numel * setup.inner_steps)
        curve.density.append(1.0)
    curve.seconds = time.monotonic() - t0
    return curve


METHODS = {
    "ddp": lambda s, seed, d, e: run_ddp(s, seed, d, e),
    "diloco": lambda s, seed, d, e: run_loco(s, seed, d, e, gate="none"),
    "diloco_fp16": lambda s, seed, d, e: run_loco(s, seed, d, e, gate="none", fp16=True),
    "pulseloco": lambda s, seed, d, e: run_loco(s, seed, d, e, gate="bf16", tally=True),
}


# ---------------------------------------------------------------- summaries


def bytes_to_reach(curve: Curve, target: float) -> float | None:
    """Cumulative bytes one trainer sent until the held-out loss first reached ``target``."""
    total = 0.0
    for loss, b in zip(curve.loss, curve.bytes):
        total += b
        if loss <= target:
            return total
    return None


def mean_curve(cs: list[Curve]) -> Curve:
    """Per-round mean over seeds (loss and bytes)."""
    return Curve(loss=[statistics.mean(v) for v in zip(*(c.loss for c in cs))],
                 bytes=[statistics.mean(v) for v in zip(*(c.bytes for c in cs))])


def summarize(curves: dict[str, list[Curve]]) -> dict[str, dict[str, float | None]]:
    """Final metric mean/std over seeds, bytes per outer step, and bytes until the seed-mean
    loss curve first reaches the worst method's final mean loss (a quality every method reaches)."""
    finals = {m: [c.loss[-1] for c in cs] for m, cs in curves.items()}
    target = max(statistics.mean(v) for v in finals.values())
    out = {}
    for m, cs in curves.items():
        out[m] = {
            "loss_mean": statistics.mean(finals[m]), "loss_std": statistics.stdev(finals[m]) if len(cs) > 1 else 0.0,
            "acc_mean": statistics.mean(c.acc[-1] for c in cs),
            "bytes_per_outer_step": statistics.mean(statistics.mean(c.bytes) for c in cs),
            "density": statistics.mean(statistics.mean(c.density) for c in cs),
            "bytes_to_target": bytes_to_reach(mean_curve(cs), target),
            "seconds": statistics.mean(c.seconds for c in cs),
        }
    out["_target_loss"] = {"value": target}
    return out


def print_table(title: str, summary: dict) -> None:
    print(f"\n## {title}  (target loss for bytes-to-target: {summary['_target_loss']['value']:.4f})")
    print(f"{'method':<12} {'loss mean':>10} {'std':>8} {'acc':>6} {'B/outer step':>14} {'density':>8} "
          f"{'B to target':>13} {'s/run':>6}")
    for m, r in summary.items():
        if m.startswith("_"):
            continue
        reach = f"{r['bytes_to_target']:.3e}" if r["bytes_to_target"] else "not reached"
        print(f"{m:<12} {r['loss_mean']:>10.4f} {r['loss_std']:>8.4f} {r['acc_mean']:>6.3f} "
              f"{r['bytes_per_outer_step']:>14.0f} {r['density']:>8.4f} {reach:>13} {r['seconds']:>6.1f}")


def sweep(setup: Setup, methods: list[str], seeds: list[int], data, evald) -> dict[str, list[Curve]]:
    curves: dict[str, list[Curve]] = {m: [] for m in methods}
    for seed in seeds:
        for m in methods:  # methods interleaved per seed: side by side on the same noisy machine
            curves[m].append(METHODS[m](setup, seed, data, evald))
            c = curves[m][-1]
            print(f"  seed {seed} {m:<12} loss {c.loss[-1]:.4f} acc {c.acc[-1]:.3f} "
                  f"bytes/step {statistics.mean(c.bytes):.0f} ({c.seconds:.1f}s)", flush=True)
    return curves


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


def rss_run(setup: Setup, data, rounds: int) -> list[int]:
    rss: list[int] = []
    cfg = LocoConfig(inner_steps=setup.inner_steps)
    run_inprocess(N_TRAINERS, lambda r: SupervisedTrainer(setup, 0, r, data[r]), rounds=rounds, cfg=cfg,
                  on_round=lambda rec, reps: rss.append(rec.rss_bytes))
    return rss


def codec_report(tally: dict[str, float]) -> dict[str, float]:
    n = max(tally.get("entries", 0), 1)
    per = {k: v / n for k, v in tally.items() if k != "entries"}
    print("  bytes per sent entry: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
    return per


def phase_main(args, seeds, rounds, data, evald) -> tuple[dict, dict]:
    print(f"\n# phase 1: supervised from scratch, inner lr {args.lr}", flush=True)
    CodecTally.tally = {}
    s1 = summarize(sweep(Setup(lr=args.lr, rounds=rounds), list(METHODS), seeds, data, evald))
    print_table(f"phase 1: supervised, lr {args.lr}", s1)
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
    s2 = summarize(sweep(rl_setup, ["diloco", "pulseloco"], seeds, data, evald))
    print_table(f"phase 2: lr {args.rl_lr} from pre-trained base", s2)
    extra = {"rl_base_loss": float(base_loss), "rl_base_acc": base_acc, "rl_adamw_bf16_change_per_step": step_rate,
             "rl_adamw_bf16_change_per_window": window_rate}
    return s2, codec_report(CodecTally.tally), extra


def phase_rss(args, data) -> list[float]:
    print(f"\n# phase 3: RSS over {args.rss_rounds} PULSELoCo rounds (lr {args.lr})", flush=True)
    rss = rss_run(Setup(lr=args.lr, rounds=0), data, 6 if args.quick else args.rss_rounds)
    mib = [r / 2**20 for r in rss]
    print("  RSS MiB by round: " + " ".join(f"{m:.0f}" for m in mib), flush=True)
    return mib


def ratio(s: dict, base: str, method: str = "pulseloco") -> float:
    return s[base]["bytes_per_outer_step"] / s[method]["bytes_per_outer_step"]


def result_json(args, s1, codec1, s2, codec2, extra, mib) -> dict:
    p1, d1 = s1["pulseloco"], s1["diloco"]
    entry = lambda c: c.get("pos_wire", 0) + c.get("val_rot_planes_zstd", 0)  # noqa: E731
    return {
        "workload": "supervised arithmetic LM (pulse_node.rl TinyGPT), not RL", "position_coder": POSITION_CODER,
        "bytes_ratio_vs_diloco": ratio(s1, "diloco"), "bytes_ratio_vs_diloco_fp16": ratio(s1, "diloco_fp16"),
        "bytes_ratio_vs_ddp": ratio(s1, "ddp"),
        "metric_pulseloco": p1["loss_mean"], "metric_diloco": d1["loss_mean"],
        "metric_std": d1["loss_std"], "metric_std_pulseloco": p1["loss_std"],
        "within_one_std": abs(p1["loss_mean"] - d1["loss_mean"]) <= d1["loss_std"],
        "metric": "held-out answer-token loss", "lr": args.lr, "density": p1["density"],
        "bytes_per_entry": entry(codec1),
        "bytes_to_target_ratio_vs_diloco": s1["diloco"]["bytes_to_target"] / p1["bytes_to_target"],
        "bytes_to_target_ratio_vs_ddp": s1["ddp"]["bytes_to_target"] / p1["bytes_to_target"],
        "rl_lr": args.rl_lr, "rl_bytes_ratio_vs_diloco": ratio(s2, "diloco"),
        "rl_bytes_ratio_vs_ddp": args_h(args) * ratio(s2, "diloco"),
        "rl_metric_pulseloco": s2["pulseloco"]["loss_mean"], "rl_metric_diloco": s2["diloco"]["loss_mean"],
        "rl_metric_std": s2["diloco"]["loss_std"], "rl_density": s2["pulseloco"]["density"],
        "rl_bytes_per_entry": entry(codec2), **extra,
        "rss_mib_first": mib[0], "rss_mib_mid": mib[len(mib) // 2], "rss_mib_last": mib[-1],
        "rss_mib_max": max(mib),
    }


def args_h(args) -> int:
    """DDP sends a dense gradient every inner step: H times DiLoCo's bytes per outer step."""
    return Setup(lr=args.lr, rounds=0).inner_steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, few rounds (smoke run)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3, help="inner AdamW lr of the main sweep")
    ap.add_argument("--rl-lr", type=float, default=3e-6)
    ap.add_argument("--rss-rounds", type=int, default=50)
    args = ap.parse_args()
    seeds = list(range(1 if args.quick else args.seeds))
    rounds = 4 if args.quick else args.rounds
    torch.set_num_threads(1)
    task = ArithmeticTask(TaskConfig(digits=2, min_digits=1, ops="+", eval_size=200))
    data = [shard(task, r, N_TRAINERS, seed=0) for r in range(N_TRAINERS)]
    evald = packed_problems(task.eval_set())
    print(f"# PULSELoCo bench: 4 trainers, H=10, seeds {seeds}, rounds {rounds}, "
          f"shards {[d[0].shape[0] for d in data]}, position coder {POSITION_CODER}", flush=True)
    s1, codec1 = phase_main(args, seeds, rounds, data, evald)
    s2, codec2, extra = phase_rl_lr(args, seeds, rounds, data, evald)
    mib = phase_rss(args, data)
    print(json.dumps(result_json(args, s1, codec1, s2, codec2, extra, mib)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
