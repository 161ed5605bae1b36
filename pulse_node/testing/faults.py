"""Fault injection for chaos tests: a ``Transport`` wrapper that drops, duplicates, reorders,
delays and corrupts what crosses it (optionally only some kinds, to some peers), and counts every
fault by kind; a wrapper that dies like a crashed process at a chosen message; a forging peer,
in-process (``start_forging_peer``) or on the real network (``ForgingPeer``).

Used by ``tests/test_node_chaos.py``, ``bench/chaos.py`` and, only when a node's config has
``[net.faults] enabled = true`` (a testing option, off by default), by ``pulse-node join``
(``faulty_factory``). Faults are drawn from a seeded RNG so a failing run can be replayed.

What was injected is reported apart from the production status: such a node writes a
``FaultReport`` to ``<data_dir>/faults.json`` (``FAULTS_FILE``) whenever its status is refreshed,
and the chaos ledger (``testing/chaos.py``) sums those over every life of every node.
"""

from __future__ import annotations

import hashlib
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pydantic

from pulse_node.chain.peer import PeerRecord, PeerStatus, Serves
from pulse_node.daemon.transport import AnchorFetch, DataPlane, Transport
from pulse_node.errors import PulseError, WireError
from pulse_node.fsutil import write_atomic
from pulse_node.net.wire.protocol import FetchRequest, kind_of
from pulse_node.peers.view import PeerView
from pulse_node.vocab import Event, PushKind

if TYPE_CHECKING:
    from pulse_node.chain.anchor import Piece
    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import VersionRecord
    from pulse_node.config import FaultConfig, RoleConfig
    from pulse_node.daemon.runtime import TransportFactory
    from pulse_node.testing.memory import MemoryHub

FAULTS = ("drop", "duplicate", "reorder", "delay", "corrupt")
#: where a node with ``[net.faults]`` reports what it injected (in its data dir)
FAULTS_FILE = "faults.json"


