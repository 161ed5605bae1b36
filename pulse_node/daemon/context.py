"""What a role needs from its node: config, identity, store, transport, status, a stop flag.

The same ``RoleContext`` is built by the real daemon (``runtime.py``, P2P transport) and by
tests (``MemoryTransport``), so role logic is exercised identically in both.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.daemon.status import NodeStatus
from pulse_node.errors import PulseError
from pulse_node.daemon.transport import PeerInfo, Transport
from pulse_node.net.dht_records import PeerStatus, Serves


C = TypeVar("C", bound=TrainerConfig | InferenceConfig)
D = TypeVar("D", bound=TrainerConfig | InferenceConfig)


@dataclass
class RoleContext(Generic[C]):
    """Everything a trainer or inference role runs on; ``C``: the role's config type."""

    cfg: C
    identity: Identity
    store: VersionStore
    transport: Transport
    status: NodeStatus
    stop: threading.Event = field(default_factory=threading.Event)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("pulse.node"))
    admission: bytes | None = None  # this trainer's admission to the trainer set, published in its record

    def peers(self, role: str | None = None) -> list[PeerInfo]:
        """Live peers from discovery (never ourselves), optionally of one role."""
        me = self.transport.peer_id
        return [p for p in self.transport.peers() if p.peer_id != me and (role is None or p.role == role)]

    def announce(self, *, version: int, chain_hash: str, state_hash: str) -> None:
        """Publish our discovery record (version held, what we serve) and refresh status."""
        anchors = self.store.anchors()
        lowest = self.store.lowest_served()  # patches from there to the head, without a hole
        held = version if version >= 0 else None
        self.transport.publish(PeerStatus(
            role=self.cfg.role, version=held, chain_hash=chain_hash or None, state_hash=state_hash or None,
            serves=Serves(lowest=lowest, highest=held, anchors=anchors[-64:]),
            node_key=self.identity.public_key_hex, metrics_url=self.status.metrics_url, admission=self.admission))
        self.status.update(version=version, chain_hash=chain_hash, state_hash=state_hash,
                           lowest=-1 if lowest is None else lowest, anchors=anchors, peers=len(self.transport.peers()))
        self.status.set_data_plane(self.transport.stats())

    def share_members(self, peer_ids: frozenset[str]) -> None:
        """Tell the transport's workers the trainer-set members' peer ids (``net/budget.py``: their
        own stream pool, larger shares); a transport without per-peer budgets ignores it."""
        tell = getattr(self.transport, "set_members", None)
        if tell is None:
            return
        try:
            tell(sorted(peer_ids))
        except PulseError as exc:  # budgets fall back to treating everyone as a non-member
            self.log.warning("telling the data plane the trainer set failed: %s", exc)

    def with_cfg(self, cfg: D) -> RoleContext[D]:
        """This context with ``cfg`` narrowed to one role's config (same identity, store, transport,
        status and stop flag)."""
        return RoleContext(cfg=cfg, identity=self.identity, store=self.store, transport=self.transport,
                           status=self.status, stop=self.stop, log=self.log, admission=self.admission)

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` unless asked to stop; True if stopping."""
        return self.stop.wait(seconds)
