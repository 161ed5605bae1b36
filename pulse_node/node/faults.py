"""Fault injection for chaos tests: a ``Transport`` wrapper that drops, duplicates, reorders,
delays and corrupts what crosses it (optionally only some kinds, to some peers), and counts every
fault by kind; a wrapper that dies like a crashed process at a chosen message.

Used by ``tests/test_node_chaos.py`` and ``bench/chaos.py``; production code never wraps its
transport. Faults are drawn from a seeded RNG so a failing run can be replayed.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pulse_node.errors import WireError
from pulse_node.node.transport import Event, PeerInfo, Transport


@dataclass(frozen=True)
class FaultRates:
    """Probability of each fault per message (fetch or push)."""

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    corrupt: float = 0.0
    max_delay_s: float = 0.2
    #: push kinds left alone (e.g. "loco": trainer payloads ride an authenticated stream)
    spare_kinds: tuple[str, ...] = ()
    #: when set, only messages of these kinds (push or fetch) are faulted
    only_kinds: tuple[str, ...] = ()
    #: when set, only messages to / fetches from these peer ids are faulted (one-way link faults)
    only_peers: tuple[str, ...] = ()


class FaultyTransport:
    """Wraps a transport; every fetch and push may be faulted according to ``rates``."""

    def __init__(self, inner: Transport, rates: FaultRates, *, seed: int) -> None:
        self.inner = inner
        self.rates = rates
        self.rng = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self._held: list[tuple[PeerInfo, str, bytes]] = []
        self._lock = threading.Lock()

    @property
    def peer_id(self) -> str:
        return self.inner.peer_id

    def _roll(self, kind: str) -> bool:
        with self._lock:
            hit = self.rng.random() < getattr(self.rates, kind)
            if hit:
                self.faults[kind] += 1
            return hit

    def _targeted(self, peer: PeerInfo, kind: str) -> bool:
        r = self.rates
        return (not r.only_kinds or kind in r.only_kinds) and (not r.only_peers or peer.peer_id in r.only_peers)

    def publish(self, info: PeerInfo) -> None:
        self.inner.publish(info)

    def peers(self) -> list[PeerInfo]:
        return self.inner.peers()

    def fetch(self, peer: PeerInfo, kind: str, params: dict[str, Any], dest: Path, *, timeout: float) -> int:
        if not self._targeted(peer, kind):
            return self.inner.fetch(peer, kind, params, dest, timeout=timeout)
        if self._roll("drop"):
            raise WireError(f"injected: {kind} fetch from {peer.peer_id} dropped")
        if self._roll("delay"):
            time.sleep(self.rng.random() * self.rates.max_delay_s)
        n = self.inner.fetch(peer, kind, params, dest, timeout=timeout)
        if n and self._roll("corrupt"):
            data = bytearray(dest.read_bytes())
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
            dest.write_bytes(bytes(data))
        return n

    def push(self, peer: PeerInfo, kind: str, data: bytes, *, timeout: float) -> None:
        if kind in self.rates.spare_kinds or not self._targeted(peer, kind):
            self.inner.push(peer, kind, data, timeout=timeout)
            return
        if self._roll("drop"):
            return  # lost silently, as on a real network
        if data and self._roll("corrupt"):
            buf = bytearray(data)
            buf[self.rng.randrange(len(buf))] ^= 1 << self.rng.randrange(8)
            data = bytes(buf)
        if self._roll("reorder"):
            self._held.append((peer, kind, data))  # delivered after the next push
            return
        if self._roll("delay"):
            time.sleep(self.rng.random() * self.rates.max_delay_s)
        self.inner.push(peer, kind, data, timeout=timeout)
        if self._roll("duplicate"):
            self.inner.push(peer, kind, data, timeout=timeout)
        held, self._held = self._held, []
        for p, k, d in held:
            self.inner.push(p, k, d, timeout=timeout)

    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]:
        return self.inner.events(max_items=max_items, wait_s=wait_s)

    def stats(self) -> dict[str, Any]:
        return {**self.inner.stats(), "faults": dict(self.faults)}

    def close(self) -> None:
        self.inner.close()


class CrashingTransport:
    """Wraps a transport that dies like a crashed process just before sending a message for which
    ``when(kind, data)`` holds: that message and everything after it is lost, and the node leaves
    discovery (``inner.close()``). ``crashed_at`` is the wall time of the crash."""

    def __init__(self, inner: Transport, when: Callable[[str, bytes], bool]) -> None:
        self.inner = inner
        self.when = when
        self.crashed_at: float | None = None

    @property
    def peer_id(self) -> str:
        return self.inner.peer_id

    def _check_alive(self) -> None:
        if self.crashed_at is not None:
            raise WireError("injected: this node has crashed")

    def publish(self, info: PeerInfo) -> None:
        if self.crashed_at is None:
            self.inner.publish(info)

    def peers(self) -> list[PeerInfo]:
        return [] if self.crashed_at is not None else self.inner.peers()

    def fetch(self, peer: PeerInfo, kind: str, params: dict[str, Any], dest: Path, *, timeout: float) -> int:
        self._check_alive()
        return self.inner.fetch(peer, kind, params, dest, timeout=timeout)

    def push(self, peer: PeerInfo, kind: str, data: bytes, *, timeout: float) -> None:
        self._check_alive()
        if self.when(kind, data):
            self.crashed_at = time.time()
            self.inner.close()
            raise WireError("injected: this node has crashed")
        self.inner.push(peer, kind, data, timeout=timeout)

    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]:
        if self.crashed_at is not None:
            time.sleep(min(wait_s, 0.05))
            return []
        return self.inner.events(max_items=max_items, wait_s=wait_s)

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()

    def close(self) -> None:
        if self.crashed_at is None:
            self.inner.close()


def start_forging_peer(hub, files: Path, *, run_id: str, claimed_version: int = 10**6) -> Counter:
    """A hostile peer on ``hub``: claims ``claimed_version``, serves records signed by a key nobody
    trusts (a well-formed chain) and random patch/anchor bytes. Returns requests served by kind."""
    import os

    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import encode_record, make_record
    from pulse_node.codec.state import write_atomic

    ident, chain, served, lock = Identity.generate(), [], Counter(), threading.Lock()

    def forged(v: int):
        with lock:
            return _extend(v)

    def _extend(v: int):
        while len(chain) <= v:
            n = len(chain)
            chain.append(make_record(ident, run_id=run_id, version=n, parent=chain[-1] if chain else None,
                                     state_hash="ab" * 32, patch=os.urandom(64) if n else None,
                                     anchor_version=0, is_anchor=n == 0, codec="pulsesync/compact/1"))
        return chain[v]

    def resolve(kind: str, params: dict):
        v = min(int(params.get("version", 0)), 10_000)
        path = Path(files) / f"{kind}-{v}"
        write_atomic(path, encode_record(forged(v)) if kind == "record" else os.urandom(4096))
        served[kind] += 1
        return path

    # announced as an inference peer: inference peers are preferred providers, so it is asked first
    hub.join("rogue", resolve).publish(PeerInfo(peer_id="rogue", role="inference", address="",
                                                version=claimed_version, lowest=0, anchors=[0],
                                                node_key=ident.public_key_hex))
    return served
