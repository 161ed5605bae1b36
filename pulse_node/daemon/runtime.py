"""The daemon: build a role's context, run the role, keep status fresh, stop within a bound.

``run_node`` is what ``pulse_node/roles.py`` calls with the role it picked (daemon/ knows no role:
it runs whatever ``RoleFactory`` builds). It owns every resource it starts (store lock,
worker processes, status server) and releases them in reverse order on return, on an error in
the role, and on SIGINT/SIGTERM (the role sees ``ctx.stop`` and returns within a round). A node
whose DHT or wire worker process died stops the same way and exits with code 1.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pulse_node.chain.admission import read_admission
from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.config import RoleConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus, StatusServer
from pulse_node.daemon.transport import Transport
from pulse_node.signals import stop_on_signals
from pulse_node.sysmem import return_large_frees

TransportFactory = Callable[[RoleConfig, Identity, Path], Transport]


class Role(Protocol):
    """What the daemon runs: a role returns from ``run`` once ``ctx.stop`` is set; ``close`` frees it."""

    def run(self) -> None: ...

    def close(self) -> None: ...


RoleFactory = Callable[[RoleContext[RoleConfig]], Role]


class RoleLogFilter(logging.Filter):
    """Prefixes every log line with peer, role and version."""

    def __init__(self, status: NodeStatus) -> None:
        super().__init__()
        self.status = status

    def filter(self, record: logging.LogRecord) -> bool:
        st = self.status
        record.prefix = f"[{st.peer_id[:8]} {st.role} v{st.version}]"
        return True


def setup_logging(status: NodeStatus, level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(RoleLogFilter(status))
    handler.setFormatter(logging.Formatter("%(asctime)s %(prefix)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger("pulse")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _status_writer(ctx: RoleContext[RoleConfig], path: Path, every_s: float, worker_died: threading.Event) -> threading.Thread:
    """Writes status.json every ``every_s``; stops the node if a transport worker process died
    (the node cannot work without it; a supervisor restarts the whole node)."""
    def loop() -> None:
        while not ctx.stop.wait(every_s):
            if not ctx.transport.alive():
                ctx.status.error("a worker process died; stopping the node")
                ctx.log.error("a worker process died; stopping the node")
                worker_died.set()
                ctx.stop.set()
            try:
                ctx.status.write(path)
            except OSError:
                pass

    t = threading.Thread(target=loop, name="status-writer", daemon=True)
    t.start()
    return t


def _warm_codec() -> threading.Thread:
    """Load the compiled kernels (the codec's, the robust rule's) in the background while the role
    starts up.

    A stale on-disk cache is cleared here, before the role can load any kernel from it.
    """
    from pulse_node.codec.warmup import clear_stale_cache, warm_up
    from pulse_node.loco import clip_kernel

    def warm() -> None:
        warm_up()
        clip_kernel.warm()

    clear_stale_cache()
    t = threading.Thread(target=warm, name="codec-warm-up", daemon=True)
    t.start()
    return t


def _admission(cfg: RoleConfig, identity: Identity) -> bytes | None:
    path = cfg.chain.admission_file
    return None if path is None else read_admission(path, run_id=cfg.run_id, key=identity.public_key_hex)


def run_node(cfg: RoleConfig, make_transport: TransportFactory, *, make_role: RoleFactory,
             stop: threading.Event | None = None, install_signals: bool = True) -> int:
    """Run one daemon with the role ``make_role`` builds until stopped; returns a process exit code."""
    data = Path(cfg.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    identity = Identity.load_or_create(data / "identity.key")
    store = VersionStore(data / "store")
    transport = None
    server = None
    stop = stop or threading.Event()
    worker_died = threading.Event()
    try:
        transport = make_transport(cfg, identity, store.root)
        status = NodeStatus(role=cfg.role, peer_id=transport.peer_id, run_id=cfg.run_id)
        setup_logging(status, cfg.log_level)
        server = StatusServer(status, host=cfg.metrics_host, port=cfg.metrics_port, healthy=lambda: not stop.is_set())
        ctx: RoleContext[RoleConfig] = RoleContext(cfg=cfg, identity=identity, store=store, transport=transport,
                                                   status=status, stop=stop, admission=_admission(cfg, identity))
        status.update(metrics_url=server.url, node_key=identity.public_key_hex,
                      trust_mode="open" if ctx.book.open else "keys", trainer_set=ctx.book.describe())
        if install_signals:
            stop_on_signals(stop)
        status.write(data / "status.json")
        _status_writer(ctx, data / "status.json", 0.5, worker_died)
        return_large_frees()  # the per-version arrays go back to the OS when freed (``sysmem``)
        _warm_codec()
        role = make_role(ctx)
        try:
            role.run()
        finally:
            role.close()
            status.update(stopped=True)
            status.write(data / "status.json")
        return 1 if worker_died.is_set() else 0
    finally:
        stop.set()
        if server is not None:
            server.close()
        if transport is not None:
            transport.close()
        store.close()
