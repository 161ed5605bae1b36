"""A swarm whose DHT holds 40 newcomers' records (more than the 32 a node stores): every node,
a client-mode reader included, keeps seeing the members' fresh records within one record lifetime.

Before issue 34, a node whose newcomer share was full refused every replica answer that carried
a newcomer it would not store (hivemind drops a dictionary answer whole when one subkey fails),
so a reader without storage of its own saw the members' records age on its cache and vanish.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import wait_for
from test_net_dht import LOCAL, PULSE_NODE, RUN, read_maddr_line, tmp_dir  # noqa: F401  (fixture)

from pulse_node.chain.peer import PeerStatus
from pulse_node.net.dht.capped_storage import STORED_NEWCOMERS
from pulse_node.net.dht.client import DhtClient, DhtConfig
from pulse_node.testing.flood import BAIT_VERSION, flood

pytestmark = pytest.mark.slow  # DHT worker processes (hivemind, p2pd) and a flooding node

TTL = 5.0
NEWCOMERS = 40
#: the newcomers' records are refreshed every third of it (a record the validator accepts names an
#: ``updated_at`` no later than its expiration: the flood's is 25 s ahead)
FLOOD_TTL = 30.0


def test_members_fresh_records_reach_every_node_past_a_full_newcomer_share(tmp_dir) -> None:  # noqa: F811
    boot = subprocess.Popen([PULSE_NODE, "bootstrap", "--host-maddrs", *LOCAL, "--identity", str(tmp_dir / "nb.key"),
                             "--run-id", RUN], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    clients: list[DhtClient] = []
    floods: list[_Flood] = []
    try:
        maddr = read_maddr_line(boot, 60)
        configs = [DhtConfig(run_id=RUN, host_maddrs=LOCAL, initial_peers=[maddr], ttl_s=TTL,
                             identity=tmp_dir / f"n{i}.key", client_mode=i == 3) for i in range(4)]
        with ThreadPoolExecutor(4) as pool:  # two members, a node, and a reader without storage of its own
            clients = list(pool.map(DhtClient.start, configs))
        members = [c.info().peer_id for c in clients[:2]]
        for c in clients[:2]:
            c.publish_peer(PeerStatus(role="trainer", version=1))  # refreshed every TTL/3 by the worker
        for c in clients[2:]:
            c.publish_peer(PeerStatus(role="inference"))

        later = threading.Event()
        with ThreadPoolExecutor(2) as pool:  # both flooding nodes start at once; the second stores later
            floods = list(pool.map(lambda a: _Flood(maddr, keys=a[0], go=a[1]),
                                   [(STORED_NEWCOMERS, None), (NEWCOMERS - STORED_NEWCOMERS, later)]))
        # every view holds the first 32 newcomers: each node's share is full
        # ~1 s alone; a deadline, not a measure (next to a busy test file on 2 cores the whole test took 88 s)
        wait_for(lambda: all(_newcomers(c, members) >= STORED_NEWCOMERS for c in clients), timeout=180, interval=1,
                 what="32 newcomers in every view")
        later.set()  # then 8 more, while the shares are full
        worst = _stalest(clients, members, seconds=3 * TTL)
        assert worst <= TTL, f"a node saw a member's record {worst:.1f}s old (record lifetime {TTL}s)"
    finally:
        for f in floods:
            f.stop()
        for c in clients:
            c.stop(timeout=4)
        boot.kill()
        boot.wait(10)


class _Flood:
    """``keys`` fresh keys' records stored and refreshed by one flooding DHT node, on a thread."""

    def __init__(self, maddr: str, *, keys: int, go: threading.Event | None = None) -> None:
        self._stop, started = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(flood(
            RUN, [maddr], keys=keys, seconds=600, on_start=started.set, stop=self._stop, ttl_s=FLOOD_TTL, go=go)),
            daemon=True)
        self._thread.start()
        assert started.wait(90), "the flooding node did not start"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _newcomers(client: DhtClient, members: list[str]) -> int:
    return sum(p.version == BAIT_VERSION for p in client.peers(prefer=members))


def _stalest(clients: list[DhtClient], members: list[str], *, seconds: float) -> float:
    """Over ``seconds``, the oldest a member's freshest record got in any node's view (a member
    missing from a view counts as infinitely old)."""
    worst, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        for c in clients:
            seen = {p.peer_id: p.updated_at for p in c.peers(prefer=members)}
            now = time.time()
            worst = max([worst] + [now - seen[m] if m in seen else float("inf") for m in members])
        time.sleep(0.5)
    return worst
