"""What ``pulse-node swarm`` shows while it runs: a live table of nodes (rich) on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pulse_node.swarm.launcher import LocalSwarm


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


class SwarmView:
    """Renders node status twice a second; silent with ``quiet`` (for --json)."""

    def __init__(self, swarm: LocalSwarm, *, quiet: bool) -> None:
        self.swarm = swarm
        self.quiet = quiet
        self.console = Console(file=sys.stderr)
        self.live: Live | None = None
        self.t0 = time.monotonic()

    def started(self) -> None:
        if self.quiet:
            return
        self.console.print(f"[bold]pulse-node swarm[/] run dir {self.swarm.root}")
        self.console.print(f"bootstrap: {self.swarm.bootstrap_addr}")
        self.console.print("join from another machine: pulse-node join --bootstrap <that address with a reachable IP> --role inference")
        self.live = Live(self._table(), console=self.console, refresh_per_second=2, transient=False)
        self.live.start()

    def tick(self) -> None:
        if self.live is not None:
            self.live.update(self._table())

    def _table(self) -> Table:
        t = Table(title=f"swarm ({time.monotonic() - self.t0:.0f}s)", expand=False)
        for col in ("node", "role", "version", "state hash", "patch bytes", "reward", "eval", "errors"):
            t.add_column(col)
        for child, s in self.swarm.statuses():
            t.add_row(child.name, child.role, str(s.get("version", "-")), str(s.get("state_hash", ""))[:12],
                      _mb(s.get("patch_bytes_total", 0)), f"{s.get('reward_mean', 0):.3f}",
                      f"{s['eval_accuracy']:.3f}" if "eval_accuracy" in s else "-", str(s.get("errors", 0)))
        return t

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()

    def final(self, summary: dict[str, Any]) -> None:
        c = self.console
        c.print(f"versions held by every node: {summary['versions']}")
        hashes = {n["state_hash"] for n in summary["nodes"] if n["version"] == summary["versions"]}
        c.print(f"state hashes at that version agree: {len(hashes) <= 1}")
        if summary["bytes_dense_equivalent"]:
            ratio = summary["bytes_dense_equivalent"] / max(summary["bytes_patch_total"], 1)
            c.print(f"patch bytes {_mb(summary['bytes_patch_total'])} vs dense {_mb(summary['bytes_dense_equivalent'])}"
                    f" ({ratio:.1f}x smaller)")
        if summary["eval_first"] is not None:
            c.print(f"held-out accuracy: {summary['eval_first']:.3f} -> {summary['eval_last']:.3f}")
