"""Two network namespaces joined by a veth pair, optionally shaped with ``tc tbf`` (root only).

Used by the benches that time a transfer over a real bandwidth-limited link
(``bench/shaped_link.py``, ``bench/sync_1b.py``). Each bench names its own pair, so two benches
never share namespaces; ``down`` is idempotent and removes both namespaces (and with them the
veth pair). Only addresses inside these namespaces are used.
"""

from __future__ import annotations

import subprocess
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
