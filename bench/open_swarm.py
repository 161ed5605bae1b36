"""A real open swarm catches trainers on inverted advantages and keeps learning: ``pulse-node swarm`` + cheating joiners.

1. start the local swarm exactly as ``pulse-node swarm --set chain.open_trainers=true`` does
   (``swarm/launcher.LocalSwarm``: bootstrap, ``--trainers`` keyed trainers, ``--inference``
   inference nodes, every one a process; the embedded default model and task, default config but
   ``--set`` overrides);
2. once the members publish version 2, start ``--cheats`` more trainers as
   ``pulse-node join --role trainer --set faults.advantage_flip=true`` processes: fresh keys, so open
   trainers, that train on verified rollouts with inverted advantages (testing-only fault mode);
3. every 2 s read the members' ``status.json``: version, held-out accuracy (``eval_every`` 1,
   every version's kept), the trust table (each cheat's checks passed / failed, convicted), the
   honest keys failed;
4. stop once every cheat is convicted on every member, the members made ``--after`` more
   versions and hold ``--versions``, or after ``--minutes``.

    nice -n 10 python bench/open_swarm.py --after 20 --versions 40 --minutes 12   # bench/RESULTS.md
    python bench/open_swarm.py --cheats 0 --inference 0 --set loco.inner_steps=5 --versions 24

Prints a table and, as the last line, JSON: versions, seconds and rounds to convict each cheat,
honest keys failed or convicted, each trainer's rounds and rounds left out, and the held-out
accuracy: start (version 0), peak and end as running means over ``--window`` evaluations
(``bench/swarm_learning.py``'s ``curve_stats``), gain = end - start, and the whole curve.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pydantic
import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.swarm_learning import curve_stats
from pulse_node.config import SwarmConfig
from pulse_node.configload import merge_override, parse_override, validate_tree
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


def swarm_config(args: argparse.Namespace) -> SwarmConfig:
    """The bench's swarm: the embedded default with open trainers, ``--set`` overrides last."""
    tree = {"trainers": args.trainers, "inference": args.inference, "run_dir": args.run_dir,
            "run_id": "open-swarm-bench", "eval_every": 1, "chain": {"open_trainers": True}}
    for item in args.overrides:
        merge_override(tree, *parse_override(item))
    return validate_tree(pydantic.TypeAdapter(SwarmConfig), tree)


class Curve:
    """Held-out accuracy per version, gathered from the members' ``status.json`` (bounded history)."""

    def __init__(self) -> None:
        self.evals: dict[int, float] = {}

    def poll(self, members: list[Child]) -> None:
        for c in members:
            st = c.status()
            for h in st.history if st is not None else []:
                if h.eval is not None:
                    self.evals.setdefault(h.version, h.eval)

    def stats(self, window: int, *, since: int = 0) -> dict:
        pts = [(v, a) for v, a in sorted(self.evals.items()) if v >= since]
        out = curve_stats(pts, window)
        if out["start"] is not None:
            out["gain"] = round(out["end"] - out["start"], 4)
            out["peak_gain"] = round(out["peak"] - out["start"], 4)
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def watch_cheats(state: dict, cheats: list[Child], view: list[dict], t_cheats: float) -> dict[str, str | None]:
    """Note each cheat convicted on every member (seconds since the cheats started, version)."""
    ids = {c.name: (st.peer_id if (st := c.status()) else None) for c in cheats}
    for name, pid in ids.items():
        if pid and name not in state and view and all(pid in m["trust"] and m["trust"][pid].convicted for m in view):
            state[name] = (time.monotonic() - t_cheats, min(m["version"] for m in view))
            log(f"{name} convicted on every member at version {state[name][1]}")
    return ids


def run(args: argparse.Namespace) -> dict:
    cfg = swarm_config(args)
    swarm, curve = LocalSwarm(cfg, log=log), Curve()
    t0 = time.monotonic()
    result: dict = {"trainers": args.trainers, "inference": args.inference, "cheats": args.cheats,
                    "overrides": args.overrides, "inner_steps": cfg.loco.inner_steps}
    try:
        swarm.start()
        members = list(swarm.children[:args.trainers])
        while min(c.version() for c in members) < 2:
            swarm.check_alive()
            time.sleep(1)
        view = members_view(members)
        start_v, start_acc = min(m["version"] for m in view), [m["acc"] for m in view]
        cheats = [add_cheat(swarm, f"cheat-{i}") for i in range(args.cheats)]
        t_cheats, caught_at, done_v, next_note = time.monotonic(), {}, None, time.monotonic() + 30
        log(f"members at version {start_v}, accuracy {start_acc}; {args.cheats} cheats started")
        while time.monotonic() - t0 < args.minutes * 60:
            time.sleep(2)
            swarm.check_alive()
            view = members_view(members)
            curve.poll(members)
            ids = watch_cheats(caught_at, cheats, view, t_cheats)
            low = min(m["version"] for m in view)
            if len(caught_at) == args.cheats and done_v is None:
                done_v = max(low + args.after, args.versions)
            if time.monotonic() >= next_note:
                log(f"version {low}, accuracy {curve.evals.get(max(curve.evals, default=-1))}, "
                    f"curve {curve.stats(args.window)}")
                next_note += 30
            if done_v is not None and low >= done_v:
                break
        curve.poll(members)
        cheat_ids = {pid for pid in ids.values() if pid}
        honest_bad = sorted({k for m in view for k, e in m["trust"].items()
                             if k not in cheat_ids and (e.convicted or e.failed)})
        rounds = {c.name: {k: getattr(st.trainer, k) for k in ("rounds", "rounds_left_out", "rollouts_in",
                                                                "rollouts_own", "rollouts_used")}
                  for c in swarm.children if c.role == "trainer" and (st := c.status()) and st.trainer}
        result.update({
            "seconds": round(time.monotonic() - t0), "start_version": start_v,
            "end_version": min(m["version"] for m in view), "start_acc": start_acc, "end_acc": [m["acc"] for m in view],
            "accuracy": curve.stats(args.window), "curve": sorted(curve.evals.items()),
            "caught": {n: {"seconds": round(s), "version": v} for n, (s, v) in caught_at.items()},
            "convicted_everywhere": len(caught_at) == args.cheats, "honest_failed_or_convicted": honest_bad,
            "cheats": {n: {k: getattr(view[0]["trust"].get(pid), k, None) for k in ("passed", "failed", "contributed",
                                                                                        "convicted", "weight")}
                       for n, pid in ids.items() if view and pid},
            "rounds": rounds,
            "checks": {m["name"]: {"drawn": m["drawn"], "passed": m["passed"], "failed": m["failed"],
                                   "spot_share": m["spot_share"]} for m in view}})
    finally:
        swarm.stop()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--inference", type=int, default=1)
    p.add_argument("--cheats", type=int, default=2)
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--after", type=int, default=5, help="versions to run after every cheat is convicted")
    p.add_argument("--versions", type=int, default=0, help="run until the members hold at least this version")
    p.add_argument("--window", type=int, default=5, help="running-mean window (evaluations) for peak and end")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a swarm config override (as `pulse-node swarm --set`), e.g. loco.inner_steps=5")
    p.add_argument("--run-dir", default=str(Path(tempfile.gettempdir()) / "open-swarm-bench"))
    result = run(p.parse_args())
    for k, v in result.items():
        if k != "curve":
            print(f"{k:28s} {v}")
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
