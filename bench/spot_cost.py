"""What spot recomputation costs: commitments per round, one check, and the rate 10% allows.

Two trainers' ``LocalEngine`` (the node's engine) run the same rounds of a preset side by side,
interleaved round by round: one records its inner steps (``InnerStepLog``: start-state copy and
Merkle tree, per step the gradient's copy and tree, the batch's bytes, the BF16 weights' hash and
diff; the signed commitment), the other does not. A round is what a trainer computes: ``H``
times (verify a pushed batch as a trainer does, one GRPO step), then the payload (gate, coding
against the base). The agreement's waiting, publishing and evaluating are left out, so the
round time is a lower bound and the rates below are conservative. A verifier with its own model
copy then checks every step of the recording engine's rounds with ``SpotChecker.check``
(opening verified, batch re-verified, one forward and backward, replay at the drawn leaves,
link to the next round). Printed: seconds per round with and without the record, per check,
per answer; the bytes of a commitment, an opening, a step's batch and BF16 patch, an evidence;
what the record holds per round; the Merkle hashing rate; the largest check rate within 10% of
trainer time for 2 and 6 trainers and the expected rounds to catch an every-round cheater.

    python bench/spot_cost.py [--preset default|realistic] [--rounds 4]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import blake3
import numpy as np
import torch

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.config import SwarmConfig, TrainerConfig
from pulse_node.configload import load_config
from pulse_node.loco.commit import encode_commitment
from pulse_node.loco.merkle import MerkleTree
from pulse_node.loco.opening import encode_opening
from pulse_node.loco.payload import encode_payload
from pulse_node.loco.spotdraw import draw_check, max_rate, rounds_to_catch
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.rollout import decode_rollouts, encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.rl.verify import RolloutVerifier
from pulse_node.swarm.launcher import node_config
from pulse_node.testing.spot_harness import verifier_parts
from pulse_node.torchbits import module_state
from pulse_node.trainer.engine import LocalEngine
from pulse_node.trainer.recompute import RoundBase, SpotCase, SpotChecker
from pulse_node.trainer.spot_record import InnerStepLog
from pulse_node.trainer.spot_replay import inner_settings

ROOT = Path(__file__).resolve().parents[1]
RUN = "spot-cost"
KEY = Identity.from_private_bytes(b"\x07" * 32)
ME = peer_id_of_key(KEY.public_key_hex)


def trainer_config(preset: str, data_dir: str) -> TrainerConfig:
    """A trainer of the preset's swarm (configs/swarm.toml or configs/realistic.toml), as the launcher makes it."""
    swarm = load_config(SwarmConfig, ROOT / "configs" / ("swarm.toml" if preset == "default" else "realistic.toml"))
    tree = node_config(swarm, role="trainer", data_dir=Path(data_dir), trusted=[])
    return TrainerConfig.model_validate(tree | {"run_id": RUN})


