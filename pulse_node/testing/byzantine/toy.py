"""Byzantine rounds on the toy MLP (``testing/toy.py``): fast enough for the test suite.

Honest ``ToyTrainer``s gate their pseudo-gradients through a real ``ErrorFeedback`` (clipped to
half the payload value bound) and every payload, Byzantine ones included, is checked against
the real ``PayloadBound`` and applied by the real ``OuterOptimizer`` of the given config; an
honest trainer puts back what the round did not apply of its payload. ``attack(round, outer,
bound, honest)`` returns the Byzantine payloads of a round (it sees the honest ones: rushing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.config import AggregateConfig, LocoConfig
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.testing.toy import ToyTrainer

ToyAttack = Callable[[int, OuterOptimizer, PayloadBound, list[LocoPayload]], list[LocoPayload]]


@dataclass
class ToyRun:
    outer: OuterOptimizer
    start: dict[str, torch.Tensor]
    trainers: list[ToyTrainer]

    def norm_ratio(self) -> float:
        """|w| / |w0| of the global weights."""
        w = torch.cat([t.reshape(-1) for t in self.outer.params.values()])
        return float(w.norm() / torch.cat([t.reshape(-1) for t in self.start.values()]).norm())

    def loss(self) -> float:
        """Mean squared error of the global weights on every honest trainer's data."""
        model = self.trainers[0].model
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(self.outer.params[n])
            return float(sum(torch.nn.functional.mse_loss(model(t.x), t.y) for t in self.trainers) / len(self.trainers))


def at_bound(values: Callable[[np.ndarray], np.ndarray], *, ids: list[str]) -> ToyAttack:
    """Payloads of every entry at 0.999 x bound x ``values(w)`` (e.g. ``np.sign``: issue 32 item 1)."""
    def attack(rnd: int, outer: OuterOptimizer, bound: PayloadBound, honest: list[LocoPayload]) -> list[LocoPayload]:
        tensors = {}
        for n, t in outer.params.items():
            w = t.reshape(-1).numpy()
            tensors[n] = (np.arange(w.size, dtype=np.int64), (0.999 * bound.limit(w) * values(w)).astype(np.float32))
        numel = {n: t.numel() for n, t in outer.params.items()}
        return [LocoPayload(rnd, tid, outer.state_hash(), tensors, numel) for tid in ids]
    return attack


