"""An in-process swarm: nodes as threads on one ``MemoryHub`` (no sockets, no workers).

Runs the real roles (``run_node``) over ``MemoryTransport``, optionally wrapped (e.g. by
``FaultyTransport``), so role logic, recovery and trust can be exercised fast and
deterministically. Each node makes catch-up patches on demand, as its wire worker would.
Used by the role tests and ``bench/chaos.py``.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.chain.catchup_producer import CatchupProducer
from pulse_node.daemon.status_model import StatusReport, read_status
from pulse_node.daemon.transport import Transport
from pulse_node.net.wire.serving import store_resolver
from pulse_node.roles import run_node
from pulse_node.testing.memory import MemoryHub

if TYPE_CHECKING:
    from pulse_node.chain.identity import Identity
    from pulse_node.config import RoleConfig
    from pulse_node.daemon.runtime import TransportFactory

Wrap = Callable[[str, Transport], Transport]


def node_status(data_dir: Path) -> StatusReport | None:
    """A node's last status.json (None while it has none)."""
    return read_status(Path(data_dir) / "status.json")


def node_version(data_dir: Path) -> int:
    """The version a node holds (-1: none yet)."""
    s = node_status(data_dir)
    return s.version if s is not None else -1


class InProcessSwarm:
    """Starts nodes as threads on one hub; ``stop``/``stop_all`` join them."""

    def __init__(self, wrap: Wrap | None = None) -> None:
        self.hub = MemoryHub()
        self.wrap: Wrap = wrap or (lambda name, transport: transport)
        self.nodes: list[tuple[threading.Thread, threading.Event, Path]] = []
        self.errors: list[str] = []

    def _factory(self, name: str) -> TransportFactory:
        def make(cfg: RoleConfig, identity: Identity, store_root: Path) -> Transport:
            resolver = store_resolver(store_root, producer=CatchupProducer(store_root))
            return self.wrap(name, self.hub.join(name, resolver))
        return make

    def start(self, name: str, cfg: RoleConfig) -> Path:
        """Run a node with ``cfg`` under peer id ``name``; returns its data dir."""
        stop = threading.Event()

        def target() -> None:
            try:
                run_node(cfg, self._factory(name), stop=stop, install_signals=False)
            except BaseException as exc:  # surfaced to the caller with its traceback
                self.errors.append(f"{name}: {exc!r}\n{traceback.format_exc()}")

        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self.nodes.append((t, stop, Path(cfg.data_dir)))
        return Path(cfg.data_dir)

    def stop(self, data_dir: Path, timeout: float = 60.0) -> None:
        """Stop one node (its thread returns and releases its store)."""
        for t, stop, d in self.nodes:
            if d == Path(data_dir):
                stop.set()
                t.join(timeout=timeout)

    def stop_all(self, timeout: float = 30.0) -> None:
        for _, stop, _ in self.nodes:
            stop.set()
        for t, _, _ in self.nodes:
            t.join(timeout=timeout)