class FaultReport(pydantic.BaseModel):
    """What one life of a fault-injecting node injected (testing only; not in ``status.json``)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    started_at: float = pydantic.Field(description="when this life's transport started (unix time)")
    faults: dict[str, int] = pydantic.Field(default_factory=dict, description="faults injected per fault kind")
    faulted: dict[str, int] = pydantic.Field(default_factory=dict, description="faults per message kind:fault")


def read_fault_report(data_dir: Path) -> FaultReport | None:
    """The report a node wrote in ``data_dir`` (None if it wrote none, or it is half-read)."""
    try:
        return FaultReport.model_validate_json((data_dir / FAULTS_FILE).read_bytes())
    except (OSError, pydantic.ValidationError):
        return None


@dataclass(frozen=True)
class FaultRates:
    """Probability of each fault per message (fetch or push)."""

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    corrupt: float = 0.0
    max_delay_s: float = 0.2
    #: message kinds (push or fetch) left alone (e.g. "loco": trainer payloads)
    spare_kinds: tuple[str, ...] = ()
    #: when set, only messages of these kinds (push or fetch) are faulted
    only_kinds: tuple[str, ...] = ()
    #: when set, only messages to / fetches from these peer ids are faulted (one-way link faults)
    only_peers: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: FaultConfig) -> FaultRates:
        return cls(drop=cfg.drop, duplicate=cfg.duplicate, reorder=cfg.reorder, delay=cfg.delay,
                   corrupt=cfg.corrupt, max_delay_s=cfg.max_delay_s, spare_kinds=tuple(cfg.spare_kinds))

    def describe(self) -> str:
        rates = ", ".join(f"{getattr(self, f):.0%} {f}" for f in FAULTS if getattr(self, f))
        spared = f"; spared: {', '.join(self.spare_kinds)}" if self.spare_kinds else ""
        return (rates or "no faults") + spared


class FaultyTransport:
    """Wraps a transport; every fetch and push may be faulted according to ``rates``.

    ``faults`` counts injected faults by fault kind, ``faulted`` by message kind and fault
    (``"loco:drop"``); with ``report_to`` they are written there as a ``FaultReport`` whenever
    the node reads its transport's ``stats()``. A push held back to reorder it goes out after the
    next push.
    """

    def __init__(self, inner: Transport, rates: FaultRates, *, seed: int, report_to: Path | None = None) -> None:
        self.inner = inner
        self.report_to = report_to
        self.started_at = time.time()
        self.rates = rates
        self.rng = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.faulted: Counter[str] = Counter()
        self._held: list[tuple[PeerRecord, PushKind, bytes, float]] = []
        self._lock = threading.Lock()
        self.peer_id = inner.peer_id

    def _roll(self, fault: str, kind: str) -> bool:
        with self._lock:
            hit: bool = self.rng.random() < getattr(self.rates, fault)
            if hit:
                self.faults[fault] += 1
                self.faulted[f"{kind}:{fault}"] += 1
            return hit

    def _flip(self, data: bytes) -> bytes:
        """``data`` with one random bit flipped."""
        with self._lock:
            i, bit = self.rng.randrange(len(data)), self.rng.randrange(8)
        buf = bytearray(data)
        buf[i] ^= 1 << bit
        return bytes(buf)

    def _sleep(self) -> None:
        with self._lock:
            pause = self.rng.random() * self.rates.max_delay_s
        time.sleep(pause)

    def _targeted(self, peer: PeerRecord, kind: str) -> bool:
        r = self.rates
        return (kind not in r.spare_kinds and (not r.only_kinds or kind in r.only_kinds)
                and (not r.only_peers or peer.peer_id in r.only_peers))

    def publish(self, status: PeerStatus) -> None:
        self.inner.publish(status)

    def peers(self) -> list[PeerRecord]:
        return self.inner.peers()

    def fetch(self, peer: PeerRecord, request: FetchRequest, dest: Path, *, timeout: float,
              max_bytes: int | None = None) -> int:
        kind = kind_of(request)
        if not self._targeted(peer, kind):
            return self.inner.fetch(peer, request, dest, timeout=timeout, max_bytes=max_bytes)
        if self._roll("drop", kind):
            raise WireError(f"injected: {kind} fetch from {peer.peer_id} dropped")
        if self._roll("delay", kind):
            self._sleep()
        n = self.inner.fetch(peer, request, dest, timeout=timeout, max_bytes=max_bytes)
        if n and self._roll("corrupt", kind):
            dest.write_bytes(self._flip(dest.read_bytes()))
        return n

    def fetch_anchor(self, providers: list[PeerRecord], *, version: int, pieces: list[Piece], dest: Path,
                     timeout: float) -> AnchorFetch:
        """Dropped or delayed as a whole (its pieces are checked against signed digests anyway)."""
        if providers and self._targeted(providers[0], "anchor"):
            if self._roll("drop", "anchor"):
                raise WireError(f"injected: anchor {version} download dropped")
            if self._roll("delay", "anchor"):
                self._sleep()
        return self.inner.fetch_anchor(providers, version=version, pieces=pieces, dest=dest, timeout=timeout)

    def push(self, peer: PeerRecord, kind: PushKind, data: bytes, *, timeout: float) -> None:
        if not self._targeted(peer, kind):
            self.inner.push(peer, kind, data, timeout=timeout)
            return
        if self._roll("drop", kind):
            return  # lost silently, as on a real network
        if data and self._roll("corrupt", kind):
            data = self._flip(data)
        if self._roll("reorder", kind):
            with self._lock:
                self._held.append((peer, kind, data, timeout))  # delivered after the next push
            return
        if self._roll("delay", kind):
            self._sleep()
        self.inner.push(peer, kind, data, timeout=timeout)
        if self._roll("duplicate", kind):
            self._push_quietly(peer, kind, data, timeout)
        with self._lock:
            held, self._held = self._held, []
        for p, k, d, t in held:
            self._push_quietly(p, k, d, t)

    def _push_quietly(self, peer: PeerRecord, kind: PushKind, data: bytes, timeout: float) -> None:
        """A duplicate or late copy: its failure is not the current push's failure."""
        try:
            self.inner.push(peer, kind, data, timeout=timeout)
        except PulseError:
            pass

    def set_view(self, view: PeerView) -> None:
        """Passed through: the inner transport's per-peer budgets serve members first."""
        self.inner.set_view(view)

    def cap_pushes(self, kind: PushKind, cap: int) -> None:
        self.inner.cap_pushes(kind, cap)

    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]:
        return self.inner.events(max_items=max_items, wait_s=wait_s)

    def stats(self) -> DataPlane:
        if self.report_to is not None:
            write_atomic(self.report_to, self.report().model_dump_json().encode(), durable=False)
        return self.inner.stats()

    def report(self) -> FaultReport:
        """What this transport injected so far."""
        with self._lock:
            return FaultReport(started_at=self.started_at, faults=dict(self.faults), faulted=dict(self.faulted))

    def alive(self) -> bool:
        """Whether the wrapped transport's worker processes still run."""
        return self.inner.alive()

    def close(self) -> None:
        self.inner.close()


