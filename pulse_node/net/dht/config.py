"""The DHT worker's config: how this node joins the swarm's DHT, and its push plane."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from pulse_node.configload import StrictModel
from pulse_node.net.dht.records import MAX_TTL_S, MIN_TTL_S
from pulse_node.net.local.spool import DEFAULT_DISK_BYTES, DEFAULT_MAX_PUSH, THRESHOLD
from pulse_node.net.local.worker_config import FULL_MADDR, LogLevel, RunId
from pulse_node.net.peers.budget import BudgetConfig

#: listen on every interface, on a port the OS picks
ANY_PORT = "/ip4/0.0.0.0/tcp/0"
#: p2pd's circuit-relay transport. On (hivemind's own default): it costs nothing unused, and a
#: node without it cannot dial a peer that is reachable only through a relay, so
#: ``use_auto_relay`` on a NATed node helps only if the rest of the swarm has it on.
USE_RELAY = True
#: DHT records live this long and are refreshed every third of it
RECORD_TTL_S = 30.0


class DhtConfig(StrictModel):
    """The DHT worker (``net/dht/worker.py``): how this node joins the swarm's DHT, and its push plane."""

    run_id: RunId
    initial_peers: list[str] = Field(default_factory=list)
    host_maddrs: list[str] = Field(default_factory=lambda: [ANY_PORT])
    announce_maddrs: list[str] = Field(default_factory=list)
    identity: Path | None = None  # Ed25519 key file (PEM), created if missing; None: a new key each start
    use_relay: bool = USE_RELAY
    use_auto_relay: bool = False
    client_mode: bool = False
    accept_pushes: bool = False  # serve the p2pd push plane (trainers receive PULSELoCo payloads on it)
    spool_dir: Path | None = None  # pass large push bodies as files here (net/local/spool.py); None: bytes only
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
            if not FULL_MADDR.match(text):
                raise ValueError(f"{text!r} is not a full multiaddr like /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...; "
                                 "copy a line that `pulse-node bootstrap` prints")
        return peers

    @model_validator(mode="after")
    def _spool_budget(self) -> DhtConfig:
        if self.spool_disk_bytes < self.spool_max_push_bytes:
            raise ValueError(f"spool_disk_bytes ({self.spool_disk_bytes}) must hold one push of "
                             f"spool_max_push_bytes ({self.spool_max_push_bytes})")
        return self
