"""What a trainer commits to for its inner steps is the bytes the verifier recomputes, bit for bit.

``InnerStepLog`` takes shortcuts (parameters found once, one concatenation into reused buffers,
leaves hashed in one call, a batch's prompts packed once); each committed value here is recomputed
the plain way: per-tensor BF16 casts and ``state_hash``, each tensor's array concatenated,
every Merkle leaf checked by the verifier's ``verify_leaf`` and the batch encoded field by field.
"""

from __future__ import annotations

import copy

import blake3
import msgpack
import numpy as np
import pytest
import torch
from helpers import tiny_solo

from pulse_node.codec.statehash import state_hash
from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.merkle import leaf_bytes, leaf_count, verify_leaf
from pulse_node.loco.opening import GRAD_DOMAIN, STATE_DOMAIN
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import Rollout, decode_rollouts, encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.torchbits import module_state
from pulse_node.trainer.spot_record import InnerStepLog, ParamIndex


def reference_encode(rollouts: list[Rollout]) -> bytes:
    """The rollout wire struct (``rl/rollout.py``), every field of every rollout packed on its own."""
    def le(values: object, dtype: str) -> bytes:
        return np.asarray(values, dtype=dtype).tobytes()
    items = [{"p": le(r.prompt_ids, "<u4"), "c": le(r.completion_ids, "<u4"), "l": le(r.logprobs, "<f4"),
              "r": float(r.reward), "v": int(r.version), "pid": r.problem_id, "g": r.group_id,
              "f": bool(r.finished), "b": int(r.batch), "i": int(r.sample)} for r in rollouts]
    precision = rollouts[0].precision if rollouts else "fp32"
    return msgpack.packb({"wire": 3, "precision": precision, "rollouts": items}, use_bin_type=True)


