"""``pulse-node swarm``: a whole local swarm as separate processes on one machine.

Starts a bootstrap, then T trainers and I inference nodes, each a ``pulse-node join`` process
with its own data dir and TOML config under ``run_dir`` (the same commands the compose file
runs). Trainer identities are created first so inference nodes trust exactly those keys.
Progress comes from each node's ``status.json`` (a ``StatusReport``): ``snapshot()`` is the
dashboard's ``SwarmSnapshot`` of exactly these nodes, ``summary()`` the JSON summary built from
it. With ``versions`` the swarm stops once every node holds that version. Every child is
stopped within ``stop_timeout_s`` on return or Ctrl+C.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from pulse_node.chain.identity import Identity
from pulse_node.config import SharedSettings, SwarmConfig, TrainingSettings
from pulse_node.daemon.status_model import StatusReport, read_status
from pulse_node.errors import PulseError
from pulse_node.ops.snapshot import NodeInput, SwarmSnapshot, build_snapshot
from pulse_node.ops.sources import read_node_dir
from pulse_node.swarm.summary import swarm_summary

if TYPE_CHECKING:
    import psutil


@dataclass
class Child:
    name: str
    role: str
    data_dir: Path
    proc: subprocess.Popen[bytes]

    def status(self) -> StatusReport | None:
        """The node's last status (None before its first write)."""
        return read_status(self.data_dir / "status.json")

    def version(self) -> int:
        """The version the node holds (-1: none yet, or no status)."""
        s = self.status()
        return s.version if s is not None else -1


def node_config(cfg: SwarmConfig, *, role: str, data_dir: Path, trusted: list[str]) -> dict[str, Any]:
    """The TOML tree of one node's config (what its ``--config`` file holds)."""
    tree = cfg.model_dump(mode="json", include=set(SharedSettings.model_fields), exclude_none=True)
    tree.update(role=role, data_dir=str(data_dir))
    tree["net"]["dht_listen"] = [f"/ip4/{cfg.host}/tcp/0"]
    tree["net"]["wire_listen"] = [f"/ip4/{cfg.host}/tcp/0"]
    tree["chain"]["trusted_trainers"] = trusted
    if cfg.versions is not None:
        tree["max_versions"] = cfg.versions
    if role == "trainer":
        tree.update(cfg.model_dump(mode="json", include=set(TrainingSettings.model_fields)))
    return tree


