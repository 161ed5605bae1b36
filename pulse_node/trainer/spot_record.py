"""A trainer's record of its inner steps: the commitment it signs, the openings it answers with.

``InnerStepLog`` is the trainer side of spot recomputation (``loco/commit.py`` says what is
committed and why). The engine calls it at three points of a round:

- ``begin_round`` (local weights just reset to the round's base): keeps a copy of the start state
  (AdamW moments and step count, error feedback, the trainer's outer momentum) and its Merkle tree;
- ``record`` between a step's clipped gradient and its AdamW step (``GRPOLearner.gradient`` /
  ``apply``): keeps the gradient and its tree, the batch's bytes and key, the state hash of the BF16
  weights the forward ran on and their sparse difference from the base;
- ``commitment`` once the payload is made: the signed ``InnerCommitment``.

Later it answers the checks drawn on that round: ``open`` (leaves of the start state and of every
gradient, with Merkle paths), ``batch_bytes`` and ``weights_patch`` (a BF16 patch from the base to
the weights of step ``k``). It keeps the last ``keep`` rounds (a check of round ``r`` also opens
round ``r + 1``'s start). What that holds, per parameter and round: 4 B per stepped step plus
12-16 B of start state, plus per step 6 B per BF16 change (at most 2 B per weight) (bench/RESULTS.md "Spot
recomputation" has the figures at real shapes). ``LocalEngine`` records through ``begin_round`` and
``record`` (from its learner and error feedback); a trainer on several processes
(``DistributedEngine``) gathers the same whole tensors to rank 0 and records through
``begin_round_of`` and ``record_of``: the bytes are those a one-process trainer with those tensors commits.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import blake3
import numpy as np
import torch

from pulse_node.chain.identity import Identity
from pulse_node.codec.patch import make_patch
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import flat_state_hash
from pulse_node.loco.commit import STATE_GLOBAL, STATE_TRAINER, BatchRef, InnerCommitment, StepCommit, sign_commitment
from pulse_node.loco.merkle import MerkleTree, leaf_bytes
from pulse_node.loco.opening import GRAD_DOMAIN, STATE_DOMAIN, FlatLayout, RoundOpening
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.rollout import Rollout, encode_rollouts

DEFAULT_LEAF = 4096


class ParamIndex:
    """A model's parameters in a layout's order, found by name once and checked on every use.

    ``named_parameters`` walks every module (about 0.1 ms a step for the default model's 52
    tensors); the check follows only the links the lookup took, module to submodule to parameter,
    and looks the parameters up again when any of them no longer holds (a parameter or module
    replaced, another model). Parameters whose data changed in place stay the same objects."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.model: torch.nn.Module | None = None
        self.params: list[torch.nn.Parameter] = []
        self.links: list[tuple[Mapping[str, object], str, object]] | None = None

    def of(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The parameters of ``model`` named by the layout, in its order (``KeyError`` for a missing one)."""
        if model is not self.model or self.links is None or \
                any(owner.get(key) is not obj for owner, key, obj in self.links):
            self._find(model)
        return self.params

    def _find(self, model: torch.nn.Module) -> None:
        named = dict(model.named_parameters())
        self.model, self.params = model, [named[n] for n in self.names]
        links: dict[tuple[int, str], tuple[Mapping[str, object], str, object]] = {}
        try:
            for name, param in zip(self.names, self.params):
                *path, last = name.split(".")
                module = model
                for part in path:
                    child = module._modules[part]
                    if child is None:
                        raise KeyError(name)
                    links[id(module._modules), part] = (module._modules, part, child)
                    module = child
                links[id(module._parameters), last] = (module._parameters, last, param)
        except (KeyError, AttributeError):  # names that are not plain paths: look up every time
            self.links = None
            return
        self.links = list(links.values())


def _cat32(tensors: Sequence[torch.Tensor | None], out: torch.Tensor) -> bool:
    """Concatenate ``tensors`` (each flattened) into ``out`` (FP32 on the CPU) in one call, if all
    are FP32 tensors on the CPU (True); else leave ``out`` alone (False)."""
    if not all(t is not None and t.dtype is torch.float32 and t.is_cpu for t in tensors):
        return False
    with torch.no_grad():
        torch.cat([t.reshape(-1) for t in tensors if t is not None], out=out)
    return True


def flat_of(tensors: Sequence[torch.Tensor | None], layout: FlatLayout, *,
            out: np.ndarray | None = None) -> np.ndarray:
    """The FP32 values of ``tensors`` (the layout's order; None: zeros) flat: ``out`` (FP32, the
    layout's size) filled, or a new array (one concatenation, no further copy)."""
    flat = np.empty(layout.total, dtype=np.float32) if out is None else out
    if not _cat32(tensors, torch.from_numpy(flat)):
        parts = [t.detach().reshape(-1).to("cpu", torch.float32) if t is not None else torch.zeros(size)
                 for t, size in zip(tensors, layout.sizes)]
        torch.cat(parts, out=torch.from_numpy(flat))
    return flat


def bf16_of(tensors: Sequence[torch.Tensor], layout: FlatLayout, *, out: np.ndarray | None = None,
            scratch: torch.Tensor | None = None) -> np.ndarray:
    """The BF16 bits (uint16) of ``tensors``' values (the layout's order) flat: ``out`` filled, or a
    new array. One cast of the concatenation, bit for bit ``module_state``'s per-tensor casts
    (rounding is per element). FP32 tensors on the CPU are concatenated into ``scratch`` (FP32,
    the layout's size) where given: no model-sized temporary, faulted in afresh each step."""
    bits = np.empty(layout.total, dtype=np.uint16) if out is None else out
    cast = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    if scratch is not None and _cat32(tensors, scratch):
        cast.copy_(scratch)  # the same rounding as .to()
    else:
        cast.copy_(torch.cat([t.detach().reshape(-1) for t in tensors]).cpu())
    return bits


def bf16_state(bits: np.ndarray, layout: FlatLayout, shapes: Mapping[str, tuple[int, ...]]) -> State:
    """``bits`` (flat BF16, the layout's order) as a ``State`` of views into it (no copy)."""
    out: State = {}
    at = 0
    for name, size in zip(layout.names, layout.sizes):
        out[name] = TensorBits("BF16", tuple(shapes[name]), bits[at:at + size])
        at += size
    return out


def adam_state(learner: GRPOLearner, params: Sequence[torch.nn.Parameter], layout: FlatLayout,
               out: tuple[np.ndarray | None, np.ndarray | None] = (None, None)) -> tuple[np.ndarray, np.ndarray, int]:
    """The inner AdamW moments of ``params`` (the layout's parameters, in its order), flat (into
    ``out``'s arrays where given), and their common step count (zeros and 0 before the first step)."""
    m, v, step = adam_moments(learner.opt, params)
    return flat_of(m, layout, out=out[0]), flat_of(v, layout, out=out[1]), step


def adam_moments(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]
                 ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None], int]:
    """The AdamW moments ``exp_avg`` and ``exp_avg_sq`` of ``params`` (None for a parameter not
    stepped yet) and their common step count (0 before the first step)."""
    states = [opt.state.get(p, {}) for p in params]
    steps = {int(float(st["step"])) for st in states if st}
    if len(steps) > 1 or (steps and not all(states)):
        raise ValueError("parameters of one model have taken different numbers of AdamW steps")
    return ([st["exp_avg"] if st else None for st in states], [st["exp_avg_sq"] if st else None for st in states],
            steps.pop() if steps else 0)


