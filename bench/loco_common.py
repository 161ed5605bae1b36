"""Workload-independent parts of ``bench/pulseloco.py``: methods, byte accounting, summaries.

A workload supplies ``make_trainer(seed) -> (rank -> InnerTrainer)`` and ``evaluate(params) ->
(metric, accuracy)`` on the global FP32 weights; ``run_loco`` runs DiLoCo (gate "none"), DiLoCo
with FP16 pseudo-gradients, or PULSELoCo (gate "bf16") through ``pulse_node.testing.loco_harness`` and
returns a ``Curve``. DDP is workload-specific (it needs the gradient), each workload has its own.
Not runnable on its own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import msgpack
import numpy as np
import torch
import zstandard

from pulse_node.codec import positions as codec_positions
from pulse_node.loco.basecoder import encode_values_ctx, position_labels
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.payload import LocoPayload, encode_payload, encode_values
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.testing.loco_harness import InnerTrainer, run_inprocess

N_TRAINERS = 4
Evaluate = Callable[[Mapping[str, torch.Tensor]], tuple[float, float]]


@dataclass
class Curve:
    """Held-out metric after every outer step and bytes one trainer sent per outer step."""

    metric: list[float] = field(default_factory=list)
    acc: list[float] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)
    density: list[float] = field(default_factory=list)
    changed: list[float] = field(default_factory=list)
    """Fraction of the global model's BF16 entries that changed in each outer step."""
    seconds: float = 0.0


class BF16Changes:
    """Fraction of BF16 entries of a parameter set that changed since the previous call."""

    def __init__(self) -> None:
        self._prev: dict[str, torch.Tensor] | None = None

    @torch.no_grad()
    def __call__(self, params: Mapping[str, torch.Tensor]) -> float:
        now = {n: t.detach().to(torch.bfloat16).view(torch.int16).clone() for n, t in params.items()}
        prev, self._prev = self._prev, now
        if prev is None:
            return 0.0
        return sum(int((now[n] != prev[n]).sum()) for n in now) / sum(t.numel() for t in now.values())


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

    tally: ClassVar[dict[str, float]] = {}

    def make_payload(self, global_params, local_params, **kwargs):
        p = super().make_payload(global_params, local_params, **kwargs)
        base = {n: t.detach().numpy() for n, t in global_params.items()}
        codec_breakdown(p, base, CodecTally.tally)
        return p


def format1_bytes(p: LocoPayload) -> int:
    """Size of the payload in the 2026-11-21 wire format 1 (per-tensor positions, byte-plane values)."""
    records, values = [], []
    for name in sorted(p.tensors):
        idx, vals = p.tensors[name]
        if idx.size:
            records.append([name, int(idx.size), codec_positions.encode_positions(idx, p.numel[name])])
            values.append(vals)
    msg = {"kind": "pulseloco/payload", "v": 1, "round": p.round, "trainer": p.trainer_id, "base": p.base_hash,
           "pos_coder": "codec.positions", "val_coder": "f32-rot-planes-zstd", "tensors": records,
           "values": encode_values(np.concatenate(values)) if values else b""}
    return len(msgpack.packb(msg, use_bin_type=True))


