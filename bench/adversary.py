"""Hostile peers (issue 13): a real local swarm (bootstrap, 2 trusted trainers, 2 inference nodes,
separate processes) and one attacker process per attack (``python -m pulse_node.testing.attack``,
its own DHT and wire workers and fresh keys, ``pulse_node/testing/attackers.py``).

    python bench/adversary.py [--baseline 20] [--window 20] [--attacks a,b,c | --only a,b] [--run-dir DIR]
                              [--attacker-cpus 1 | --attacker-nice 19]

By default the attacker shares this machine's CPUs with the swarm, so on a small box what it
spends on itself is taken from the honest nodes too. ``--attacker-cpus`` gives it CPUs of its
own (the swarm keeps the rest in every window): the model of an attacker on its own machine.

For every attack: a baseline window without attack, then the attack window. Per attack: what it
tried; ``held`` (every state an inference node held or stored is one the trainers signed, checked
by ``ChaosLedger`` against the trainers' histories and stores); ``crashed`` (an honest process
exited or restarted); ``poisoned`` (the attacker's payload named in a round decision);
``rate_ratio`` (versions/s of the trainers during the attack / the baseline window before it);
``reported`` (every status counter of the honest nodes that moved during the window). The
``control`` ratios compare consecutive no-attack windows (the noise floor on shared cores).
Last line: JSON with ``attacks``, ``held``, ``crashed``, ``poisoned``, ``min_rate_ratio``,
``per_attack`` (``{name: {"rate_ratio", "held"}}``), ``rows`` (everything per attack) and, over the
flood attacks (issue 21: fresh keys' records, ``testing/flood.py``), ``inference_max_lag`` (the most
versions an inference node was behind the trainers' head, polled every second).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from bench.cpu_share import snapshot, used
from pulse_node.testing.free_keys import NODE_CONFIG_ENV, node_config_path

DEFAULT_ATTACKS = ("inject_payload", "trainer_role", "huge_version", "rollback", "slow_drip", "bad_anchor",
                   "oversize", "catchup_flood", "fake_trainers", "rollout_flood", "smaller",
                   "sybil_trainers", "sybil_peers", "record_flood", "sybil_flood", "junk_rollouts", "pool_hog",
                   "catchup_sybils", "hostile_status")
MEMBER_ATTACKS = ("member_presigned", "member_equivocate", "member_heads", "member_far_version",
                  "member_anchor_swap", "member_oversize", "member_patch_size")  # testing/member_attackers.py
#: floods of free identities (issue 21): inference nodes must stay within ``MAX_LAG`` versions of the head
FLOOD_ATTACKS = {"record_flood", "sybil_flood", "junk_rollouts", "pool_hog", "catchup_sybils"}
MAX_LAG = 2
#: attacks whose records stay in the DHT after the attacker exits (``testing/flood.py``), and how long
RECORD_FLOODS = {"record_flood", "sybil_flood"}
RECORD_TTL_S = 60.0
SMALL = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2}, "task": {"digits": 2},
         "sampling": {"prompts_per_batch": 8, "group_size": 4}}


def swarm_config(run_dir: Path, *, trainers: int = 2, inference: int = 2, seed: int = 0):
    from pulse_node.config import SwarmConfig

    return SwarmConfig.model_validate({
        **SMALL, "trainers": trainers, "inference": inference, "run_dir": str(run_dir), "run_id": "adversary",
        "seed": seed, "model": {**SMALL["model"], "cache_dir": str(run_dir / "cache")},
        "grpo": {"warmstart_steps": 50}, "loco": {"inner_steps": 2, "deadline_s": 10},
        "rollout_wait_s": 0.5, "eval_every": 0, "rollout_batches_per_version": 1,
        "chain": {"anchor_every": 5, "keep_versions": 8}})


def counters(statuses: list) -> Counter:
    """Every int counter of every honest node, flattened (dicts summed), keyed ``role.path``."""
    out: Counter = Counter()

    def walk(prefix: str, tree: Any) -> None:
        if isinstance(tree, bool):
            return
        if isinstance(tree, int):
            out[prefix] += tree
        elif isinstance(tree, dict):
            if prefix.endswith(("strikes", "bans", "rejected")) and all(isinstance(v, int) for v in tree.values()):
                out[prefix] += sum(tree.values())
                return
            for k, v in tree.items():
                walk(f"{prefix}.{k}", v)

    skip = {"version", "lowest", "peers", "contributors", "ranks", "started_at", "updated_at", "schema", "history"}
    for s in statuses:
        tree = s.model_dump(mode="json", by_alias=True)
        for k, v in tree.items():
            if k not in skip and k != "rollout_senders":
                walk(f"{s.role}.{k}", v)
        for sender in tree.get("rollout_senders", {}).values():
            walk(f"{s.role}.rollout_senders", sender)
        out[f"{s.role}.evidence"] += len(tree.get("evidence", []))  # members convicted of equivocation
    return out


class Bench:
    def __init__(self, args) -> None:
        from pulse_node.chain.identity import Identity
        from pulse_node.swarm.launcher import LocalSwarm
        from pulse_node.testing.chaos import ChaosLedger
        from pulse_node.testing.member_attackers import member_keys

        self.args = args
        self.root = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="pulse-adversary-"))
        self.cfg = swarm_config(self.root)
        self.swarm = LocalSwarm(self.cfg, log=lambda m: print(m, file=sys.stderr))
        self.members = member_keys(self.root, args.attacks.split(","))  # admitted like the trainers' keys
        honest_keys = self.swarm.trainer_keys
        self.swarm.trainer_keys = lambda: honest_keys() + [Identity.load(k).public_key_hex for k in self.members.values()]
        self.ledger = ChaosLedger()
        self.lives: dict[str, float] = {}
        self.restarts: list[str] = []

    def poll(self) -> None:
        self.ledger.poll(self.swarm.children)
        for c in self.swarm.children:
            s = c.status()
            if s is None:
                continue
            first = self.lives.setdefault(c.name, s.started_at)
            if s.started_at != first and f"{c.name} restarted" not in self.restarts:
                self.restarts.append(f"{c.name} restarted")

    def crashed(self) -> list[str]:
        dead = [f"{c.name} exited {c.proc.returncode}" for c in self.swarm.children if c.proc.poll() is not None]
        boot = self.swarm.bootstrap
        if boot is not None and boot.poll() is not None:
            dead.append(f"bootstrap exited {boot.returncode}")
        return dead + self.restarts

    def head(self) -> int:
        return max((c.version() for c in self.swarm.children if c.role == "trainer"), default=-1)

    def statuses(self) -> list:
        return [s for c in self.swarm.children if (s := c.status()) is not None]

    def window(self, seconds: float, proc: subprocess.Popen | None = None) -> dict[str, Any]:
        """Versions/s over ``seconds`` and the counters that moved."""
        self.poll()
        trees = {c.name: c.proc.pid for c in self.swarm.children}
        trees |= {"bootstrap": self.swarm.bootstrap.pid} if self.swarm.bootstrap is not None else {}
        trees |= {"attacker": proc.pid} if proc is not None else {}
        cpu0 = cpu1 = snapshot(trees)
        v0, c0, t0 = self.head(), counters(self.statuses()), time.monotonic()
        contributors: Counter = Counter()
        lag = 0
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)
            self.poll()
            for s in self.statuses():
                if s.contributors is not None:
                    contributors[s.contributors] += 1
            lag = max(lag, self.inference_lag())
            cpu1 = snapshot(trees)  # taken while the attacker still runs (it may exit at the window's end)
        v1, dt = self.head(), time.monotonic() - t0
        cpu = used(cpu0, cpu1)
        honest = round(sum(sum(v.values()) for k, v in cpu.items() if k != "attacker"), 1)
        moved = {k: v - c0.get(k, 0) for k, v in counters(self.statuses()).items() if v != c0.get(k, 0)}
        return {"versions": v1 - v0, "seconds": round(dt, 1), "rate": (v1 - v0) / dt, "moved": moved,
                "contributors_seen": dict(contributors), "inference_max_lag": lag,
                "cpu_s": {"honest": honest, "attacker": round(sum(cpu.get("attacker", {}).values()), 1),
                          "per_node": cpu}, "load": [round(x, 2) for x in os.getloadavg()]}

    def inference_lag(self) -> int:
        """How many versions the furthest-behind inference node is behind the trainers' head."""
        inf = [c.version() for c in self.swarm.children if c.role == "inference"]
        return max(0, self.head() - min(inf)) if inf else 0

    def attack(self, name: str) -> dict[str, Any]:
        out = self.root / "attacks" / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pulse_node.testing.attack", name, "--bootstrap", self.swarm.bootstrap_addr,
               "--run-id", self.cfg.run_id, "--root", str(self.root / "attacks" / name),
               "--seconds", str(self.args.window), "--out", str(out), "--started", str(out.with_suffix(".started"))]
        cmd += ["--identity", str(self.members[name])] if name in self.members else []
        log = open(self.root / "attacks" / f"{name}.log", "w")
        env = {**os.environ, NODE_CONFIG_ENV: str(node_config_path(self.root))}
        nice, cpus = self.args.attacker_nice, self.args.attacker_cpus
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                preexec_fn=(lambda: _attacker_process(nice, cpus)) if nice or cpus else None)  # noqa: PLW1509 (os calls only)
        operator: dict[str, Any] = {}
        delay = min(10.0, self.args.window / 3)
        probe = threading.Thread(target=lambda: operator.update(self.operator_status(delay=delay)), daemon=True)
        try:
            self.wait_attack_started(out.with_suffix(".started"), proc)  # its workers take seconds to start
            if name == "hostile_status":
                probe.start()
            w = self.window(self.args.window, proc)
            if probe.is_alive():
                probe.join(timeout=120)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
            log.close()
        res = json.loads(out.read_text()) if out.exists() else {"attacker_error": f"no result (exit {proc.returncode})"}
        return {**w, "attacker": res, "operator": operator}

    def wait_attack_started(self, marker: Path, proc: subprocess.Popen, *, limit_s: float = 120.0) -> None:
        """Until the attacker says its attack runs (or it exits, or ``limit_s``): the measured
        window is the attack, not the attacker's start-up."""
        end = time.monotonic() + limit_s
        while not marker.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
            self.poll()

    def operator_status(self, *, delay: float) -> dict[str, Any]:
        """The operator's ``pulse-node status --bootstrap ... --once --json`` against the live swarm
        (its hostile records included): how long it took, and whether it finished."""
        time.sleep(delay)
        cmd = [sys.executable, "-m", "pulse_node", "status", "--bootstrap", self.swarm.bootstrap_addr,
               "--run-id", self.cfg.run_id, "--once", "--json"]
        t0 = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
        except subprocess.TimeoutExpired:
            return {"status_s": round(time.monotonic() - t0, 1), "finished": False}
        nodes = len(json.loads(done.stdout.strip().splitlines()[-1]).get("nodes", [])) if done.returncode == 0 else 0
        return {"status_s": round(time.monotonic() - t0, 1), "finished": True, "rc": done.returncode,
                "nodes_shown": nodes}

    def settle(self, rate: float, *, limit_s: float = 150.0) -> float | None:
        """Seconds until the swarm makes versions again at half its baseline ``rate`` over 10 s
        (an attack can outlive its process: its DHT record stays until it expires); ``limit_s`` max."""
        t0, marks = time.monotonic(), [(time.monotonic(), self.head())]
        need = max(1, int(rate * 10 * 0.5))
        while time.monotonic() - t0 < limit_s:
            time.sleep(1.0)
            self.poll()
            now, v = time.monotonic(), self.head()
            marks.append((now, v))
            old = [m for m in marks if now - m[0] >= 10.0]
            if old and v - old[-1][1] >= need:
                return round(now - t0 - 10.0, 1) if now - t0 > 10.0 else 0.0
        return None

    def idle_until(self, t: float) -> None:
        while time.monotonic() < t:
            time.sleep(1.0)
            self.poll()

    def wait_started(self, versions: int = 2, timeout: float = 600) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll()
            if self.crashed():
                raise RuntimeError(f"swarm died while starting: {self.crashed()}")
            inf = [c.version() for c in self.swarm.children if c.role == "inference"]
            if self.head() >= versions and inf and min(inf) >= 1:
                return
            time.sleep(1.0)
        raise RuntimeError("swarm did not reach its first versions in time")

    def run(self, names: list[str]) -> dict[str, Any]:
        rows, baselines = [], []
        self.swarm.start()
        try:
            self.wait_started()
            for name in names:
                base = self.window(self.args.baseline)
                baselines.append(base["rate"])
                before = self.ledger.check()["corrupted_states_used"]
                res = self.attack(name)
                ended = time.monotonic()
                self.poll()
                wrong = self.ledger.check()["corrupted_states_used"] - before
                rows.append(row(name, base, res, wrong, self.crashed()))
                rows[-1]["recovery_s"] = self.settle(base["rate"])
                if name in RECORD_FLOODS:  # its records outlive it by their TTL: not in the next baseline
                    self.idle_until(ended + RECORD_TTL_S)
                print(fmt(rows[-1]), file=sys.stderr, flush=True)
            baselines.append(self.window(self.args.baseline)["rate"])
            self.poll()
            crashed = self.crashed()  # before the swarm is stopped (stopped processes have exited)
        finally:
            self.swarm.stop()
        self.ledger.read_stores(self.swarm.children)
        final = self.ledger.check()
        return summary(rows, baselines, final, crashed, self.root)