class TimedLog(InnerStepLog):
    """The engine's record, with the seconds it takes per round (its whole cost to the trainer)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = 0.0

    def begin_round(self, **kwargs) -> None:
        t0 = time.perf_counter()
        super().begin_round(**kwargs)
        self.seconds += time.perf_counter() - t0

    def record(self, *args, **kwargs) -> None:
        t0 = time.perf_counter()
        super().record(*args, **kwargs)
        self.seconds += time.perf_counter() - t0

    def commitment(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = super().commitment(*args, **kwargs)
        self.seconds += time.perf_counter() - t0
        return out


class Arm:
    """One trainer's engine, recording its inner steps or not."""

    def __init__(self, cfg: TrainerConfig, *, record: bool, keep: int = 2) -> None:
        self.cfg, self.engine = cfg, LocalEngine(cfg)
        self.task = make_task_source(cfg.task)
        self.verifier = RolloutVerifier(self.engine.worker, self.task, run_id=RUN, batches_per_version=64,
                                        max_staleness=0, cfg=cfg.verify)
        if record:
            self.engine.inner_log = TimedLog(self.engine.shapes, keep=keep)  # every round kept, for the checks
        self.made: dict[int, tuple] = {}
        self.commit_s: list[float] = []
        self.bases: dict[int, RoundBase] = {}

    def round(self, batches: list[tuple[str, bytes]]) -> float:
        e, r = self.engine, self.engine.outer.round
        self.bases[r] = RoundBase(r, module_state(e.outer.params.items()),
                                  {n: t.clone() for n, t in e.outer.params.items()})
        t0 = time.perf_counter()
        e.reset_local()
        e.begin_inner_log(round=r, base_hash=e.outer.state_hash())
        state = self.bases[r].bf16
        for sender, data in batches:
            v = self.verifier.check(decode_rollouts(data), sender=sender, current_version=r,
                                    state_of=lambda ver: state if ver == r else None)
            e.step(v.rollouts, current_version=r, producer=sender)
        payload = e.make_payload(round=r, trainer_id=ME, base_hash=e.outer.state_hash())
        data = encode_payload(payload, base=e.outer.params)
        if e.inner_log is not None:
            c = e.inner_log.commitment(KEY, run_id=RUN, trainer=ME, payload=blake3.blake3(data).digest(),
                                       settings=inner_settings(e.learner, self.cfg.loco))
            self.made[r] = (c, payload, data)
        seconds = time.perf_counter() - t0
        if isinstance(e.inner_log, TimedLog):
            self.commit_s.append(e.inner_log.seconds)
            e.inner_log.seconds = 0.0
        e.outer.apply([payload])
        return seconds


