"""A volunteer behind a real NAT: does pulse-node work for it? Real node processes in network namespaces.

    sudo /work/venv/bin/python bench/nat.py [--modes default client_mode auto_relay ip_change]
        [--versions 3] [--window 150] [--unreachable drop|unroutable] [--keep-dir]

Topology (namespaces, veths and addresses this script creates, and removes at the end, also on
error or Ctrl+C):

    pnat-pub 10.233.0.1 ==veth== 10.233.0.254 pnat-rtr 192.168.233.1 ==veth== 192.168.233.2 pnat-home
    bootstrap, 2 trainers,       MASQUERADE out of its public side,         the volunteer's
    2 inference nodes            ip_forward on                              inference node

The home namespace's default route is the router; the public namespace has no route into the
home subnet: with ``--unreachable drop`` (default; like the internet, where private addresses
are not routed) packets to it go to a gateway nobody answers for, so dials time out; with
``unroutable`` they fail at once (ENETUNREACH). The script checks this before starting nodes.

Public side: ``pulse-node bootstrap`` and 2 trainers listen on 10.233.0.1 (``net.dht_listen`` /
``net.wire_listen``, as ``pulse-node swarm`` does with its host: dialable on both planes);
``inference-pub`` follows the README's recipe for a dialable node (fixed ports on all
interfaces, ``--announce`` / ``--wire-announce``); ``inference-pub-defaults`` runs the README's
plain volunteer command (default listen addresses, no announce flags). Each mode starts a fresh
home node (own data dir and identity) running the README's plain volunteer command against the
same public swarm, plus the mode's documented NAT option:
``default`` (none), ``client_mode`` (``--set net.client_mode=true``), ``auto_relay``
(``--set net.use_auto_relay=true``; waits up to 90 s for a relay address), ``ip_change`` (none;
mid-window the router's public address changes, as on a DSL reconnect, which drops every NAT
mapping). Per mode: does the home node join the DHT and see peers, which addresses its DHT
record announces (read from the public side), does it reach the trainers' head with
bit-identical state hashes (``status.json`` histories), do its rollouts reach the trainers, do
head pushes reach it (wire ``push`` bytes in) or does it rely on DHT polling, do public nodes
fail on it (wire errors, strikes, errors naming it), and publish -> held seconds vs the public
inference node. ``default`` also probes cold dials (a fresh data-plane client dials each record's
first wire address, from the other side of the NAT) and starts a late public inference node that
may pick the home node as a provider. Prints a block per mode; last line: JSON.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pulse_node.daemon.status_model import InferenceCounters, StatusReport, VersionEntry, new_report, read_status  # noqa: E402 (torch-free)

NS_PUB, NS_RTR, NS_HOME = "pnat-pub", "pnat-rtr", "pnat-home"
NAMESPACES = (NS_PUB, NS_RTR, NS_HOME)
PUB_IP, RTR_PUB_IP, RTR_HOME_IP, HOME_IP = "10.233.0.1", "10.233.0.254", "192.168.233.1", "192.168.233.2"
RTR_PUB_IP2 = "10.233.0.253"  # the router's public address after a reconnect (mode ip_change)
HOME_NET = "192.168.233.0/24"
SINK_IP, SINK_MAC = "10.233.0.77", "02:00:0a:e9:00:4d"  # a gateway nobody answers for (--unreachable drop)
#: (root-namespace name, namespace, address) of every veth end; a pair is created in the root namespace
VETHS = ((("pnat-p0", NS_PUB, f"{PUB_IP}/24"), ("pnat-r0", NS_RTR, f"{RTR_PUB_IP}/24")),
         (("pnat-r1", NS_RTR, f"{RTR_HOME_IP}/24"), ("pnat-h0", NS_HOME, f"{HOME_IP}/24")))
MODES = {"default": [], "client_mode": ["net.client_mode=true"], "auto_relay": ["net.use_auto_relay=true"],
         "ip_change": []}
RUN_ID = "bench-nat"
STOP_DEADLINE_S = 15.0
PROBE_TIMEOUT_S = 10.0


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def nsx(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns, *cmd, check=check)


# ---- the lab: namespaces, veths, NAT ---------------------------------------------------------
def lab_down() -> None:
    """Remove every namespace and veth this script may have created (idempotent)."""
    for ns in NAMESPACES:
        sh("ip", "netns", "del", ns, check=False)
    for pair in VETHS:  # a pair not yet moved into its namespaces lives in the root namespace
        sh("ip", "link", "del", pair[0][0], check=False)
    left = [ns for ns in sh("ip", "netns", "list").stdout.split() if ns.startswith("pnat-")]
    if left:
        raise RuntimeError(f"namespaces left behind: {left}")


def lab_up(unreachable: str) -> None:
    lab_down()
    for ns in NAMESPACES:
        sh("ip", "netns", "add", ns)
        nsx(ns, "ip", "link", "set", "lo", "up")
    for (a, ns_a, ip_a), (b, ns_b, ip_b) in VETHS:
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for dev, ns, ip in ((a, ns_a, ip_a), (b, ns_b, ip_b)):
            sh("ip", "link", "set", dev, "netns", ns)
            nsx(ns, "ip", "addr", "add", ip, "dev", dev)
            nsx(ns, "ip", "link", "set", dev, "up")
    nsx(NS_HOME, "ip", "route", "add", "default", "via", RTR_HOME_IP)
    nsx(NS_RTR, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    nsx(NS_RTR, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "pnat-r0", "-j", "MASQUERADE")
    if unreachable == "drop":  # private addresses are not routed on the internet: SYNs vanish
        # a gateway that does not exist (its MAC is nobody's): frames leave and nobody takes them
        nsx(NS_PUB, "ip", "neigh", "add", SINK_IP, "lladdr", SINK_MAC, "dev", "pnat-p0", "nud", "permanent")
        nsx(NS_PUB, "ip", "route", "add", HOME_NET, "via", SINK_IP, "dev", "pnat-p0")


_PROBE = r"""
import socket, sys
mode, host = sys.argv[1], sys.argv[2]
if mode == "serve":
    s = socket.socket(); s.bind((host, 0)); s.listen(1); print(s.getsockname()[1], flush=True)
    s.settimeout(10); c, peer = s.accept(); print(peer[0], flush=True)
else:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, int(sys.argv[3]))); print("connected")
    except OSError as exc:
        print(type(exc).__name__)
"""


def lab_check() -> dict[str, str]:
    """Home -> public connects and is seen from the router's address; public -> home does not connect."""
    srv = subprocess.Popen(["ip", "netns", "exec", NS_PUB, sys.executable, "-c", _PROBE, "serve", PUB_IP],
                           stdout=subprocess.PIPE, text=True)
    try:
        port = srv.stdout.readline().strip()
        out = nsx(NS_HOME, sys.executable, "-c", _PROBE, "dial", PUB_IP, port).stdout.strip()
        seen = srv.stdout.readline().strip()
    finally:
        srv.kill()
        srv.wait()
    back = nsx(NS_PUB, sys.executable, "-c", _PROBE, "dial", HOME_IP, "9").stdout.strip()
    res = {"home_to_public": out, "public_sees_home_as": seen, "public_to_home": back}
    if out != "connected" or seen != RTR_PUB_IP or back == "connected":
        raise RuntimeError(f"the NAT does not behave as intended: {res}")
    return res


# ---- node processes --------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    ns: str
    data_dir: Path
    popen: subprocess.Popen
    role: str = ""
    started: float = field(default_factory=time.time)

    def status(self) -> StatusReport:
        """The node's last status; before its first write, an empty one (version -1, no history)."""
        got = read_status(self.data_dir / "status.json")
        return got if got is not None else new_report(role=self.role or "node", peer_id="", run_id="")

    def alive(self) -> bool:
        return self.popen.poll() is None


class Procs:
    """Every process this bench started, stopped by PID: SIGTERM, then SIGKILL to its group at a deadline."""

    def __init__(self) -> None:
        self.all: list[Proc] = []

    def spawn(self, name: str, ns: str, data_dir: Path, args: list[str], *, role: str = "") -> Proc:
        data_dir.mkdir(parents=True, exist_ok=True)
        log = open(data_dir / "log.txt", "ab")
        try:
            popen = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "pulse_node", *args],
                                     cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        finally:
            log.close()
        proc = Proc(name, ns, data_dir, popen, role)
        self.all.append(proc)
        return proc

    def stop(self, procs: list[Proc] | None = None) -> None:
        procs = list(self.all if procs is None else procs)
        for p in procs:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_DEADLINE_S
        for p in procs:
            try:
                p.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {p.name} did not stop within {STOP_DEADLINE_S:.0f} s: SIGKILL", file=sys.stderr)
        for p in procs:  # the session also holds the node's workers and p2pd
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.alive():
                p.popen.wait(timeout=5)


