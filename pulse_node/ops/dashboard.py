"""The live dashboard behind ``pulse-node status``: gather inputs, build a snapshot, draw it.

``Dashboard.snapshot()`` reads every configured source once (run dir and/or DHT) and returns a
``SwarmSnapshot``; between calls it remembers each inference node's mean reward at the
version it held, so the reward chart fills in while the dashboard runs even when the
version histories carry no reward. ``run_live`` redraws until Ctrl+C.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from pulse_node.daemon.status_model import Alert
from pulse_node.errors import PulseError
from pulse_node.ops.render import render
from pulse_node.ops.snapshot import NodeInput, SwarmSnapshot, build_snapshot
from pulse_node.ops.sources import DhtSource, bootstrap_address, read_run_dir


class Dashboard:
    """Owns its sources (a DHT client is stopped by ``close``)."""

    def __init__(self, *, run_dir: Path | None, dht: DhtSource | None, run_id: str | None,
                 bootstrap: str | None = None) -> None:
        self.run_dir, self.dht, self.run_id = run_dir, dht, run_id
        self.bootstrap = bootstrap
        self._rewards: dict[tuple[str, int], float] = {}
        self._notes: list[Alert] = []

    def _gather(self) -> tuple[list[NodeInput], list[dict[str, Any]], str]:
        nodes: list[NodeInput] = []
        peers: list[dict[str, Any]] = []
        where = []
        if self.run_dir is not None:
            nodes += read_run_dir(self.run_dir)
            where.append(f"run dir {self.run_dir}")
            self.bootstrap = self.bootstrap or bootstrap_address(self.run_dir)
        self._notes = []
        if self.dht is not None:
            try:
                more, peers = self.dht.read()
            except PulseError as exc:  # a slow or lost DHT read is shown, and retried next refresh
                self._notes.append(Alert(kind="source", level="warn", message=f"reading the DHT failed: {exc}"))
                more = []
            nodes += more
            where.append(f"DHT ({len(peers)} peer records)")
        return nodes, peers, " + ".join(where)

    def _remember_rewards(self, nodes: list[NodeInput]) -> dict[int, float]:
        for n in nodes:
            s = n.status
            if s is not None and s.role == "inference" and s.version >= 0 and s.reward_mean is not None:
                self._rewards[(s.peer_id or n.name, s.version)] = s.reward_mean
        by_version: dict[int, list[float]] = {}
        for (_node, v), r in self._rewards.items():
            by_version.setdefault(v, []).append(r)
        return {v: sum(rs) / len(rs) for v, rs in by_version.items()}

    def snapshot(self) -> SwarmSnapshot:
        nodes, peers, where = self._gather()
        run_filter = [n for n in nodes if not self.run_id or n.status is None or n.status.run_id == self.run_id]
        return build_snapshot(run_filter, peers, now=time.time(), run_id=self.run_id, source=where,
                              bootstrap=self.bootstrap, reward_samples=self._remember_rewards(run_filter),
                              notes=self._notes)

    def close(self) -> None:
        if self.dht is not None:
            self.dht.close()


def run_live(dash: Dashboard, console: Console, *, interval_s: float, stop: threading.Event) -> None:
    """Redraw every ``interval_s`` until ``stop`` is set (Ctrl+C sets it); the last screen stays current."""
    with Live(render(dash.snapshot()), console=console, refresh_per_second=4, screen=False) as live:
        while not stop.wait(interval_s):
            live.update(render(dash.snapshot()))
        live.update(render(dash.snapshot()))