def batches_for(gen: RolloutWorker, task, arm: Arm, inner: int) -> list[tuple[str, bytes]]:
    r = arm.engine.outer.round
    gen.set_weights(module_state(arm.engine.outer.params.items()), r)
    return [(f"infer-{h % 4}", encode_rollouts(gen.generate_batch(task, BatchKey(RUN, r, f"infer-{h % 4}", h // 4))))
            for h in range(inner)]


def check_all(arm: Arm, checker: SpotChecker, rounds: list[int]) -> dict:
    log, out = arm.engine.inner_log, {"check": [], "answer": [], "opening": [], "patch": [], "batch": []}
    for r in rounds:
        c, payload, _data = arm.made[r]
        nxt = arm.made[r + 1][0]
        for k in range(len(c.steps)):
            d = draw_check(bytes([r, k]), round=r, target=ME, verifier="v", steps=len(c.steps), params=c.params,
                           leaf=c.leaf)
            d = type(d)(d.round, d.target, d.verifier, k, d.leaves)
            t0 = time.perf_counter()
            case = SpotCase(c, log.open(r, d.leaves), log.batch_bytes(r, k), log.weights_patch(r, k) if k else None,
                            payload, True, nxt, log.open(r + 1, d.leaves, start_only=True))
            t1 = time.perf_counter()
            v = checker.check(d, case, arm.bases[r])
            assert v.ok, v.detail
            out["answer"].append(t1 - t0)
            out["check"].append(time.perf_counter() - t1)
            out["opening"].append(len(encode_opening(case.opening)) + len(encode_opening(case.next_opening)))
            out["patch"].append(len(case.patch or b""))
            out["batch"].append(sum(len(b) for b in case.batches))
            out.setdefault("parts", []).append(v.seconds)
    return out


def held_bytes(log: InnerStepLog) -> int:
    r = log.rounds[max(log.rounds)]
    grads = sum(s.grad.nbytes for s in r.steps if s.grad is not None)
    diffs = sum((0 if s.diff[0] is None else s.diff[0].nbytes) + s.diff[1].nbytes for s in r.steps)
    return grads + diffs + sum(a.nbytes for a in r.arrays)


def hash_rate(mb: int = 256, *, threads: int = 1) -> float:
    a = np.random.default_rng(0).standard_normal(mb << 18).astype(np.float32)
    t0 = time.perf_counter()
    MerkleTree.build([a], leaf=4096, domain=b"grad", threads=threads)
    return mb / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=["default", "realistic"], default="default")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = tempfile.mkdtemp(prefix="spot-cost-")
    cfg = trainer_config(args.preset, tmp)
    rec, plain = Arm(cfg, record=True, keep=args.rounds + 2), Arm(cfg, record=False)
    gen, task = RolloutWorker(rec.engine.policy, cfg.sampling), make_task_source(cfg.task)
    times: dict[str, list[float]] = {"record": [], "plain": []}
    for i in range(args.rounds + 1):
        order = [(rec, "record"), (plain, "plain")][:: 1 if i % 2 else -1]
        for arm, name in order:
            seconds = arm.round(batches_for(gen, task, arm, cfg.loco.inner_steps))
            if i:  # round 0 warms caches and kernels up
                times[name].append(seconds)
    learner, worker = verifier_parts(cfg)
    checker = SpotChecker(learner, worker, task, run_id=RUN, loco=cfg.loco, verify=cfg.verify)
    costs = check_all(rec, checker, list(range(1, args.rounds)))
    report(args, cfg, rec, times, costs)


def report(args, cfg: TrainerConfig, rec: Arm, times: dict, costs: dict) -> None:
    med = statistics.median
    round_s, plain_s = med(times["record"]), med(times["plain"])
    commit_s, check_s = med(rec.commit_s[1:]), med(costs["check"])
    c, _, data = rec.made[1]
    n = sum(rec.engine.shapes[k][0] * int(np.prod(rec.engine.shapes[k][1:])) for k in rec.engine.shapes)
    rates = {t: max_rate(check_s=check_s, round_s=plain_s, commit_s=commit_s, trainers=t) for t in (2, 6)}
    parts = {k: med([p[k] for p in costs["parts"]]) for k in ("verify", "gradient", "replay")}
    print(f"preset {args.preset}: {n:,} parameters, H = {cfg.loco.inner_steps}, lr {cfg.grpo.lr:g}, "
          f"{args.rounds} rounds, {len(costs['check'])} checks")
    print(f"round (verify + H steps + payload): {plain_s:.3f} s without the record, {round_s:.3f} s with "
          f"({round_s / plain_s:.3f}x); the record itself {commit_s:.3f} s per round ({commit_s / plain_s:.3f})")
    print(f"one check: {check_s:.3f} s = {check_s / plain_s:.3f} of a round (opening+patch+batch verify "
          f"{parts['verify']:.3f}, gradient {parts['gradient']:.3f}, replay {parts['replay']:.3f}); the target's "
          f"answer {med(costs['answer']):.3f} s")
    print(f"bytes: commitment {len(encode_commitment(c))}, opening (+ next start) {med(costs['opening']):,.0f}, "
          f"batch {med(costs['batch']):,.0f}, patch median {med(costs['patch']):,.0f} max {max(costs['patch']):,}, "
          f"payload {len(data):,}; record held per round {held_bytes(rec.engine.inner_log) / n:.1f} B/param")
    hr, cores = hash_rate(), os.cpu_count() or 1
    hr_all = hash_rate(threads=cores)
    print(f"Merkle tree over FP32 (4096-value leaves): {hr:,.0f} MB/s on one thread, {hr_all:,.0f} on {cores}")
    for t, p in rates.items():
        print(f"{t} trainers: rate within 10% of trainer time {p:.2f} per trainer and round -> an every-round cheater "
              f"is caught within {rounds_to_catch(p):.1f} rounds on average")
    print(json.dumps({"preset": args.preset, "params": n, "round_s": plain_s, "round_record_s": round_s,
                      "check_s": check_s, "check_over_round": check_s / plain_s, "answer_s": med(costs["answer"]),
                      "commit_s": commit_s, "opening_bytes": med(costs["opening"]), "patch_bytes_max": max(costs["patch"]),
                      "commitment_bytes": len(encode_commitment(c)), "held_b_per_param": held_bytes(rec.engine.inner_log) / n,
                      "hash_mb_s": hr, "hash_mb_s_all_cores": hr_all, "rate": rates, "rounds_to_catch": {t: rounds_to_catch(p) for t, p in rates.items()}}))


if __name__ == "__main__":
    main()
