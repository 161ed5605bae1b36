"""Hostile peers on the real network, one function per attack of issue 13 (``bench/adversary.py``,
``tests/test_node_adversary.py``).

A ``Hostile`` is a peer with its own hivemind DHT worker and py-libp2p wire worker (the node's
own net clients), a fresh key and a store it serves. Every attack in ``ATTACKS`` takes one
(plus the run's bootstrap and id) and hammers the swarm until its deadline, speaking only the
real protocols, and returns what it tried and what it saw (``tried``, counts, ``evidence`` of
success such as its payload named in a round decision). Run one per process with
``python -m pulse_node.testing.attack``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from pulse_node.chain.peer import PeerRecord, PeerStatus, Serves
from pulse_node.errors import PulseError
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.protocol import StreamKind
from pulse_node.testing.faults import ForgedChain
from pulse_node.vocab import NodeRole, PushKind

#: what an attack tried and saw (printed as JSON by ``testing/attack.py``)
Report = dict[str, object]

HUGE_VERSION = 10**15


@dataclass
class Hostile:
    """One hostile peer: its own key, DHT and wire workers, a store under ``root``."""

    root: Path
    run_id: str
    bootstrap: list[str]
    host: str = "127.0.0.1"
    tally: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        from pulse_node.chain.identity import Identity
        from pulse_node.net.dht.client import DhtClient, DhtConfig
        from pulse_node.net.wire.client import WireClient, WireConfig

        self.root.mkdir(parents=True, exist_ok=True)
        self.identity = Identity.load_or_create(self.root / "identity.key")
        self.chain = ForgedChain(self.run_id, self.identity)
        self.wire = WireClient.start(WireConfig(store=self.root / "store", listen=[f"/ip4/{self.host}/tcp/0"],
                                                identity=self.root / "identity.key", max_streams=256),
                                     log_path=self.root / "wire.log")
        try:
            self.dht = DhtClient.start(DhtConfig(run_id=self.run_id, initial_peers=self.bootstrap,
                                                 host_maddrs=[f"/ip4/{self.host}/tcp/0"],
                                                 identity=self.root / "identity.key"), log_path=self.root / "dht.log")
        except BaseException:
            self.wire.stop()
            raise
        info = self.wire.info()
        self.peer_id = info.peer_id
        self.maddrs = [m if "/p2p/" in m else f"{m}/p2p/{info.peer_id}" for m in info.listen_maddrs][:8]

    def announce(self, role: NodeRole = "inference", version: int | None = None, **extra: Any) -> bool:
        serves = extra.pop("serves", Serves(lowest=0 if version is not None else None, highest=version))
        return self.dht.publish_peer(PeerStatus(role=role, wire_maddrs=extra.pop("wire_maddrs", self.maddrs),
                                                version=version, serves=serves,
                                                node_key=extra.pop("node_key", self.identity.public_key_hex), **extra))

    def others(self, role: str | None = None) -> list[PeerRecord]:
        return [r for r in self.dht.peers() if r.peer_id != self.peer_id and r.wire_maddrs and not r.leaving
                and r.role != "bootstrap" and (role is None or r.role == role)]

    def push(self, rec: PeerRecord, kind: PushKind, data: bytes, timeout: float = 5.0) -> bool:
        try:
            self.wire.push(rec.wire_maddrs[0], kind, data, timeout=timeout)
            self.tally[f"{kind}_pushed"] += 1
            return True
        except PulseError:
            self.tally[f"{kind}_push_failed"] += 1
            return False

    def fetch(self, rec: PeerRecord, request: wp.FetchRequest, *, max_bytes: int | None = 1 << 30,
              timeout: float = 20.0) -> bytes | None:
        kind = wp.kind_of(request)
        dest = self.root / "fetched" / f"{kind}-{os.urandom(4).hex()}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.wire.fetch(rec.wire_maddrs[0], request, dest, timeout=timeout, max_bytes=max_bytes)
            self.tally[f"{kind}_fetched"] += 1
            data = dest.read_bytes()
            dest.unlink(missing_ok=True)
            return data
        except (PulseError, OSError):
            self.tally[f"{kind}_fetch_failed"] += 1
            return None

    def close(self) -> None:
        for stop in (self.dht.stop, self.wire.stop):
            try:
                stop()
            except Exception:  # keep stopping the rest
                pass


def _loop(deadline: float, every: float, step: Callable[[], None]) -> None:
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            step()
        except PulseError:
            pass
        time.sleep(max(0.0, every - (time.monotonic() - t0)))


def _write(h: Hostile, kind: str, version: int, data: bytes) -> None:
    from pulse_node.chain.layout import store_path
    from pulse_node.fsutil import write_atomic

    write_atomic(store_path(h.root / "store", kind, version), data)


class _TrainerView(TypedDict):
    """What a hostile peer reads of a trusted trainer's state: the round base a payload must name."""

    base: bytes
    shapes: dict[str, tuple[int, ...]]
    round: int
    epoch: bytes