def wait_until(pred: Callable[[], bool], *, timeout: float, what: str, procs: list[Proc] = ()) -> bool:
    """Poll ``pred`` every 0.5 s; False at the deadline. Raises if a watched process exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited with code {p.popen.returncode}; see {p.data_dir / 'log.txt'}")
        if pred():
            return True
        time.sleep(0.5)
    print(f"  timed out after {timeout:.0f} s waiting for {what}", file=sys.stderr)
    return False


def start_bootstrap(procs: Procs, root: Path) -> str:
    d = root / "bootstrap"
    maddrs = d / "maddrs.txt"
    p = procs.spawn("bootstrap", NS_PUB, d, ["bootstrap", "--host-maddrs", f"/ip4/{PUB_IP}/tcp/0",
                                              "--identity", str(d / "identity.key"), "--run-id", RUN_ID,
                                              "--print-maddrs-file", str(maddrs)])
    wait_until(lambda: maddrs.exists() and bool(maddrs.read_text().strip()), timeout=90, what="bootstrap address",
               procs=[p])
    return maddrs.read_text().split()[0]


def swarm_config(cache_dir: str):
    from pulse_node.config import SwarmConfig

    return SwarmConfig.model_validate({
        "host": PUB_IP, "run_id": RUN_ID, "model": {"cache_dir": cache_dir},
        "loco": {"inner_steps": 5, "deadline_s": 30}, "eval_every": 0, "rollout_batches_per_version": 4,
        "chain": {"anchor_every": 1000}})


def write_config(cfg, d: Path, *, role: str, trusted: list[str], volunteer: bool) -> Path:
    """``node_config`` of the local swarm; a volunteer keeps the default (all-interfaces) listen addresses."""
    import tomli_w

    from pulse_node.swarm.launcher import node_config

    tree = node_config(cfg, role=role, data_dir=d, trusted=trusted)
    if volunteer:
        del tree["net"]["dht_listen"], tree["net"]["wire_listen"]
    d.mkdir(parents=True, exist_ok=True)
    (d / "node.toml").write_text(tomli_w.dumps(tree))
    return d / "node.toml"


def start_node(procs: Procs, cfg, root: Path, name: str, *, role: str, ns: str, boot: str, trusted: list[str],
               volunteer: bool = False, sets: list[str] = (), flags: list[str] = ()) -> Proc:
    d = root / name
    conf = write_config(cfg, d, role=role, trusted=trusted, volunteer=volunteer)
    args = ["join", "--role", role, "--config", str(conf), "--bootstrap", boot, *flags]
    for s in sets:
        args += ["--set", s]
    return procs.spawn(name, ns, d, args, role=role)


#: README's recipe for a dialable node: fixed listen ports on all interfaces, announced (the
#: ports are free: nothing else runs in pnat-pub)
ANNOUNCED_PORTS = (31338, 31339)
README_RECIPE = {
    "sets": [f'net.dht_listen=["/ip4/0.0.0.0/tcp/{ANNOUNCED_PORTS[0]}"]',
             f'net.wire_listen=["/ip4/0.0.0.0/tcp/{ANNOUNCED_PORTS[1]}"]'],
    "flags": ["--announce", f"/ip4/{PUB_IP}/tcp/{ANNOUNCED_PORTS[0]}",
              "--wire-announce", f"/ip4/{PUB_IP}/tcp/{ANNOUNCED_PORTS[1]}"]}


# ---- measurements ----------------------------------------------------------------------------
def history(status: StatusReport) -> dict[int, VersionEntry]:
    return {h.version: h for h in status.history}


def head(trainers: list[Proc]) -> int:
    return max((t.status().version for t in trainers), default=-1)


def counters(p: Proc) -> dict[str, float]:
    s = p.status()
    t, i, d = s.trainer, s.inference, s.data_plane
    return {"wire_errors": d.wire_errors, "fetch_errors": i.fetch_errors if i else 0, "errors": s.counters.errors,
            "rejected": s.counters.rejected, "hivemind_push_errors": d.hivemind_push_errors,
            "rollouts_in": t.rollouts_in if t else 0, "rollouts_sent": i.rollouts_sent if i else 0,
            "patches_applied": i.patches_applied if i else 0,
            "push_bytes_in": d.bytes_in_by_kind.get("push", 0), "push_bytes_out": d.bytes_out_by_kind.get("push", 0),
            "wire_dial_errors": 0}  # filled from logs when present


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def read_peers(boot: str, work: Path) -> list[dict]:
    """The swarm's peer records as the public side sees them (a client-mode DHT node in pnat-pub)."""
    return _run_self_in(NS_PUB, ["--read-peers", boot, str(work)], timeout=120)