@dataclass
class _Step:
    batch: BatchRef
    data: bytes
    weights: bytes
    diff: tuple[np.ndarray | None, np.ndarray]  # flat positions and BF16 bits where the weights differ from
    # the base, or (None, all the BF16 bits) when more than a third differ
    grad: np.ndarray | None
    tree: MerkleTree | None
    norm: float


@dataclass
class _Round:
    round: int
    base_hash: bytes
    base_bits: np.ndarray  # the base's BF16 bits, flat in the layout's order
    layout: FlatLayout
    shapes: Mapping[str, tuple[int, ...]]
    adam_step: int
    state: tuple[str, ...]
    arrays: list[np.ndarray]
    tree: MerkleTree
    steps: list[_Step] = field(default_factory=list)
    commitment: InnerCommitment | None = None
    base_state_hash: str | None = None  # the base's BF16 state hash, once a patch needed it

    @functools.cached_property
    def base_bf16(self) -> State:
        """The base's bits as a State of views, made when a patch first needs them (most rounds
        answer no check: 0.3-0.5 ms a round saved)."""
        return bf16_state(self.base_bits, self.layout, self.shapes)


class InnerStepLog:
    """Records a trainer's inner steps for its commitments and keeps them for the checks (see above)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], *, leaf: int = DEFAULT_LEAF, keep: int = 2,
                 hash_threads: int | None = None) -> None:
        self.layout = FlatLayout.of(shapes)
        self.shapes = {n: tuple(s) for n, s in shapes.items()}
        self.leaf, self.keep = leaf, keep
        self.hash_threads = hash_threads or os.cpu_count() or 1  # trees of >= 64 leaves only
        self.rounds: dict[int, _Round] = {}
        self._open: _Round | None = None
        # model-sized arrays of rounds no longer kept, filled again rather than allocated (a fresh
        # array kept is faulted in page by page: ~0.1 ms per MB here, every step)
        self._free: dict[type, list[np.ndarray]] = {np.float32: [], np.uint16: []}
        # scratch of every step, kept for the same reason: the FP32 weights before their BF16 cast,
        # and where they differ from the base
        self._scratch = torch.empty(self.layout.total, dtype=torch.float32)
        self._differs = np.empty(self.layout.total, dtype=bool)
        self._params = ParamIndex(self.layout.names)

    def _take(self, dtype: type) -> np.ndarray | None:
        free = self._free[dtype]
        return free.pop() if free else None

    def _drop(self, round: int) -> None:
        """Forget the rounds a round ``round`` no longer keeps (and an earlier ``round``); their
        arrays are reused (only this log's own thread reads them: the trainer's round)."""
        for r in [r for r in self.rounds if r <= round - self.keep or r == round]:
            old = self.rounds.pop(r)
            self._free[np.float32] += old.arrays + [s.grad for s in old.steps if s.grad is not None]
            self._free[np.uint16] += [old.base_bits] + [s.diff[1] for s in old.steps if s.diff[0] is None]

    def take(self, dtype: type) -> np.ndarray:
        """A model-sized flat array of ``dtype`` (``np.float32`` or ``np.uint16``) to fill and hand to
        ``begin_round_flat`` or ``record_flat`` (one of a dropped round's, else a new one)."""
        free = self._take(dtype)
        return free if free is not None else np.empty(self.layout.total, dtype=dtype)

    def views(self, flat: np.ndarray) -> dict[str, torch.Tensor]:
        """Each tensor's part of ``flat`` (the layout's order), shaped, as a tensor sharing its memory
        (BF16 bits, uint16, as bfloat16)."""
        bits = flat.dtype == np.uint16
        whole = torch.from_numpy(flat.view(np.int16)).view(torch.bfloat16) if bits else torch.from_numpy(flat)
        out, at = {}, 0
        for name, size in zip(self.layout.names, self.layout.sizes):
            out[name] = whole[at:at + size].view(self.shapes[name])
            at += size
        return out

    def begin_round(self, *, round: int, base_hash: bytes, base: Mapping[str, torch.Tensor],
                    learner: GRPOLearner, ef: ErrorFeedback) -> None:
        """Start round ``round`` from ``learner``'s AdamW state and the error feedback ``ef``."""
        f32, names = np.float32, self.layout.names
        params = self._params.of(learner.policy.model)
        m, v, t = adam_state(learner, params, self.layout, (self._take(f32), self._take(f32)))
        arrays = [m, v, flat_of([ef.e.get(n) for n in names], self.layout, out=self._take(f32))] + (
            [flat_of([ef.v.get(n) for n in names], self.layout, out=self._take(f32))] if ef.v else [])
        self.begin_round_flat(round=round, base_hash=base_hash, base=base, arrays=arrays, adam_step=t)

    def begin_round_flat(self, *, round: int, base_hash: bytes, base: Mapping[str, torch.Tensor],
                         arrays: list[np.ndarray], adam_step: int) -> None:
        """Start round ``round`` from its start state, flat in the layout's order (FP32): the AdamW
        moments, the error feedback and, where the outer step is the trainer's own, its outer
        momentum (``[m, v, e]`` or ``[m, v, e, u]``); ``adam_step`` AdamW steps were taken before it."""
        self._drop(round)
        state = STATE_TRAINER if len(arrays) == 4 else STATE_GLOBAL
        tree = MerkleTree.build(arrays, leaf=self.leaf, domain=STATE_DOMAIN, threads=self.hash_threads)
        bits = bf16_of([base[n] for n in self.layout.names], self.layout, out=self._take(np.uint16),
                       scratch=self._scratch)
        self._open = _Round(round, bytes(base_hash), bits, self.layout, self.shapes, adam_step, state, arrays, tree)
        self.rounds[round] = self._open

    @property
    def open_round(self) -> int | None:
        """The round being recorded (None before the first ``begin_round``)."""
        return self._open.round if self._open is not None else None

    def record(self, learner: GRPOLearner, rollouts: list[Rollout], *, producer: str, grad_norm: float | None) -> None:
        """One step: its batch, the BF16 weights its forward ran on, its clipped gradient (if it steps).

        The batch committed is ``rollouts`` as verifying them gave (rewards and log-probs this
        trainer recomputed), encoded: not the producer's bytes, whose claims a verifier elsewhere
        would judge again near its tolerance (bench/RESULTS.md "cut again")."""
        params = self._params.of(learner.policy.model)
        now = bf16_of(params, self.layout, out=self._take(np.uint16), scratch=self._scratch)
        grad = None if grad_norm is None else flat_of([p.grad for p in params], self.layout, out=self._take(np.float32))
        self.record_flat(rollouts, producer=producer, weights=now, grad=grad, grad_norm=grad_norm)

    def record_flat(self, rollouts: list[Rollout], *, producer: str, weights: np.ndarray, grad: np.ndarray | None,
                    grad_norm: float | None) -> None:
        """``record`` from flat arrays in the layout's order (from ``take``, kept by the log): the BF16
        bits (uint16) of the weights the forward ran on and the clipped FP32 gradient (None, with
        ``grad_norm``: the step took no AdamW step)."""
        if self._open is None:
            raise RuntimeError("record() before begin_round()")
        data = encode_rollouts(rollouts)
        ref = BatchRef(producer, int(rollouts[0].version) if rollouts else 0, int(rollouts[0].batch) if rollouts else 0,
                       blake3.blake3(data).digest())
        now = weights
        weights_hash = bytes.fromhex(flat_state_hash("BF16", self.shapes, now))
        differs = np.not_equal(now, self._open.base_bits, out=self._differs)
        diff: tuple[np.ndarray | None, np.ndarray] = (None, now)  # 6 B per change, or 2 per weight
        if 3 * np.count_nonzero(differs) <= now.size:  # (counted first: most steps differ densely)
            pos = np.flatnonzero(differs)
            diff = (pos.astype(np.uint32), now[pos])
            self._free[np.uint16].append(now)
        if grad is not None and grad_norm is None:  # no AdamW step: no gradient to commit to
            self._free[np.float32].append(grad)
            grad = None
        tree = None if grad is None else MerkleTree.build([grad], leaf=self.leaf, domain=GRAD_DOMAIN,
                                                          threads=self.hash_threads)
        self._open.steps.append(_Step(ref, data, weights_hash, diff, grad, tree, float(grad_norm or 0.0)))

    def commitment(self, identity: Identity, *, run_id: str, trainer: str, payload: bytes,
                   settings: bytes) -> InnerCommitment:
        """The signed commitment of the open round, standing behind the payload with digest ``payload``,
        made with the inner-step settings of digest ``settings`` (``spot_replay.inner_settings``)."""
        r = self._open
        if r is None:
            raise RuntimeError("commitment() before begin_round()")
        steps = tuple(StepCommit((s.batch,), s.weights, s.tree.root if s.tree else b"", s.norm) for s in r.steps)
        unsigned = InnerCommitment(run_id=run_id, round=r.round, trainer=trainer, signer="", base=r.base_hash,
                                   payload=payload, settings=settings, params=self.layout.total, leaf=self.leaf, adam_step=r.adam_step,
                                   state=r.state, state_root=r.tree.root, steps=steps)
        r.commitment = sign_commitment(identity, unsigned)
        return r.commitment

    def _round(self, round: int) -> _Round:
        if round not in self.rounds:
            raise KeyError(f"round {round} is no longer (or was never) recorded here")
        return self.rounds[round]

    def open(self, round: int, leaves: tuple[int, ...], *, start_only: bool = False) -> RoundOpening:
        """Round ``round``'s start state and (unless ``start_only``) every gradient at ``leaves``."""
        r = self._round(round)
        state = tuple((leaf_bytes(r.arrays, i, self.leaf), tuple(r.tree.prove(i))) for i in leaves)
        grads = () if start_only else tuple(
            tuple((leaf_bytes([s.grad], i, self.leaf), tuple(s.tree.prove(i))) for i in leaves)
            for s in r.steps if s.grad is not None and s.tree is not None)
        return RoundOpening(round, r.commitment.trainer if r.commitment else "", tuple(leaves), state, grads)

    def batch_bytes(self, round: int, step: int) -> list[bytes]:
        return [self._round(round).steps[step].data]

    def weights_patch(self, round: int, step: int) -> bytes:
        """A BF16 patch from the round's base to the weights step ``step`` ran its forward on."""
        r = self._round(round)
        pos, bits = r.steps[step].diff
        flat = bits.copy() if pos is None else r.base_bits.copy()
        if pos is not None:
            flat[pos] = bits
        new = bf16_state(flat, self.layout, self.shapes)  # views into ``flat``, a copy of its own
        if r.base_state_hash is None:
            r.base_state_hash = flat_state_hash("BF16", self.shapes, r.base_bits)
        return make_patch(r.base_bf16, new, mode="compact", base_hash=r.base_state_hash,
                          new_hash=r.steps[step].weights.hex())
