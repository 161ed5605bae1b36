"""Run by ``tests/test_trainer_shard_record.py`` under ``torchrun --nproc-per-node 2`` (gloo, CPU).

    torchrun --nproc-per-node 2 tests/shard_record_run.py <cache dir> <report.json> [<HF model dir>]

(with an HF model dir, e.g. ``testing/hf_models.build_hf_model``'s tied Qwen2 as ``tests/hf_fixtures.py``
builds it, that model instead of the tiny one)

Rank 0 runs a ``DistributedEngine`` (rank 1 serves it) and, in the same process, a one-process
``LocalEngine`` of the same config (tiny model, seed, warm start), both recording their inner steps:

- rounds 0 and 1 on the same batches, each step's gradient the sum of two rollouts' (one per rank
  on two processes, one micro-batch each on one): the same FP32 sums, so both trainers must sign
  byte-identical inner commitments (round 1 starts from non-zero AdamW moments and error feedback);
- round 2 on seeded batches (as a producer makes them, many micro-batches and rollouts per rank):
  the sums differ in order, and a real spot check of every step of the 2-process trainer must pass.

The report (JSON) says what matched; the test asserts on it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import blake3
import numpy as np
import torch

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.config import TrainerConfig
from pulse_node.loco.commit import decode_commitment, encode_commitment
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.loco.spotdraw import draw_check
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.testing.spot_harness import make_batches
from pulse_node.torchbits import module_state
from pulse_node.trainer.distributed import DistributedEngine, memory_mb, serve_rank
from pulse_node.trainer.engine import Engine, LocalEngine
from pulse_node.trainer.recompute import RoundBase, SpotCase, SpotChecker
from pulse_node.trainer.spot_record import InnerStepLog, _Round
from pulse_node.trainer.spot_replay import inner_settings

RUN, STEPS, LEAF = "shard-record", 2, 256


def config(cache: str, data: str, hf: str | None = None) -> TrainerConfig:
    """The spot tests' tiny model and task (``tests/test_trainer_spot.py``: batches with a signal), or
    the HF model in ``hf``, in a swarm that runs spot checks; every rollout its own micro-batch."""
    model = {"kind": "hf", "path": hf} if hf else {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 24}
    return TrainerConfig.model_validate({
        "model": {**model, "cache_dir": cache, "device": "cpu"}, "task": {"digits": 1, "eval_size": 20},
        "sampling": {"prompts_per_batch": 6, "group_size": 4, "max_new_tokens": 3 if hf else 4},
        "grpo": {"warmstart_steps": 150, "warmstart_lr": 1e-2, "lr": 1e-3 if hf else 1e-2, "micro_batch_tokens": 1},
        "data_dir": data, "seed": 0, "run_id": RUN, "loco": {"inner_steps": STEPS, "spot": {"keyed": True}}})


def pair_batch(worker: RolloutWorker, cfg: TrainerConfig, index: int) -> list[Rollout]:
    """A batch whose only informative rollouts are two of one group (rewards 0, 1, 1/2, 1/2)."""
    task = make_task_source(cfg.task)
    key = BatchKey(RUN, 0, "peer", index)
    rs = worker.generate(assigned_problems(task, key, cfg.sampling.prompts_per_batch), key=key)
    for i, r in enumerate(rs):
        r.reward = (0.0, 1.0, 0.5, 0.5)[i] if i < 4 else 0.0
        r.local = True
    return rs


def run_round(engine: Engine, r: int, batches: list[tuple[str, list[Rollout]]], me: Identity,
              cfg: TrainerConfig) -> tuple[bytes, LocoPayload, float]:
    """One recorded round on ``engine`` from its base: the encoded signed inner commitment, the
    payload (left in the error feedback, as a round that applied none) and the CPU seconds taken."""
    assert engine.inner_log is not None
    start = time.process_time()
    engine.reset_local()
    base_hash = engine.outer.state_hash()
    engine.begin_inner_log(round=r, base_hash=base_hash)
    for producer, rollouts in batches:
        engine.step(rollouts, current_version=0, producer=producer)
    tid = peer_id_of_key(me.public_key_hex)
    payload = engine.make_payload(round=r, trainer_id=tid, base_hash=base_hash)
    digest = blake3.blake3(encode_payload(payload, base=None)).digest()
    c = engine.inner_log.commitment(me, run_id=RUN, trainer=tid, payload=digest,
                                    settings=inner_settings(engine.learner, cfg.loco))
    engine.restore(payload)
    return encode_commitment(c), payload, time.process_time() - start


def compare(a: bytes, b: bytes, ra: _Round, rb: _Round) -> dict[str, object]:
    """Where two encoded inner commitments (and the logs' rounds behind them) agree."""
    ca, cb = decode_commitment(a), decode_commitment(b)
    fields = ("run_id", "round", "trainer", "signer", "base", "settings", "params", "leaf", "adam_step", "state",
              "state_root")
    steps = [{"batch": s.batches == t.batches, "weights": s.weights == t.weights, "grad_root": s.grad_root == t.grad_root,
              "grad_norm": s.grad_norm == t.grad_norm, "stepped": s.stepped and t.stepped}
             for s, t in zip(ca.steps, cb.steps)]
    rel = [float(np.linalg.norm(x.grad.astype(np.float64) - y.grad) / np.linalg.norm(y.grad))
           for x, y in zip(ra.steps, rb.steps) if x.grad is not None and y.grad is not None]
    return {"identical": a == b, "fields": {f: getattr(ca, f) == getattr(cb, f) for f in fields},
            "start_state": all(np.array_equal(x, y) for x, y in zip(ra.arrays, rb.arrays)),
            "payload": ca.payload == cb.payload, "steps": steps, "gradient_rel": rel}


def check_steps(engine: DistributedEngine, cfg: TrainerConfig, r: int, made: dict[int, tuple[bytes, LocoPayload]]
                ) -> list[dict[str, object]]:
    """A spot check of every step of round ``r`` of ``engine`` (and the link to round ``r + 1``) by a
    verifier with its own model; the round's payload was left out (``restore``: keep 0)."""
    log = engine.inner_log
    assert log is not None
    c, payload = decode_commitment(made[r][0]), made[r][1]
    policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo)
    checker = SpotChecker(GRPOLearner(policy, cfg.grpo, temperature=cfg.sampling.temperature),
                          RolloutWorker(policy, cfg.sampling), make_task_source(cfg.task), run_id=RUN, loco=cfg.loco,
                          verify=cfg.verify)
    fp32 = {n: t.clone() for n, t in engine.outer.params.items()}
    base = RoundBase(0, module_state(fp32.items()), fp32)
    out = []
    for step in range(len(c.steps)):
        d = dataclasses.replace(draw_check(b"seed", round=r, target=c.trainer, verifier="v", steps=len(c.steps),
                                           params=c.params, leaf=c.leaf), step=step)
        case = SpotCase(c, log.open(r, d.leaves), log.batch_bytes(r, step),
                        None if step == 0 else log.weights_patch(r, step), payload, keep=0.0,
                        next_commitment=decode_commitment(made[r + 1][0]),
                        next_opening=log.open(r + 1, d.leaves, start_only=True))
        v = checker.check(d, case, base)
        out.append({"ok": v.ok, "reason": str(v.reason), "detail": v.detail, "gradient_error": v.gradient_error})
    return out