def _run_self_in(ns: str, args: list[str], *, timeout: float) -> list[dict]:
    """This script with ``args`` inside namespace ``ns``; its last stdout line, a JSON list."""
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, str(Path(__file__).resolve()), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [{"error": (res.stderr or res.stdout)[-500:]}]


def _read_peers_main(boot: str, work: Path) -> None:
    from pulse_node.net.dht.client import DhtClient, DhtConfig

    work.mkdir(parents=True, exist_ok=True)
    client = DhtClient.start(DhtConfig(run_id=RUN_ID, initial_peers=[boot], client_mode=True,
                                       host_maddrs=[f"/ip4/{PUB_IP}/tcp/0"]), log_path=work / "dht.log")
    try:
        recs = client.peers()
    finally:
        client.stop()
    print(json.dumps([{"peer_id": r.peer_id, "role": r.role, "version": r.version, "dht_maddrs": r.dht_maddrs,
                       "wire_maddrs": r.wire_maddrs} for r in recs]))


def probe_wire(ns: str, listen_ip: str, records: list[dict], work: Path) -> list[dict]:
    """From namespace ``ns``, a fresh data-plane client (no connection to anyone yet, like a peer
    that never talked to them) dials each record's first wire address and asks for its head record."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "records.json").write_text(json.dumps(records))
    return _run_self_in(ns, ["--probe-wire", listen_ip, str(work)], timeout=180)


def _probe_wire_main(listen_ip: str, work: Path) -> None:
    from pulse_node.errors import PulseError
    from pulse_node.net.wire import protocol as wp
    from pulse_node.net.wire.client import WireClient, WireConfig

    out = []
    with WireClient.start(WireConfig(store=work / "store", listen=[f"/ip4/{listen_ip}/tcp/0"])) as wire:
        for rec in json.loads((work / "records.json").read_text()):
            addr = (rec.get("wire_maddrs") or [""])[0]
            t0 = time.monotonic()
            try:
                wire.fetch(addr, wp.RecordRequest(version=None), work / "probe.rec", timeout=PROBE_TIMEOUT_S)
                err = ""
            except PulseError as exc:
                err = str(exc)[:160]
            answered = not err or any(f": {s}:" in err for s in ("not_found", "busy"))  # the peer replied
            out.append({"name": rec.get("name", rec["peer_id"][-8:]), "addr": addr, "connected": answered,
                        "error": "" if answered else err, "seconds": round(time.monotonic() - t0, 2)})
    print(json.dumps(out))


def latencies(trainers: list[Proc], node: Proc, versions: list[int]) -> list[float]:
    """Seconds from a version's first publication (any trainer's history) to ``node`` holding it."""
    pub: dict[int, float] = {}
    for t in trainers:
        for v, h in history(t.status()).items():
            pub[v] = min(pub.get(v, h.at), h.at)
    held = history(node.status())
    return [held[v].at - pub[v] for v in versions if v in held and v in pub]


def hashes_agree(trainers: list[Proc], node: Proc) -> tuple[int, int]:
    """(versions the node holds that the trainers published with the same hash, versions that differ)."""
    ref: dict[int, str] = {}
    for t in trainers:
        ref.update({v: h.state_hash for v, h in history(t.status()).items()})
    same = diff = 0
    for v, h in history(node.status()).items():
        if v in ref:
            same += ref[v] == h.state_hash
            diff += ref[v] != h.state_hash
    return same, diff


def errors_naming(p: Proc, peer_id: str, since: float) -> list[str]:
    return [e.message for e in p.status().recent_errors if e.at >= since and peer_id[:12] in e.message]


def log_lines(p: Proc, needle: str, since_bytes: int = 0) -> list[str]:
    out = []
    for name in ("log.txt", "wire.log", "dht.log"):
        try:
            with open(p.data_dir / name, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        out += [f"{name}: {line}" for line in text.splitlines() if needle and needle in line]
    return out


# ---- one home node, one window ----------------------------------------------------------------
@dataclass
class Swarm:
    procs: Procs
    cfg: Any
    root: Path
    boot: str
    trusted: list[str]
    trainers: list[Proc]
    public_inf: Proc  # the README's recipe: fixed ports on all interfaces, --announce / --wire-announce
    public_defaults: Proc  # a public volunteer with the README's plain command: default listen, no announce

    @property
    def public(self) -> list[Proc]:
        return [*self.trainers, self.public_inf, self.public_defaults]

    def add(self, name: str, *, ns: str, volunteer: bool, sets: list[str] = (), flags: list[str] = ()) -> Proc:
        return start_node(self.procs, self.cfg, self.root, name, role="inference", ns=ns, boot=self.boot,
                          trusted=self.trusted, volunteer=volunteer, sets=sets, flags=flags)

    def names(self, extra: list[Proc] = ()) -> dict[str, str]:
        """peer id -> node name, from the status files."""
        return {p.status().peer_id: p.name for p in [*self.public, *extra]}


def baseline(sw: Swarm, versions: int, timeout: float) -> dict[str, Any]:
    """Counter deltas of the public swarm alone over ``versions`` versions (what the home windows compare to)."""
    v0, t0 = head(sw.trainers), time.monotonic()
    before = {p.name: counters(p) for p in sw.public}
    wait_until(lambda: head(sw.trainers) >= v0 + versions, timeout=timeout, what="baseline versions", procs=sw.public)
    v1 = head(sw.trainers)
    after = {p.name: counters(p) for p in sw.public}
    lat = latencies(sw.trainers, sw.public_inf, list(range(v0 + 1, v1 + 1)))
    return {"versions": v1 - v0, "seconds": round(time.monotonic() - t0, 1),
            "public_wire_errors": {n: delta(after[n], before[n])["wire_errors"] for n in after},
            "public_inference_latency_s": _stats(lat)}


def _stats(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "median": round(statistics.median(xs), 2) if xs else None,
            "max": round(max(xs), 2) if xs else None}


class Window:
    """One home node's run: waits with a shared deadline that also ends if the home node exits."""

    def __init__(self, sw: Swarm, home: Proc, seconds: float) -> None:
        self.sw, self.home, self.end = sw, home, time.monotonic() + seconds
        self.t0 = time.monotonic()

    def left(self) -> float:
        return max(1.0, self.end - time.monotonic())

    def wait(self, pred: Callable[[], bool], what: str, *, timeout: float | None = None) -> float | None:
        """Seconds since the window began when ``pred`` held; None at the deadline or if home exited."""
        ok = wait_until(lambda: not self.home.alive() or pred(), timeout=min(timeout or 1e9, self.left()), what=what,
                        procs=self.sw.public)
        return round(time.monotonic() - self.t0, 1) if ok and self.home.alive() else None

    def version(self) -> int:
        return self.home.status().version


