"""What ``pulse-node swarm`` shows while it runs: on stdout, or on stderr with ``--json`` (stdout
then holds only the JSON line).

On a terminal: the ``pulse-node status`` screen (``ops/render.py``, the same code) redrawn
twice a second, under a header of its own (run dir, bootstrap address, uptime). Without one
(piped, under systemd or docker) or with ``--json``: plain progress lines, one per version, and
a line per new alert (``swarm/progress.py``). At the end, a few lines of results and every alert
from the summary.
"""

from __future__ import annotations

import ipaddress
import sys
import time
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from pulse_node.ops.render import human_bytes, render
from pulse_node.ops.snapshot import SwarmSnapshot
from pulse_node.swarm.launcher import LocalSwarm
from pulse_node.swarm.progress import ProgressLines


class SwarmView:
    """The live screen (a terminal, not ``plain``) or progress lines (else) of one local swarm."""

    def __init__(self, swarm: LocalSwarm, *, plain: bool = False, stream: TextIO | None = None) -> None:
        self.swarm = swarm
        self.stream = stream or (sys.stderr if plain else sys.stdout)
        self.interactive = not plain and self.stream.isatty()
        self.console = Console(file=self.stream, highlight=False, force_terminal=self.interactive or None)
        self.live: Live | None = None
        self.progress = ProgressLines(self._line)
        self.t0 = time.monotonic()

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def started(self) -> None:
        self._line(f"pulse-node swarm: run dir {self.swarm.root}")
        self._line(f"bootstrap: {self.swarm.bootstrap_addr}")
        self._line(join_hint(self.swarm))
        if self.interactive:
            self.live = Live(self._screen(self.swarm.snapshot()), console=self.console, refresh_per_second=2,
                             transient=False)
            self.live.start()

    def say(self, text: str) -> None:
        """A line of the launcher's own (warm-up progress, a node's exit), above the live screen if any."""
        if self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            self._line(text)

    def _screen(self, snap: SwarmSnapshot) -> RenderableType:
        head = Text(f"pulse-node swarm  {time.monotonic() - self.t0:.0f}s  {len(self.swarm.children)} nodes"
                    f"  (Ctrl+C stops every node)", style="bold")
        return Group(head, render(snap))

    def tick(self) -> None:
        snap = self.swarm.snapshot()
        if self.live is not None:
            self.live.update(self._screen(snap))
        else:
            self.progress.update(snap)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
        else:
            self.progress.update(self.swarm.snapshot(), final=True)

    def final(self, summary: dict[str, Any]) -> None:
        c = self.console
        c.print(f"versions held by every node: {summary['versions']}")
        c.print(f"state hashes at that version agree: {summary['states_agree']}")
        if summary["bytes_dense_equivalent"]:
            ref = summary["smaller_than_reference"]
            c.print(f"patch bytes {human_bytes(summary['bytes_patch_total'])} vs dense "
                    f"{human_bytes(summary['bytes_dense_equivalent'])} ({summary['smaller_than_dense'] or 0:.1f}x "
                    f"smaller)" + (f", {ref:.1f}x smaller than the reference codec" if ref else ""))
        if summary["changed_fraction_mean"] is not None:
            c.print(f"BF16 entries changed per version: {summary['changed_fraction_mean'] * 100:.3g}% on average")
        if summary["catchups"]:
            c.print(f"catch-up patches: {summary['catchups']}, {human_bytes(summary['catchup_bytes'])} instead of "
                    f"{human_bytes(summary['catchup_replaced_bytes'])} of patches")
        if summary["eval_first"] is not None:
            c.print(f"held-out accuracy: {summary['eval_first']:.3f} -> {summary['eval_last']:.3f}")
        for a in summary["alerts"]:
            c.print(f"ALERT {a['level'].upper()} {a['kind']}: {a['message']}", markup=False, soft_wrap=True,
                    style="red" if a["level"] == "fail" else "yellow")
        if summary["failed"]:
            c.print(f"FAILED: {', '.join(summary['failed'])} (exit code 2)", style="bold red")


def join_hint(swarm: LocalSwarm) -> str:
    """How a node on another machine joins this swarm: a command that passes ``join``'s trust gate
    (the trainers' keys), or, while the swarm listens on loopback only, how to make it reachable."""
    keys = ", ".join(f'"{k}"' for k in swarm.trusted)
    if swarm.cfg.host == "localhost" or ipaddress.ip_address(swarm.cfg.host).is_loopback:
        return ("join from another machine: this swarm listens on 127.0.0.1 only; start it with "
                "--set host=<this machine's IP>, then run the command it prints there")
    return (f"join from another machine: pulse-node join --role inference --bootstrap {swarm.bootstrap_addr} "
            f"--set 'chain.trusted_trainers=[{keys}]' --set run_id={swarm.cfg.run_id}")
