"""Deterministic aggregation of PULSELoCo payloads and the outer Nesterov SGD step.

Every trainer keeps a replica of the FP32 global weights and the outer momentum and applies the
same payloads. To end each round bit-identical on every trainer (and every CPU):

- payloads are applied in canonical order, sorted by trainer id, whatever order they arrived in;
- each payload's clip factor ``k`` (``loco/aggregate.py``: 1 for every payload with
  ``loco.aggregate.rule = "mean"``) is computed once over the whole round, its trust weight ``w``
  comes from the ledger; ``g = sum w * k * p / W`` is accumulated in a preallocated FP32 buffer,
  one IEEE multiply by ``fp32(w * k)`` (skipped where it is 1) and one add per entry in that
  order, then divided by ``W = sum w`` (the number of contributors when every ``w`` is 1);
- the outer step uses only single-rounding elementwise ops (``mul``, ``add``, ``sub``; never
  ``alpha=``, ``addcmul`` or other fused forms that may compile to FMA on some CPUs).

Outer step (``g`` = the weighted mean pseudo-gradient)::

    m = mu * m + g
    theta -= lr * (g + mu * m)   if nesterov else   lr * m

With ``outer_placement = "trainer"`` each trainer has already applied that step to its own
pseudo-gradient (``sparsify.ErrorFeedback``), so ``g`` is the mean update: ``theta -= g``, and
the momentum stays zero.

``state_hash()`` covers round, weights, momentum and the trust ledger (``loco/ledger.py``: each
trainer's verified work, whence the payloads' trust weights): the base every payload of a round
names. ``apply`` takes the round's trust weights and what its decision tells the ledger.
A trainer that joins or re-syncs adopts a peer's state with ``load_state_dict`` (fetched and
checked by ``trainer/state.py``).
``apply`` = ``check`` (the whole round's payloads against the whole model) + ``weigh`` (over
whole payloads; ``kept`` then holds each trainer's weight, for its error feedback) + ``step``.
Every operation of ``step`` is per entry, so it can run on any slice of the tensors: a trainer
on several processes (``trainer/distributed.py``) checks and weighs on rank 0 and steps each
rank's row range of each tensor with the payloads' entries in that range and the same
weights, and gets the same FP32 bits as one process would. ``step``'s scratch (two buffers the
size of the largest tensor) is allocated on the first step, so an optimizer that never steps
(rank 0's full replica) costs only its weights and momentum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np
import torch

from pulse_node.errors import BaseMismatchError, WireError
from pulse_node.loco.aggregate import Weights, robust_weights, trust_of, uniform
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.hashing import outer_hash
from pulse_node.loco.ledger import Ledger, RoundFacts
from pulse_node.loco.payload import LocoPayload


class OuterState(TypedDict):
    """What a lagging or diverged trainer pulls: the round, global FP32 weights and momentum, the ledger."""

    round: int
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    ledger: bytes

class OuterOptimizer:
    """Owns the outer momentum; updates the given FP32 global weights in place."""

    def __init__(self, params: Mapping[str, torch.Tensor], cfg: LocoConfig, *, round: int = 0) -> None:
        for name, t in params.items():
            if t.dtype != torch.float32 or t.device.type != "cpu":
                raise TypeError(f"{name}: global weights must be FP32 CPU tensors")
        self.cfg = cfg
        self.params = {n: params[n] for n in sorted(params)}
        self.momentum = {n: torch.zeros_like(t) for n, t in self.params.items()}
        self._flat: tuple[torch.Tensor, torch.Tensor] | None = None  # step()'s scratch, made by its first call
        self._total = 0.0  # W of the round being stepped
        self.round = round
        self._hash: bytes | None = None
        self.last = Weights({})  # the weights of the last round weighed here
        self.kept: dict[str, float] = {}  # trainer id -> share of its payload the last step applied
        self.trust: dict[str, float] = {}  # trainer id -> its trust weight in the last step
        self.ledger = Ledger(cfg.trust)

    def state_hash(self) -> bytes:
        """Hash of (round, weights, momentum, ledger); the base every payload of this round names."""
        if self._hash is None:
            self._hash = outer_hash(self.params, self.momentum, round=self.round, ledger=self.ledger.digest())
        return self._hash

    def check(self, payloads: Sequence[LocoPayload]) -> None:
        """``WireError``/``BaseMismatchError`` unless the payloads fit this round and state."""
        seen: set[str] = set()
        base = self.state_hash()
        for p in payloads:
            if p.trainer_id in seen:
                raise WireError(f"two payloads from trainer {p.trainer_id!r} in round {self.round}")
            seen.add(p.trainer_id)
            if p.round != self.round:
                raise WireError(f"payload of {p.trainer_id!r} is for round {p.round}, not {self.round}")
            if p.base_hash != base:
                raise BaseMismatchError(f"payload of {p.trainer_id!r} was made on another global state")
            for name, (idx, vals) in p.tensors.items():
                t = self.params.get(name)
                if t is None:
                    raise WireError(f"payload of {p.trainer_id!r} names unknown tensor {name!r}")
                if (idx.shape != vals.shape or idx.ndim != 1 or vals.dtype.name != "float32"
                        or idx.dtype.name != "int64"):
                    raise WireError(f"{name}: payload positions/values malformed")
                if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= t.numel()):
                    raise WireError(f"{name}: payload position out of range")

    def _scratch(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Two FP32 buffers the size of the largest tensor, viewed as ``name`` (reused for every
        tensor and round: 8 B per element of the largest tensor, not per parameter)."""
        if self._flat is None:
            largest = max((t.numel() for t in self.params.values()), default=0)
            self._flat = (torch.zeros(largest), torch.zeros(largest))
        t = self.params[name]
        a, b = self._flat
        return a[:t.numel()].view(t.shape), b[:t.numel()].view(t.shape)

    def weigh(self, payloads: Sequence[LocoPayload], *, trust: Mapping[str, float] | None = None) -> Weights:
        """Each payload's clip factor in this round's step (``loco/aggregate.py``), over whole payloads
        and this optimizer's whole tensors, with the payloads' ``trust`` weights; kept as ``last``."""
        agg = self.cfg.aggregate
        if agg.rule == "mean":
            self.last = uniform(payloads)
        else:
            momentum = ({n: t.numpy() for n, t in self.momentum.items()}
                        if self.cfg.outer_placement == "global" else {})
            self.last = robust_weights(payloads, momentum=momentum, scale=1.0 - self.cfg.outer_momentum,
                                       numel={n: t.numel() for n, t in self.params.items()}, cfg=agg, trust=trust)
        return self.last

    def _mean_into_acc(self, name: str, ordered: Sequence[LocoPayload]) -> torch.Tensor:
        acc = self._scratch(name)[0]
        acc.zero_()
        flat = acc.view(-1)
        for p in ordered:
            if name in p.tensors:
                idx, vals = p.tensors[name]
                v = torch.as_tensor(vals)
                k = float(np.float32(self.kept[p.trainer_id] * self.trust[p.trainer_id]))
                flat.index_add_(0, torch.as_tensor(idx), v if k == 1.0 else torch.mul(v, k))
        return acc.div_(self._total)

    def _step(self, name: str, g: torch.Tensor) -> None:
        if self.cfg.outer_placement == "trainer":  # the outer step already ran on every trainer
            self.params[name].sub_(g)
            return
        m, tmp, theta = self.momentum[name], self._scratch(name)[1], self.params[name]
        mu, lr = self.cfg.outer_momentum, self.cfg.outer_lr
        m.mul_(mu).add_(g)
        if self.cfg.nesterov:
            torch.mul(m, mu, out=tmp)
            tmp.add_(g)
        else:
            tmp.copy_(m)
        tmp.mul_(lr)
        theta.sub_(tmp)

    @torch.no_grad()
    def apply(self, payloads: Sequence[LocoPayload], *, trust: Mapping[str, float] | None = None,
              facts: RoundFacts | None = None) -> None:
        """Average the payloads of this round's contributors, weighted by ``trust`` (trainer id ->
        trust weight, ``loco/ledger.py``; absent: 1), take one outer step, and apply ``facts`` (what
        the round's decision names) to the ledger.

        Validates everything first (round, base hash, unknown tensors, ranges, duplicates), so
        a bad payload leaves the state unchanged. With a total trust weight below
        ``cfg.min_contributors`` no update is applied, but the round still closes.
        """
        self.check(payloads)
        keep = self.weigh(payloads, trust=trust).keep
        self._advance(payloads, keep=keep, trust=trust)
        if facts is not None:
            self.ledger.record(facts)
            self.set_round(self.round)

    def _advance(self, payloads: Sequence[LocoPayload], *, keep: Mapping[str, float],
                 trust: Mapping[str, float] | None) -> None:
        """The outer step itself (a trainer on several processes runs it on its ranks' rows)."""
        self.step(payloads, keep=keep, trust=trust)

    @torch.no_grad()
    def step(self, payloads: Sequence[LocoPayload], *, keep: Mapping[str, float] | None = None,
             trust: Mapping[str, float] | None = None) -> None:
        """``apply`` without ``check`` nor the ledger: for payloads already checked (against the whole
        model), or slices of them (every payload of the round, each cut to this optimizer's tensors)
        with the factors ``keep`` found over the whole payloads (absent: 1, the plain mean) and their
        ``trust`` weights (absent: 1)."""
        ordered = sorted(payloads, key=lambda p: p.trainer_id.encode())
        if self.settle(ordered, keep, trust):
            for name in self.params:
                self._step(name, self._mean_into_acc(name, ordered))
        self.set_round(self.round + 1)

    def settle(self, payloads: Sequence[LocoPayload], keep: Mapping[str, float] | None,
               trust: Mapping[str, float] | None = None) -> bool:
        """Set ``trust`` (each payload's trust weight), ``kept`` (each payload's FP32 factor; 0 for
        all when the round's total trust is below ``min_contributors`` and it applies nothing: it
        all goes back to the error feedback). True if the round applies its payloads."""
        w = trust_of(payloads, trust)
        self.trust = {p.trainer_id: float(x) for p, x in zip(payloads, w)}
        self._total = math.fsum(w)
        applies = bool(payloads) and self._total >= self.cfg.min_contributors
        self.kept = {p.trainer_id: float(np.float32((keep or {}).get(p.trainer_id, 1.0))) if applies else 0.0
                     for p in payloads}
        return applies

    def set_round(self, round: int) -> None:
        """The weights and momentum now hold the state of ``round`` (after a step, or after they
        were loaded or gathered from elsewhere)."""
        self.round = round
        self._hash = None

    def state_dict(self) -> OuterState:
        """Round, global FP32 weights, momentum and ledger: what a lagging or diverged trainer pulls."""
        return {"round": self.round,
                "params": {n: t.clone() for n, t in self.params.items()},
                "momentum": {n: t.clone() for n, t in self.momentum.items()},
                "ledger": self.ledger.encode()}

    @torch.no_grad()
    def load_state_dict(self, state: OuterState) -> None:
        """Adopt a peer's state (in place; its hashes were checked by ``trainer/state.py``)."""
        params, momentum = state["params"], state["momentum"]
        if set(params) != set(self.params) or set(momentum) != set(self.params):
            raise WireError("re-sync state does not match the model's tensors")
        for n, t in self.params.items():
            if params[n].shape != t.shape or momentum[n].shape != t.shape:
                raise WireError(f"{n}: re-sync state has the wrong shape")
        ledger = Ledger.decode(state["ledger"], cfg=self.cfg.trust)
        for n, t in self.params.items():
            t.copy_(params[n])
            self.momentum[n].copy_(momentum[n])
        self.ledger = ledger
        self.set_round(int(state["round"]))  # the cached base hash described the state we just replaced