def run_mode(sw: Swarm, mode: str, *, versions: int, window: float) -> dict[str, Any]:
    t0 = time.time()
    before = {p.name: counters(p) for p in sw.public}
    home = sw.add(f"home-{mode}", ns=NS_HOME, volunteer=True, sets=MODES[mode])
    w = Window(sw, home, window)
    out: dict[str, Any] = {"mode": mode, "sets": MODES[mode], "v_sync": -1}
    try:
        out["started_s"] = w.wait(lambda: bool(home.status().peer_id), "home start")
        out["synced_s"] = out["started_s"] and w.wait(lambda: 0 <= head(sw.trainers) <= w.version(), "home at head")
        out["v_sync"] = w.version()
        if out["synced_s"]:
            w.wait(lambda: w.version() >= out["v_sync"] + versions, f"home {versions} versions past the head")
        out["records"] = _records(sw, home, mode, relay_wait=90.0 if mode == "auto_relay" else 0.0, w=w)
        if mode == "default":
            out["probes"] = _probes(sw, out["records"])
            out["late_joiner"] = _late_joiner(sw, home, timeout=min(120.0, w.left()))
        if mode == "ip_change":
            out["ip_change"] = _ip_change(sw, w)
    finally:
        hs = home.status()
        out["exit_code"] = home.popen.poll()
        sw.procs.stop([home])
    after = {p.name: counters(p) for p in sw.public}
    out.update(_home_findings(sw, home, hs, v_sync=out["v_sync"], t0=t0))
    out["public_deltas"] = {n: delta(after[n], before[n]) for n in after}
    out["window_s"] = round(time.monotonic() - w.t0, 1)
    return out