def run_toy(*, honest: int, rounds: int, lr: float, cfg: LocoConfig, attack: ToyAttack | None = None) -> ToyRun:
    """``rounds`` rounds of ``honest`` toy trainers (AdamW at ``lr``, the bound of that lr) and ``attack``."""
    bound = PayloadBound.of(cfg, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    trainers = [ToyTrainer(r, lr=lr) for r in range(honest)]
    start = {n: t.detach().clone() for n, t in trainers[0].local_params().items()}
    outer = OuterOptimizer({n: t.clone() for n, t in start.items()}, cfg)
    efs = [ErrorFeedback({n: tuple(t.shape) for n, t in start.items()}, cfg=cfg, bound=bound) for _ in trainers]
    for rnd in range(rounds):
        for tr in trainers:
            with torch.no_grad():
                for n, t in tr.local_params().items():
                    t.copy_(outer.params[n])
            for _ in range(cfg.inner_steps):
                tr.inner_step()
        mine = [ef.make_payload(outer.params, {n: t.detach() for n, t in tr.local_params().items()}, round=rnd,
                                trainer_id=f"h{i}", base_hash=outer.state_hash())
                for i, (tr, ef) in enumerate(zip(trainers, efs))]
        byz = attack(rnd, outer, bound, mine) if attack else []
        base = {n: t.numpy() for n, t in outer.params.items()}
        for p in byz:
            bound.check(p.tensors, base, who=p.trainer_id)
        outer.apply(mine + byz)
        for p, ef in zip(mine, efs):
            ef.restore(p, keep=outer.kept[p.trainer_id]) if outer.kept[p.trainer_id] < 1.0 else None
    return ToyRun(outer, start, trainers)


def sign_flip(ids: list[str]) -> ToyAttack:
    """Each attacker sends an honest payload of this round negated (rushing; stronger than
    flipping its own, which would only be like one)."""
    def attack(rnd: int, outer: OuterOptimizer, bound: PayloadBound, honest: list[LocoPayload]) -> list[LocoPayload]:
        return [LocoPayload(rnd, tid, p.base_hash, {n: (i, -v) for n, (i, v) in p.tensors.items()}, dict(p.numel))
                for tid, p in zip(ids, honest)]
    return attack


class Hoarder:
    """Toy trainers that train honestly but send nothing for ``hoard`` rounds, then everything
    their error feedback holds in one round, each entry up to 0.999 x the bound."""

    def __init__(self, ids: list[str], *, hoard: int, lr: float, cfg: LocoConfig) -> None:
        self.ids, self.hoard, self.cfg = ids, hoard, cfg
        self.trainers = [ToyTrainer(100 + k, lr=lr) for k in range(len(ids))]
        shapes = {n: tuple(t.shape) for n, t in self.trainers[0].local_params().items()}
        self.efs = [ErrorFeedback(shapes, cfg=cfg) for _ in ids]

    def __call__(self, rnd: int, outer: OuterOptimizer, bound: PayloadBound, honest: list[LocoPayload]) -> list[LocoPayload]:
        out = []
        for tid, tr, ef in zip(self.ids, self.trainers, self.efs):
            with torch.no_grad():
                for n, t in tr.local_params().items():
                    t.copy_(outer.params[n])
            for _ in range(self.cfg.inner_steps):
                tr.inner_step()
            p = ef.make_payload(outer.params, {n: t.detach() for n, t in tr.local_params().items()}, round=rnd,
                                trainer_id=tid, base_hash=outer.state_hash())
            ef.restore(p)  # everything stays in the error feedback
            if rnd % (self.hoard + 1) == self.hoard:
                tensors = {}
                for n, e in ef.e.items():
                    lim = 0.999 * bound.limit(outer.params[n].reshape(-1).numpy())
                    tensors[n] = (np.arange(e.numel(), dtype=np.int64),
                                  np.clip(e.reshape(-1).numpy(), -lim, lim).astype(np.float32))
                    e.zero_()
                out.append(LocoPayload(rnd, tid, outer.state_hash(), tensors, dict(p.numel)))
        return out


def ef_growth(*, power: int, lr: float, rounds: int, honest: int = 4) -> dict[str, float]:
    """Honest toy trainers only (each on its own data shard), the robust rule with ``power``:
    the largest error-feedback norm of any trainer over the median one's at the end, and the
    smallest weight of the last round. A rule that takes ever less of a trainer whose payload is
    farthest makes that trainer's error feedback grow without bound (its work is then lost)."""
    cfg = LocoConfig(inner_steps=5, aggregate=AggregateConfig(power=power))
    bound = PayloadBound.of(cfg, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    trainers = [ToyTrainer(r, lr=lr) for r in range(honest)]
    start = {n: t.detach().clone() for n, t in trainers[0].local_params().items()}
    outer = OuterOptimizer({n: t.clone() for n, t in start.items()}, cfg)
    efs = [ErrorFeedback({n: tuple(t.shape) for n, t in start.items()}, cfg=cfg, bound=bound) for _ in trainers]
    for rnd in range(rounds):
        mine = []
        for i, (tr, ef) in enumerate(zip(trainers, efs)):
            with torch.no_grad():
                for n, t in tr.local_params().items():
                    t.copy_(outer.params[n])
            for _ in range(cfg.inner_steps):
                tr.inner_step()
            mine.append(ef.make_payload(outer.params, {n: t.detach() for n, t in tr.local_params().items()},
                                        round=rnd, trainer_id=f"h{i}", base_hash=outer.state_hash()))
        outer.apply(mine)
        for p, ef in zip(mine, efs):
            if outer.kept[p.trainer_id] < 1.0:
                ef.restore(p, keep=outer.kept[p.trainer_id])
    norms = sorted(float(torch.cat([e.reshape(-1) for e in ef.e.values()]).norm()) for ef in efs)
    return {"ef_max_over_median": norms[-1] / max(norms[len(norms) // 2], 1e-30), "min_weight": min(outer.kept.values())}
