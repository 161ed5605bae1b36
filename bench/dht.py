"""DHT discovery benchmark: worker start time, record propagation, read cost (local swarm).

    /work/venv/bin/python bench/dht.py [--rounds 20] [--peers 3]

Starts a bootstrap worker and ``--peers`` joined workers on 127.0.0.1, then measures, side by
side in one run:
- start: spawn -> ready for a worker without peers and for a joining worker, next to the cost
  of a bare ``import hivemind`` in a fresh interpreter (what dominates the start);
- propagation: one worker publishes a peer record with a new version; another polls every
  10 ms until it sees it (time from publish call to first sighting);
- read: the wall time of one ``peers()`` call (a full DHT lookup, latest=True).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from pulse_node.chain.peer import PeerStatus
from pulse_node.net.dht.client import DhtClient, DhtConfig

LOCAL = ["/ip4/127.0.0.1/tcp/0"]


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def import_seconds() -> float:
    _, dt = timed(subprocess.run, [sys.executable, "-c", "import hivemind.dht.node"], check=True)
    return dt


def propagation(src: DhtClient, dst: DhtClient, rounds: int) -> list[float]:
    out = []
    for i in range(1, rounds + 1):
        version = 1000 + i
        t = time.perf_counter()
        src.publish_peer(PeerStatus(role="trainer", version=version), ttl_s=30)
        while not any(p.version == version for p in dst.peers()):
            if time.perf_counter() - t > 30:
                raise RuntimeError(f"peer record version {version} not visible after 30 s")
            time.sleep(0.01)
        out.append(time.perf_counter() - t)
    return out


def summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(1000 * statistics.median(xs), 1), "p90_ms": round(1000 * xs[int(0.9 * (len(xs) - 1))], 1),
            "max_ms": round(1000 * xs[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--peers", type=int, default=3)
    args = ap.parse_args()
    imp = import_seconds()
    boot, boot_s = timed(DhtClient.start, DhtConfig(run_id="bench", host_maddrs=LOCAL))
    clients = []
    try:
        maddrs = boot.info().visible_maddrs
        cfg = DhtConfig(run_id="bench", host_maddrs=LOCAL, initial_peers=maddrs)
        joined, join_s = timed(DhtClient.start, cfg)
        clients.append(joined)
        with ThreadPoolExecutor(max(1, args.peers - 1)) as pool:
            clients += list(pool.map(lambda _: DhtClient.start(cfg), range(args.peers - 1)))
        src, dst = clients[0], clients[-1]
        peer_prop = propagation(src, dst, args.rounds)
        reads = [timed(dst.peers)[1] for _ in range(args.rounds)]
    finally:
        for c in clients:
            c.stop()
        boot.stop()
    result = {
        "bench": "dht", "peers": args.peers + 1, "rounds": args.rounds,
        "import_hivemind_s": round(imp, 2), "start_alone_s": round(boot_s, 2), "start_joined_s": round(join_s, 2),
        "start_over_import": round(join_s / imp, 2),
        "peer_propagation": summary(peer_prop), "peers_read": summary(reads),
    }
    print(f"import hivemind {imp:.2f}s | worker start alone {boot_s:.2f}s, joined {join_s:.2f}s "
          f"({join_s / imp:.2f}x the import)")
    print(f"peer record publish->visible: {summary(peer_prop)}")
    print(f"peers() read: {summary(reads)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