def _trainer_view(h: Hostile) -> tuple[_TrainerView, PeerRecord] | None:
    """A trusted trainer's state (anyone may fetch it): the round base a payload must name."""
    from safetensors import safe_open

    for rec in h.others("trainer"):
        data = h.fetch(rec, wp.TrainerStateRequest(), timeout=30.0)
        if not data:
            continue
        path = h.root / "trainer_state.safetensors"
        path.write_bytes(data)
        with safe_open(str(path), framework="numpy") as fh:
            meta = fh.metadata() or {}
            shapes = {k.split("/", 1)[1]: tuple(fh.get_slice(k).get_shape()) for k in fh if k.startswith("param/")}
        from pulse_node.chain.record import decode_record

        record = decode_record(bytes.fromhex(meta["pulse.record"]))
        return {"base": bytes.fromhex(meta.get("pulse.outer_hash", "00" * 32)), "shapes": shapes,
                "round": record.version, "epoch": bytes.fromhex(record.epoch)}, rec
    return None


# ---- 1: inject a payload and a decision into rounds -------------------------------------------------
def inject_payload(h: Hostile, deadline: float, *, scale: float = 1e4) -> Report:
    """Announce the trainer role, then every round push a payload named on the real base (values
    ``scale``) and a decision, signed by its own key, naming itself; look for itself in decisions."""
    import numpy as np

    from pulse_node.loco.decision import encode_decision, make_decision, payload_digest
    from pulse_node.loco.payload import LocoPayload, encode_payload

    h.announce("trainer", None)
    named: set[int] = set()

    def step() -> None:
        view = _trainer_view(h)
        if view is None:
            return
        st, _ = view
        for r in (st["round"], st["round"] + 1, st["round"] + 2):
            tensors = {n: (np.arange(0, int(np.prod(s)), 7, dtype=np.int64),
                           np.full(len(range(0, int(np.prod(s)), 7)), scale, dtype=np.float32))
                       for n, s in st["shapes"].items()}
            p = LocoPayload(round=r, trainer_id=h.peer_id, base_hash=st["base"], tensors=tensors,
                            numel={n: int(np.prod(s)) for n, s in st["shapes"].items()})
            data = encode_payload(p)
            digest = payload_digest(data)
            dec = encode_decision(make_decision(h.identity, run_id=h.run_id, round=r, base=st["base"], epoch=st["epoch"],
                                                coordinator=h.peer_id, contributors={h.peer_id: digest}))
            for rec in h.others("trainer"):
                h.push(rec, "loco", data)
                h.push(rec, "loco_decision", dec)
        for rec in h.others("trainer"):  # did any decision name us?
            for r in range(max(0, st["round"] - 3), st["round"] + 1):
                raw = h.fetch(rec, wp.LocoDecisionRequest(round=r), max_bytes=1 << 20, timeout=5.0)
                if raw and h.peer_id.encode() in raw:
                    named.add(r)

    _loop(deadline, 2.0, step)
    return {"tried": f"payloads (values x{scale:g}) + self-signed decisions into every round as a fresh "
                     f"key announcing the trainer role", "evidence": sorted(named), "succeeded": bool(named)}