def varint_zstd_positions(idx: np.ndarray) -> bytes:
    """Comparison column: strictly increasing indices as LEB128 gap varints in one zstd frame
    (level 3), the simplest coder there is; the payload uses ``codec.positions``."""
    gaps = np.diff(np.asarray(idx, dtype=np.int64), prepend=-1) - 1
    v = gaps.astype(np.uint64)
    nbytes = np.ones(v.size, dtype=np.int64)
    for k in range(1, 10):
        nbytes += v >= np.uint64(1 << (7 * k))
    starts = np.cumsum(nbytes) - nbytes
    out = np.empty(int(nbytes.sum()), dtype=np.uint8)
    for k in range(int(nbytes.max(initial=0))):
        sel = nbytes > k
        more = np.where(nbytes[sel] > k + 1, 0x80, 0).astype(np.uint64)
        out[starts[sel] + k] = (((v[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)) | more).astype(np.uint8)
    return zstandard.ZstdCompressor(level=3).compress(out.tobytes())


def codec_breakdown(p: LocoPayload, base: Mapping[str, np.ndarray], tally: dict[str, float]) -> None:
    names = sorted(n for n, (i, _) in p.tensors.items() if i.size)
    if not names:
        return
    offs = np.cumsum([0] + [p.numel[n] for n in names])
    flat = np.concatenate([p.tensors[n][0] + offs[k] for k, n in enumerate(names)])
    vals = np.concatenate([p.tensors[n][1] for n in names])
    w = np.concatenate([base[n].reshape(-1) for n in names]).view(np.uint32)
    zc = zstandard.ZstdCompressor(level=3)
    add = {
        "entries": vals.size,
        "wire_v2_base": len(encode_payload(p, base=base)), "wire_v2_basefree": len(encode_payload(p)),
        "wire_v1": format1_bytes(p),
        "val_raw": 4 * vals.size, "val_zstd": len(zc.compress(vals.tobytes())),
        "val_rot_planes_zstd": len(encode_values(vals)),
        "val_base_exp_rel": len(encode_values_ctx(vals, w[flat], threshold=False)),
        "val_base_excess": len(encode_values_ctx(vals, w[flat])),
        "pos_int64_raw": 8 * vals.size,
        "pos_varint_zstd_flat": len(varint_zstd_positions(flat)),
        "pos_rans_per_tensor": sum(len(codec_positions.encode_positions(p.tensors[n][0], p.numel[n])) for n in names),
        "pos_rans_flat": len(codec_positions.encode_positions(flat, int(offs[-1]))),
        "pos_rans_flat_base_ctx": len(codec_positions.encode_positions(flat, int(offs[-1]),
                                                                       context=position_labels(w))),
    }
    for k, v in add.items():
        tally[k] = tally.get(k, 0) + v


def codec_report(tally: dict[str, float]) -> dict[str, float]:
    n = max(tally.get("entries", 0), 1)
    per = {k: v / n for k, v in tally.items() if k != "entries"}
    print("  bytes per fired entry: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items()), flush=True)
    return per


def run_loco(*, rounds: int, inner_steps: int, make_trainer: Callable[[int], InnerTrainer], evaluate: Evaluate,
             numel: int, gate: str, fp16: bool = False, tally: bool = False,
             gate_scale: float = 1.0, base: Mapping[str, torch.Tensor] | None = None,
             outer: Mapping[str, float] | None = None, placement: str = "global") -> Curve:
    """DiLoCo (gate "none", dense), its FP16 variant, or PULSELoCo (gate "bf16", gate scale
    ``gate_scale``) for ``rounds``. With ``base`` (the start weights), ``curve.changed`` also
    covers the first outer step. ``outer`` overrides the outer optimizer (``outer_lr``,
    ``outer_momentum``, ``nesterov``) for every method alike; ``placement`` is
    ``LocoConfig.outer_placement``."""
    cfg = LocoConfig(inner_steps=inner_steps, gate=gate, gate_scale=gate_scale, outer_placement=placement,
                     **(outer or {}))
    curve, changes = Curve(), BF16Changes()
    if base is not None:
        changes(base)

    def on_round(rec, replicas):
        curve.changed.append(changes(replicas[0].outer.params))
        metric, acc = evaluate(replicas[0].outer.params)
        curve.metric.append(metric)
        curve.acc.append(acc)
        curve.density.append(statistics.mean(rec.fired.values()) / numel)
        sent = rec.payload_bytes.values() if gate == "bf16" else [(2 if fp16 else 4) * numel]
        curve.bytes.append(statistics.mean(sent))

    feedback = Fp16DenseFeedback if fp16 else CodecTally if tally else ErrorFeedback
    t0 = time.monotonic()
    run_inprocess(N_TRAINERS, make_trainer, rounds=rounds, cfg=cfg, make_feedback=feedback, on_round=on_round)
    curve.seconds = time.monotonic() - t0
    return curve


def rss_run(make_trainer: Callable[[int], InnerTrainer], *, rounds: int, inner_steps: int) -> list[float]:
    """RSS (MiB) after every round of a PULSELoCo run."""
    rss: list[int] = []
    run_inprocess(N_TRAINERS, make_trainer, rounds=rounds, cfg=LocoConfig(inner_steps=inner_steps),
                  on_round=lambda rec, reps: rss.append(rec.rss_bytes))
    return [r / 2**20 for r in rss]


# ---------------------------------------------------------------- summaries


def bytes_to_reach(curve: Curve, target: float, *, higher_better: bool) -> float | None:
    """Cumulative bytes one trainer sent until the held-out metric first reached ``target``."""
    total = 0.0
    for m, b in zip(curve.metric, curve.bytes):
        total += b
        if (m >= target) if higher_better else (m <= target):
            return total
    return None


def mean_curve(cs: list[Curve]) -> Curve:
    """Per-round mean over seeds (metric and bytes)."""
    return Curve(metric=[statistics.mean(v) for v in zip(*(c.metric for c in cs))],
                 bytes=[statistics.mean(v) for v in zip(*(c.bytes for c in cs))])


def summarize(curves: dict[str, list[Curve]], *, higher_better: bool) -> dict[str, dict[str, float | None]]:
    """Final metric mean/std over seeds, bytes per outer step, and bytes until the seed-mean
    metric curve first reaches the worst method's final mean (a quality every method reaches)."""
    finals = {m: [c.metric[-1] for c in cs] for m, cs in curves.items()}
    means = [statistics.mean(v) for v in finals.values()]
    target = min(means) if higher_better else max(means)
    out: dict[str, dict[str, float | None]] = {}
    for m, cs in curves.items():
        out[m] = {
            "metric_mean": statistics.mean(finals[m]),
            "metric_std": statistics.stdev(finals[m]) if len(cs) > 1 else 0.0,
            "metric_first_mean": statistics.mean(c.metric[0] for c in cs),
            "acc_mean": statistics.mean(c.acc[-1] for c in cs),
            "bytes_per_outer_step": statistics.mean(statistics.mean(c.bytes) for c in cs),
            "density": statistics.mean(statistics.mean(c.density) for c in cs),
            "density_first": statistics.mean(c.density[0] for c in cs),
            "density_last": statistics.mean(c.density[-1] for c in cs),
            "bf16_changed": statistics.mean(statistics.mean(c.changed) for c in cs) if cs[0].changed else None,
            "bytes_to_target": bytes_to_reach(mean_curve(cs), target, higher_better=higher_better),
            "seconds": statistics.mean(c.seconds for c in cs),
        }
    out["_target"] = {"value": target}
    return out


def print_table(title: str, summary: dict, metric_name: str) -> None:
    print(f"\n## {title}  (target {metric_name} for bytes-to-target: {summary['_target']['value']:.5f})")
    print(f"{'method':<12} {metric_name + ' mean':>14} {'std':>8} {'acc':>6} {'B/outer step':>14} {'density':>8} "
          f"{'B to target':>13} {'BF16 chg':>8} {'s/run':>6}")
    for m, r in summary.items():
        if m.startswith("_"):
            continue
        reach = f"{r['bytes_to_target']:.3e}" if r["bytes_to_target"] else "not reached"
        chg = f"{r['bf16_changed']:.4f}" if r.get("bf16_changed") is not None else "-"
        print(f"{m:<12} {r['metric_mean']:>14.5f} {r['metric_std']:>8.5f} {r['acc_mean']:>6.3f} "
              f"{r['bytes_per_outer_step']:>14.0f} {r['density']:>8.4f} {reach:>13} {chg:>8} {r['seconds']:>6.1f}", flush=True)


def sweep(methods: dict[str, Callable[[int], Curve]], seeds: list[int], metric_name: str) -> dict[str, list[Curve]]:
    """Every method for every seed, methods interleaved per seed (side by side on a noisy machine)."""
    curves: dict[str, list[Curve]] = {m: [] for m in methods}
    for seed in seeds:
        for m, run in methods.items():
            c = run(seed)
            curves[m].append(c)
            print(f"  seed {seed} {m:<12} {metric_name} {c.metric[0]:.5f} -> {c.metric[-1]:.5f} acc {c.acc[-1]:.3f} "
                  f"bytes/step {statistics.mean(c.bytes):.0f} density {statistics.mean(c.density):.4f} "
                  f"global BF16 changed/step {statistics.mean(c.changed) if c.changed else float('nan'):.4f} "
                  f"({c.seconds:.1f}s)", flush=True)
    return curves


def ratio(s: dict, base: str, method: str = "pulseloco") -> float:
    return s[base]["bytes_per_outer_step"] / s[method]["bytes_per_outer_step"]


def ratio_to_target(s: dict, base: str, method: str = "pulseloco") -> float | None:
    a, b = s[base]["bytes_to_target"], s[method]["bytes_to_target"]
    return a / b if a and b else None
