"""Spot recomputation: re-run one committed inner step of another trainer and replay its round.

A verifier drawn for a target (``loco/spotdraw.py``) holds the target's signed commitment
(``loco/commit.py``) and what the target answered (``SpotCase``: the opening at the drawn leaves,
the drawn step's rollout batches, a BF16 patch to the weights that step ran on), plus what every
trainer of the round holds anyway (``RoundBase``: the round's BF16 version state and FP32 global
weights; the target's payload; which share of it the round applied). ``SpotChecker.check``:

1. verifies the opening against the signed roots and the patch against the signed weights hash
   (a target that cannot answer is ``unanswered``, not convicted: the protocol decides);
2. re-verifies the step's batches as their producer's (``rl/verify.py``: prompts, every token's
   seeded draw, rewards and behaviour log-probs recomputed) -- a refused batch is ``batch``;
3. runs that step's forward and backward with the engine's own GRPO code (``GRPOLearner.gradient``:
   advantages from the recomputed rewards, the clipped surrogate, micro-batches, clipping) on the
   committed BF16 weights, and compares the gradient with the opened leaves: relative L2 error
   (and of the pre-clip norm) above ``SpotTolerance.gradient`` is ``gradient`` (an advantage flip,
   a free rider's or copier's invented steps);
4. replays the round at the opened coordinates (``trainer/spot_replay.py``): the BF16 weights
   before the drawn step must be the patch's (``weights``), the payload entries there must be the
   gate of the replayed update (``payload``: a scaled, copied or invented payload), and the next
   round's commitment must start from the replayed end state (``link``).

A commitment naming other inner-step settings (``settings``) is refused first, never accused: a
misconfigured trainer is not a liar. Every other failure but ``unanswered`` rests on signed or
digest-named data only, so it becomes evidence any trainer of the round re-checks by running the
same check (``trainer/spot_evidence.py``).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import blake3
import numpy as np
import torch

from pulse_node.codec.inplace import apply_patch_inplace
from pulse_node.codec.patch import parse_patch
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import PulseError, WireError
from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.commit import InnerCommitment
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.opening import FlatLayout, Opened, RoundOpening, verify_opening
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.spotdraw import SpotDraw
from pulse_node.rl.config import VerifyConfig
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.rollout import MAX_BATCH_INDEX, Rollout, decode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import TaskSource
from pulse_node.rl.verify import RolloutVerifier
from pulse_node.trainer.spot_replay import (
    AdamSettings,
    inner_settings,
    payload_mismatch,
    replay_round,
    state_mismatch,
)
from pulse_node.vocab import BatchRefusal


class SpotFailure(str, enum.Enum):
    BATCH = "batch"  # a committed batch fails verification (or is not what the commitment names)
    GRADIENT = "gradient"  # the recomputed gradient of the drawn step differs
    WEIGHTS = "weights"  # the weights the step ran on are not where the committed gradients lead
    PAYLOAD = "payload"  # the payload is not the gate of the committed steps
    LINK = "link"  # the next round does not start from where this round ended
    UNANSWERED = "unanswered"  # the target's answer is missing or does not match its own commitment
    SETTINGS = "settings"  # made with other inner-step settings than ours: refused, not accused


@dataclass(frozen=True)
class SpotTolerance:
    """Calibrated bounds (bench/spot_calibrate.py, bench/RESULTS.md "Spot recomputation")."""

    gradient: float = 1e-3  # relative L2 error of the opened gradient (and of its norm)
    rtol: float = 1e-4  # replayed values (payload, next start state), relative to the value
    atol: float = 1e-5  # ... plus this much of the largest magnitude of the compared array
    share: float = 0.01  # share of replayed entries allowed outside the bound (BF16 gate ties)


@dataclass
class SpotCase:
    """What the target answered for a drawn check, and its payload and inclusion in the round."""

    commitment: InnerCommitment
    opening: RoundOpening
    batches: list[bytes]
    patch: bytes | None
    payload: LocoPayload
    keep: float  # the share of the payload the round applied (0: left out; the robust rule's factor)
    next_commitment: InnerCommitment | None = None
    next_opening: RoundOpening | None = None


@dataclass
class RoundBase:
    """The round as every trainer of it holds it: its version, BF16 state and FP32 global weights
    (never changed once made: every check of the round reads them, and the state hash is kept)."""

    version: int
    bf16: State
    fp32: Mapping[str, torch.Tensor]
    _hash: str | None = field(default=None, init=False, repr=False, compare=False)

    def state_hash(self) -> str:
        """The BF16 state's hash, computed by the round's first check and kept for the others."""
        if self._hash is None:
            self._hash = state_hash(self.bf16)
        return self._hash


@dataclass
class SpotVerdict:
    draw: SpotDraw
    reason: SpotFailure | None = None
    detail: str = ""
    gradient_error: float = math.nan
    weights_off: float = 0.0
    payload_off: float = 0.0
    link_off: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.reason is None


class SpotUnavailable(PulseError):
    """This verifier cannot run the check (it does not hold a version the batches were made on)."""


class _Refused(Exception):
    def __init__(self, reason: SpotFailure, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def gather(named: Mapping[str, torch.Tensor], layout: FlatLayout, coords: np.ndarray) -> np.ndarray:
    """FP32 values of ``named`` at flat ``coords`` (ascending) of ``layout``."""
    out = np.empty(coords.size, dtype=np.float32)
    offsets = layout.offsets
    for name, size in zip(layout.names, layout.sizes):
        lo, hi = np.searchsorted(coords, [offsets[name], offsets[name] + size])
        if hi > lo:
            flat = named[name].detach().reshape(-1).to("cpu", torch.float32)
            out[lo:hi] = flat[torch.from_numpy(coords[lo:hi] - offsets[name])].numpy()
    return out


def _norm(x: np.ndarray) -> float:
    """The L2 norm of ``x`` summed in float64 by NumPy, not by BLAS (``np.linalg.norm``): OpenBLAS
    runs a dot of a check's 32 K values on its thread pool, whose threads then spin, ~55 ms of CPU
    per check on 2 cores (bench/RESULTS.md "Spot checks without a BLAS dot"); only rounding differs."""
    return math.sqrt(float(np.square(x, dtype=np.float64).sum()))


class SpotChecker:
    """Re-runs drawn inner steps on its own copy of the model (``learner``, never the trainer's)."""

    def __init__(self, learner: GRPOLearner, worker: RolloutWorker, task: TaskSource, *, run_id: str,
                 loco: LocoConfig, verify: VerifyConfig, tolerance: SpotTolerance | None = None) -> None:
        self.learner, self.worker, self.task, self.run_id = learner, worker, task, run_id
        self.loco, self.verify_cfg = loco, verify
        self.tol = tolerance or SpotTolerance()
        self.adam = AdamSettings.of(learner.opt)
        self.bound = PayloadBound.of(loco, lr=self.adam.lr, betas=self.adam.betas,
                                     weight_decay=self.adam.weight_decay)
        self.settings = inner_settings(learner, loco)
        self.shapes = {n: tuple(p.shape) for n, p in learner.policy.model.named_parameters()}
        self.layout = FlatLayout.of(self.shapes)
        self.verifier = RolloutVerifier(worker, task, run_id=run_id, batches_per_version=MAX_BATCH_INDEX,
                                        max_staleness=learner.cfg.max_staleness, cfg=verify)
        self._held: State | None = None  # the patched weights' arrays (``_copy_of``)

    def check(self, draw: SpotDraw, case: SpotCase, base: RoundBase, *,
              state_of: Callable[[int], State | None] | None = None) -> SpotVerdict:
        verdict, c = SpotVerdict(draw), case.commitment
        if c.settings != self.settings:
            verdict.reason, verdict.detail = SpotFailure.SETTINGS, "the commitment names other inner-step settings"
            return verdict
        try:
            t0 = time.perf_counter()
            opened = verify_opening(case.opening, c, draw.leaves)
            weights = self._weights(c, draw.step, case.patch, base)
            rollouts = self._batches(c, draw.step, case.batches, base, state_of)
            t1 = time.perf_counter()
            self._gradient(verdict, c, opened, weights, rollouts, version=base.version)
            t2 = time.perf_counter()
            self._replay(verdict, case, opened, weights, base)
            verdict.seconds = {"verify": t1 - t0, "gradient": t2 - t1, "replay": time.perf_counter() - t2}
        except _Refused as exc:
            verdict.reason, verdict.detail = exc.reason, exc.detail
        except SpotUnavailable:
            raise
        except PulseError as exc:
            verdict.reason, verdict.detail = SpotFailure.UNANSWERED, str(exc)
        return verdict

    def _weights(self, c: InnerCommitment, step: int, patch: bytes | None, base: RoundBase) -> State:
        """The BF16 weights step ``step`` ran on: the base itself, or the base patched (checked by
        hash: a patch whose result hash is the one named, applied with its hashes verified, the
        base's being the one the round keeps) in this checker's own copy of the base, valid until
        its next check."""
        want = c.steps[step].weights.hex()
        parsed = None if patch is None else parse_patch(patch)
        if (base.state_hash() if parsed is None else parsed.header.result_state_hash) != want:
            raise _Refused(SpotFailure.UNANSWERED, f"no weights with the state hash step {step} names")
        if parsed is None:
            return base.bf16
        state = self._copy_of(base.bf16)
        apply_patch_inplace(state, parsed, base_hash=base.state_hash())  # refuses unless the result's hash is the header's
        return state

    def _copy_of(self, bf16: State) -> State:
        """``bf16``'s bits copied into arrays this checker keeps (a model-sized array allocated per
        check is faulted in page by page)."""
        held = self._held
        if held is None or held.keys() != bf16.keys() or any(
                (h.dtype, h.shape) != (t.dtype, t.shape) for h, t in zip(held.values(), bf16.values())):
            held = self._held = {n: TensorBits(t.dtype, t.shape, t.bits.copy()) for n, t in bf16.items()}
            return held
        for n, t in bf16.items():
            np.copyto(held[n].bits, t.bits)
        return held

    def _batches(self, c: InnerCommitment, step: int, batches: list[bytes], base: RoundBase,
                 state_of: Callable[[int], State | None] | None) -> list[Rollout]:
        refs = c.steps[step].batches
        if len(batches) != len(refs) or any(blake3.blake3(b).digest() != r.digest for b, r in zip(batches, refs)):
            raise _Refused(SpotFailure.UNANSWERED, f"the batches of step {step} do not match their digests")
        verifier = self.verifier
        verifier.forget_accepted()  # a batch checked before (another verifier's draw) is checked again
        held = state_of or (lambda v: base.bf16 if v == base.version else None)
        out: list[Rollout] = []
        for data, ref in zip(batches, refs):
            try:
                rollouts = decode_rollouts(data)
            except WireError as exc:
                raise _Refused(SpotFailure.BATCH, f"batch {ref.index} of step {step} is malformed: {exc}") from None
            if not rollouts or (rollouts[0].version, rollouts[0].batch) != (ref.version, ref.index):
                raise _Refused(SpotFailure.BATCH, f"batch {ref.index} of step {step} is not the batch named")
            v = verifier.check(rollouts, sender=ref.producer, current_version=base.version, state_of=held)
            if v.reason == BatchRefusal.UNKNOWN_VERSION:
                raise SpotUnavailable(f"this verifier does not hold version {ref.version}: {v.detail}")
            if not v.ok:
                raise _Refused(SpotFailure.BATCH, f"batch {ref.index} of step {step} refused: {v.reason} ({v.detail})")
            out.extend(v.rollouts)
        return out

    def _gradient(self, verdict: SpotVerdict, c: InnerCommitment, opened: Opened, weights: State,
                  rollouts: list[Rollout], *, version: int) -> None:
        step = verdict.draw.step
        self.learner.policy.load_bf16_state(weights)
        _, norm = self.learner.gradient(rollouts, current_version=version)
        claimed = c.steps[step]
        if (norm is None) != (not claimed.stepped):
            verdict.gradient_error = math.inf
            raise _Refused(SpotFailure.GRADIENT, f"step {step}: committed {'a' if claimed.stepped else 'no'} "
                           f"AdamW step, the recomputation {'took none' if norm is None else 'took one'}")
        if norm is None:
            verdict.gradient_error = 0.0
            return
        coords = self.layout.coords(verdict.draw.leaves, c.leaf)
        ours = gather({n: p.grad if p.grad is not None else torch.zeros_like(p)
                       for n, p in self.learner.policy.model.named_parameters()}, self.layout, coords)
        theirs = opened.grads[step]
        scale = max(_norm(ours), _norm(theirs), 1e-30)
        leaf_err = _norm(ours.astype(np.float64) - theirs) / scale
        norm_err = abs(claimed.grad_norm - norm) / max(norm, claimed.grad_norm, 1e-30)
        verdict.gradient_error = max(leaf_err, norm_err)
        if not verdict.gradient_error <= self.tol.gradient:
            raise _Refused(SpotFailure.GRADIENT, f"step {step}: gradient differs by {leaf_err:.3g} (norm "
                           f"{norm_err:.3g}), tolerance {self.tol.gradient:g}")

    def _replay(self, verdict: SpotVerdict, case: SpotCase, opened: Opened, weights: State, base: RoundBase) -> None:
        c, draw, tol = case.commitment, verdict.draw, self.tol
        coords = self.layout.coords(draw.leaves, c.leaf)
        rep = replay_round(base=gather(base.fp32, self.layout, coords), start=opened.state, adam_step=c.adam_step,
                           grads=opened.grads, steps=len(c.steps), adam=self.adam, loco=self.loco, bound=self.bound,
                           keep=case.keep, round=c.round, trainer=c.trainer)
        ran_on = np.concatenate([weights[n].bits for n in self.layout.names])[coords]
        base_bits = np.concatenate([base.bf16[n].bits for n in self.layout.names])[coords]
        moved = (ran_on != base_bits) | (rep.bf16_before[draw.step] != base_bits)
        verdict.weights_off = float((ran_on != rep.bf16_before[draw.step]).sum()) / max(1, int(moved.sum()))
        if verdict.weights_off > tol.share:
            raise _Refused(SpotFailure.WEIGHTS, f"step {draw.step} ran on weights the committed gradients do not "
                           f"lead to ({verdict.weights_off:.3g} of the moved weights)")
        off, union = payload_mismatch(rep.payload, self._sent(case.payload, coords), rtol=tol.rtol,
                                      atol=tol.atol * self.adam.lr)
        verdict.payload_off = off / max(1, union)
        if verdict.payload_off > tol.share:
            raise _Refused(SpotFailure.PAYLOAD, f"{off} of {union} payload entries at the opened leaves are not "
                           "the gate of the committed steps")
        self._link(verdict, case, rep.end, rep.adam_step)

    def _sent(self, payload: LocoPayload, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The payload's entries at ``coords``, as positions into ``coords`` and values."""
        return self.layout.entries_at(payload.tensors, coords)

    def _link(self, verdict: SpotVerdict, case: SpotCase, end: dict[str, np.ndarray], adam_step: int) -> None:
        nxt, c = case.next_commitment, case.commitment
        if nxt is None or case.next_opening is None:
            return
        if (nxt.trainer, nxt.signer, nxt.round, nxt.state) != (c.trainer, c.signer, c.round + 1, c.state):
            raise _Refused(SpotFailure.UNANSWERED, "the next commitment is not this trainer's next round")
        opened = verify_opening(case.next_opening, nxt, verdict.draw.leaves, start_only=True).state
        atol = {n: self.tol.atol * float(np.max(np.abs(a), initial=0.0)) for n, a in end.items()}
        bad = max(state_mismatch({n: end[n]}, {n: opened[n]}, rtol=self.tol.rtol, atol=atol[n]) for n in end)
        verdict.link_off = bad / max(1, next(iter(end.values())).size)
        if nxt.adam_step != adam_step or verdict.link_off > self.tol.share:
            raise _Refused(SpotFailure.LINK, f"round {nxt.round} does not start where round {c.round} ended "
                           f"(AdamW step {nxt.adam_step} vs {adam_step}, {verdict.link_off:.3g} of the state)")
