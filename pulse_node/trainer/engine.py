"""The trainer's model, optimizers and PULSELoCo state behind one interface, on one process or many.

The trainer role (``trainer/role.py``) runs rounds and speaks to the swarm; what it does to
weights goes through an ``Engine``:

- ``step(rollouts)``: one GRPO inner step;
- ``make_payload`` / ``restore``: the error-feedback gate on ``global - local``;
- ``outer``: the ``OuterOptimizer`` whose ``params`` / ``momentum`` are the whole FP32 global
  weights and momentum (what payloads are coded against, hashed, published and served to
  re-syncing trainers) and whose ``apply`` runs the round's outer step;
- ``reset_local``, ``load_global``, ``worker`` (rollouts and evals on the version's BF16 cast).

``LocalEngine`` does all of it in this process (what the role did inline before).
``DistributedEngine`` (``trainer/distributed.py``) is rank 0 of a ``torchrun`` group: the inner
steps run under FSDP2 on every rank and the gate, error feedback and outer step on each rank's
shard; the outer step is bit-identical to ``LocalEngine``'s for the same payloads. Either records
its inner steps into ``inner_log`` (spot checks) when it is set.
``make_engine`` picks one from the environment torchrun sets (``WORLD_SIZE``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from pulse_node.codec.state import State
from pulse_node.config import TrainerConfig
from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.torchbits import load_state
from pulse_node.trainer import world_size
from pulse_node.trainer.spot_record import InnerStepLog

if TYPE_CHECKING:
    from pulse_node.daemon.status import NodeStatus


class Engine(Protocol):
    shapes: dict[str, tuple[int, ...]]
    learner: GRPOLearner  # whose settings are the inner steps' (``spot_replay.inner_settings``)
    inner_log: InnerStepLog | None  # set: inner steps are recorded for spot checks

    @property
    def outer(self) -> OuterOptimizer: ...

    @property
    def worker(self) -> RolloutWorker: ...

    def step(self, rollouts: list[Rollout], *, current_version: int, producer: str = "") -> dict[str, float]: ...

    def begin_inner_log(self, *, round: int, base_hash: bytes) -> None: ...

    def make_payload(self, *, round: int, trainer_id: str, base_hash: bytes) -> LocoPayload: ...

    def restore(self, payload: LocoPayload, *, keep: float = 0.0) -> None: ...

    def reset_local(self) -> None: ...

    def load_global(self, state: State, *, round: int) -> None: ...

    def close(self) -> None: ...


def make_engine(cfg: TrainerConfig, *, status: NodeStatus | None = None) -> Engine:
    """A ``DistributedEngine`` under torchrun with several processes, else a ``LocalEngine``."""
    if world_size() > 1:
        from pulse_node.trainer.distributed import DistributedEngine

        return DistributedEngine(cfg, status=status)
    return LocalEngine(cfg)


class LocalEngine:
    """One process: FP32 masters (the local weights) on the model's device, the rest on CPU."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo, progress=True)
        self.learner = GRPOLearner(self.policy, cfg.grpo, temperature=cfg.sampling.temperature)
        self._worker = RolloutWorker(self.policy, cfg.sampling, compute=cfg.verify.compute)
        self.local = dict(self.policy.model.named_parameters())
        global_params = {n: p.detach().to("cpu", torch.float32).clone() for n, p in self.local.items()}
        self.shapes = {n: tuple(t.shape) for n, t in global_params.items()}
        self.outer = OuterOptimizer(global_params, cfg.loco)
        self.ef = ErrorFeedback(self.shapes, cfg=cfg.loco, bound=PayloadBound.of_trainer(cfg))
        self.inner_log: InnerStepLog | None = None  # set: inner steps are recorded for spot checks

    @property
    def worker(self) -> RolloutWorker:
        return self._worker

    def step(self, rollouts: list[Rollout], *, current_version: int, producer: str = "") -> dict[str, float]:
        """One GRPO step; with ``inner_log`` its batch (made by ``producer``), weights and clipped
        gradient are recorded between the backward and the AdamW step."""
        if self.inner_log is None:
            return self.learner.step(rollouts, current_version=current_version)
        stats, norm = self.learner.gradient(rollouts, current_version=current_version)
        self.inner_log.record(self.learner, rollouts, producer=producer, grad_norm=norm)
        return self.learner.apply(stats, norm)

    def begin_inner_log(self, *, round: int, base_hash: bytes) -> None:
        """Start recording round ``round`` (after ``reset_local``), if ``inner_log`` is set."""
        if self.inner_log is not None:
            self.inner_log.begin_round(round=round, base_hash=base_hash, base=self.outer.params,
                                       learner=self.learner, ef=self.ef)

    def make_payload(self, *, round: int, trainer_id: str, base_hash: bytes) -> LocoPayload:
        local_cpu = {n: p.detach().to("cpu", torch.float32) for n, p in self.local.items()}
        return self.ef.make_payload(self.outer.params, local_cpu, round=round, trainer_id=trainer_id,
                                    base_hash=base_hash)

    def restore(self, payload: LocoPayload, *, keep: float = 0.0) -> None:
        self.ef.restore(payload, keep=keep)

    def reset_local(self) -> None:
        with torch.no_grad():
            for n, p in self.local.items():
                p.copy_(self.outer.params[n].to(p.device))

    def load_global(self, state: State, *, round: int) -> None:
        """The global weights become ``state`` (BF16 -> FP32 is exact) as of ``round``."""
        load_state(self.outer.params, state)
        self.outer.set_round(round)

    def close(self) -> None:
        pass