def reference_flat(tensors: list[torch.Tensor | None], sizes: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([t.detach().numpy().reshape(-1).astype(np.float32) if t is not None
                           else np.zeros(n, np.float32) for t, n in zip(tensors, sizes)])


def assert_root_commits_to(tree, arrays: list[np.ndarray], *, domain: bytes, leaf: int) -> None:
    """Every leaf of ``arrays`` verifies under the tree's root (the verifier's check)."""
    for i in range(leaf_count(arrays[0].size, leaf)):
        verify_leaf(tree.root, domain=domain, elements=int(arrays[0].size), leaf=leaf, index=i,
                    data=leaf_bytes(arrays, i, leaf), path=tree.prove(i), arrays=len(arrays))


def test_the_encoding_is_the_wire_struct_field_by_field() -> None:
    shared = [3, 1, 4, 1, 5]
    rs = [Rollout(prompt_ids=shared if i < 4 else [2, 7, i // 6], completion_ids=[9, i, 2][: 1 + i % 3],
                  logprobs=[-0.5, -1e-9, -3.25][: 1 + i % 3], reward=float(i % 2), version=7, problem_id="p",
                  group_id=f"g{i // 4}", finished=bool(i % 2), batch=2, sample=i) for i in range(12)]
    rs.append(Rollout(prompt_ids=np.array([2, 7, 1]), completion_ids=(5,), logprobs=np.array([-0.1]),  # type: ignore[arg-type]
                      reward=1, version=7, problem_id="p", group_id="g9", batch=2, sample=12))
    for batch in (rs, rs[:12], decode_rollouts(encode_rollouts(rs[:12])), rs[:1], []):
        assert encode_rollouts(batch) == reference_encode(batch)


class Recorder:
    """A tiny policy, its learner and error feedback, and batches with mixed rewards."""

    def __init__(self, cache_dir, *, leaf: int, threads: int) -> None:
        cfg = tiny_solo(cache_dir)
        self.policy = build_policy(cfg.model, cfg.task, seed=3, grpo_cfg=cfg.grpo)
        self.learner = GRPOLearner(self.policy, cfg.grpo, temperature=cfg.sampling.temperature)
        self.worker = RolloutWorker(self.policy, cfg.sampling)
        self.task = make_task_source(cfg.task)
        named = dict(self.policy.model.named_parameters())
        self.shapes = {n: tuple(p.shape) for n, p in named.items()}
        self.base = {n: p.detach().clone() for n, p in named.items()}
        loco = LocoConfig(inner_steps=3)
        self.ef = ErrorFeedback(self.shapes, cfg=loco, bound=PayloadBound.of(
            loco, lr=cfg.grpo.lr, betas=cfg.grpo.betas, weight_decay=cfg.grpo.weight_decay))
        gen = torch.Generator().manual_seed(0)
        for t in self.ef.e.values():
            t.copy_(torch.randn(t.shape, generator=gen) * 1e-3)
        self.log = InnerStepLog(self.shapes, leaf=leaf, keep=2, hash_threads=threads)
        self.names = self.log.layout.names

    def batch(self, index: int) -> list[Rollout]:
        self.worker.set_weights(module_state(self.policy.model.named_parameters()), version=0)
        key = BatchKey("record", 0, "peer", index)
        rs = self.worker.generate(assigned_problems(self.task, key, 3), key=key)
        for i, r in enumerate(rs):
            r.reward = float(i % 2)  # a gradient in every group
        return rs

    def step(self, rollouts: list[Rollout], *, stepped: bool = True
             ) -> tuple[bytes, bytes, np.ndarray, np.ndarray | None]:
        """One recorded step; the batch digest, weights hash, BF16 bits and gradient computed the plain way."""
        stats, norm = self.learner.gradient(rollouts, current_version=0)
        named = dict(self.policy.model.named_parameters())
        state = module_state(named.items())
        weights, bits = bytes.fromhex(state_hash(state)), np.concatenate([state[n].bits for n in self.names])
        grad = reference_flat([named[n].grad for n in self.names], self.log.layout.sizes) if stepped else None
        self.log.record(self.learner, rollouts, producer="peer", grad_norm=norm if stepped else None)
        self.learner.apply(stats, norm)
        return blake3.blake3(reference_encode(rollouts)).digest(), weights, bits, grad


@pytest.mark.parametrize(("leaf", "threads"), [(256, 1), (16, 2)])  # one call per leaf; threads over >= 64 leaves
def test_recorded_steps_commit_the_plainly_computed_bytes(tmp_path, leaf: int, threads: int) -> None:
    rec, dense = Recorder(tmp_path, leaf=leaf, threads=threads), set()
    for r in range(2):
        params = [p for n, p in sorted(rec.policy.model.named_parameters())]
        rec.log.begin_round(round=r, base_hash=bytes(32), base=rec.base, learner=rec.learner, ef=rec.ef)
        opened = rec.log.rounds[r]
        states = [rec.learner.opt.state.get(p, {}) for p in params]
        state = [reference_flat([s.get(k) for s in states], rec.log.layout.sizes) for k in ("exp_avg", "exp_avg_sq")]
        state.append(reference_flat([rec.ef.e[n] for n in rec.names], rec.log.layout.sizes))
        assert opened.adam_step == 3 * r and all(np.array_equal(a, b) for a, b in zip(opened.arrays, state))
        assert_root_commits_to(opened.tree, state, domain=STATE_DOMAIN, leaf=leaf)
        base_bits = {n: t.bits for n, t in module_state(rec.base.items()).items()}
        assert np.array_equal(opened.base_bits, np.concatenate([base_bits[n] for n in rec.names]))
        for k in range(3):
            digest, weights, bits, grad = rec.step(rec.batch(3 * r + k), stepped=k != 1)
            s = opened.steps[k]
            assert (s.batch.digest, s.weights) == (digest, weights)
            pos, changed = s.diff  # kept as the changes from the base (sparse) or whole (dense)
            assert (pos is None) == (3 * int((bits != opened.base_bits).sum()) > bits.size)
            kept = changed if pos is None else opened.base_bits.copy()
            kept[pos if pos is not None else slice(None)] = changed
            assert np.array_equal(kept, bits)
            dense.add(pos is None)
            if grad is None:
                assert s.grad is None and s.tree is None
            else:
                assert s.grad is not None and s.tree is not None and np.array_equal(s.grad, grad)
                assert_root_commits_to(s.tree, [grad], domain=GRAD_DOMAIN, leaf=leaf)
    assert dense == {True, False}  # (round 0 starts at the base: its first step changes nothing)


def test_replaced_parameters_and_modules_are_found_again(tmp_path) -> None:
    rec = Recorder(tmp_path, leaf=256, threads=1)
    model, index = rec.policy.model, ParamIndex(rec.names)

    def current() -> list[torch.nn.Parameter]:
        named = dict(model.named_parameters())
        return [named[n] for n in rec.names]

    def same(a: list[torch.nn.Parameter], b: list[torch.nn.Parameter]) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))

    assert same(index.of(model), current()) and same(index.of(model), current())
    name = next(n for n in rec.names if n.count(".") >= 2)
    *path, last = name.split(".")
    owner = model.get_submodule(".".join(path))
    setattr(owner, last, torch.nn.Parameter(getattr(owner, last).detach() + 1.0))  # a parameter replaced
    assert same(index.of(model), current())
    parent_name, _, child_name = ".".join(path).rpartition(".")
    model.get_submodule(parent_name).add_module(child_name, copy.deepcopy(owner))  # a module replaced
    assert same(index.of(model), current())
    assert index.of(model)[rec.names.index(name)] is not getattr(owner, last)
    other = copy.deepcopy(model)  # another model
    assert same(index.of(other), [dict(other.named_parameters())[n] for n in rec.names])
