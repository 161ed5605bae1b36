"""Chaos on the real data plane: a ``LocalSwarm`` of separate processes whose nodes fault their
own fetches and pushes (``[net.faults]``, a testing option), nodes killed with SIGKILL at random
times and restarted on the same data dir, and a forging peer on the real network.

``ProcessChaos.tick()`` drives the schedule (kill one node at a time: its role process only, the
whole node, or one of its worker processes; restart it once its processes are gone) and lets a
``ChaosLedger`` read every node's status (``StatusReport``), so every state an inference node applied or held
is checked against what the trainers published even across restarts (a node's status history
starts empty again in each life). Used by ``tests/test_node_chaos.py`` (short) and
``bench/chaos.py --processes`` (long).
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pulse_node.config import SwarmConfig
from pulse_node.daemon.status_model import StatusReport
from pulse_node.swarm.launcher import Child, LocalSwarm
from pulse_node.testing.faults import FaultReport, read_fault_report

if TYPE_CHECKING:
    import psutil

    from pulse_node.testing.faults import ForgingPeer

KILL_MODES = ("role", "node", "dht", "wire")
#: counters summed over every life of every node of a role (names declared in daemon/status_model.py)
INFERENCE_COUNTERS = ("anchor_loads", "catchups", "gaps", "patches_applied", "fetch_errors", "apply_errors")
TRAINER_COUNTERS = ("resyncs", "forks", "rounds_left_out", "decisions_rejected", "decision_conflicts",
                    "decisions_made", "decisions_pulled", "loco_fetched", "rollouts_in")
ORPHAN_WAIT_S = 20.0  # a node whose role process was killed: its workers must be gone by then
NOTICE_WAIT_S = 60.0  # a node one of whose workers was killed: it must have exited by then


class ChaosLedger:
    """What every node published, applied and held, across restarts (read from status.json)."""

    def __init__(self) -> None:
        self.published: dict[int, dict[str, str]] = defaultdict(dict)  # version -> trainer -> state hash
        self.held: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))  # node -> version -> hashes
        self.stored: dict[str, dict[int, str]] = defaultdict(dict)  # node -> version -> hash of its store record
        self.lives: dict[tuple[str, float], StatusReport] = {}  # (node, started_at) -> its last status
        self.fault_lives: dict[tuple[str, float], FaultReport] = {}  # (node, started_at) -> faults it injected
        self.head = -1
        self.max_lag = 0
        self.last_lag: dict[str, int] = {}

    def poll(self, children: list[Child]) -> None:
        polled = [(c, s) for c in children if (s := c.status()) is not None]
        for c in children:
            if (f := read_fault_report(c.data_dir)) is not None:
                self.fault_lives[(c.name, f.started_at)] = f
        for c, s in polled:
            self.lives[(c.name, s.started_at)] = s
            if c.role == "trainer":
                for h in s.history:
                    self.published[h.version].setdefault(c.name, h.state_hash)
                self.head = max(self.head, s.version)
                continue
            seen = self.held[c.name]
            for v, state_hash in s.held().items():
                seen[v].add(state_hash)
        for c, s in polled:  # lag of every inference node whose process runs (restarted ones included)
            if c.role == "inference" and c.proc.poll() is None and s.version >= 0 and self.head >= 0:
                self.last_lag[c.name] = self.head - s.version
                self.max_lag = max(self.max_lag, self.last_lag[c.name])

    def read_stores(self, children: list[Child]) -> None:
        """Add every record in the nodes' stores (after the swarm stopped): trainers' to what was
        published, inference nodes' to what they accepted."""
        from pulse_node.chain.layout import parse_version
        from pulse_node.chain.record import decode_record

        for c in children:
            for path in sorted((c.data_dir / "store" / "records").glob("*.rec")):
                if parse_version(path, ".rec") is None:
                    continue
                rec = decode_record(path.read_bytes())
                if c.role == "trainer":
                    self.published[rec.version].setdefault(f"{c.name}/store", rec.state_hash)
                else:
                    self.stored[c.name][rec.version] = rec.state_hash

    def counters(self, role: str, keys: tuple[str, ...]) -> dict[str, int]:
        """``keys`` (counters of ``role``'s section) and ``rejected`` summed over every life of
        every node of ``role``."""
        out: Counter[str] = Counter()
        for s in self.lives.values():
            section = getattr(s, role) if s.role == role else None
            if section is None:
                continue
            for k in keys:
                out[k] += getattr(section, k)
            out["rejected"] += s.counters.rejected
        return dict(out)

    def faults(self) -> tuple[dict[str, int], dict[str, int]]:
        """Faults injected, by fault kind and by ``message kind:fault``, over all lives."""
        by_fault: Counter[str] = Counter()
        by_message: Counter[str] = Counter()
        for f in self.fault_lives.values():
            by_fault.update(f.faults)
            by_message.update(f.faulted)
        return dict(by_fault), dict(sorted(by_message.items()))

    def strikes_of(self, peer_id: str) -> int:
        """Records (or patches) from ``peer_id`` that inference nodes rejected, over all lives."""
        return sum(s.inference.strikes.get(peer_id, 0) for s in self.lives.values() if s.inference is not None)

    def honest_strikes(self) -> dict[str, int]:
        """Strikes inference nodes gave to swarm members (whose damaged data was injected), and
        the bans those strikes caused (each ends; repeated bans grow, see ``peers/strikes.py``)."""
        members = {s.peer_id for s in self.lives.values()}
        inference = [s.inference for s in self.lives.values() if s.inference is not None]
        given = [n for c in inference for p, n in c.strikes.items() if p in members]
        bans = [n for c in inference for p, n in c.bans.items() if p in members]
        return {"strikes": sum(given), "bans": sum(bans)}

    def check(self) -> dict[str, Any]:
        """Held and stored states against the trainers' published state hashes, per version."""
        truth = {v: set(by.values()) for v, by in self.published.items()}
        forks = sorted(v for v, hashes in truth.items() if len(hashes) > 1)
        out = Counter[str]()
        wrong: list[str] = []
        for name, versions in self.held.items():
            for v, hashes in versions.items():
                for h in hashes:
                    key = "held_unverified" if v not in truth else "held_checked"
                    out[key] += 1
                    if v in truth and h not in truth[v]:
                        wrong.append(f"{name}@{v}")
        for name, records in self.stored.items():
            for v, h in records.items():
                out["stored_unverified" if v not in truth else "stored_checked"] += 1
                if v in truth and h not in truth[v]:
                    wrong.append(f"{name}@{v} (store)")
        return {**dict(out), "corrupted_states_used": len(wrong), "wrong": wrong[:10],
                "trainer_versions_compared": sum(len(by) > 1 for by in self.published.values()),
                "trainer_disagreements": forks[:20], "trainer_disagreement_count": len(forks)}