def _records(sw: Swarm, home: Proc, mode: str, *, relay_wait: float, w: Window) -> list[dict]:
    """The DHT records as the public side reads them; with ``relay_wait``, until home's shows a relay address."""
    deadline = time.monotonic() + min(relay_wait, w.left())
    names = sw.names([home])
    while True:
        recs = read_peers(sw.boot, sw.root / f"read-peers-{mode}")
        for r in recs:
            r["name"] = names.get(r.get("peer_id", ""), r.get("role", "?"))
        mine = [r for r in recs if r.get("name") == home.name]
        if not relay_wait or any("/p2p-circuit" in m for r in mine for m in r.get("dht_maddrs", [])) \
                or time.monotonic() >= deadline or not home.alive():
            return recs
        time.sleep(10)


def _probes(sw: Swarm, records: list[dict]) -> dict[str, list[dict]]:
    """Cold dials on the data plane: public side -> home node, home side -> public nodes."""
    homes = [r for r in records if str(r.get("name", "")).startswith("home-")]
    public = [r for r in records if r.get("wire_maddrs") and not str(r.get("name", "")).startswith("home-")]
    return {"public_to_home": probe_wire(NS_PUB, PUB_IP, homes, sw.root / "probe-pub"),
            "home_to_public": probe_wire(NS_HOME, HOME_IP, public, sw.root / "probe-home")}


def _late_joiner(sw: Swarm, home: Proc, *, timeout: float) -> dict[str, Any]:
    """A public inference node that starts now: it needs the chain and may pick the home node as provider."""
    late = sw.add("inference-late", ns=NS_PUB, volunteer=False)
    t0 = time.monotonic()
    try:
        ok = wait_until(lambda: late.status().version >= head(sw.trainers) >= 0, timeout=timeout,
                        what="late joiner at head", procs=[*sw.public, late])
        st = late.status()
    finally:
        sw.procs.stop([late])
    pid = home.status().peer_id
    mentions = [ln for ln in log_lines(late, pid[:12]) if pid]
    inf = st.inference or InferenceCounters()
    return {"at_head_s": round(time.monotonic() - t0, 1) if ok else None, "version": st.version,
            "fetch_errors": inf.fetch_errors, "wire_errors": st.data_plane.wire_errors,
            "anchor_loads": inf.anchor_loads, "catchups": inf.catchups,
            "strikes_on_home": inf.strikes.get(pid, 0), "log_lines_naming_home": mentions[-6:],
            "bytes_in_from": st.data_plane.bytes_in_by_kind}


