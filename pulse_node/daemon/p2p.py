"""The real transport: the hivemind DHT worker for discovery, the py-libp2p wire worker for data.

Both workers run in their own processes under the node's persistent Ed25519 identity, so the
node's DHT peer id and data-plane peer id are the same. Peers are addressed by their
data-plane multiaddr (taken from their signed DHT record). PULSELoCo payloads (``loco``) go
over the DHT worker's p2pd instead (``net/dht/push.py``, measured several times faster), to the
DHT addresses in the peer's record, and fall back to the wire push on any error (counted).
Trainers give the DHT worker a spool (``<data_dir>/spool``) so payloads up to
``loco.max_payload_bytes`` cross the node <-> worker RPC as files; the wire fallback stays capped
at ``wire_protocol.PUSH_CAPS["loco"]`` (48 MiB) and refuses a larger payload outright.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pulse_node import __version__
from pulse_node.chain.anchor import Piece
from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.chain.peer import PeerCounters, PeerRecord, PeerStatus
from pulse_node.config import RoleConfig, TrainerConfig
from pulse_node.daemon.background import Background
from pulse_node.daemon.transport import AnchorFetch, DataPlane
from pulse_node.errors import PulseError, WireError
from pulse_node.net.dht.client import DhtClient, DhtConfig
from pulse_node.net.dht.records import NEWCOMERS_READ
from pulse_node.net.dht.rpc import PushPlaneStats
from pulse_node.net.local import spool
from pulse_node.net.wire.client import WireClient, WireConfig
from pulse_node.net.wire.protocol import PUSH_CAPS, FetchRequest
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.peers.view import PeerView
from pulse_node.vocab import BudgetRefusal, Event, PushKind, check_push_kind

log = logging.getLogger("pulse.p2p")


class P2PTransport:
    """``Transport`` over a DhtClient and a WireClient (both separate processes)."""

    def __init__(self, cfg: RoleConfig, dht: DhtClient, wire: WireClient) -> None:
        self.cfg = cfg
        self.dht = dht
        self.wire = wire
        info = wire.info()
        self.peer_id = info.peer_id
        self.wire_maddrs = _full(info.listen_maddrs, info.peer_id, cfg.net.wire_announce)
        self._last_peers: list[PeerRecord] = []
        self._peers_at = float("-inf")
        self._loco_fallbacks = 0
        # the configured trainers' records are read first, however many others the DHT holds
        trainers = TrainerSet.from_config(cfg.chain, run_id=cfg.run_id)
        self._configured = [peer_id_of_key(k) for k in sorted(trainers.configured)]
        self._members: list[str] = []
        self._standing: list[str] = []
        self._told_standing: set[str] | None = None
        self._dht_calls = Background("dht-calls")  # publish and read without the role's loop waiting

    @classmethod
    def create(cls, cfg: RoleConfig, identity: Identity, store_root: Path) -> P2PTransport:
        """Start both workers at once, their imports overlapping; then wait for the wire worker
        first (it is local-only and fails fast), then for the DHT worker's join."""
        data = Path(cfg.data_dir)
        trainer = cfg.role == "trainer"
        cap = _spool_cap(cfg)
        wire = WireClient.spawn(WireConfig(store=store_root, listen=cfg.net.wire_listen, announce=cfg.net.wire_announce,
                                           identity=data / "identity.key", budget=cfg.net.budget),
                                log_path=data / "wire.log")
        dht_cfg = DhtConfig(
            run_id=cfg.run_id, initial_peers=cfg.net.bootstrap, host_maddrs=cfg.net.dht_listen,
            announce_maddrs=cfg.net.announce, identity=data / "identity.key",
            use_relay=cfg.net.use_relay, use_auto_relay=cfg.net.use_auto_relay,
            client_mode=cfg.net.client_mode, ttl_s=cfg.net.record_ttl_s, budget=cfg.net.budget,
            accept_pushes=trainer,
            spool_dir=data / "spool" if trainer else None, spool_max_push_bytes=cap,
            spool_disk_bytes=max(spool.DEFAULT_DISK_BYTES, 2 * cap))
        try:
            dht = DhtClient.spawn(dht_cfg, log_path=data / "dht.log")
        except BaseException:
            wire.stop()
            raise
        try:
            wire.wait_ready(cfg.net.worker_start_timeout_s)
            dht.wait_ready(DhtClient.start_timeout(dht_cfg))
        except BaseException:
            wire.stop()
            dht.stop()
            raise
        return cls(cfg, dht, wire)

    def publish(self, status: PeerStatus) -> None:
        """Publish ``status`` with what this transport knows (data-plane addresses, byte counters,
        software) from a background thread: a DHT store waits on other DHT nodes, which anyone can
        run (``daemon/background.py``); a newer status replaces one not yet published."""
        self._dht_calls.submit("publish", lambda: self._publish_now(status))

    def _publish_now(self, status: PeerStatus) -> None:
        stats = self.stats()
        self.dht.publish_peer(status.model_copy(update={
            "wire_maddrs": self.wire_maddrs[:8], "software": f"pulse-node {__version__}",
            "counters": PeerCounters(bytes_in=stats.bytes_in, bytes_out=stats.bytes_out)}))

    def peers(self) -> list[PeerRecord]:
        """Live peers, from a DHT lookup at most every ``net.head_poll_s`` (pushes carry the fast
        path). Only the first lookup is waited for; later ones run in the background and this
        returns the last view meanwhile."""
        if self._peers_at == float("-inf"):
            self._read_peers()
        elif (time.monotonic() - self._peers_at >= self.cfg.net.head_poll_s
              and not self._dht_calls.waiting_or_running("peers")):
            self._dht_calls.submit("peers", self._read_peers)
        return list(self._last_peers)

    def _read_peers(self) -> None:
        prefer = list(dict.fromkeys(self._configured + self._members + self._standing))
        # the view keeps a few newcomers only (peers/standing.py): reading more would cost CPU for nothing
        found = self.dht.peers(prefer=prefer, limit=len(prefer) + NEWCOMERS_READ)
        out = [r for r in found if not r.leaving and r.role != "bootstrap" and r.wire_maddrs]
        self._last_peers, self._peers_at = out, time.monotonic()

    def fetch(self, peer: PeerRecord, request: FetchRequest, dest: Path, *, timeout: float,
              max_bytes: int | None = None) -> int:
        return self.wire.fetch(peer.address, request, dest, timeout=timeout, max_bytes=max_bytes).bytes

    def fetch_anchor(self, providers: list[PeerRecord], *, version: int, pieces: list[Piece], dest: Path,
                     timeout: float) -> AnchorFetch:
        """Download anchor ``version`` from ``providers`` (the caller chose them), piece by signed piece."""
        by_address = {p.address: p.peer_id for p in providers}
        size = pieces[-1].offset + pieces[-1].length
        r = self.wire.fetch_anchor(list(by_address), version=version, size=size, dest=dest, timeout=timeout,
                                   pieces=[(p.offset, p.length, p.digest) for p in pieces])
        return AnchorFetch(r.bytes if r.complete else 0, error=r.error,
                           bad_peers=[by_address[a] for a in r.bad_providers if a in by_address],
                           failed_peers=[by_address[a] for a in r.failed_providers if a in by_address])

    def push(self, peer: PeerRecord, kind: PushKind, data: bytes, *, timeout: float) -> None:
        check_push_kind(kind)
        if kind == "loco" and peer.dht_maddrs:
            left = self._push_loco(peer, data, timeout=timeout)
            if left is None:
                return
            timeout = left
        cap = PUSH_CAPS[kind]
        if len(data) > cap:  # a payload only the p2pd plane (with a spool) carries: say so, do not try
            raise WireError(f"{kind} push of {len(data)} bytes to {peer.peer_id[:12]} exceeds the wire plane's cap "
                            f"of {cap} bytes; larger PULSELoCo payloads travel only on the p2pd plane")
        self.wire.push(peer.address, kind, data, timeout=timeout)

    def _push_loco(self, peer: PeerRecord, data: bytes, *, timeout: float) -> float | None:
        """Try the p2pd plane; None when delivered, else the time left for the wire fallback."""
        t0 = time.monotonic()
        try:
            self.dht.push(peer.peer_id, peer.dht_maddrs, "loco", data, timeout=timeout)
            return None
        except PulseError as exc:
            self._loco_fallbacks += 1
            log.warning("loco push to %s over p2pd failed (%s); falling back to the wire", peer.peer_id[:12], exc)
        return max(1.0, timeout - (time.monotonic() - t0))

    def set_view(self, view: PeerView) -> None:
        """What the peer book thinks of peers (``peers/view.py``), to both workers: members get
        their own stream pool and larger shares in each, peers with standing shares of their own
        in the wire worker (everyone else shares the newcomers'); the members' and then the
        standing peers' records are read right after the configured trainers', however many
        records fresh keys publish."""
        members, standing = sorted(view.members), list(view.standing)
        if members != self._members:
            self.wire.set_members(members)
            if self.dht.config.accept_pushes:
                self.dht.set_members(members)
            self._members = members
        if self._told_standing is None or set(standing) != self._told_standing:
            self.wire.set_standing(standing)
            self._told_standing = set(standing)
        self._standing = standing

    def cap_pushes(self, kind: PushKind, cap: int) -> None:
        """Lower the cap of ``kind`` pushes to ``cap`` on the p2pd plane (the wire plane's is
        ``PUSH_CAPS``, already smaller than any model's payload bound needs to be)."""
        if self.dht.config.accept_pushes:
            self.dht.set_push_cap(kind, cap)

    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]:
        """Pushes from both planes; the wire call waits, the p2pd queue is read before and after."""
        got = self._dht_events(max_items)
        wire = self.wire.events(max_events=max_items, wait_s=0.0 if got else wait_s)
        if not got and wait_s > 0:
            got = self._dht_events(max_items)
        return wire + got

    def _dht_events(self, max_items: int) -> list[Event]:
        if not self.dht.config.accept_pushes:
            return []
        try:
            return self.dht.events(max_events=max_items)
        except PulseError as exc:  # the DHT worker is failing; the wire still delivers
            log.warning("reading p2pd pushes failed: %s", exc)
            return []

    def stats(self) -> DataPlane:
        """Data-plane byte counters: totals of both planes, per-kind (wire) and per-plane breakdowns."""
        raw = self.wire.stats()
        hm = self._push_stats()
        hm_in, hm_out = (hm.bytes_in, hm.bytes_out) if hm is not None else ({}, {})
        by_plane_in = {"wire": sum(raw.bytes_in.values()), "hivemind": sum(hm_in.values())}
        by_plane_out = {"wire": sum(raw.bytes_out.values()), "hivemind": sum(hm_out.values())}
        return DataPlane(bytes_in=sum(by_plane_in.values()), bytes_out=sum(by_plane_out.values()),
                         bytes_in_by_kind=raw.bytes_in, bytes_out_by_kind=raw.bytes_out,
                         bytes_in_by_plane=by_plane_in, bytes_out_by_plane=by_plane_out,
                         hivemind_push_errors=sum(hm.errors.values()) if hm is not None else 0,
                         loco_fallbacks=self._loco_fallbacks, wire_errors=sum(raw.errors.values()),
                         duplicate=self._duplicate(),
                         refused=_merged(raw.refused, hm.refused if hm is not None else {}))

    def _push_stats(self) -> PushPlaneStats | None:
        try:
            return self.dht.push_stats()
        except PulseError:
            return None

    def _duplicate(self) -> bool:
        """True while another live node publishes under our identity (a copied key file)."""
        try:
            return bool(getattr(self.dht.info(), "duplicate", False))
        except Exception:
            return False

    def alive(self) -> bool:
        """Whether both worker processes still run (the node cannot work without either)."""
        return self.dht.alive() and self.wire.alive()

    def close(self) -> None:
        self._dht_calls.close()
        for stop in (self.dht.stop, self.wire.stop):
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                log.warning("stopping a worker failed: %s", exc)


def _merged(*counts: dict[BudgetRefusal, int]) -> dict[BudgetRefusal, int]:
    """Refusal counts of both planes, by reason."""
    out: dict[BudgetRefusal, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def _spool_cap(cfg: RoleConfig) -> int:
    """Largest push through a trainer's spool: the payload size its agreement accepts (1 GiB by default)."""
    cap = cfg.loco.max_payload_bytes if isinstance(cfg, TrainerConfig) else spool.DEFAULT_MAX_PUSH
    return max(spool.THRESHOLD + 1, cap)


def _full(maddrs: list[str], peer_id: str, announce: list[str]) -> list[str]:
    """Dialable data-plane multiaddrs (announced ones first), each ending in /p2p/<id>."""
    out = []
    for m in list(announce) + list(maddrs):
        if "/p2p/" not in m:
            m = f"{m}/p2p/{peer_id}"
        if m not in out:
            out.append(m)
    return out