@dataclass
class ChaosPlan:
    """What to break, and how often."""

    kill_every_s: float = 30.0
    kill_modes: tuple[str, ...] = KILL_MODES
    kill_trainers: bool = True
    forger: bool = True
    forged_versions: int = 1000
    seed: int = 0


@dataclass
class _Down:
    child: Child
    mode: str  # a kill mode, or "exit" (it exited without being killed)
    tree: list[psutil.Process] = field(default_factory=list)
    at: float = field(default_factory=time.monotonic)
    exit_seen: bool = False


class ProcessChaos:
    """A local process swarm plus the kill/restart schedule and the forging peer."""

    def __init__(self, cfg: SwarmConfig, plan: ChaosPlan, *,
                 log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> None:
        self.cfg, self.plan, self.log = cfg, plan, log
        self.swarm = LocalSwarm(cfg, log=log)
        self.ledger = ChaosLedger()
        self.rng = random.Random(plan.seed)
        self.forger: ForgingPeer | None = None
        self.down: dict[str, _Down] = {}
        self.kills: Counter[str] = Counter()  # "role:mode"
        self.restarts = 0
        self.exit_codes: Counter[str] = Counter()  # "mode:code" of nodes that exited on their own
        self.orphans_killed = 0  # processes still running ORPHAN_WAIT_S after their node was killed
        self.not_noticed = 0  # nodes still running NOTICE_WAIT_S after one of their workers was killed
        self.unexpected: list[str] = []
        self.rogue_served: dict[str, Any] = {}
        self.started = time.monotonic()
        self._next_kill = float("inf")
        self._spawned: dict[str, float] = {}  # node -> wall time its current process was started

    def start(self) -> None:
        from pulse_node.testing.faults import ForgingPeer

        spawned = time.time()
        self.swarm.start()
        self._spawned = {c.name: spawned for c in self.swarm.children}
        if self.plan.forger:
            self.forger = ForgingPeer(self.swarm.root / "rogue", run_id=self.cfg.run_id,
                                      bootstrap=[self.swarm.bootstrap_addr], versions=self.plan.forged_versions,
                                      host=self.cfg.host)
        self.started = time.monotonic()
        self._schedule()

    def _schedule(self) -> None:
        self._next_kill = time.monotonic() + self.plan.kill_every_s * self.rng.uniform(0.5, 1.5)

    def tick(self) -> None:
        """Read statuses, push the forger's head, restart what is down, kill when it is time."""
        self.ledger.poll(self.swarm.children)
        if self.forger is not None:
            self.forger.tick()
        self._recover()
        if not self.down and time.monotonic() >= self._next_kill:
            self.kill_one()
            self._schedule()

    def kill_one(self, *, role: str | None = None, mode: str | None = None) -> Child | None:
        """SIGKILL (part of) one running node that holds a version; never the last live trainer."""
        up = [c for c in self.swarm.children if c.proc.poll() is None and c.name not in self.down
              and (s := self.current_status(c)) is not None and s.version >= 0]
        trainers_up = sum(c.role == "trainer" for c in up)
        pool = [c for c in up if (role is None or c.role == role)
                and (c.role == "inference" or (self.plan.kill_trainers and trainers_up > 1))]
        if not pool:
            return None
        child = self.rng.choice(pool)
        mode = mode or self.rng.choice(self.plan.kill_modes)
        self.down[child.name] = _Down(child, mode, self.swarm.kill(child, mode))
        self.kills[f"{child.role}:{mode}"] += 1
        self.log(f"chaos: killed {child.name} ({mode}) at version {child.version()}")
        return child

    def node(self, name: str) -> Child:
        """The node called ``name`` as it runs now (``restart`` replaces its ``Child``)."""
        return next(c for c in self.swarm.children if c.name == name)

    def current_status(self, c: Child) -> StatusReport | None:
        """``c``'s status if its current process wrote it, else None (a restarted node's file is
        its previous life's until the new process writes one)."""
        s = c.status()
        return s if s is not None and s.started_at >= self._spawned.get(c.name, 0.0) else None

    def _recover(self) -> None:
        now = time.monotonic()
        for c in list(self.swarm.children):
            down, exited = self.down.get(c.name), c.proc.poll() is not None
            if down is None:
                if exited:  # nobody killed it
                    self.unexpected.append(f"{c.name} exited with code {c.proc.returncode}")
                    self.down[c.name] = _Down(c, "exit")
                continue
            if not exited:
                if now - down.at > NOTICE_WAIT_S:
                    self.not_noticed += 1
                    down.tree = self.swarm.kill(c, "node")
                continue
            if down.mode in ("dht", "wire", "exit") and not down.exit_seen:
                self.exit_codes[f"{down.mode}:{c.proc.returncode}"] += 1
                down.exit_seen = True
            if not self.swarm.gone(down.tree):
                if now - down.at < ORPHAN_WAIT_S:
                    continue
                self.orphans_killed += sum(p.is_running() for p in down.tree)
                LocalSwarm.kill_leftovers(down.tree)
            self._spawned[c.name] = time.time()
            self.swarm.restart(c)
            self.restarts += 1
            del self.down[c.name]
            self.log(f"chaos: restarted {c.name} after {now - down.at:.1f} s down")

    def close(self) -> None:
        """Stop everything, then read the stores (records of every version each node kept)."""
        try:
            self.ledger.poll(self.swarm.children)
        finally:
            try:
                if self.forger is not None:
                    self.rogue_served = self.forger.served()
                    self.forger.close()
            finally:
                self.swarm.stop()
        self.ledger.read_stores(self.swarm.children)

    def summary(self) -> dict[str, Any]:
        by_fault, by_message = self.ledger.faults()
        return {
            "minutes": round((time.monotonic() - self.started) / 60, 2),
            "versions_published": self.ledger.head,
            **self.ledger.check(),
            "faults_by_kind": by_fault, "faults_by_message": by_message,
            "kills": dict(self.kills), "restarts": self.restarts, "exit_codes": dict(self.exit_codes),
            "orphans_killed": self.orphans_killed, "dead_worker_not_noticed": self.not_noticed,
            "unexpected_exits": self.unexpected[:10],
            "inference": self.ledger.counters("inference", INFERENCE_COUNTERS),
            "trainers": self.ledger.counters("trainer", TRAINER_COUNTERS),
            "max_lag_versions": self.ledger.max_lag, "final_lag": dict(self.ledger.last_lag),
            "forged_rejected": self.ledger.strikes_of(self.forger.peer_id) if self.forger else 0,
            "honest_peers_struck": self.ledger.honest_strikes(),
            "rogue_served": self.rogue_served, "rogue_heads_pushed": self.forger.heads_pushed if self.forger else 0,
        }
