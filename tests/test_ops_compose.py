"""docker-compose.yml is valid, and its services' own commands form a working swarm.

There is no Docker engine here, so the services run as local processes: the commands and health
checks are read from docker-compose.yml and translated (``/dns4/bootstrap`` -> 127.0.0.1, fixed
ports -> port 0 / the bootstrap's real port, named volumes -> directories under one run dir,
tiny model via ``--set``). The same running swarm then feeds the dashboard (``status --once``,
``--json``), and a node started with a copied identity must be refused and shown as such.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import wait_for

from pulse_node.daemon.status_model import StatusReport, read_status

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
PULSE = [sys.executable, "-m", "pulse_node"]
TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "task.digits=2", "sampling.prompts_per_batch=4",
        "sampling.group_size=4", 'net.dht_listen=["/ip4/127.0.0.1/tcp/0"]', 'net.wire_listen=["/ip4/127.0.0.1/tcp/0"]']
TINY_TRAINER = ["grpo.warmstart_steps=30", "loco.inner_steps=2", "eval_every=0", "rollout_wait_s=0.5"]
#: generous: start + warm start + 2 versions take ~100 s on 2 busy cores
SWARM_DEADLINE_S = 240


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's variable substitution, for the forms the file uses: ``${VAR:-default}`` (default
    when unset or empty), ``${VAR-default}`` (default when unset) and ``$$`` (a literal ``$``)."""
    env = env or {}

    def value(m: re.Match) -> str:
        name, colon, default = m.groups()
        v = env.get(name)
        return default if v is None or (colon and not v) else v

    return re.sub(r"\$\{(\w+)(:?)-([^}]*)\}", value, text.replace("$$", "\0")).replace("\0", "$")


def test_compose_nodes_announce_a_dialable_data_plane_address() -> None:
    """Each node's data plane listens on a fixed port and announces it by service name (the
    default /ip4/0.0.0.0 port 0 would announce 0.0.0.0, which no other container can dial)."""
    from pulse_node.config import NodeConfig
    from pulse_node.configload import load_config

    for name, svc in _compose()["services"].items():
        script = svc["command"][2]
        if " join " not in script:
            continue
        assert f"--wire-announce /dns4/{name}/tcp/31339" in script, name
        sets = [a for a in shlex.split(script.split("--bootstrap")[0]) if a.startswith("net.wire_listen=")]
        cfg = load_config(NodeConfig, None, [*sets, f'net.wire_announce=["/dns4/{name}/tcp/31339"]'])
        assert cfg.net.wire_listen == ["/ip4/0.0.0.0/tcp/31339"] and cfg.net.wire_announce, name


def test_compose_file_declares_the_swarm() -> None:
    c = _compose()
    svcs = c["services"]
    default = sorted(n for n, s in svcs.items() if not s.get("profiles"))
    assert default == ["bootstrap", "inference-0", "inference-1", "trainer-0", "trainer-1"]
    for name in default:
        cmd = " ".join(svcs[name]["command"])
        assert ("pulse-node bootstrap " if name == "bootstrap" else "pulse-node join --role ") in cmd
        assert svcs[name]["healthcheck"]["test"][0] == "CMD"
        assert all(v.split(":")[0] in c["volumes"] for v in svcs[name]["volumes"])  # named volumes only
        if name != "bootstrap":
            assert "--bootstrap /dns4/bootstrap/tcp/31337/p2p/" in cmd
            assert "/health" in " ".join(svcs[name]["healthcheck"]["test"])
            assert svcs[name]["depends_on"]["bootstrap"]["condition"] == "service_healthy"
    gpu = [s for s in svcs.values() if "gpu" in s.get("profiles", [])]
    assert gpu and gpu[0]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert len({s["volumes"][0] for s in svcs.values()}) == len(svcs)  # no two nodes share a data volume


def test_compose_nodes_trust_exactly_the_trainer_services_keys() -> None:
    """Every trainer service writes its own public key to the shared volume; every node waits for
    all of them and trusts exactly those (never "any peer announcing the trainer role")."""
    c = _compose()
    svcs = c["services"]
    trainers = sorted(n for n, s in svcs.items() if " --role trainer " in s["command"][2])
    assert trainers == ["trainer-0", "trainer-1"]
    assert c["x-node"]["environment"]["PULSE_TRAINER_KEYS"] == str(len(trainers))
    for name, svc in svcs.items():
        script = svc["command"][2]
        if " join " not in script:
            continue
        assert "--set chain.trusted_trainers_path=/shared/trainer-keys" in script, name
        assert script.index("-ge $$PULSE_TRAINER_KEYS") < script.index("exec pulse-node join"), name
        writes = f"/shared/trainer-keys/{name}.pub"
        assert (writes in script) == (name in trainers), name
        assert ("shared:/shared" in svc["volumes"]) == (name in trainers), name  # only trainers write there


