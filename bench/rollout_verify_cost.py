"""What verifying rollouts costs a trainer: per inner step, and per version, side by side.

Two trainers on the default solo model (warm-started tiny transformer, 32 prompts x 8 samples,
``max_new_tokens`` 5, lr 3e-4) run the trainer's per-version work in one process, interleaved
version by version (alternating which goes first): ``--inner-steps`` GRPO steps (default 10 =
``loco.inner_steps``) on peer batches, then publish the version (compact patch + signed record)
and evaluate it (200 held-out problems, ``eval_every = 1``). Arm "verify" checks each batch as
the trainer does (``rl/verify.py``: assignment, termination, every token's seeded draw, reward and
log-probs recomputed) and learns with its own numbers; arm "trust" takes the batch as claimed
(what trainers did before). Both get the same honest batches, made (untimed) by an inference
worker from the verify arm's version. The PULSELoCo exchange is left out: it costs both arms
the same, so the ratio printed is an upper bound for a real trainer.

Also times the teacher-forced recomputation on a random sample of k rollouts of a batch, the
alternative to checking every rollout.

    python bench/rollout_verify_cost.py [--versions 8] [--inner-steps 10] [--threads 1]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.config import ChainConfig
from pulse_node.configload import load_config
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import SoloConfig, VerifyConfig
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import decode_rollouts, encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.rl.verify import RolloutVerifier
from pulse_node.trainer.publisher import VersionPublisher

ROOT = Path(__file__).resolve().parents[1]
RUN = "bench-verify"


class Arm:
    """One trainer's per-version work (inner steps, publish, eval), with or without verification."""

    def __init__(self, cfg: SoloConfig, task, store_dir: Path, *, verify: bool) -> None:
        self.cfg, self.verify = cfg, verify
        self.policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo)
        self.learner = GRPOLearner(self.policy, cfg.grpo, temperature=cfg.sampling.temperature)
        self.worker = RolloutWorker(self.policy, cfg.sampling)  # eval and (verify arm) verification
        self.verifier = RolloutVerifier(self.worker, task, run_id=RUN, batches_per_version=16,
                                        max_staleness=cfg.grpo.max_staleness, cfg=VerifyConfig())
        self.store = VersionStore(store_dir)
        self.publisher = VersionPublisher(self.store, Identity.generate(), run_id=RUN, chain=ChainConfig())
        self.publisher.publish(self.policy.bf16_state())
        self.evals = task.eval_set()
        self.times = {"version": [], "check": [], "step": []}

    @property
    def version(self) -> int:
        return self.publisher.head.version

    def inner_step(self, data: bytes, sender: str) -> None:
        t0 = time.perf_counter()
        rollouts = decode_rollouts(data)
        if self.verify:
            verdict = self.verifier.check(rollouts, sender=sender, current_version=self.version,
                                          state_of=lambda v: self.publisher.state if v == self.version else None)
            assert verdict.ok, verdict.detail
            rollouts = verdict.rollouts
        else:
            for r in rollouts:
                r.local = True  # the claims taken as they come (trainers before verification)
        t1 = time.perf_counter()
        self.learner.step(rollouts, current_version=self.version)
        self.times["check"].append(t1 - t0)
        self.times["step"].append(time.perf_counter() - t1)

    def version_round(self, batches: list[tuple[str, bytes]]) -> None:
        t0 = time.perf_counter()
        for sender, data in batches:
            self.inner_step(data, sender)
        state = self.policy.bf16_state()
        self.publisher.publish(state)
        self.worker.set_weights(state, self.version)
        evaluate(self.worker, self.evals)
        self.times["version"].append(time.perf_counter() - t0)


def make_batches(producer: RolloutWorker, task, arm: Arm, inner_steps: int) -> list[tuple[str, bytes]]:
    producer.set_weights(arm.publisher.state, arm.version)
    out = []
    for h in range(inner_steps):
        sender = f"inference-{h % 4}"
        out.append((sender, encode_rollouts(producer.generate_batch(task, BatchKey(RUN, arm.version, sender, h // 4)))))
    return out


def sample_costs(arm: Arm, data: bytes, sender: str, sizes: list[int]) -> dict[int, float]:
    """Median seconds of the teacher-forced recomputation on k random rollouts of one batch."""
    rollouts = decode_rollouts(data)
    key = BatchKey(RUN, rollouts[0].version, sender, rollouts[0].batch)
    out = {}
    for k in sizes:
        times = []
        for rep in range(5):
            pick = random.Random(rep).sample(rollouts, k)
            t0 = time.perf_counter()
            arm.verifier.recompute(pick, key)
            times.append(time.perf_counter() - t0)
        out[k] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", type=int, default=8)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(SoloConfig, ROOT / "configs" / "solo.toml")
    task = make_task_source(cfg.task)
    with tempfile.TemporaryDirectory() as tmp:
        arms = {name: Arm(cfg, task, Path(tmp) / name, verify=name == "verify") for name in ("verify", "trust")}
        producer = RolloutWorker(arms["verify"].policy, cfg.sampling)
        for v in range(args.versions):
            batches = make_batches(producer, task, arms["verify"], args.inner_steps)
            order = ("verify", "trust") if v % 2 == 0 else ("trust", "verify")
            for name in order:
                arms[name].version_round(batches)
            print(f"version {v + 1}: verify {arms['verify'].times['version'][-1]:.2f} s, "
                  f"trust {arms['trust'].times['version'][-1]:.2f} s", flush=True)
        batch = batches[0]
        arms["verify"].worker.set_weights(arms["verify"].publisher.state, arms["verify"].version)
        samples = sample_costs(arms["verify"], make_batches(producer, task, arms["verify"], 1)[0][1], batch[0], [16, 32, 64, 256])
    med = {name: {k: statistics.median(v) for k, v in arm.times.items()} for name, arm in arms.items()}
    ratio = med["verify"]["version"] / med["trust"]["version"]
    check_vs_step = (med["verify"]["check"] - med["trust"]["check"]) / med["verify"]["step"]
    print(f"\nper version (median of {args.versions}): verify {med['verify']['version']:.3f} s, "
          f"trust {med['trust']['version']:.3f} s -> ratio {ratio:.3f} (target <= 1.3)")
    print(f"per inner step: check {med['verify']['check'] * 1e3:.1f} ms (trust: decode {med['trust']['check'] * 1e3:.1f} ms), "
          f"GRPO step {med['verify']['step'] * 1e3:.1f} ms -> verification / inner step {check_vs_step:.3f}")
    print("teacher-forced recomputation on k of 256 rollouts: " +
          ", ".join(f"k={k} {s * 1e3:.1f} ms" for k, s in samples.items()))
    print(json.dumps({"bench": "rollout_verify_cost", "versions": args.versions, "inner_steps": args.inner_steps,
                      "threads": args.threads, "median_s": med, "version_ratio": ratio,
                      "verification_over_inner_step": check_vs_step,
                      "recompute_s_by_sample": samples}))


if __name__ == "__main__":
    main()
