"""Which role a node runs: the one place above ``daemon/``, ``trainer/`` and ``inference/`` that
picks the role for a config and hands it to the daemon (``daemon/runtime.run_node``).

``daemon/`` knows no role; ``pulse-node join`` and the in-process test swarm call ``run_node``
here. The roles (and torch) are imported lazily, when a node starts.
"""

from __future__ import annotations

import threading

from pulse_node.config import RoleConfig, TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.runtime import Role, TransportFactory
from pulse_node.daemon.runtime import run_node as run_daemon


def make_role(ctx: RoleContext[RoleConfig]) -> Role:
    """The role object for ``ctx.cfg`` (a ``TrainerRole`` or an ``InferenceRole``)."""
    cfg = ctx.cfg
    if cfg.torch_threads:
        import torch

        torch.set_num_threads(cfg.torch_threads)
    if isinstance(cfg, TrainerConfig):
        from pulse_node.trainer.role import TrainerRole

        return TrainerRole(ctx.with_cfg(cfg))
    from pulse_node.inference.role import InferenceRole

    return InferenceRole(ctx.with_cfg(cfg))


def run_node(cfg: RoleConfig, make_transport: TransportFactory, *, stop: threading.Event | None = None,
             install_signals: bool = True) -> int:
    """Run the node ``cfg`` describes until stopped (``daemon/runtime.run_node`` with its role)."""
    return run_daemon(cfg, make_transport, make_role=make_role, stop=stop, install_signals=install_signals)