def faulty_factory(make: TransportFactory, cfg: FaultConfig) -> TransportFactory:
    """``make`` (a ``run_node`` transport factory) whose transport faults its own data plane at
    ``cfg``'s rates, seeded per peer; warns loudly on stderr (the node's log) when it starts."""
    rates = FaultRates.from_config(cfg)

    def make_faulty(node_cfg: RoleConfig, identity: Identity, store_root: Path) -> Transport:
        inner = make(node_cfg, identity, store_root)
        seed = int.from_bytes(hashlib.blake2b(f"{cfg.seed}:{inner.peer_id}".encode(), digest_size=8).digest(), "big")
        bar = "!" * 78
        print(f"{bar}\n!!! CHAOS TESTING: [net.faults] is enabled. This node deliberately faults its own\n"
              f"!!! fetches and pushes ({rates.describe()}).\n!!! Never enable this outside tests.\n{bar}",
              file=sys.stderr, flush=True)
        return FaultyTransport(inner, rates, seed=seed, report_to=Path(node_cfg.data_dir) / FAULTS_FILE)

    return make_faulty


class CrashingTransport:
    """Wraps a transport that dies like a crashed process just before sending a message for which
    ``when(kind, data)`` holds: that message and everything after it is lost, and the node leaves
    discovery (``inner.close()``). ``crashed_at`` is the wall time of the crash. Pushes go one at
    a time, so no push running at once with the fatal one (``push_to_all``) slips out after it."""

    def __init__(self, inner: Transport, when: Callable[[str, bytes], bool]) -> None:
        self.inner = inner
        self.when = when
        self.crashed_at: float | None = None
        self._lock = threading.Lock()

    @property
    def peer_id(self) -> str:
        return self.inner.peer_id

    def _check_alive(self) -> None:
        if self.crashed_at is not None:
            raise WireError("injected: this node has crashed")

    def publish(self, status: PeerStatus) -> None:
        if self.crashed_at is None:
            self.inner.publish(status)

    def peers(self) -> list[PeerRecord]:
        return [] if self.crashed_at is not None else self.inner.peers()

    def fetch(self, peer: PeerRecord, request: FetchRequest, dest: Path, *, timeout: float,
              max_bytes: int | None = None) -> int:
        self._check_alive()
        return self.inner.fetch(peer, request, dest, timeout=timeout, max_bytes=max_bytes)

    def fetch_anchor(self, providers: list[PeerRecord], *, version: int, pieces: list[Piece], dest: Path,
                     timeout: float) -> AnchorFetch:
        self._check_alive()
        return self.inner.fetch_anchor(providers, version=version, pieces=pieces, dest=dest, timeout=timeout)

    def push(self, peer: PeerRecord, kind: PushKind, data: bytes, *, timeout: float) -> None:
        with self._lock:
            self._check_alive()
            if self.when(kind, data):
                self.crashed_at = time.time()
                self.inner.close()
                raise WireError("injected: this node has crashed")
            self.inner.push(peer, kind, data, timeout=timeout)

    def set_view(self, view: PeerView) -> None:
        """Passed through: the inner transport's per-peer budgets serve members first."""
        if self.crashed_at is None:
            self.inner.set_view(view)

    def cap_pushes(self, kind: PushKind, cap: int) -> None:
        if self.crashed_at is None:
            self.inner.cap_pushes(kind, cap)

    def alive(self) -> bool:
        """Always: the test stops a crashed node itself (``crashed_at`` says when it died)."""
        return True

    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]:
        if self.crashed_at is not None:
            time.sleep(min(wait_s, 0.05))
            return []
        return self.inner.events(max_items=max_items, wait_s=wait_s)

    def stats(self) -> DataPlane:
        return self.inner.stats()

    def close(self) -> None:
        if self.crashed_at is None:
            self.inner.close()


class ForgedChain:
    """A well-formed chain of version records signed by a key nobody trusts, grown on demand
    (thread-safe), each with a random 64-byte "patch"."""

    def __init__(self, run_id: str, identity: Identity | None = None) -> None:
        from pulse_node.chain.identity import Identity

        self.run_id = run_id
        self.identity = identity or Identity.generate()
        self.records: list[VersionRecord] = []
        self._lock = threading.Lock()

    def record(self, version: int) -> VersionRecord:
        import os

        from pulse_node.chain.record import make_record

        with self._lock:
            while len(self.records) <= version:
                n, parent = len(self.records), self.records[-1] if self.records else None
                self.records.append(make_record(
                    self.identity, run_id=self.run_id, version=n, parent=parent, state_hash="ab" * 32,
                    patch=os.urandom(64) if n else None, anchor_version=0, is_anchor=n == 0,
                    codec="pulsesync/compact/1"))
            return self.records[version]


