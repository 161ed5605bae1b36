"""The individual checks of ``pulse-node doctor``: each returns a ``Check`` (PASS/WARN/FAIL/SKIP + next step).

Environment checks (python, imports, dependency pins, disk, accelerator) need no network.
Imports of torch, hivemind and libp2p each run in their own subprocess: hivemind and libp2p
cannot share a process, and a broken install must not take the doctor down with it.
Network checks live in ``doctor.py`` (they share one DHT client).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, ParamSpec

import pydantic

Status = Literal["PASS", "WARN", "FAIL", "SKIP"]
IMPORT_TIMEOUT_S = 120.0
DISK_FAIL_BYTES = 500 * 10**6
DISK_WARN_BYTES = 5 * 10**9
PYTHON_RANGE = ((3, 10), (3, 13))

PROBES = {
    "torch": ("import json, torch\n"
              "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
              "print(json.dumps({'version': torch.__version__, 'cuda_build': torch.version.cuda,\n"
              "  'devices': [torch.cuda.get_device_name(i) for i in range(n)]}))"),
    "hivemind": ("import json, os, hivemind\n"
                 "p = os.path.join(os.path.dirname(hivemind.__file__), 'hivemind_cli', 'p2pd')\n"
                 "print(json.dumps({'version': hivemind.__version__, 'p2pd': os.access(p, os.X_OK)}))"),
    "libp2p": ("import json, libp2p\nfrom importlib.metadata import version\n"
               "print(json.dumps({'version': version('libp2p')}))"),
}


class Check(pydantic.BaseModel):
    """One line of the doctor's report (``--json`` prints a list of these)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    name: str
    status: Status
    detail: str
    fix: str = ""
    seconds: float = 0.0


_P = ParamSpec("_P")


def timed(name: str, fn: Callable[_P, Check], *args: _P.args, **kwargs: _P.kwargs) -> Check:
    """Run one check function; an unexpected exception is a FAIL naming it, never a crash."""
    t0 = time.monotonic()
    try:
        check = fn(*args, **kwargs)
    except Exception as exc:  # a doctor must report, not die
        check = Check(name=name, status="FAIL", detail=f"{type(exc).__name__}: {exc}",
                      fix="this is a bug in the check or a broken install; please report it")
    return check.model_copy(update={"seconds": round(time.monotonic() - t0, 2)})


def check_python() -> Check:
    v = sys.version_info[:3]
    lo, hi = PYTHON_RANGE
    text = ".".join(map(str, v))
    if lo <= v[:2] < hi:
        return Check(name="python", status="PASS", detail=f"Python {text} at {sys.executable}")
    return Check(name="python", status="FAIL",
                 detail=f"Python {text} is outside {lo[0]}.{lo[1]} <= python < {hi[0]}.{hi[1]}",
                 fix="create the venv with a supported Python, e.g. python3.11 -m venv .venv")


# ---- imports in subprocesses ----------------------------------------------------------------
def run_probes(names: list[str], *, timeout: float = IMPORT_TIMEOUT_S) -> dict[str, dict[str, Any] | str]:
    """Import each package in its own interpreter, all at once; a dict of facts or an error line."""
    procs = {n: subprocess.Popen([sys.executable, "-c", PROBES[n]], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True) for n in names}
    deadline = time.monotonic() + timeout
    out: dict[str, dict[str, Any] | str] = {}
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            out[name] = f"import did not finish within {timeout:.0f} s"
            continue
        if p.returncode != 0:
            lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
            out[name] = lines[-1] if lines else f"exit code {p.returncode}"
            continue
        try:
            out[name] = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out[name] = f"unexpected probe output {stdout[-200:]!r}"
    return out


def check_import(name: str, facts: dict[str, Any] | str) -> Check:
    if isinstance(facts, str):
        return Check(name=name, status="FAIL", detail=f"import {name} failed: {facts}",
                     fix=f"reinstall: pip install --force-reinstall '{_requirement_of(name) or name}'"
                     + (" (install torch first: see README)" if name == "torch" else ""))
    if name == "hivemind" and not facts.get("p2pd"):
        return Check(name=name, status="FAIL", detail=f"hivemind {facts['version']} has no executable p2pd binary",
                     fix="pip install --force-reinstall hivemind==1.1.12 "
                     "(its wheel ships p2pd; a source build needs Go)")
    return Check(name=name, status="PASS", detail=f"{name} {facts['version']} imports")


