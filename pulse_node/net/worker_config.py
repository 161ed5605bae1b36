"""What each worker is started with: one validated pydantic model per worker, declared once.

The node builds a ``DhtConfig`` / ``WireConfig``; ``process.WorkerClient.start`` writes it as JSON
and the worker (``rpc_server.run_worker``) validates the same model again from that file: there
is no second list of flags on either side. Importable without hivemind, trio or py-libp2p.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pulse_node.configload import StrictModel
from pulse_node.net.budget import BudgetConfig
from pulse_node.net.dht_records import MAX_TTL_S, MIN_TTL_S
from pulse_node.net.spool import DEFAULT_DISK_BYTES, DEFAULT_MAX_PUSH, THRESHOLD
from pulse_node.vocab import check_run_id

#: listen on every interface, on a port the OS picks
ANY_PORT = "/ip4/0.0.0.0/tcp/0"
#: p2pd's circuit-relay transport. On (hivemind's own default): it costs nothing unused, and a
#: node without it cannot dial a peer that is reachable only through a relay, so
#: ``use_auto_relay`` on a NATed node helps only if the rest of the swarm has it on.
USE_RELAY = True
#: DHT records live this long and are refreshed every third of it
RECORD_TTL_S = 30.0
#: a new data-plane connection (TCP + Noise + yamux) must be up within this many seconds; a live
#: internet path needs ~1 RTT per step. Without it a dial to an address that drops SYNs (a NATed
#: peer's private address, a firewall) holds the caller for its whole deadline (60 s for a fetch).
DIAL_TIMEOUT_S = 10.0

#: a run id field (``vocab.RUN_ID_RULE``) of a config model
RunId = Annotated[str, AfterValidator(check_run_id)]
LogLevel = Literal["debug", "info", "warning", "error"]
_FULL_MADDR = re.compile(r"^/(ip4|ip6|dns|dns4|dns6)/[^/]+/(tcp|udp)/\d{1,5}(/quic-v1|/quic)?(/[^/]+/[^/]+)*"
                         r"/p2p/[1-9A-HJ-NP-Za-km-z]{40,64}$")


class DhtConfig(StrictModel):
    """The DHT worker (``dht_worker.py``): how this node joins the swarm's DHT, and its push plane."""

    run_id: RunId
    initial_peers: list[str] = Field(default_factory=list)
    host_maddrs: list[str] = Field(default_factory=lambda: [ANY_PORT])
    announce_maddrs: list[str] = Field(default_factory=list)
    identity: Path | None = None  # Ed25519 key file (PEM), created if missing; None: a new key each start
    use_relay: bool = USE_RELAY
    use_auto_relay: bool = False
    client_mode: bool = False
    accept_pushes: bool = False  # serve the p2pd push plane (trainers receive PULSELoCo payloads on it)
    spool_dir: Path | None = None  # pass large push bodies as files here (net/spool.py); None: bytes only
    spool_max_push_bytes: int = Field(default=DEFAULT_MAX_PUSH, gt=THRESHOLD)
    spool_disk_bytes: int = Field(default=DEFAULT_DISK_BYTES, gt=THRESHOLD)
    bootstrap_timeout_s: float = Field(default=15.0, gt=0, le=300)
    ttl_s: float = Field(default=RECORD_TTL_S, ge=MIN_TTL_S, le=MAX_TTL_S)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)  # the push plane's per-peer shares
    log_level: LogLevel = "info"

    @field_validator("initial_peers")
    @classmethod
    def _full_maddrs(cls, peers: list[str]) -> list[str]:
        for text in peers:
            if not _FULL_MADDR.match(text):
                raise ValueError(f"{text!r} is not a full multiaddr like /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...; "
                                 "copy a line that `pulse-node bootstrap` prints")
        return peers

    @model_validator(mode="after")
    def _spool_budget(self) -> DhtConfig:
        if self.spool_disk_bytes < self.spool_max_push_bytes:
            raise ValueError(f"spool_disk_bytes ({self.spool_disk_bytes}) must hold one push of "
                             f"spool_max_push_bytes ({self.spool_max_push_bytes})")
        return self


class WireConfig(StrictModel):
    """The wire worker (``wire_worker.py``): the py-libp2p host serving ``store`` to peers."""

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
    budget: BudgetConfig = Field(default_factory=BudgetConfig)  # per-peer budgets (``net/budget.py``)
    log_level: LogLevel = "warning"