def start_forging_peer(hub: MemoryHub, files: Path, *, run_id: str, claimed_version: int = 10**6) -> Counter[str]:
    """A hostile peer on ``hub``: claims ``claimed_version``, serves records signed by a key nobody
    trusts (a well-formed chain) and random patch/anchor bytes. Returns requests served by kind."""
    import os

    from pulse_node.chain.record import encode_record
    from pulse_node.fsutil import write_atomic

    chain, served = ForgedChain(run_id), Counter[str]()

    def resolve(request: FetchRequest) -> Path:
        kind, v = kind_of(request), min(int(getattr(request, "version", 0) or 0), 10_000)
        path = Path(files) / f"{kind}-{v}"
        write_atomic(path, encode_record(chain.record(v)) if kind == "record" else os.urandom(4096))
        served[kind] += 1
        return path

    # announced as an inference peer: inference peers are preferred providers, so it is asked first
    hub.join("rogue", resolve).publish(PeerStatus(role="inference", version=claimed_version,
                                                  serves=Serves(lowest=0, highest=claimed_version, anchors=[0]),
                                                  node_key=chain.identity.public_key_hex))
    return served


class ForgingPeer:
    """The forging peer on the real network: its own DHT worker and wire worker processes.

    Joins the run's DHT under its own key and announces itself as an inference node (inference
    peers are asked first) holding ``claimed_version``. Its wire worker serves a store holding a
    forged chain of ``versions`` records (``ForgedChain``), random patch bytes and a random
    "anchor" 0; every ``push_every_s`` (``tick``) it pushes its forged head record to the
    inference nodes. ``served()``: requests its wire worker answered, by kind.
    """

    def __init__(self, root: Path, *, run_id: str, bootstrap: list[str], versions: int = 1000,
                 claimed_version: int = 10**6, host: str = "127.0.0.1", push_every_s: float = 5.0) -> None:
        from pulse_node.chain.identity import Identity
        from pulse_node.net.dht.client import DhtClient, DhtConfig
        from pulse_node.net.wire.client import WireClient, WireConfig

        self.root = Path(root)
        identity = Identity.load_or_create(self.root / "identity.key")
        self.chain = ForgedChain(run_id, identity)
        self._write_store(versions)
        self.push_every_s, self._pushed_at, self.heads_pushed = push_every_s, float("-inf"), 0
        self.wire = WireClient.start(WireConfig(store=self.root / "store", listen=[f"/ip4/{host}/tcp/0"],
                                                identity=self.root / "identity.key"), log_path=self.root / "wire.log")
        try:
            self.dht = DhtClient.start(DhtConfig(run_id=run_id, initial_peers=bootstrap,
                                                 host_maddrs=[f"/ip4/{host}/tcp/0"],
                                                 identity=self.root / "identity.key"), log_path=self.root / "dht.log")
        except BaseException:
            self.wire.stop()
            raise
        self._announce(claimed_version)

    def _write_store(self, versions: int) -> None:
        import os

        from pulse_node.chain.layout import store_path
        from pulse_node.chain.record import encode_record
        from pulse_node.fsutil import write_atomic

        store = self.root / "store"
        for v in range(versions):
            write_atomic(store_path(store, "record", v), encode_record(self.chain.record(v)))
            if v:
                write_atomic(store_path(store, "patch", v), os.urandom(64))
        write_atomic(store_path(store, "anchor", 0), os.urandom(4096))

    def _announce(self, claimed_version: int) -> None:
        info = self.wire.info()
        maddrs = [m if "/p2p/" in m else f"{m}/p2p/{info.peer_id}" for m in info.listen_maddrs]
        self.peer_id = info.peer_id
        self.dht.publish_peer(PeerStatus(role="inference", wire_maddrs=maddrs[:8], version=claimed_version,
                                         serves=Serves(lowest=0, highest=claimed_version, anchors=[0]),
                                         node_key=self.chain.identity.public_key_hex))

    def tick(self) -> None:
        """Push the forged head record to every inference node, at most every ``push_every_s``."""
        from pulse_node.chain.record import encode_record

        if time.monotonic() - self._pushed_at < self.push_every_s:
            return
        self._pushed_at = time.monotonic()
        head = encode_record(self.chain.records[-1])
        for rec in self.dht.peers():
            if rec.role == "inference" and rec.peer_id != self.peer_id and rec.wire_maddrs and not rec.leaving:
                try:
                    self.wire.push(rec.wire_maddrs[0], "head", head, timeout=5.0)
                    self.heads_pushed += 1
                except PulseError:
                    pass

    def served(self) -> dict[str, int]:
        return dict(self.wire.stats().requests)

    def close(self) -> None:
        for stop in (self.dht.stop, self.wire.stop):
            try:
                stop()
            except Exception:  # keep stopping the rest
                pass