def row(name: str, base: dict, res: dict, wrong: int, crashed: list[str]) -> dict[str, Any]:
    a = res["attacker"]
    ratio = res["rate"] / base["rate"] if base["rate"] > 0 else float("nan")
    return {"attack": name, "tried": a.get("tried", name), "held": wrong == 0, "wrong_states": wrong,
            "crashed": crashed, "poisoned": bool(a.get("succeeded")), "rate_ratio": round(ratio, 2),
            "baseline_rate": round(base["rate"], 3), "attack_rate": round(res["rate"], 3),
            "reported": res["moved"], "contributors_seen": res["contributors_seen"],
            "inference_max_lag": res["inference_max_lag"], "baseline_inference_max_lag": base["inference_max_lag"],
            "attacker_sent": a.get("sent", {}), "attacker_error": a.get("attacker_error"),
            "attacker": {k: v for k, v in a.items() if k not in ("tried", "sent", "peer_ids")},
            "operator": res.get("operator") or None, "cpu_s": res["cpu_s"], "baseline_cpu_s": base["cpu_s"],
            "load": res["load"]}


REPORT_KEYS = ("rejected", "decisions_rejected", "strikes", "bans", "loco_base_mismatch", "rollouts_refused",
               "fetch_errors", "wire_errors", "resyncs", "forks", "catchup_misses", "apply_errors", "errors",
               "evidence", "equivocation")


