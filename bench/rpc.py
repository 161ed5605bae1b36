"""The node <-> worker RPC: this tree against an earlier commit, side by side in one run.

Run: ``python bench/rpc.py [--base REF] [--rounds 3] [--polls 300]``

Each round starts one child process per variant (``--base``'s ``pulse_node``, extracted with
``git archive``, and this checkout's), alternating which goes first. A child starts two DHT workers
(push plane on, spools on) and two wire workers on 127.0.0.1 and times, through the public
clients, what a trainer's node does all the time:

- ``dht_poll`` / ``wire_poll``: one ``events()`` call on an empty queue (the node polls both
  planes every loop; median of ``--polls``);
- ``spool_push_40mb``: a 40 MB PULSELoCo payload pushed over p2pd through both spools, until the
  receiving node holds it (``push`` + ``events``; best of 3);
- ``p2pd_push_1mb``: a 1 MiB payload (the largest that still crosses the RPC as bytes; best of 10);
- ``wire_push_16mb``: a 16 MiB push on the py-libp2p plane, bytes through both workers' RPC (best of 3);
- ``stop_s``: stopping all four workers.

Prints each figure per variant and the ratio this/base (below 1: faster now); the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
LOCAL = ["/ip4/127.0.0.1/tcp/0"]


def _wire(store: Path):
    from pulse_node.net.wire import client as wire_client

    if hasattr(wire_client, "WireConfig"):
        return wire_client.WireClient.start(wire_client.WireConfig(store=store, listen=LOCAL))
    return wire_client.WireClient.start(store=store, listen=tuple(LOCAL))


def _drain(poll, want: int, timeout: float = 60.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{want} event(s) not received in {timeout:.0f} s")
        got += poll()
    return got


def _seconds(fn, n: int) -> list[float]:
    """How long each of ``n`` calls of ``fn`` took."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def child(polls: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from pulse_node.net.dht.client import DhtClient, DhtConfig

    rollouts = "rollouts" if Path(__import__("pulse_node").__file__).with_name("vocab.py").exists() else "rollout"
    with tempfile.TemporaryDirectory(prefix="pulse-bench-rpc-") as d:
        base = Path(d)
        with ThreadPoolExecutor(4) as pool:
            dhts = [pool.submit(DhtClient.start, DhtConfig(run_id="bench-rpc", host_maddrs=LOCAL, accept_pushes=True,
                                                           spool_dir=base / f"spool{i}")) for i in range(2)]
            wires = [pool.submit(_wire, base / f"store{i}") for i in range(2)]
            (sender, receiver), (wa, wb) = [f.result() for f in dhts], [f.result() for f in wires]
        try:
            info, addr = receiver.info(), wb.info().listen_maddrs[0]
            rid, maddrs = info.peer_id, info.visible_maddrs
            out = {"dht_poll": statistics.median(_seconds(receiver.events, polls)),
                   "wire_poll": statistics.median(_seconds(lambda: wb.events(wait_s=0.0), polls))}
            big, small, roll = os.urandom(40_000_000), os.urandom(MiB), os.urandom(16 * MiB)

            def p2pd(body: bytes) -> None:
                sender.push(rid, maddrs, "loco", body, timeout=120)
                assert len(_drain(receiver.events, 1)[0].data) == len(body)

            def wire() -> None:
                wa.push(addr, rollouts, roll, timeout=120)
                assert len(_drain(lambda: wb.events(wait_s=1.0), 1)[0].data) == len(roll)

            out["spool_push_40mb"] = min(_seconds(lambda: p2pd(big), 3))
            out["p2pd_push_1mb"] = min(_seconds(lambda: p2pd(small), 10))
            out["wire_push_16mb"] = min(_seconds(wire, 3))
        finally:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda c: c.stop(), (sender, receiver, wa, wb)))
            out["stop_s"] = time.perf_counter() - t0
    return out


def extract(ref: str, into: Path) -> Path:
    """``ref``'s ``pulse_node`` package under ``into`` (an import root for PYTHONPATH)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "pulse_node"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run_child(root: Path, polls: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, __file__, "--child", "--polls", str(polls)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"child under {root} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD~1", help="git ref to compare against (default HEAD~1)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--polls", type=int, default=300)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.polls)))
        return
    with tempfile.TemporaryDirectory(prefix="pulse-bench-base-") as d:
        roots = {"base": extract(args.base, Path(d)), "this": ROOT}
        runs: dict[str, list[dict]] = {"base": [], "this": []}
        for r in range(args.rounds):
            for name in (("base", "this") if r % 2 == 0 else ("this", "base")):
                runs[name].append(run_child(roots[name], args.polls))
                print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    summary = {}
    for key in runs["this"][0]:
        base, this = (statistics.median(x[key] for x in runs[n]) for n in ("base", "this"))
        summary[key] = {"base": base, "this": this, "ratio": this / base}
        unit, scale = ("us", 1e6) if key.endswith("poll") else ("s", 1.0)
        print(f"{key:16s} base {base * scale:9.3f} {unit}   this {this * scale:9.3f} {unit}   this/base {this / base:.2f}")
    print(json.dumps({"bench": "rpc", "base": args.base, "rounds": args.rounds, "results": summary}))


if __name__ == "__main__":
    main()