def test_bootstrap_port_is_published_on_loopback_unless_asked() -> None:
    (port,) = _compose()["services"]["bootstrap"]["ports"]
    assert interpolate(port) == "127.0.0.1:31337:31337"
    assert interpolate(port, {"PULSE_BOOTSTRAP_BIND": "0.0.0.0"}) == "0.0.0.0:31337:31337"
    assert interpolate(port, {"PULSE_BOOTSTRAP_PORT": ""}) == "127.0.0.1::31337"  # Docker picks the host port
    assert all("ports" not in s for n, s in _compose()["services"].items() if n != "bootstrap")


def _compose_cli() -> list[str] | None:
    """``docker compose`` (v2 plugin) or ``docker-compose``, whichever is installed."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    exe = shutil.which("docker-compose")
    return [exe] if exe else None


def test_docker_compose_config_accepts_the_file() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed; YAML checks above still ran")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    for profile in ([], ["--profile", "gpu"]):
        r = subprocess.run([*cli, "-f", str(COMPOSE), *profile, "config", "-q"], capture_output=True, text=True,
                           timeout=60, cwd=REPO, env=env)
        assert r.returncode == 0, r.stderr


# ---- the services as local processes --------------------------------------------------------
class ComposeAsProcesses:
    """Runs compose services' commands locally; every process is stopped by ``close``."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.compose, self.root, self.cache = _compose(), root, cache
        self.procs: dict[str, subprocess.Popen] = {}
        self.bootstrap_port = 0
        self.env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        self.env["PULSE_TRAINER_KEYS"] = "1"  # compose sets it for its 2 trainer services; this run starts one

    def volume_dir(self, volume: str) -> Path:
        return self.root / re.sub(r"-(data|state)$", "", volume)

    def translate(self, service: str, text: str) -> str:
        text = interpolate(text)  # none of the file's variables is set here
        for spec in self.compose["services"][service].get("volumes", []):
            volume, target = spec.split(":")[:2]
            self.volume_dir(volume).mkdir(parents=True, exist_ok=True)
            text = re.sub(rf"(?<![\w.-]){re.escape(target)}(?=[/\s'\"]|$)", str(self.volume_dir(volume)), text)
        text = text.replace("/ip4/0.0.0.0/tcp/31337", "/ip4/127.0.0.1/tcp/0")
        # containers announce their data plane by service name on a fixed port; local processes
        # share one host, so they listen on 127.0.0.1 port 0 (TINY) and announce that instead
        text = re.sub(r" --wire-announce /dns4/[\w-]+/tcp/31339", "", text)
        text = text.replace("/dns4/bootstrap/tcp/31337", f"/ip4/127.0.0.1/tcp/{self.bootstrap_port}")
        text = text.replace("/configs/", f"{REPO / 'configs'}/")
        return text.replace("--metrics-port 9100", "--metrics-port 0")

    def command(self, service: str) -> list[str]:
        cmd = self.compose["services"][service]["command"]
        assert cmd[:2] == ["sh", "-c"], cmd
        script = self.translate(service, cmd[2])
        if " join " in script:
            role_sets = TINY + (TINY_TRAINER if "--role trainer" in script else [])
            role_sets.append(f"model.cache_dir={json.dumps(str(self.cache))}")
            script += "".join(f" --set {shlex.quote(s)}" for s in role_sets)
        return ["sh", "-c", script]

    def start(self, service: str, *, data_dir: str | None = None) -> subprocess.Popen:
        cmd = self.command(service)
        if data_dir is not None:  # the same service again with another data dir (identity tests)
            cmd[2] = cmd[2].replace(str(self.volume_dir(f"{service}-data")), str(self.root / data_dir))
            (self.root / data_dir).mkdir(parents=True, exist_ok=True)
        name = data_dir or service
        log = open(self.root / f"{name}.log", "ab")
        try:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=self.env, start_new_session=True)
        finally:
            log.close()
        self.procs[name] = p
        return p

    def healthy(self, service: str, *, metrics_port: int = 0) -> bool:
        test = self.compose["services"][service]["healthcheck"]["test"]
        assert test[0] == "CMD"
        argv = [self.translate(service, a).replace("127.0.0.1:9100", f"127.0.0.1:{metrics_port}") for a in test[1:]]
        argv = [sys.executable if a == "python" else a for a in argv]
        return subprocess.run(argv, capture_output=True, timeout=30, env=self.env).returncode == 0

    def start_bootstrap(self) -> str:
        self.start("bootstrap")
        wait_for(lambda: self._alive("bootstrap") and self.healthy("bootstrap"), timeout=60, interval=0.2,
                 what="the bootstrap's compose health check (maddrs file written)")
        addr = next(a for a in (self.root / "shared" / "bootstrap.maddrs").read_text().split() if "/127.0.0.1/" in a)
        self.bootstrap_port = int(addr.split("/tcp/")[1].split("/")[0])
        return addr

    def _alive(self, name: str) -> bool:
        p = self.procs[name]
        if p.poll() is not None:
            pytest.fail(f"{name} exited with code {p.returncode}:\n{self.log_tail(name)}")
        return True

    def log_tail(self, name: str, n: int = 25) -> str:
        try:
            return "\n".join((self.root / f"{name}.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def wait_versions(self, services: tuple[str, ...], version: int, *, timeout: float) -> None:
        """Until every service holds ``version``; on timeout fail with each one's version and log tail."""
        def report() -> str:
            return f"version {version}:\n" + "\n".join(
                f"--- {s}: version {self.version(s)}\n{self.log_tail(s, 8)}" for s in services)

        wait_for(lambda: all(self._alive(s) for s in services) and min(self.version(s) for s in services) >= version,
                 timeout=timeout, interval=0.2, what=report)

    def status(self, service: str) -> StatusReport | None:
        return read_status(self.volume_dir(f"{service}-data") / "status.json")

    def version(self, service: str) -> int:
        s = self.status(service)
        return s.version if s is not None else -1

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)


def _hash_at(status: StatusReport, version: int) -> str | None:
    return next((h.state_hash for h in status.history if h.version == version), None)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, warm_cache):
    root = tmp_path_factory.mktemp("compose-run")
    runner = ComposeAsProcesses(root, warm_cache)
    try:
        runner.start_bootstrap()
        for service in ("trainer-0", "inference-0"):
            runner.start(service)
        runner.wait_versions(("trainer-0", "inference-0"), 2, timeout=SWARM_DEADLINE_S)
        yield runner
    finally:
        runner.close()