def fmt(r: dict) -> str:
    rep = ", ".join(f"{k.split('.', 1)[1]}+{v}" for k, v in sorted(r["reported"].items())
                    if k.rsplit(".", 1)[-1] in REPORT_KEYS and v > 0)
    return (f"{r['attack']:<15} held={'yes' if r['held'] else 'NO':<3} crashed={'NO' if not r['crashed'] else 'YES'}"
            f" poisoned={'YES' if r['poisoned'] else 'no':<3} ratio={r['rate_ratio']:<5} "
            f"({r['attack_rate']:.3f}/{r['baseline_rate']:.3f} v/s) recovery={r.get('recovery_s')}s "
            f"max_contributors={max(map(int, r['contributors_seen']), default='-')} "
            f"inference_lag={r['inference_max_lag']} cpu_s honest={r['cpu_s']['honest']} "
            f"(baseline {r['baseline_cpu_s']['honest']}) attacker={r['cpu_s']['attacker']} load={r['load']} "
            f"reported: {rep or '-'}")


def summary(rows: list[dict], baselines: list[float], final: dict, crashed: list[str], root: Path) -> dict[str, Any]:
    control = [round(b / a, 2) for a, b in itertools.pairwise(baselines) if a > 0]
    ratios = [r["rate_ratio"] for r in rows if r["rate_ratio"] == r["rate_ratio"]]
    lags = [r["inference_max_lag"] for r in rows if r["attack"] in FLOOD_ATTACKS]
    return {"attacks": len(rows), "held": all(r["held"] for r in rows) and final["corrupted_states_used"] == 0,
            "crashed": bool(crashed), "poisoned": any(r["poisoned"] for r in rows),
            "min_rate_ratio": min(ratios, default=None), "control_ratios": control,
            "min_control_ratio": min(control, default=None), "baseline_rates": [round(b, 3) for b in baselines],
            "final_check": {k: final[k] for k in ("corrupted_states_used", "wrong", "trainer_disagreement_count")
                            if k in final} | {k: v for k, v in final.items() if k.startswith(("held_", "stored_"))},
            "crashes": crashed, "run_dir": str(root), "per_attack": per_attack(rows),
            "inference_max_lag": max(lags, default=None),
            "inference_within_lag": None if not lags else max(lags) <= MAX_LAG, "rows": rows}


