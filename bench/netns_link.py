"""Two network namespaces joined by a veth pair, optionally shaped with ``tc tbf`` (root only).

Used by the benches that time a transfer over a real bandwidth-limited link
(``bench/shaped_link.py``, ``bench/sync_1b.py``). Each bench names its own pair, so two benches
never share namespaces; ``down`` is idempotent and removes both namespaces (and with them the
veth pair). Only addresses inside these namespaces are used.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: link rates the benches know, in bytes per second ("10gbit": the bare veth, unshaped)
RATES = {"100mbit": 100e6 / 8, "1gbit": 1e9 / 8, "10gbit": 10e9 / 8}


def sh(*cmd: str, check: bool = True) -> None:
    subprocess.run(cmd, check=check, capture_output=True)


@dataclass(frozen=True)
class VethPair:
    """Namespaces ``ns_a``/``ns_b`` with devices ``dev_a``/``dev_b`` at ``ip_a``/``ip_b`` (a /30)."""

    ns_a: str
    ns_b: str
    dev_a: str
    dev_b: str
    ip_a: str
    ip_b: str

    def up(self, rate: str) -> None:
        """Create the pair (after removing any leftover), shaped to ``rate`` unless "10gbit"."""
        self.down()
        sh("ip", "netns", "add", self.ns_a)
        sh("ip", "netns", "add", self.ns_b)
        sh("ip", "link", "add", self.dev_a, "type", "veth", "peer", "name", self.dev_b)
        for ns, dev, ip in ((self.ns_a, self.dev_a, self.ip_a), (self.ns_b, self.dev_b, self.ip_b)):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/30", "dev", dev)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            if rate != "10gbit":
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                   "burst", "1mb" if rate == "1gbit" else "256kb", "latency", "50ms")

    def down(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            sh("ip", "netns", "del", ns, check=False)

    def serve(self, store: Path, ready: Path, stop: Path) -> None:
        """Run in namespace ``ns_a``: serve ``store`` on a wire worker at ``ip_a``, write its
        address to ``ready``, until ``stop`` exists."""
        from pulse_node.net.wire.client import WireClient, WireConfig

        with WireClient.start(WireConfig(store=store, listen=[f"/ip4/{self.ip_a}/tcp/0"])) as wire:
            me = wire.info()
            ready.write_text(next(m for m in me.listen_maddrs if self.ip_a in m) + f"/p2p/{me.peer_id}")
            while not stop.exists():
                time.sleep(0.1)

    def run_pair(self, script: Path, rate: str, store: Path, client_args: list[str], *,
                 start_timeout: float, timeout: float) -> dict:
        """Shape the pair to ``rate``; run ``script --serve store`` in ``ns_a`` (it calls ``serve``)
        and, once its address is written, ``script --client <addr> store <work> *client_args`` in
        ``ns_b``; the client's last stdout line, as JSON. Everything is torn down afterwards."""
        self.up(rate)
        tmp = Path(tempfile.mkdtemp(prefix="pulse-link-"))
        ready, stop = tmp / "ready", tmp / "stop"
        py = [sys.executable, str(script)]
        server = subprocess.Popen(["ip", "netns", "exec", self.ns_a, *py, "--serve", str(store), str(ready), str(stop)])
        try:
            deadline = time.monotonic() + start_timeout  # a loaded box starts the wire worker slowly
            while "/p2p/" not in (ready.read_text() if ready.exists() else "") and time.monotonic() < deadline:
                time.sleep(0.1)  # (the server's write_text makes the file before it fills it)
            (tmp / "work").mkdir()
            res = subprocess.run(["ip", "netns", "exec", self.ns_b, *py, "--client", ready.read_text(), str(store),
                                  str(tmp / "work"), *client_args], capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                raise RuntimeError(res.stderr[-3000:])
            out: dict = json.loads(res.stdout.strip().splitlines()[-1])
            return out
        finally:
            stop.write_text("1")
            server.wait(timeout=30)
            self.down()
            shutil.rmtree(tmp, ignore_errors=True)  # the client's copy of a dense anchor is the model's size