@pytest.mark.slow
def test_compose_services_form_a_working_swarm(swarm) -> None:
    t, i = swarm.status("trainer-0"), swarm.status("inference-0")
    assert _hash_at(t, 2) and _hash_at(t, 2) == _hash_at(i, 2)
    assert t.trust_mode == i.trust_mode == "keys", "compose nodes must trust only the trainers' keys"
    for service, st in (("trainer-0", t), ("inference-0", i)):
        port = int(st.metrics_url.rsplit(":", 1)[1])
        assert swarm.healthy(service, metrics_port=port), f"{service}: compose health check failed"


def _status_cli(swarm, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PULSE, "status", "--run-dir", str(swarm.root), "--once", *extra],
                          capture_output=True, text=True, timeout=60, env=swarm.env)


@pytest.mark.slow
def test_dashboard_snapshot_and_screen_of_the_running_swarm(swarm) -> None:
    r = _status_cli(swarm, "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    by = {n["name"]: n for n in snap["nodes"]}
    assert set(by) == {"trainer-0", "inference-0"} and snap["roles"] == {"inference": 1, "trainer": 1}
    assert snap["head"] >= 2 and all(n["state"] == "live" for n in by.values())
    assert snap["hash_checks_total"] >= 2 and snap["hash_disagreements"] == []
    assert not [a for a in snap["alerts"] if a["level"] == "fail"]
    assert snap["bootstrap"] == (swarm.root / "shared" / "bootstrap.maddrs").read_text().split()[0]
    versions = {v["version"]: v for v in snap["versions"]}
    assert {0, 1, 2} <= set(versions) and versions[0]["compression"] is None  # v0: the genesis anchor
    assert versions[1]["compression"] > 1 and versions[2]["dense_bytes"] > versions[2]["patch_bytes"]
    screen = _status_cli(swarm, "--width", "140")
    assert screen.returncode == 0, screen.stderr
    for needle in ("pulse-node status", "trainer-0", "inference-0", "versions", "vs dense", "vs ref", "state hash"):
        assert needle in screen.stdout, needle


@pytest.mark.slow
def test_copied_identity_is_refused_and_shown_by_the_dashboard(swarm) -> None:
    (swarm.root / "trainer-copy").mkdir()
    shutil.copy(swarm.volume_dir("trainer-0-data") / "identity.key", swarm.root / "trainer-copy" / "identity.key")
    p = swarm.start("trainer-0", data_dir="trainer-copy")
    p.wait(timeout=90)
    log = swarm.log_tail("trainer-copy")
    assert p.returncode != 0 and "already used by another running node" in log, log
    shutil.copy(swarm.root / "trainer-copy.log", swarm.root / "trainer-copy" / "log.txt")
    snap = json.loads(_status_cli(swarm, "--json").stdout)
    down = next(n for n in snap["nodes"] if n["name"] == "trainer-copy")
    assert down["state"] == "down" and "already used" in down["problem"]
    assert any(a["level"] == "fail" and "duplicate identity" in a["message"] and "trainer-copy" in a["message"]
               for a in snap["alerts"])