def per_attack(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """``{name: {"rate_ratio": float, "held": bool}}`` for every attack run (the JSON line's ``per_attack``)."""
    return {r["attack"]: {"rate_ratio": r["rate_ratio"], "held": r["held"] and not r["poisoned"]} for r in rows}


def _attacker_process(nice: int, cpus: set[int] | None) -> None:
    """In the attacker's child process, after its ``setsid``: on its own CPUs (its workers inherit
    them), and/or niced, with its session's autogroup too (with autogroups, a process's nice value
    weighs only against its own session's processes)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    if not nice:
        return
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        pass


def split_cpus(spec: str | None) -> set[int] | None:
    """``--attacker-cpus``: the attacker's CPUs; this process (and so the swarm it starts) keeps
    the others. None: everyone shares every CPU."""
    if not spec:
        return None
    mine = os.sched_getaffinity(0)
    theirs = {int(c) for c in spec.split(",") if c.strip()}
    if not theirs or not theirs < mine:
        raise SystemExit(f"--attacker-cpus {spec}: name some, not all, of this machine's CPUs {sorted(mine)}")
    os.sched_setaffinity(0, mine - theirs)
    return theirs


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=float, default=20.0, help="seconds of each no-attack window")
    ap.add_argument("--window", type=float, default=20.0, help="seconds of each attack")
    ap.add_argument("--attacks", default=",".join(DEFAULT_ATTACKS + MEMBER_ATTACKS),
                    help="comma-separated subset to run (e.g. --attacks member_presigned,record_flood)")
    ap.add_argument("--only", help="run only these attacks (comma separated; same as --attacks)")
    ap.add_argument("--run-dir")
    ap.add_argument("--attacker-nice", type=int, default=0,
                    help="run each attacker process at this niceness (e.g. 19): on one shared machine the attacker "
                         "takes CPU from the honest nodes, which an attacker on its own machine cannot")
    ap.add_argument("--attacker-cpus", type=str, default=None,
                    help="comma-separated CPUs the attacker runs on; the swarm keeps the others in every window, "
                         "attack and no-attack alike (e.g. 1 on a 2-core box): an attacker with its own machine, "
                         "going at full speed, against a swarm with a fixed share of this one")
    args = ap.parse_args()
    args.attacker_cpus = split_cpus(args.attacker_cpus)
    names = [a for a in (args.only or args.attacks).split(",") if a]
    for sig in (signal.SIGINT, signal.SIGTERM):  # stop the swarm and attacker on either (background jobs ignore INT)
        signal.signal(sig, _interrupt)
    res = Bench(args).run(names)
    res["cpus"] = {"swarm": sorted(os.sched_getaffinity(0)), "attacker": sorted(args.attacker_cpus or []) or "shared",
                   "attacker_nice": args.attacker_nice}
    print(f"{'attack':<15} {'held':<5} {'crashed':<8} {'poisoned':<9} {'ratio':<6} reported")
    for r in res["rows"]:
        print(fmt(r))
    print(f"control (no-attack) ratios: {res['control_ratios']}")
    print(json.dumps(res, default=str))


if __name__ == "__main__":
    main()