class LocalSwarm:
    """Owns the bootstrap and node processes of one local swarm."""

    def __init__(self, cfg: SwarmConfig, *, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> None:
        self.cfg = cfg
        self.log = log
        self.root = Path(cfg.run_dir).resolve()
        self.children: list[Child] = []
        self.bootstrap: subprocess.Popen[bytes] | None = None
        self.bootstrap_addr = ""
        self.trusted: list[str] = []
        self.leftovers: list[psutil.Process] = []  # processes of killed nodes (psutil), killed at stop if still running

    # ---- start ---------------------------------------------------------------------------
    def start(self, *, stop: Callable[[], bool] = lambda: False) -> None:
        """Wipe the last run's state (``fresh``), start the bootstrap, warm the model up once
        (``warm_up``), then every node. ``stop``: asked while warming up (Ctrl+C)."""
        if self.cfg.fresh:
            wipe_run_state(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.cfg.net.faults.enabled:
            self.log("WARNING: CHAOS TESTING: [net.faults] is enabled; every node faults its own fetches and pushes")
        self.bootstrap_addr = self._start_bootstrap()
        self.trusted = self.trainer_keys()
        self.warm_up(stop)
        for i in range(self.cfg.trainers):
            self.add_node(f"trainer-{i}", "trainer")
        for i in range(self.cfg.inference):
            self.add_node(f"inference-{i}", "inference")

    def trainer_keys(self) -> list[str]:
        """Create (or load) every trainer's identity before any node starts; every node's config
        then trusts exactly these keys (``chain.trusted_trainers``), so the local swarm is keyed,
        not open."""
        return [Identity.load_or_create(self.root / f"trainer-{i}" / "identity.key").public_key_hex
                for i in range(self.cfg.trainers)]

    def warm_up(self, stop: Callable[[], bool]) -> None:
        """Train (or find in the cache) the embedded model's warm start once, before any trainer
        starts, its progress lines passed to ``log``: the trainers then load it from the cache
        instead of all training the same thing at once in silence."""
        if self.cfg.model.kind == "hf" or self.cfg.grpo.warmstart_steps == 0:
            return
        d = self.root / "trainer-0"
        d.mkdir(parents=True, exist_ok=True)
        conf = d / "node.toml"
        conf.write_text(tomli_w.dumps(node_config(self.cfg, role="trainer", data_dir=d, trusted=self.trusted)))
        cached = _cached_warm_start(conf)
        if cached is not None:  # no process to start: each trainer loads it
            self.log(f"[warm start] cached weights found: {cached}")
            return
        proc = subprocess.Popen([sys.executable, "-m", "pulse_node.commands.warmup", str(conf)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: queue.Queue[str] = queue.Queue()

        def read() -> None:
            for ln in proc.stdout or ():
                lines.put(ln)

        threading.Thread(target=read, name="warm-up-lines", daemon=True).start()
        last: list[str] = []
        try:
            while not (proc.poll() is not None and lines.empty()):
                if stop():
                    return
                with contextlib.suppress(queue.Empty):
                    line = lines.get(timeout=0.5).rstrip()
                    last = [*last[-11:], line]
                    if line.startswith("[warm start]"):
                        self.log(line)
        finally:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=5)
        if proc.returncode:
            raise PulseError(f"the warm start exited with code {proc.returncode}:" + "".join(f"\n  | {ln}" for ln in last))

    def _start_bootstrap(self) -> str:
        d = self.root / "bootstrap"
        d.mkdir(parents=True, exist_ok=True)
        maddrs = d / "maddrs.txt"
        maddrs.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pulse_node", "bootstrap", "--host-maddrs", f"/ip4/{self.cfg.host}/tcp/0",
               "--identity", str(d / "identity.key"), "--run-id", self.cfg.run_id, "--print-maddrs-file", str(maddrs)]
        self.bootstrap = self._spawn(cmd, d / "log.txt")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.bootstrap.poll() is not None:
                raise PulseError(f"bootstrap exited with code {self.bootstrap.returncode}; see {d / 'log.txt'}")
            if maddrs.exists() and maddrs.read_text().strip():
                return maddrs.read_text().split()[0]
            time.sleep(0.1)
        raise PulseError(f"bootstrap did not print its address within 60 s; see {d / 'log.txt'}")

    def add_node(self, name: str, role: str) -> Child:
        """Start one more ``pulse-node join`` process (also used for late joiners)."""
        child = self._launch(name, role)
        self.children.append(child)
        return child

    def _launch(self, name: str, role: str) -> Child:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        conf = d / "node.toml"
        conf.write_text(tomli_w.dumps(node_config(self.cfg, role=role, data_dir=d, trusted=self.trusted)))
        cmd = [sys.executable, "-m", "pulse_node", "join", "--role", role, "--config", str(conf),
               "--bootstrap", self.bootstrap_addr]
        ranks = self._ranks(name, role)
        if ranks > 1:  # the way distributed PyTorch is launched: rank 0 is the node, the rest compute
            cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "pulse_node"]
        return Child(name, role, d, self._spawn(cmd, d / "log.txt"))

    def _ranks(self, name: str, role: str) -> int:
        index = int(name.rsplit("-", 1)[-1]) if role == "trainer" and name.rsplit("-", 1)[-1].isdigit() else -1
        return self.cfg.trainer_ranks[index] if 0 <= index < len(self.cfg.trainer_ranks) else 1

    @staticmethod
    def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        log = open(log_path, "ab")
        try:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            log.close()

    # ---- watch ---------------------------------------------------------------------------
    def statuses(self) -> list[tuple[Child, StatusReport | None]]:
        return [(c, c.status()) for c in self.children]

    def node_inputs(self) -> list[NodeInput]:
        """The dashboard's inputs: exactly the nodes this swarm started (not older dirs in run_dir)."""
        return [read_node_dir(c.data_dir, name=c.name, starting=c.proc is not None and c.proc.poll() is None)
                for c in self.children]

    def snapshot(self) -> SwarmSnapshot:
        return build_snapshot(self.node_inputs(), now=time.time(), run_id=self.cfg.run_id,
                              source=f"run dir {self.root}", bootstrap=self.bootstrap_addr)

    def check_alive(self) -> None:
        """``PulseError`` naming the first node that exited, with the end of its own log."""
        for c in self.children:
            if c.proc.poll() is not None:
                tail = log_tail(c.data_dir / "log.txt")
                raise PulseError(f"{c.name} exited with code {c.proc.returncode}; the end of {c.data_dir / 'log.txt'}:"
                                 + "".join(f"\n  | {line}" for line in tail))

    def min_version(self) -> int:
        return min((c.version() for c in self.children), default=-1)

    def wait_versions(self, versions: int | None, *, on_tick: Callable[[], None], stop: Callable[[], bool]) -> None:
        """Until every node holds ``versions`` (or forever), calling ``on_tick`` twice a second."""
        while not stop():
            self.check_alive()
            on_tick()
            if versions is not None and self.min_version() >= versions:
                return
            time.sleep(0.5)

    # ---- chaos (tests and bench/chaos.py) --------------------------------------------------
    def kill(self, child: Child, what: str = "node") -> list[psutil.Process]:
        """SIGKILL part of a running node, by the PIDs this swarm started and their children:
        ``role`` (the role process only: its workers must notice and exit by themselves),
        ``node`` (the role process and all its workers), ``dht`` or ``wire`` (one worker and its
        children: the node must notice and exit). Returns the node's whole process tree just
        before, as ``psutil.Process`` objects (``gone`` says when all have exited)."""
        import psutil

        try:
            root = psutil.Process(child.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        targets = [root] if what == "role" else tree if what == "node" else _worker_tree(tree, worker_module(what))
        if not targets:
            raise PulseError(f"{child.name}: no {what} process to kill")
        for p in targets:
            try:
                p.kill()  # psutil checks the process is still the one it saw (no PID reuse)
            except psutil.NoSuchProcess:
                pass
        self.leftovers.extend(tree)
        return tree

    @staticmethod
    def gone(procs: list[psutil.Process]) -> bool:
        """Whether none of ``procs`` (``psutil.Process``) runs any more (zombies count as gone)."""
        import psutil

        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                pass
        return True

    @staticmethod
    def kill_leftovers(procs: list[psutil.Process]) -> None:
        """SIGKILL what still runs of ``procs`` (``psutil.Process``, e.g. orphaned workers of a
        killed node); psutil checks each is still the process it saw."""
        import psutil

        for p in procs:
            try:
                if p.is_running():
                    p.kill()
            except psutil.NoSuchProcess:
                pass

    def restart(self, child: Child, *, timeout: float = 30.0) -> Child:
        """Start an exited (or killed) node again on the same data dir; returns its new ``Child``."""
        child.proc.wait(timeout=timeout)
        new = self._launch(child.name, child.role)
        self.children[self.children.index(child)] = new
        return new

    # ---- stop ----------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM every child, then SIGKILL what is left at the deadline."""
        procs = [c.proc for c in self.children] + ([self.bootstrap] if self.bootstrap else [])
        for p in procs:  # the node stops its own workers; the group is killed only at the deadline
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.stop_timeout_s * 0.8
        for p in procs:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:  # also reaches workers orphaned by a node that died
            _signal_group(p, signal.SIGKILL)
            if p.poll() is None:
                p.wait(timeout=5)
        self.kill_leftovers(self.leftovers)

    # ---- summary -------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The JSON summary of ``pulse-node swarm --json`` (keys listed in the README)."""
        nodes = [(c.name, c.role, st) for c, st in self.statuses()]
        return swarm_summary(self.snapshot(), nodes, run_dir=self.root, bootstrap=self.bootstrap_addr)


def log_tail(path: Path, *, lines: int = 12, max_bytes: int = 16 << 10) -> list[str]:
    """The last ``lines`` lines of a node's log (from its last ``max_bytes``): where its own error is."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return [f"(cannot read it: {exc})"]
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]


#: what a fresh run keeps of a node dir: its key (trainers stay the trusted set); all else is the last run's
KEPT_ACROSS_RUNS = ("identity.key",)


def wipe_run_state(root: Path) -> None:
    """Delete every per-run file of the node dirs under ``root`` (stores, decided rounds, evidence,
    spools, logs, status) but ``KEPT_ACROSS_RUNS``: no node of a new run starts with anything the
    last run signed, decided or wrote."""
    if not root.is_dir():
        return
    for node in root.iterdir():
        if not (node.is_dir() and (node.name.startswith(("trainer-", "inference-")) or node.name == "bootstrap")):
            continue
        for entry in node.iterdir():
            if entry.name in KEPT_ACROSS_RUNS:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


#: the ``-m`` module each worker process runs (``DhtClient.module``, ``WireClient.module``; a test
#: keeps them equal: the house keeps ``swarm/`` from importing ``net/``)
WORKER_MODULES = {"dht": "pulse_node.net.dht.worker", "wire": "pulse_node.net.wire.worker"}


def _cached_warm_start(conf: Path) -> Path | None:
    """The warm-start file a trainer of ``conf`` would load, if it is in the cache already."""
    from pulse_node.config import TrainerConfig, load_node_config
    from pulse_node.rl.warmstart_key import cached_file

    cfg = load_node_config(conf, role="trainer")
    assert isinstance(cfg, TrainerConfig)
    path = cached_file(cfg.task, model_cfg=cfg.model, grpo_cfg=cfg.grpo, seed=cfg.seed)
    return path if path.is_file() else None


def worker_module(what: str) -> str:
    """The ``-m`` module a node's ``dht`` or ``wire`` worker process runs (what ``kill`` looks for)."""
    return WORKER_MODULES[what]


def _worker_tree(tree: list[psutil.Process], module: str) -> list[psutil.Process]:
    """The process of worker ``module`` (its ``-m`` name, e.g. ``pulse_node.net.dht.worker``) in ``tree`` and its children."""
    import psutil

    for p in tree:
        try:
            if module in p.cmdline():
                return [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return []


def _signal_group(p: subprocess.Popen[bytes] | subprocess.Popen[str], sig: int) -> None:
    """Signal the child's process group (its session), which outlives the leader while any
    member (a worker) still runs; an empty group is a no-op."""
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