def _ip_change(sw: Swarm, w: Window) -> dict[str, Any]:
    """The home router's public address changes (a DSL reconnect): MASQUERADE drops every mapping."""
    v0, push0 = head(sw.trainers), w.home.status().data_plane.bytes_in_by_kind.get("push", 0)
    errs0 = {p.name: counters(p)["wire_errors"] for p in sw.public}
    nsx(NS_RTR, "ip", "addr", "del", f"{RTR_PUB_IP}/24", "dev", "pnat-r0")
    nsx(NS_RTR, "ip", "addr", "add", f"{RTR_PUB_IP2}/24", "dev", "pnat-r0")
    t0 = time.monotonic()
    try:
        back = wait_until(lambda: w.version() >= v0 + 2, timeout=min(120.0, w.left()), what="home after the IP change",
                          procs=sw.public)
        took = round(time.monotonic() - t0, 1) if back else None
        wait_until(lambda: w.version() >= v0 + 4, timeout=min(40.0, w.left()), what="home 4 versions after",
                   procs=sw.public)
    finally:
        nsx(NS_RTR, "ip", "addr", "del", f"{RTR_PUB_IP2}/24", "dev", "pnat-r0", check=False)
        nsx(NS_RTR, "ip", "addr", "add", f"{RTR_PUB_IP}/24", "dev", "pnat-r0", check=False)
    hs = w.home.status()
    later = list(range(v0 + 1, hs.version + 1))
    return {"version_at_change": v0, "seconds_to_hold_v_plus_2": took, "home_version": hs.version,
            "head_push_bytes_after": hs.data_plane.bytes_in_by_kind.get("push", 0) - push0,
            "public_wire_errors_after": {p.name: counters(p)["wire_errors"] - errs0[p.name] for p in sw.public},
            "latency_home_s": _stats(latencies(sw.trainers, w.home, later)),
            "latency_public_inference_s": _stats(latencies(sw.trainers, sw.public_inf, later)),
            "home_errors": [e.message[:160] for e in hs.recent_errors][-4:]}


def _home_findings(sw: Swarm, home: Proc, hs: StatusReport, *, v_sync: int, t0: float) -> dict[str, Any]:
    pid = hs.peer_id
    same, diff = hashes_agree(sw.trainers, home)
    v_end = hs.version
    later = list(range(max(v_sync, 0) + 1, v_end + 1))
    inf, plane = hs.inference or InferenceCounters(), hs.data_plane
    return {
        "peer_id": pid, "peers_seen": hs.peers, "version": v_end, "trainer_head": head(sw.trainers),
        "hashes_same": same, "hashes_differ": diff,
        "patches_applied": inf.patches_applied, "catchups": inf.catchups, "anchor_loads": inf.anchor_loads,
        "rollouts_sent": inf.rollouts_sent,
        "rollout_push_failures": sum("rollout push" in e.message for e in hs.recent_errors),
        "head_push_bytes_in": plane.bytes_in_by_kind.get("push", 0),
        "bytes_in_by_kind": plane.bytes_in_by_kind, "bytes_out_by_kind": plane.bytes_out_by_kind,
        "wire_errors": plane.wire_errors, "fetch_errors": inf.fetch_errors,
        "recent_errors": [e.message[:200] for e in hs.recent_errors][-5:],
        "latency_home_s": _stats(latencies(sw.trainers, home, later)),
        "latency_public_inference_s": _stats(latencies(sw.trainers, sw.public_inf, later)),
        "strikes_on_home": {p.name: (p.status().inference or InferenceCounters()).strikes.get(pid, 0)
                            for p in sw.public if pid},
        "public_errors_naming_home": {p.name: errors_naming(p, pid, t0) for p in sw.public if pid},
        "home_log_tail": _tail(home.data_dir / "log.txt", 6),
    }


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


# ---- main ------------------------------------------------------------------------------------
def start_public(procs: Procs, root: Path, cache_dir: str) -> Swarm:
    from pulse_node.chain.identity import Identity

    cfg = swarm_config(cache_dir)
    boot = start_bootstrap(procs, root)
    trusted = [Identity.load_or_create(root / f"trainer-{i}" / "identity.key").public_key_hex for i in range(2)]
    trainers = [start_node(procs, cfg, root, f"trainer-{i}", role="trainer", ns=NS_PUB, boot=boot, trusted=trusted)
                for i in range(2)]
    sw = Swarm(procs, cfg, root, boot, trusted, trainers, None, None)  # type: ignore[arg-type]
    sw.public_inf = sw.add("inference-pub", ns=NS_PUB, volunteer=True, **README_RECIPE)
    sw.public_defaults = sw.add("inference-pub-defaults", ns=NS_PUB, volunteer=True)
    return sw


