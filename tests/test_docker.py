"""The image builds from this checkout and ``docker compose up`` runs the swarm in containers.

Needs a Docker engine with the compose v2 plugin (on Linux as root, ``bash
../shared/tools/docker-lab.sh`` sets one up); skipped with the reason when ``docker info`` fails or
the base image can be neither found nor pulled. The image is built under a tag of its own, the five
services of docker-compose.yml run under a unique project name with a tiny model
(``PULSE_TRAINER_ARGS`` / ``PULSE_INFERENCE_ARGS``) and a free host port for the bootstrap, and
``docker compose down -v`` always runs at the end (the tag is removed too; build layers stay
cached).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
BASE_IMAGE = "python:3.11-slim"
NODES = ("trainer-0", "trainer-1", "inference-0", "inference-1")
TINY = ("--set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set task.digits=2 "
        "--set sampling.prompts_per_batch=4 --set sampling.group_size=4")
TINY_TRAINER = "--set grpo.warmstart_steps=30 --set loco.inner_steps=2 --set eval_every=0 --set rollout_wait_s=0.5"
#: an uncached build took ~5 min here (dependency downloads); a cached one ~30 s
BUILD_TIMEOUT_S = 1200
#: start + warm start + 2 versions in 4 containers; ~250 s here with 2 cores at load average ~20
SWARM_DEADLINE_S = 420


def _run(argv: list[str], *, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def _engine_problem() -> str | None:
    """Why this machine cannot run the test, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    info = _run(["docker", "info"], timeout=60)
    if info.returncode != 0:
        return f"no Docker engine (`docker info` failed: {(info.stderr or info.stdout).strip()[-200:]})"
    if _run(["docker", "compose", "version"], timeout=30).returncode != 0:
        return "the docker compose v2 plugin is not installed"
    if _run(["docker", "image", "inspect", BASE_IMAGE], timeout=30).returncode != 0:
        pull = _run(["docker", "pull", BASE_IMAGE], timeout=600)
        if pull.returncode != 0:
            return f"base image {BASE_IMAGE} is absent and cannot be pulled: {pull.stderr.strip()[-200:]}"
    return None


class ComposeProject:
    """One ``docker compose -p NAME`` project of docker-compose.yml; ``down`` removes all of it."""

    def __init__(self) -> None:
        self.name = f"pulsetest-{os.getpid()}-{secrets.token_hex(3)}"
        self.image = f"pulse-node:{self.name}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
        self.env.update(PULSE_IMAGE=self.image, PULSE_BOOTSTRAP_PORT="", PULSE_INFERENCE_ARGS=TINY,
                        PULSE_TRAINER_ARGS=f"{TINY} {TINY_TRAINER}")

    def compose(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return _run(["docker", "compose", "-p", self.name, "-f", str(COMPOSE), *args], timeout=timeout, env=self.env)

    def check(self, *args: str, timeout: float) -> str:
        r = self.compose(*args, timeout=timeout)
        if r.returncode != 0:
            pytest.fail(f"docker compose {' '.join(args)} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
        return r.stdout

    def status(self, service: str) -> dict:
        r = self.compose("exec", "-T", service, "cat", "/data/status.json", timeout=30)
        try:
            return json.loads(r.stdout) if r.returncode == 0 else {}
        except ValueError:
            return {}

    def bootstrap_maddr(self) -> str:
        port = self.check("port", "bootstrap", "31337", timeout=30).strip().rsplit(":", 1)[1]
        maddrs = self.check("exec", "-T", "bootstrap", "cat", "/shared/bootstrap.maddrs", timeout=30).split()
        return f"/ip4/127.0.0.1/tcp/{port}/p2p/{maddrs[0].rsplit('/p2p/', 1)[1]}"

    def containers(self) -> list[dict]:
        """``docker compose ps`` as dicts (one JSON object per line)."""
        out = self.check("ps", "--all", "--format", "json", timeout=60)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "15", timeout=60).stdout

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=180)
        _run(["docker", "image", "rm", self.image], timeout=60)


def _hash_at(status: dict, version: int) -> str | None:
    return next((h["state_hash"] for h in status.get("history", []) if h.get("version") == version), None)


def _all_hold(project: ComposeProject, version: int) -> bool:
    """Every node holds ``version`` or later and all four have the same state hash at it."""
    statuses = [project.status(s) for s in NODES]
    hashes = {_hash_at(st, version) for st in statuses}
    return min(st.get("version", -1) for st in statuses) >= version and len(hashes) == 1 and None not in hashes


@pytest.fixture(scope="module")
def compose_swarm():
    problem = _engine_problem()
    if problem:
        pytest.skip(problem)
    project = ComposeProject()
    try:
        project.check("build", "bootstrap", timeout=BUILD_TIMEOUT_S)
        project.check("up", "-d", timeout=300)
        try:
            wait_for(lambda: _all_hold(project, 2), timeout=SWARM_DEADLINE_S, interval=2,
                     what="every container at version 2 with equal state hashes")
            wait_for(lambda: all(c.get("Health") == "healthy" for c in project.containers()), timeout=60,
                     interval=2, what="every container's compose health check")
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\n{project.logs()}")
        yield project
    finally:
        project.down()


def test_containers_agree_on_every_version(compose_swarm) -> None:
    statuses = {s: compose_swarm.status(s) for s in NODES}
    common = set.intersection(*({h["version"] for h in st["history"]} for st in statuses.values()))
    assert 2 in common, common  # a node that started late may have jumped a version (catch-up patch)
    for v in sorted(common):
        assert len({_hash_at(st, v) for st in statuses.values()}) == 1, f"state hashes differ at version {v}"
    containers = compose_swarm.containers()
    assert sorted(c["Service"] for c in containers) == sorted(("bootstrap", *NODES))
    assert all(c["State"] == "running" and c["Health"] == "healthy" for c in containers), containers


def test_host_status_sees_every_container(compose_swarm) -> None:
    maddr = compose_swarm.bootstrap_maddr()
    r = _run([sys.executable, "-m", "pulse_node", "status", "--bootstrap", maddr, "--run-id", "pulse-local",
              "--once", "--json"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    snap = json.loads(r.stdout)
    assert snap["roles"] == {"bootstrap": 1, "trainer": 2, "inference": 2}, snap["roles"]
    seen = {n["peer_id"] for n in snap["nodes"]}
    assert {compose_swarm.status(s)["peer_id"] for s in NODES} <= seen
    assert snap["head"] >= 2 and snap["hash_disagreements"] == []
    assert all(n["hash_agrees"] is not False for n in snap["nodes"])
