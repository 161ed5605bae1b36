"""A real open swarm catches trainers on inverted advantages: ``pulse-node swarm`` + cheating joiners.

1. start the local swarm exactly as ``pulse-node swarm --set chain.open_trainers=true`` does
   (``swarm/launcher.LocalSwarm``: bootstrap, ``--trainers`` keyed trainers, ``--inference``
   inference nodes, every one a process; the embedded default model and task);
2. once the members publish version 2, start ``--cheats`` more trainers as
   ``pulse-node join --role trainer --set faults.advantage_flip=true`` processes: fresh keys, so open
   trainers, that train on verified rollouts with inverted advantages (testing-only fault mode);
3. every 2 s read the members' ``status.json``: version, held-out accuracy (``eval_every`` 1),
   the trust table (each cheat's checks passed / failed, convicted), the honest keys failed;
4. stop once every cheat is convicted on every member and the members made ``--after`` more
   versions, or after ``--minutes``.

    nice -n 10 python bench/open_swarm.py --inference 0 --after 25   # what bench/RESULTS.md reports
    python bench/open_swarm.py --minutes 5 --cheats 1

Prints a table and, as the last line, JSON: versions, seconds and rounds to convict each cheat,
honest keys failed or convicted, accuracy at the cheats' start and at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from pulse_node.config import SwarmConfig
from pulse_node.swarm.launcher import Child, LocalSwarm, node_config


def log(msg: str) -> None:
    print(f"[open_swarm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def add_cheat(swarm: LocalSwarm, name: str) -> Child:
    """One more trainer process, ``pulse-node join --role trainer --set faults.advantage_flip=true``."""
    d = swarm.root / name
    shutil.rmtree(d, ignore_errors=True)  # a fresh key and store every run
    d.mkdir(parents=True)
    conf = d / "node.toml"
    conf.write_text(tomli_w.dumps(node_config(swarm.cfg, role="trainer", data_dir=d, trusted=swarm.trusted)))
    cmd = [sys.executable, "-m", "pulse_node", "join", "--role", "trainer", "--config", str(conf),
           "--bootstrap", swarm.bootstrap_addr, "--set", "faults.advantage_flip=true"]
    child = Child(name, "trainer", d, LocalSwarm._spawn(cmd, d / "log.txt"))
    swarm.children.append(child)
    return child


def members_view(members: list[Child]) -> list[dict]:
    out = []
    for c in members:
        st = c.status()
        if st is None:
            continue
        accs = [(h.version, h.eval) for h in st.history if h.eval is not None]
        out.append({"name": c.name, "version": st.version, "acc": accs[-1][1] if accs else None,
                    "trust": {e.key: e for e in st.trust}, "drawn": st.trainer.spot_drawn,
                    "passed": st.trainer.spot_passed, "failed": st.trainer.spot_failed,
                    "spot_share": round(st.trainer.spot_seconds / max(1e-9, st.updated_at - st.started_at), 4)})
    return out


def run(args: argparse.Namespace) -> dict:
    cfg = SwarmConfig.model_validate({
        "trainers": args.trainers, "inference": args.inference, "run_dir": args.run_dir, "run_id": "open-swarm-bench",
        "loco": {"inner_steps": args.inner_steps, "deadline_s": 30}, "eval_every": 1,
        "chain": {"open_trainers": True}})
    swarm = LocalSwarm(cfg, log=log)
    t0 = time.monotonic()
    result: dict = {"trainers": args.trainers, "inference": args.inference, "cheats": args.cheats}
    try:
        swarm.start()
        members = list(swarm.children[:args.trainers])
        while min(c.version() for c in members) < 2:
            swarm.check_alive()
            time.sleep(1)
        view = members_view(members)
        start_v, start_acc = min(m["version"] for m in view), [m["acc"] for m in view]
        cheats = [add_cheat(swarm, f"cheat-{i}") for i in range(args.cheats)]
        t_cheats, caught_at, done_v = time.monotonic(), {}, None
        log(f"members at version {start_v}, accuracy {start_acc}; {args.cheats} cheats started")
        while time.monotonic() - t0 < args.minutes * 60:
            time.sleep(2)
            swarm.check_alive()
            view = members_view(members)
            ids = {c.name: (c.status().peer_id if c.status() else None) for c in cheats}
            for name, pid in ids.items():
                if pid and name not in caught_at and view and all(
                        pid in m["trust"] and m["trust"][pid].convicted for m in view):
                    caught_at[name] = (time.monotonic() - t_cheats, min(m["version"] for m in view))
                    log(f"{name} convicted on every member at version {caught_at[name][1]}")
            if len(caught_at) == args.cheats and done_v is None:
                done_v = min(m["version"] for m in view) + args.after
            if done_v is not None and min(m["version"] for m in view) >= done_v:
                break
        cheat_ids = {pid for pid in ids.values() if pid}
        honest_bad = sorted({k for m in view for k, e in m["trust"].items()
                             if k not in cheat_ids and (e.convicted or e.failed)})
        result.update({
            "seconds": round(time.monotonic() - t0), "start_version": start_v,
            "end_version": min(m["version"] for m in view), "start_acc": start_acc, "end_acc": [m["acc"] for m in view],
            "caught": {n: {"seconds": round(s), "version": v} for n, (s, v) in caught_at.items()},
            "convicted_everywhere": len(caught_at) == args.cheats, "honest_failed_or_convicted": honest_bad,
            "cheats": {n: {k: getattr(view[0]["trust"].get(pid), k, None) for k in ("passed", "failed", "contributed",
                                                                                        "convicted", "weight")}
                       for n, pid in ids.items() if view and pid},
            "checks": {m["name"]: {"drawn": m["drawn"], "passed": m["passed"], "failed": m["failed"],
                                   "spot_share": m["spot_share"]} for m in view}})
    finally:
        swarm.stop()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--inference", type=int, default=0, help="inference nodes (with one, joiners fell behind: RESULTS.md)")
    p.add_argument("--cheats", type=int, default=2)
    p.add_argument("--inner-steps", type=int, default=5)
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--after", type=int, default=5, help="versions to run after every cheat is convicted")
    p.add_argument("--run-dir", default=str(Path(tempfile.gettempdir()) / "open-swarm-bench"))
    result = run(p.parse_args())
    for k, v in result.items():
        print(f"{k:28s} {v}")
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