def print_mode(r: dict[str, Any]) -> None:
    print(f"\n== home node, mode {r['mode']} ({' '.join('--set ' + s for s in r['sets']) or 'volunteer defaults'})")
    rows = [("started / at head after (s)", f"{r['started_s']} / {r['synced_s']}"),
            ("exit code at the end (None = running)", r["exit_code"]),
            ("peers it sees", r["peers_seen"]),
            ("version / trainer head", f"{r['version']} / {r['trainer_head']}"),
            ("state hashes equal / differ", f"{r['hashes_same']} / {r['hashes_differ']}"),
            ("anchor loads / catch-ups / patches", f"{r['anchor_loads']} / {r['catchups']} / {r['patches_applied']}"),
            ("rollouts sent / push failures", f"{r['rollouts_sent']} / {r['rollout_push_failures']}"),
            ("head pushes received (bytes)", r["head_push_bytes_in"]),
            ("it served (bytes out by kind)", r["bytes_out_by_kind"]),
            ("publish -> held, home (median/max s)", _fmt(r["latency_home_s"])),
            ("publish -> held, public inference", _fmt(r["latency_public_inference_s"])),
            ("strikes on it by public nodes", r["strikes_on_home"]),
            ("public wire_errors in window", {n: d.get("wire_errors") for n, d in r["public_deltas"].items()})]
    for k, v in rows:
        print(f"  {k:<40} {v}")
    for rec in r.get("records", []):
        print(f"  record {rec.get('name')}: dht {rec.get('dht_maddrs')} wire {rec.get('wire_maddrs')}"
              if "error" not in rec else f"  reading records failed: {rec['error']}")
    for k in ("probes", "late_joiner", "ip_change"):
        if k in r:
            print(f"  {k}: {json.dumps(r[k])}")
    if r["recent_errors"]:
        print(f"  its recent errors: {r['recent_errors']}")


def _fmt(s: dict) -> str:
    return f"{s['median']} / {s['max']} (n={s['n']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--versions", type=int, default=3, help="versions the home node follows after reaching the head")
    ap.add_argument("--window", type=float, default=150.0, help="deadline of one home node's window (s)")
    ap.add_argument("--unreachable", choices=("drop", "unroutable"), default="drop")
    ap.add_argument("--cache-dir", help="warm-start cache (default: the model's default cache, trained once)")
    ap.add_argument("--keep-dir", action="store_true", help="keep the run dir (logs, status files) and print it")
    ap.add_argument("--read-peers", nargs=2, metavar=("BOOTSTRAP", "WORK"), help=argparse.SUPPRESS)
    ap.add_argument("--probe-wire", nargs=2, metavar=("LISTEN_IP", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.read_peers:
        _read_peers_main(args.read_peers[0], Path(args.read_peers[1]))
        return
    if args.probe_wire:
        _probe_wire_main(args.probe_wire[0], Path(args.probe_wire[1]))
        return
    if os.geteuid() != 0:
        sys.exit("bench/nat.py needs root (ip netns, iptables)")
    print(json.dumps(run(args)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pulse_node.rl.config import default_cache_dir

    procs = Procs()
    root = Path(tempfile.mkdtemp(prefix="pulse-nat-"))
    atexit.register(lab_down)
    atexit.register(procs.stop)  # runs first (atexit is LIFO): processes before their namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # -> finally blocks, then atexit
    t0 = time.monotonic()
    commit = sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD", check=False).stdout.strip()
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "unreachable": args.unreachable,
                              "commit": commit}
    try:
        lab_up(args.unreachable)
        result["nat_check"] = lab_check()
        print(f"NAT: {result['nat_check']}")
        sw = start_public(procs, root, args.cache_dir or default_cache_dir())
        print(f"bootstrap {sw.boot}; waiting for the public swarm's version 1")
        wait_until(lambda: head(sw.trainers) >= 1 and min(p.status().version for p in sw.public) >= 1,
                   timeout=240, what="public swarm at version 1", procs=sw.public)
        result["public_start_s"] = round(time.monotonic() - t0, 1)
        result["baseline"] = baseline(sw, 2, timeout=120)
        print(f"baseline (public swarm alone): {result['baseline']}")
        result["modes"] = []
        for mode in args.modes:
            r = run_mode(sw, mode, versions=args.versions, window=args.window)
            result["modes"].append(r)
            print_mode(r)
        result["public_alive_at_end"] = {p.name: p.alive() for p in sw.public}
    finally:
        procs.stop()
        lab_down()
        result["netns_left"] = [ns for ns in sh("ip", "netns", "list").stdout.split() if ns.startswith("pnat-")]
        result["seconds"] = round(time.monotonic() - t0, 1)
        if args.keep_dir:
            print(f"run dir kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
