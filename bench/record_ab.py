"""What recording inner steps costs, this tree against another checkout, in one process.

``InnerStepLog`` (``trainer/spot_record.py``) with the Merkle tree, rollout encoder and statement
envelope of ``--old`` (a checkout of the code to compare with, e.g. a worktree at an older
commit) against this tree's, on the byzantine bench's trainer (``configs/trainer.toml``, 16 x 8
rollouts, one thread): the same learner steps, both logs record each step, in alternating
order; every round both commit and must agree on every committed value (commitment, trees,
arrays, batch bytes, weight differences, patches, openings). Then each part on its own, old and
new interleaved. CPU is ``time.process_time``.

    python bench/record_ab.py --old /path/to/old/checkout [--rounds 23]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load(old: Path, rel: str, name: str) -> ModuleType:
    """The module file ``rel`` of the old checkout, as module ``name`` (beside this tree's)."""
    spec = importlib.util.spec_from_file_location(name, old / "pulse_node" / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _old_modules(old: Path) -> dict[str, ModuleType]:
    mods = {k: _load(old, rel, f"old_{k}") for k, rel in
            (("rollout", "rl/rollout.py"), ("merkle", "loco/merkle.py"), ("statement", "chain/statement.py"),
             ("spot_record", "trainer/spot_record.py"))}
    rec = mods["spot_record"]
    rec.MerkleTree, rec.leaf_bytes = mods["merkle"].MerkleTree, mods["merkle"].leaf_bytes
    rec.encode_rollouts = mods["rollout"].encode_rollouts
    return mods


def _world() -> Any:
    from pulse_node.config import load_node_config
    from pulse_node.testing.byzantine.world import World

    torch.set_num_threads(1)
    cfg = load_node_config(ROOT / "configs" / "trainer.toml",
                           ["sampling.prompts_per_batch=16", "loco.base_coding=false"], role="trainer")
    world = World(cfg)
    world.load(world.base, 0)
    return world


def _same_round(a: Any, b: Any) -> None:
    assert a.commitment == b.commitment and a.tree.levels == b.tree.levels
    assert np.array_equal(a.base_bits, b.base_bits) and all(np.array_equal(x, y) for x, y in zip(a.arrays, b.arrays))
    for s, t in zip(a.steps, b.steps, strict=True):
        assert (s.data, s.weights, s.batch) == (t.data, t.weights, t.batch)
        assert (s.grad is None) == (t.grad is None) and (s.grad is None or np.array_equal(s.grad, t.grad))
        assert (s.tree is None) == (t.tree is None) and (s.tree is None or s.tree.levels == t.tree.levels)
        assert all((x is None and y is None) or np.array_equal(x, y) for x, y in zip(s.diff, t.diff))


def rounds_ab(world: Any, mods: dict[str, ModuleType], *, rounds: int, warm: int = 3) -> None:
    """Both logs record the same rounds; CPU per round of each, past ``warm`` rounds."""
    from pulse_node.chain import statement
    from pulse_node.chain.identity import Identity
    from pulse_node.loco.sparsify import ErrorFeedback
    from pulse_node.rl.grpo import GRPOLearner
    from pulse_node.trainer.spot_record import InnerStepLog

    learner = GRPOLearner(world.policy(), world.cfg.grpo, temperature=world.cfg.sampling.temperature)
    ef = ErrorFeedback(world.shapes, cfg=world.cfg.loco, bound=world.bound)
    logs = {"old": mods["spot_record"].InnerStepLog(world.shapes, leaf=world.leaf, keep=3),
            "new": InnerStepLog(world.shapes, leaf=world.leaf, keep=3)}
    wires = {"old": mods["statement"]._wire, "new": statement._wire}
    key, batches = Identity.from_private_bytes(b"k" * 32), [world.batch("t0", i, seed=0) for i in range(4)]
    cpu = {k: {"begin": 0.0, "record": 0.0, "commit": 0.0} for k in logs}

    def timed(k: str, part: str, r: int, f: Callable[..., object], *args: object, **kwargs: object) -> None:
        t0 = time.process_time()
        f(*args, **kwargs)
        cpu[k][part] += time.process_time() - t0 if r >= warm else 0.0

    for r in range(rounds):
        order = ("old", "new") if r % 2 else ("new", "old")
        for k in order:
            timed(k, "begin", r, logs[k].begin_round, round=r, base_hash=bytes(32), base=world.base,
                  learner=learner, ef=ef)
        for step in range(10):
            b = batches[step % 4]
            stats, norm = learner.gradient(b, current_version=0)
            for k in order:
                timed(k, "record", r, logs[k].record, learner, b, producer="t0", grad_norm=norm)
            learner.apply(stats, norm)
        for k in order:
            statement._wire = wires[k]  # the envelope's own field walk for each side's signature
            timed(k, "commit", r, logs[k].commitment, key, run_id="r", trainer="t", payload=bytes(32),
                  settings=bytes(32))
        statement._wire = wires["new"]
        _same_round(logs["old"].rounds[r], logs["new"].rounds[r])
        assert logs["old"].weights_patch(r, 5) == logs["new"].weights_patch(r, 5)
        assert r == 0 or logs["old"].open(r - 1, (0, 7)) == logs["new"].open(r - 1, (0, 7))
    n = rounds - warm
    print(f"identical over {rounds} rounds; CPU per round past the first {warm}:")
    for k, c in cpu.items():
        print(f"  {k}: begin_round {c['begin'] / n * 1e3:.2f} ms, record {c['record'] / n / 10 * 1e3:.3f} ms a step, "
              f"commitment {c['commit'] / n * 1e3:.2f} ms; {sum(c.values()) / n * 1e3:.1f} ms a round")


def parts_ab(world: Any, mods: dict[str, ModuleType], *, repeats: int = 15, calls: int = 40) -> None:
    """Each part, old and new, interleaved: the median of ``repeats`` means of ``calls`` calls."""
    from pulse_node.loco import merkle
    from pulse_node.rl import rollout
    from pulse_node.rl.grpo import GRPOLearner
    from pulse_node.trainer import spot_record as new

    learner = GRPOLearner(world.policy(), world.cfg.grpo, temperature=world.cfg.sampling.temperature)
    batch = world.batch("t0", 0, seed=0)
    learner.gradient(batch, current_version=0)
    old, model, layout = mods["spot_record"], learner.policy.model, new.FlatLayout.of(world.shapes)
    index, scratch = new.ParamIndex(layout.names), torch.empty(layout.total)
    u16, f32 = np.empty(layout.total, np.uint16), np.empty(layout.total, np.float32)
    g = np.random.default_rng(0).standard_normal(layout.total).astype(np.float32)
    decoded = rollout.decode_rollouts(rollout.encode_rollouts(batch))
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "parameters looked up": (lambda: dict(model.named_parameters()), lambda: index.of(model)),
        "BF16 weights cast": (lambda: old.bf16_of(dict(model.named_parameters()), layout, out=u16),
                              lambda: new.bf16_of(index.of(model), layout, out=u16, scratch=scratch)),
        "gradient flattened": (
            lambda: old.flat_of({n: p.grad for n, p in model.named_parameters()}, layout, out=f32),
            lambda: new.flat_of([p.grad for p in index.of(model)], layout, out=f32)),
        "gradient tree": (lambda: mods["merkle"].MerkleTree.build([g], leaf=world.leaf, domain=b"grad", threads=2),
                          lambda: merkle.MerkleTree.build([g], leaf=world.leaf, domain=b"grad", threads=2)),
        "start-state tree (3 arrays)": (
            lambda: mods["merkle"].MerkleTree.build([g, g, g], leaf=world.leaf, domain=b"state", threads=2),
            lambda: merkle.MerkleTree.build([g, g, g], leaf=world.leaf, domain=b"state", threads=2)),
        "encode the batch (sampler's)": (lambda: mods["rollout"].encode_rollouts(batch),
                                         lambda: rollout.encode_rollouts(batch)),
        "encode the batch (decoded)": (lambda: mods["rollout"].encode_rollouts(decoded),
                                       lambda: rollout.encode_rollouts(decoded)),
    }
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
    for rep in range(repeats):
        for name, fs in pairs.items():
            for i in ((0, 1) if rep % 2 else (1, 0)):
                t0 = time.process_time()
                for _ in range(calls):
                    fs[i]()
                times[name][i].append((time.process_time() - t0) / calls * 1e3)
    print(f"{'part':32s} {'old ms':>8s} {'new ms':>8s}  (median of {repeats} x {calls} calls, interleaved)")
    for name, (o, n) in times.items():
        print(f"{name:32s} {sorted(o)[len(o) // 2]:8.3f} {sorted(n)[len(n) // 2]:8.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="a checkout of the code to compare with")
    ap.add_argument("--rounds", type=int, default=23)
    args = ap.parse_args()
    mods, world = _old_modules(args.old.resolve()), _world()
    rounds_ab(world, mods, rounds=args.rounds)
    parts_ab(world, mods)
    return 0


if __name__ == "__main__":
    sys.exit(main())