def main(cache: str, report: str, hf: str | None = None) -> int:
    cfg = config(cache, str(Path(report).parent / "trainer"), hf)
    if int(os.environ.get("RANK", "0")) > 0:
        return serve_rank(cfg)
    torch.set_num_threads(1)
    sharded = DistributedEngine(cfg)
    try:
        one = LocalEngine(cfg)
        for e in (sharded, one):
            e.inner_log = InnerStepLog(e.shapes, leaf=LEAF, keep=4, hash_threads=1)
        me = Identity.generate()
        worker = RolloutWorker(one.policy, cfg.sampling)
        worker.set_weights(module_state(one.outer.params.items()), version=0)
        task = make_task_source(cfg.task)
        batches = [[("peer", pair_batch(worker, cfg, i)) for i in range(STEPS)]] * 2 + [
            make_batches(worker, task, run_id=RUN, version=0, producer="infer", count=STEPS, first=STEPS * r)
            for r in (2, 3)]
        out: dict[str, object] = {
            "initial_equal": all(torch.equal(one.outer.params[n], sharded.outer.params[n]) for n in one.shapes)}
        made: dict[int, tuple[bytes, LocoPayload]] = {}
        for r, rollouts in enumerate(batches):
            a, payload, ta = run_round(sharded, r, rollouts, me, cfg)
            b, _, tb = run_round(one, r, rollouts, me, cfg)
            made[r] = (a, payload)
            out[f"round{r}"] = {**compare(a, b, sharded.inner_log.rounds[r], one.inner_log.rounds[r]),
                                "cpu_s_sharded_rank0": ta, "cpu_s_one": tb}
        out["checks"] = check_steps(sharded, cfg, 2, made)
        out["memory"] = memory_mb()
        Path(report).write_text(json.dumps(out))
    finally:
        sharded.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