# ---- 2: trust by default --------------------------------------------------------------------------
def trainer_role(h: Hostile, deadline: float) -> Report:
    """Announce the trainer role and push a self-signed chain's head at every node."""
    from pulse_node.chain.record import encode_record

    for v in range(50):
        _write(h, "record", v, encode_record(h.chain.record(v)))
    h.announce("trainer", 49)

    def step() -> None:
        for rec in h.others():
            h.push(rec, "head", encode_record(h.chain.record(49)))

    _loop(deadline, 1.0, step)
    return {"tried": "fresh key announces the trainer role, serves and pushes a self-signed chain"}


# ---- 3: a DHT record with a huge version / another peer's key --------------------------------------
def huge_version(h: Hostile, deadline: float) -> Report:
    """A record announcing version 1e15 under its own key, and (refused by the schema before it
    leaves?) one carrying a trusted trainer's key and another peer's address."""
    refused = Counter[str]()
    h.announce("inference", HUGE_VERSION, serves=Serves(lowest=0, highest=HUGE_VERSION, anchors=[HUGE_VERSION]))
    trainers = h.others("trainer")
    if trainers:
        t = trainers[0]
        for extra in ({"node_key": t.node_key}, {"wire_maddrs": t.wire_maddrs}):
            try:
                h.announce("trainer", HUGE_VERSION, **extra)
                refused["sent"] += 1
            except (PulseError, ValueError) as exc:
                refused[type(exc).__name__] += 1
    h.announce("inference", HUGE_VERSION, serves=Serves(lowest=0, highest=HUGE_VERSION, anchors=[HUGE_VERSION]))
    _loop(deadline, 1.0, lambda: None)
    return {"tried": "record announcing version 1e15; records with a trainer's key / address",
            "foreign_claims": dict(refused)}


# ---- 4: roll a trainer back ---------------------------------------------------------------------
def rollback(h: Hostile, deadline: float) -> Report:
    """Push genuine old head records (fetched from a trainer) and forged heads at every node,
    announcing the trainer role with an old version (re-sync bait)."""
    from pulse_node.chain.record import encode_record

    olds: list[bytes] = []
    for rec in h.others("trainer"):
        top = rec.version or 0
        for v in range(max(0, top - 6), max(0, top - 2)):  # still kept (keep_versions), older than the head
            data = h.fetch(rec, wp.RecordRequest(version=v), max_bytes=8 << 10, timeout=5.0)
            if data:
                olds.append(data)
        break
    h.announce("trainer", 1)

    def step() -> None:
        for rec in h.others():
            for data in olds + [encode_record(h.chain.record(5))]:
                h.push(rec, "head", data)

    _loop(deadline, 1.0, step)
    return {"tried": f"{len(olds)} genuine old heads + a forged head pushed, trainer role at version 1"}


# ---- 5: slow-drip streams ------------------------------------------------------------------------
def slow_drip(h: Hostile, deadline: float, *, streams: int = 48) -> Report:
    """Open ``streams`` data-plane streams per target that send a frame header and then stall (each
    held until the server's idle limit), on fetch and push protocols, over and over."""
    import struct

    bait = struct.pack(">I", 200) + b"\x80"  # declares a 200-byte frame (under every cap), sends one byte

    def hold(rec: PeerRecord, kind: StreamKind) -> None:
        while time.monotonic() < deadline:
            try:
                h.wire.probe(rec.wire_maddrs[0], kind, bait, timeout=min(30.0, max(1.0, deadline - time.monotonic())))
                h.tally["drip_answered"] += 1
            except PulseError:
                h.tally["drip_ended"] += 1

    targets = h.others()
    with ThreadPoolExecutor(max_workers=max(1, streams * max(1, len(targets)))) as pool:
        for rec in targets:
            for i in range(streams):
                pool.submit(hold, rec, ("push", "record", "push", "catchup")[i % 4])
    return {"tried": f"{streams} stalled streams at each of {len(targets)} nodes until the deadline"}


