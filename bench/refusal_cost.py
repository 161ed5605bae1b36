"""What refusing one stream costs the refusing wire worker: reset before negotiation vs ``busy`` after.

    python bench/refusal_cost.py [--requests 1500] [--threads 8] [--rounds 2]

Two wire worker processes on 127.0.0.1: a victim with a tiny request budget (1 stream/s, burst 1)
and a sender that asks it for the head record ``--requests`` times from ``--threads`` threads.
Side by side, alternating, ``--rounds`` times each:

- ``after``: the sender has its own bucket (the victim names no peers with standing), so each
  refusal happens after py-libp2p negotiated the protocol and the victim read the request: a
  ``busy`` reply (``StreamPools.open``);
- ``before``: the victim names another peer with standing, so the sender is a newcomer, and its
  streams over the newcomers' bucket are reset by the muxer before negotiation
  (``net/wire/gate.py``).

Per mode: the victim worker's CPU seconds per refused stream (``psutil`` on its process), the
sender's, and refusals per second. Last line: JSON with ``victim_cpu_per_refusal_ratio``
(before / after).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu(client) -> float:
    import psutil

    t = psutil.Process(client._process.proc.pid).cpu_times()
    return t.user + t.system


def one_round(victim, sender, addr: str, tmp: Path, requests: int, threads: int, mode: str) -> dict:
    from pulse_node.errors import PeerUnavailable
    from pulse_node.net.wire import protocol as wp

    # "after": the sender has standing (its own bucket, taken after negotiation); "before": only
    # another peer has, so the sender is a newcomer, admitted (or reset) before negotiation
    victim.set_standing([sender.info().peer_id] if mode == "after" else ["12D3KooWAnotherPeerWithStanding"])
    time.sleep(1.5)  # the bucket refills (one token a second) so both modes start alike
    outcomes = {"ok": 0, "refused": 0}

    def ask(i: int) -> None:
        try:
            sender.fetch(addr, wp.RecordRequest(version=None), tmp / f"{mode}{i}", timeout=10.0)
            outcomes["ok"] += 1
        except PeerUnavailable:
            outcomes["refused"] += 1

    v0, s0, t0 = _cpu(victim), _cpu(sender), time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(ask, range(requests)))
    dt = time.monotonic() - t0
    v, s = _cpu(victim) - v0, _cpu(sender) - s0
    n = max(1, outcomes["refused"])
    return {"mode": mode, **outcomes, "seconds": dt, "victim_cpu_s": v, "sender_cpu_s": s,
            "victim_ms_per_refusal": 1e3 * v / n, "sender_ms_per_request": 1e3 * s / requests,
            "refusals_per_s": outcomes["refused"] / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from pulse_node.net.peers.budget import BudgetConfig
    from pulse_node.net.wire.client import WireClient, WireConfig

    with tempfile.TemporaryDirectory(prefix="pulse-refusal-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "victim").mkdir()
        (tmp / "sender").mkdir()
        budget = BudgetConfig(requests_per_s=1.0, request_burst=1.0)
        victim = WireClient.start(WireConfig(store=tmp / "victim", budget=budget))
        sender = WireClient.start(WireConfig(store=tmp / "sender"))
        try:
            victim.set_head(b"a signed head record")
            addr = victim.info().listen_maddrs[0]
            rows = []
            for r in range(args.rounds):
                for mode in (("after", "before") if r % 2 == 0 else ("before", "after")):
                    rows.append(one_round(victim, sender, addr, tmp, args.requests, args.threads, mode))
                    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}),
                          flush=True)
        finally:
            sender.stop()
            victim.stop()
    best = {m: min(r["victim_ms_per_refusal"] for r in rows if r["mode"] == m) for m in ("after", "before")}
    print(f"victim CPU per refused stream: after negotiation {best['after']:.2f} ms, before it "
          f"{best['before']:.2f} ms ({best['before'] / best['after']:.2f}x)")
    print(json.dumps({"bench": "refusal_cost", "rows": rows, "victim_ms_per_refusal": best,
                      "victim_cpu_per_refusal_ratio": best["before"] / best["after"]}))


if __name__ == "__main__":
    main()
