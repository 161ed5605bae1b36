"""docker-compose.yml with its defaults, measured: time to each node's first versions, versions
reached, state-hash agreement across the containers, what the host's ``pulse-node status`` sees.

Needs a Docker engine with Compose v2 and the image built (``docker compose build``). Runs the
project ``pulserun`` with a Docker-chosen host port for the bootstrap, reads each node's
``/data/status.json`` every 5 s through ``docker compose exec``, and always ends with
``docker compose down -v``. Results: bench/RESULTS.md "Docker image and a fresh machine".

    python bench/compose_run.py --minutes 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NODES = ("trainer-0", "trainer-1", "inference-0", "inference-1")
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}, "PULSE_BOOTSTRAP_PORT": ""}


def compose(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "compose", "-p", "pulserun", "-f", str(REPO / "docker-compose.yml"), *args],
                          capture_output=True, text=True, timeout=timeout, env=ENV, stdin=subprocess.DEVNULL)


def status(service: str) -> dict:
    r = compose("exec", "-T", service, "cat", "/data/status.json", timeout=30)
    try:
        return json.loads(r.stdout) if r.returncode == 0 else {}
    except ValueError:
        return {}


def hash_at(st: dict, version: int) -> str | None:
    return next((h["state_hash"] for h in st.get("history", []) if h.get("version") == version), None)


def watch(minutes: float, t0: float) -> dict:
    """Seconds after ``t0`` at which each node first held versions 0, 1 and 2."""
    first: dict[str, list[float | None]] = {s: [None, None, None] for s in NODES}
    while time.monotonic() - t0 < minutes * 60:
        for s in NODES:
            v = status(s).get("version", -1)
            for k in range(3):
                if v >= k and first[s][k] is None:
                    first[s][k] = round(time.monotonic() - t0)
        time.sleep(5)  # sampling period of the measurement
    return first


def host_status() -> dict:
    port = compose("port", "bootstrap", "31337").stdout.strip().rsplit(":", 1)[1]
    peer = compose("exec", "-T", "bootstrap", "cat", "/shared/bootstrap.maddrs").stdout.split()[0].rsplit("/p2p/", 1)[1]
    r = subprocess.run([sys.executable, "-m", "pulse_node", "status", "--bootstrap", f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}",
                        "--run-id", "pulse-local", "--once", "--json"], capture_output=True, text=True, timeout=120)
    return json.loads(r.stdout) if r.stdout.strip() else {"error": r.stderr[-500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the swarm runs")
    args = ap.parse_args()
    t0 = time.monotonic()
    try:
        up = compose("up", "-d", timeout=600)
        if up.returncode != 0:
            sys.exit(f"docker compose up failed:\n{up.stderr[-2000:]}")
        print(f"up -d returned after {time.monotonic() - t0:.0f}s", flush=True)
        first = watch(args.minutes, t0)
        statuses = {s: status(s) for s in NODES}
        common = set.intersection(*({h["version"] for h in st.get("history", [])} for st in statuses.values()))
        equal = sum(len({hash_at(st, v) for st in statuses.values()}) == 1 for v in common)
        health = {c["Service"]: c.get("Health") for c in
                  (json.loads(line) for line in compose("ps", "--format", "json").stdout.splitlines() if line.strip())}
        snap = host_status()
        ids = {st.get("peer_id") for st in statuses.values()}
        result = {
            "seconds": round(time.monotonic() - t0), "first_versions_s": first,
            "versions": {s: st.get("version") for s, st in statuses.items()},
            "versions_in_every_history": len(common), "versions_with_equal_hashes": equal, "health": health,
            "host_status": {"roles": snap.get("roles"), "head": snap.get("head"),
                            "sees_every_container": ids <= {n["peer_id"] for n in snap.get("nodes", [])},
                            "hash_disagreements": snap.get("hash_disagreements"), "error": snap.get("error")},
        }
        print(compose("logs", "--no-color", "--tail", "2", "trainer-0").stdout)
        print(json.dumps(result))
    finally:
        compose("down", "-v", "--timeout", "20", timeout=180)


if __name__ == "__main__":
    main()