# ---- 6: bad anchor pieces / blame shifting ---------------------------------------------------------
def bad_anchor(h: Hostile, deadline: float) -> Report:
    """Copy the trainers' genuine records and serve them with garbage anchors and patches, as a
    co-provider of every anchor the swarm announces."""
    def step() -> None:
        for rec in h.others("trainer")[:1]:
            top = rec.version or 0
            anchors = list(rec.serves.anchors)
            for v in range(max(0, top - 20), top + 1):
                data = h.fetch(rec, wp.RecordRequest(version=v), max_bytes=8 << 10, timeout=5.0)
                if data:
                    _write(h, "record", v, data)
                    _write(h, "patch", v, os.urandom(256))
            for a in anchors[-4:]:
                _write(h, "anchor", a, os.urandom(64 << 10))
            h.announce("inference", top, serves=Serves(lowest=max(0, top - 20), highest=top, anchors=anchors[-8:]))

    _loop(deadline, 3.0, step)
    return {"tried": "serves genuine records with garbage patches and anchors, announced as a provider"}


# ---- 7: disk, memory, CPU -------------------------------------------------------------------------
def oversize(h: Hostile, deadline: float) -> Report:
    """Serve genuine records with 64 MiB bodies for their patches and anchors."""
    blob = os.urandom(1 << 20) * 64

    def step() -> None:
        for rec in h.others("trainer")[:1]:
            top = rec.version or 0
            for v in range(max(0, top - 5), top + 3):
                data = h.fetch(rec, wp.RecordRequest(version=v), max_bytes=8 << 10, timeout=5.0)
                if data:
                    _write(h, "record", v, data)
                    _write(h, "patch", v, blob)
            h.announce("inference", top + 2, serves=Serves(lowest=max(0, top - 5), highest=top + 2, anchors=[]))

    _loop(deadline, 2.0, step)
    return {"tried": "genuine records served with 64 MiB patch bodies"}


def catchup_flood(h: Hostile, deadline: float, *, workers: int = 8) -> Report:
    """Request catch-up patches for many distinct (base, target) pairs from every node."""
    pairs = iter(range(10**9))

    def one() -> None:
        while time.monotonic() < deadline:
            for rec in h.others():
                i = next(pairs)
                top = rec.version or 0
                base = i % max(1, top)
                h.fetch(rec, wp.CatchupRequest(base=base, target=top), max_bytes=64 << 20, timeout=10.0)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in range(workers):
            pool.submit(one)
    return {"tried": f"catch-up requests for distinct (base, target) pairs, {workers} at a time"}


def fake_trainers(h: Hostile, deadline: float) -> Report:
    """Announce the trainer role (so it counts as live) and park future-round payloads at trainers."""
    import numpy as np

    from pulse_node.loco.payload import LocoPayload, encode_payload

    h.announce("trainer", None)

    def step() -> None:
        view = _trainer_view(h)
        if view is None:
            return
        st, _ = view
        for r in range(st["round"] + 1, st["round"] + 6):
            tensors = {n: (np.arange(int(np.prod(s)), dtype=np.int64), np.random.randn(int(np.prod(s))).astype(np.float32))
                       for n, s in st["shapes"].items()}
            data = encode_payload(LocoPayload(round=r, trainer_id=h.peer_id, base_hash=os.urandom(32), tensors=tensors,
                                              numel={n: int(np.prod(s)) for n, s in st["shapes"].items()}))
            for rec in h.others("trainer"):
                h.push(rec, "loco", data)

    _loop(deadline, 2.0, step)
    return {"tried": "announces the trainer role, never contributes, parks dense payloads of 5 future rounds"}


def rollout_flood(h: Hostile, deadline: float) -> Report:
    """Push well-formed rollout batches of the current version (random tokens) as fast as it can."""
    from pulse_node.rl.rollout import Rollout, encode_rollouts

    def step() -> None:
        for rec in h.others("trainer"):
            v = rec.version or 0
            batch = [Rollout(prompt_ids=list(range(1, 9)), completion_ids=[3, 4, 5, 2], logprobs=[-1.0] * 4, reward=1.0,
                             version=v, problem_id=f"p{i // 4}", group_id=f"g{i // 4}", batch=i % 4, sample=i)
                     for i in range(32)]
            h.push(rec, "rollouts", encode_rollouts(batch))

    _loop(deadline, 0.05, step)
    return {"tried": "well-formed rollout batches of the current version, as fast as accepted"}


