"""Memory per rank of a trainer on N processes (torchrun + FSDP2) against one process, same work.

Runs what a trainer does to its weights, without the network (``trainer/engine.py``): rounds
of GRPO inner steps on synthetic rollouts, the PULSELoCo payload (gate + error feedback, coded
against the round's base as the role does), the outer step, the local reset, the BF16 version
state, its patch against the previous version and the trainer-state file, on a locally built
Qwen2 model (``testing/hf_models.py``). Once as one process (``LocalEngine``) and once under
``torchrun --nproc-per-node N`` (``DistributedEngine``, gloo on CPU here). Every rank reports
its resident memory after the imports (base), its peak after start-up and the first round's
inner steps (before any payload, outer step or publication: the training state) and its peak
overall; the table gives bytes per parameter above base, per rank, side by side.

Run: ``python bench/fsdp_memory.py [--hidden 768 --layers 8] [--ranks 2] [--rounds 2 --inner 2]``
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parent.parent
TASK = {"digits": 1, "eval_size": 20}


def _config(model_dir: str, args: argparse.Namespace):
    from pulse_node.config import TrainerConfig

    return TrainerConfig.model_validate({
        "model": {"kind": "hf", "path": model_dir, "device": "cpu"}, "task": TASK, "torch_threads": 1,
        "sampling": {"max_new_tokens": 3, "group_size": 4, "prompts_per_batch": args.prompts},
        "grpo": {"lr": 1e-5, "warmstart_steps": 0}, "loco": {"inner_steps": args.inner}})


def _rollouts(tokenizer, *, n: int, version: int, rng: random.Random):
    """Groups of 4 with mixed rewards (every group informative); completions of 3 tokens + EOS.

    Marked ``local`` (as the trainer's own sampler or the verifier's re-scoring would): GRPO
    trains only on those, and verification is not what this bench measures."""
    from pulse_node.rl.rollout import Rollout

    out = []
    for i in range(n):
        prompt = tokenizer.encode(f"{rng.randint(0, 9)}+{rng.randint(0, 9)}=")
        completion = [rng.randrange(1, tokenizer.vocab_size) for _ in range(3)] + [tokenizer.eos_id]
        out.append(Rollout(prompt_ids=prompt, completion_ids=completion, logprobs=[-2.0] * len(completion),
                           reward=float(i % 2), version=version, problem_id=str(i // 4), group_id=f"{version}:{i // 4}",
                           finished=True, text="", local=True))
    return out


def _rounds(engine, cfg, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """What a trainer does each version, timed."""
    import torch  # noqa: F401 (engine tensors)

    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.statehash import state_hash
    from pulse_node.loco.payload import encode_payload
    from pulse_node.torchbits import module_state
    from pulse_node.trainer.distributed import memory_mb

    tokenizer = engine.policy.tokenizer
    rng = random.Random(0)
    prev = module_state(engine.outer.params.items())
    times: dict = {"step_s": 0.0, "round_s": 0.0}
    for version in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.inner):
            engine.step(_rollouts(tokenizer, n=4 * args.prompts, version=version, rng=rng), current_version=version)
        times["step_s"] += time.perf_counter() - t0
        if version == 0:  # start-up and inner steps only, before any payload, outer step or publication
            times["steps_peak_mb"] = engine.status.peaks if engine.status else [memory_mb()["peak_rss_mb"]]
        t1 = time.perf_counter()
        base_hash = engine.outer.state_hash()
        mine = engine.make_payload(round=engine.outer.round, trainer_id="bench", base_hash=base_hash)
        encode_payload(mine, base=engine.outer.params)
        engine.outer.apply([mine])
        engine.reset_local()
        state = module_state(engine.outer.params.items())
        make_patch(prev, state, mode="compact", base_hash=state_hash(prev), new_hash=state_hash(state))
        _write_trainer_state(engine, tmp)
        prev = state
        times["round_s"] += time.perf_counter() - t1
    return {k: v / args.rounds if k.endswith("_s") else v for k, v in times.items()}


class _Peaks:
    """Stands in for the node status: keeps the per-rank peaks the distributed engine reports."""

    peaks: ClassVar[list[float]] = []

    def update(self, **fields) -> None:
        self.peaks = fields.get("rank_peak_rss_mb", self.peaks)


def _write_trainer_state(engine, tmp: Path) -> None:
    """The trainer-state file a trainer rewrites every version (whole FP32 weights + momentum)."""
    from pulse_node.codec.state import save_safetensors_atomic
    from pulse_node.torchbits import tensor_to_bits

    state = {f"param/{n}": tensor_to_bits(t) for n, t in engine.outer.params.items()}
    state.update({f"momentum/{n}": tensor_to_bits(t) for n, t in engine.outer.momentum.items()})
    save_safetensors_atomic(state, tmp / "trainer-state.safetensors")


def child(args: argparse.Namespace) -> None:
    """One rank (or the one process): base memory, the work, peak memory -> ``<out>/rank<r>.json``."""
    import torch  # noqa: F401 (the imports are part of the base)
    import transformers  # noqa: F401

    from pulse_node.trainer.distributed import memory_mb, serve_rank
    from pulse_node.trainer.engine import make_engine

    base = memory_mb()["rss_mb"]
    rank = int(os.environ.get("RANK", "0"))
    cfg = _config(args.model, args)
    result: dict = {"rank": rank, "base_mb": base}
    if rank > 0:
        serve_rank(cfg)
    else:
        engine = make_engine(cfg, status=_Peaks())
        engine.status = getattr(engine, "status", None)
        result["params"] = sum(math.prod(s) for s in engine.shapes.values())
        with tempfile.TemporaryDirectory() as tmp:
            result.update(_rounds(engine, cfg, args, Path(tmp)))
        engine.close()
    result.update(peak_mb=memory_mb()["peak_rss_mb"])
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))


def _run(world: int, args: argparse.Namespace, model_dir: Path, out: Path) -> list[dict]:
    out.mkdir(parents=True)
    me = [str(Path(__file__).resolve()), "--child", "--model", str(model_dir), "--out", str(out),
          "--rounds", str(args.rounds), "--inner", str(args.inner), "--prompts", str(args.prompts)]
    cmd = [sys.executable, *me] if world == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", *me]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if world > 1 else None)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--inner", type=int, default=2)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(ROOT))
    from pulse_node.rl.config import task_config
    from pulse_node.testing.hf_models import build_hf_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_hf_model(Path(tmp) / "model", task=task_config(**TASK), hidden=args.hidden, layers=args.layers,
                               heads=max(1, args.hidden // 64), kv_heads=max(1, args.hidden // 256))
        runs = {w: _run(w, args, model, Path(tmp) / f"w{w}") for w in (1, args.ranks)}
    params = runs[1][0]["params"]
    print(f"model: {params / 1e6:.1f} M parameters (hidden {args.hidden}, {args.layers} layers); "
          f"{args.rounds} rounds x {args.inner} inner steps")
    print(f"{'processes':>9} {'rank':>4} {'base MB':>8} {'steps MB':>9} {'steps B/p':>9} {'peak MB':>8} "
          f"{'peak B/p':>8} {'x 1-proc':>8} {'step s':>7} {'round s':>8}")
    one = runs[1][0]["peak_mb"] - runs[1][0]["base_mb"]
    rows = []
    for world, ranks in runs.items():
        for r in ranks:
            above, steps = r["peak_mb"] - r["base_mb"], ranks[0]["steps_peak_mb"][r["rank"]] - r["base_mb"]
            rows.append({"world": world, **r, "above_mb": above, "bytes_per_param": above * 2**20 / params,
                         "steps_bytes_per_param": steps * 2**20 / params})
            print(f"{world:>9} {r['rank']:>4} {r['base_mb']:>8.0f} {steps:>9.0f} {steps * 2**20 / params:>9.1f} "
                  f"{r['peak_mb']:>8.0f} {above * 2**20 / params:>8.1f} {above / one:>8.2f} "
                  f"{ranks[0]['step_s']:>7.2f} {ranks[0]['round_s']:>8.2f}")
    print(json.dumps({"bench": "fsdp_memory", "params": params, "ranks": args.ranks, "rows": rows}))


if __name__ == "__main__":
    main()