def check_accelerator(facts: dict[str, Any] | str) -> Check:
    if isinstance(facts, str):
        return Check(name="accelerator", status="SKIP", detail="torch does not import (see the torch check)")
    if facts.get("devices"):
        return Check(name="accelerator", status="PASS",
                     detail=f"CUDA {facts.get('cuda_build')}: {', '.join(facts['devices'])}")
    cuda = facts.get("cuda_build")
    build = f"CUDA {cuda} build, no visible GPU" if cuda else "a CPU-only torch build"
    return Check(name="accelerator", status="PASS",
                 detail=f"no CUDA device ({build}); nodes run on CPU (fine for the tiny model)",
                 fix="for a GPU: install the torch build for your CUDA, check nvidia-smi, "
                 "and in Docker use --profile gpu")


# ---- dependency sanity (pip check, for pulse-node's requirement closure) --------------------
def _requirement_of(name: str) -> str | None:
    for req in metadata.requires("pulse-node") or []:
        if req.lower().startswith(name.lower()):
            return req.split(";")[0].strip()
    return None


def dependency_problems(root: str = "pulse-node") -> list[str]:
    """Unmet requirements in the installed closure of ``root`` (missing or wrong version)."""
    from packaging.requirements import Requirement

    problems: list[str] = []
    seen: set[str] = set()
    todo = [(root, None)]
    while todo:
        dist_name, extra = todo.pop()
        if dist_name.lower() in seen:
            continue
        seen.add(dist_name.lower())
        for text in metadata.requires(dist_name) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra or ""}):
                continue
            try:
                installed = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                problems.append(f"{dist_name} requires {req}, which is not installed")
                continue
            if req.specifier and not req.specifier.contains(installed, prereleases=True):
                problems.append(f"{dist_name} requires {req}, but {installed} is installed")
            todo.append((req.name, None))
    return sorted(set(problems))


def check_dependencies() -> Check:
    try:
        problems = dependency_problems()
    except metadata.PackageNotFoundError:
        return Check(name="dependencies", status="FAIL", detail="pulse-node is not installed in this interpreter",
                     fix="pip install -e . (or pip install pulse-node) in this venv")
    if problems:
        return Check(name="dependencies", status="FAIL", detail="; ".join(problems[:6]),
                     fix="pip install -e . again in a fresh venv (torch first); do not upgrade protobuf/grpcio "
                     "past the pins: hivemind 1.1.12 and libp2p 0.8.1 need them")
    return Check(name="dependencies", status="PASS", detail="every requirement of pulse-node's closure is met")


# ---- disk ----------------------------------------------------------------------------------
def check_disk(data_dir: Path) -> Check:
    probe = Path(data_dir).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    detail = f"{free / 1e9:.1f} GB free at {probe} (data dir {data_dir})"
    if free < DISK_FAIL_BYTES:
        return Check(name="disk", status="FAIL", detail=detail,
                     fix="free space or point --data-dir elsewhere; lower chain.keep_versions / keep_anchors")
    if free < DISK_WARN_BYTES:
        return Check(name="disk", status="WARN", detail=detail,
                     fix="anchors of large models need GBs: lower chain.keep_anchors or free space")
    return Check(name="disk", status="PASS", detail=detail)


# ---- address classification (used by the reachability check) -------------------------------
def address_scope(maddr: str) -> str:
    """public | private | loopback | relay | dns | unknown for one multiaddr."""
    if "/p2p-circuit" in maddr:
        return "relay"
    parts = maddr.split("/")
    if len(parts) > 2 and parts[1] in ("dns", "dns4", "dns6"):
        return "dns"
    if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
        try:
            ip = ipaddress.ip_address(parts[2])
        except ValueError:
            return "unknown"
        if ip.is_loopback:
            return "loopback"
        return "private" if (ip.is_private or ip.is_link_local or ip.is_unspecified) else "public"
    return "unknown"