# ---- 8: smaller ---------------------------------------------------------------------------------
def smaller(h: Hostile, deadline: float) -> Report:
    """metrics_url at a local listener (SSRF bait), a wrong-run head record, a data-plane address
    of another peer (the schema refuses it before it leaves?)."""
    from pulse_node.chain.record import encode_record

    results: Report = {}
    try:
        h.announce("inference", None, metrics_url="http://127.0.0.1:9/ssrf")
        results["metrics_url_record"] = "published"
    except (PulseError, ValueError) as exc:
        results["metrics_url_record"] = f"refused: {type(exc).__name__}"
    other = ForgedChain("another-run", h.identity)
    trainers = h.others("trainer")
    if trainers:
        try:
            h.announce("inference", None, wire_maddrs=trainers[0].wire_maddrs)
            results["foreign_address_record"] = "published"
        except (PulseError, ValueError) as exc:
            results["foreign_address_record"] = f"refused: {type(exc).__name__}"
        h.announce("inference", None)

    def step() -> None:
        for rec in h.others():
            h.push(rec, "head", encode_record(other.record(3)))

    _loop(deadline, 1.0, step)
    return {"tried": "metrics_url SSRF bait, foreign data-plane address, wrong-run heads", **results}


#: an attack: a hostile peer and a deadline in, what it tried and saw out
Attack = Callable[[Hostile, float], Report]
ATTACKS: dict[str, Attack] = {
    "inject_payload": inject_payload, "trainer_role": trainer_role, "huge_version": huge_version,
    "rollback": rollback, "slow_drip": slow_drip, "bad_anchor": bad_anchor, "oversize": oversize,
    "catchup_flood": catchup_flood, "fake_trainers": fake_trainers, "rollout_flood": rollout_flood,
    "smaller": smaller,
}
#: attacks run by several fresh keys at once (Sybil): name -> (attack, keys)
SYBILS: dict[str, tuple[str, int]] = {"sybil_trainers": ("trainer_role", 4), "sybil_peers": ("huge_version", 6)}


def run_attack(name: str, root: Path, *, run_id: str, bootstrap: list[str], seconds: float,
               host: str = "127.0.0.1", attacks: dict[str, Attack] | None = None,
               sybils: dict[str, tuple[str, int]] | None = None, on_start: Callable[[], None] | None = None) -> Report:
    """Run attack ``name`` (one of ``attacks`` or ``sybils``, by default ``ATTACKS`` and
    ``SYBILS``) for ``seconds``; what it tried and saw."""
    attack, keys = (SYBILS if sybils is None else sybils).get(name, (name, 1))
    fn = (ATTACKS if attacks is None else attacks)[attack]
    peers: list[Hostile] = []
    try:
        with ThreadPoolExecutor(max_workers=keys) as pool:  # Sybil keys start their workers at once
            started = [pool.submit(Hostile, root / f"key-{i}", run_id, bootstrap, host) for i in range(keys)]
            for f in started:
                try:
                    peers.append(f.result())
                except Exception:
                    continue
        if len(peers) < keys:
            raise RuntimeError(f"{keys - len(peers)} of {keys} hostile peers did not start")
        deadline = time.monotonic() + seconds
        if on_start is not None:  # every key's workers run: the attack starts now
            on_start()
        out: list[Report] = [{}] * keys
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(peers[i], deadline)), daemon=True)
                   for i in range(keys)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        tally = sum((p.tally for p in peers), Counter())
        res = {**out[0], "keys": keys, "peer_ids": [p.peer_id for p in peers], "sent": dict(tally),
               "succeeded": any(o.get("succeeded") for o in out)}
        if keys > 1:
            res["tried"] = f"{keys} fresh keys at once: {res.get('tried', attack)}"
        return res
    finally:
        for p in peers:
            p.close()
