"""The wire worker's config: the py-libp2p host serving the node's store to peers."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pulse_node.configload import StrictModel
from pulse_node.net.local.worker_config import LogLevel
from pulse_node.net.peers.budget import BudgetConfig

#: a new data-plane connection (TCP + Noise + yamux) must be up within this many seconds; a live
#: internet path needs ~1 RTT per step. Without it a dial to an address that drops SYNs (a NATed
#: peer's private address, a firewall) holds the caller for its whole deadline (60 s for a fetch).
DIAL_TIMEOUT_S = 10.0


class WireConfig(StrictModel):
    """The wire worker (``net/wire/worker.py``): the py-libp2p host serving ``store`` to peers."""

    store: Path  # root of the node's store, served read-only
    listen: list[str] = Field(default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"], min_length=1)
    announce: list[str] = Field(default_factory=list)  # advertised instead of the listen addresses
    identity: Path | None = None  # Ed25519 key: raw 32-byte seed or PKCS#8 PEM; None: an ephemeral key
    max_streams: int = Field(default=32, ge=1, le=4096)  # concurrent outbound streams (inbound: ``budget``)
    idle_timeout_s: float = Field(default=10.0, gt=0)  # how long any stream read or write may stall
    dial_timeout_s: float = Field(default=DIAL_TIMEOUT_S, gt=0)
    max_upload_rate: float = Field(default=0.0, ge=0)  # bytes/s served to peers, 0 = no cap
    max_events: int = Field(default=1024, ge=1)  # queued inbound pushes
    max_event_bytes: int = Field(default=256 << 20, ge=1)  # bytes of queued inbound pushes
    budget: BudgetConfig = Field(default_factory=BudgetConfig)  # per-peer budgets (``net/peers/budget.py``)
    log_level: LogLevel = "warning"
