"""The house of docs/ARCHITECTURE.md holds in the code: which folder may import which, no import
cycle between modules, no module over 500 lines, test support never imported by production code."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "pulse_node"
SHARED = {"errors", "vocab", "fsutil", "signals", "sysmem", "configload", "__version__"}
ABOVE_NET = SHARED | {"codec", "chain", "torchbits", "rl", "loco", "net", "config"}
#: folder (or top-level module) -> what it may import; mirrors the house table of docs/ARCHITECTURE.md
ALLOWED: dict[str, set[str]] = {
    **{m: SHARED for m in SHARED},
    "codec": SHARED,
    "chain": SHARED | {"codec"},
    "torchbits": {"codec"},
    "rl": SHARED | {"codec", "torchbits"},
    "loco": SHARED | {"codec", "chain"},
    "net": SHARED | {"chain"},
    "config": SHARED | {"rl", "loco", "net"},
    "daemon": ABOVE_NET,
    "trainer": ABOVE_NET | {"daemon"},
    "inference": ABOVE_NET | {"daemon"},
    "ops": SHARED | {"chain", "net", "daemon"},
    "roles": ABOVE_NET | {"daemon", "trainer", "inference"},
    "swarm": SHARED | {"chain", "config", "daemon", "ops"},
    "commands": ABOVE_NET | {"daemon", "trainer", "inference", "roles", "ops", "swarm", "commands"},
    "cli": SHARED | {"commands"},
    "__main__": {"cli"},
}
#: edges the table names as exceptions: (importing module, imported folder)
EXCEPTIONS = {
    ("commands/join.py", "testing"),  # fault injection, only with net.faults.enabled (chaos runs)
}
MAX_LINES = 500


def _unit(module: str) -> str:
    """``pulse_node.chain.record`` -> ``chain``; ``pulse_node.errors`` -> ``errors``."""
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    """Every ``pulse_node.*`` module ``path`` imports (at any depth, lazy imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pulse_node."):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names
                       if (PKG / Path(*node.module.split(".")[1:]) / f"{a.name}.py").exists())
        elif isinstance(node, ast.ImportFrom) and node.module == "pulse_node":
            out.update(f"pulse_node.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pulse_node."))
    return out


def _modules() -> dict[str, Path]:
    return {".".join(("pulse_node", *p.relative_to(PKG).with_suffix("").parts)): p
            for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}


def test_folders_import_only_what_the_house_table_allows() -> None:
    bad = []
    for module, path in _modules().items():
        unit = _unit(module) if module.count(".") else "__init__"
        if unit in ("testing", "__init__"):
            continue
        rel = path.relative_to(PKG).as_posix()
        for imported in _imports(path):
            target = _unit(imported)
            if target == unit or (rel, target) in EXCEPTIONS:
                continue
            if target not in ALLOWED.get(unit, set()):
                bad.append(f"{rel} imports {imported}")
    assert not bad, "imports the house table (docs/ARCHITECTURE.md) does not allow:\n" + "\n".join(sorted(bad))


def test_daemon_sits_below_the_roles() -> None:
    """daemon/ runs a role it is handed (``roles.py`` picks it): nothing in it imports trainer/ or
    inference/, not even lazily, and no exception may say otherwise."""
    up = sorted(f"{path.relative_to(PKG).as_posix()} imports {imported}"
                for module, path in _modules().items() if module.startswith("pulse_node.daemon.")
                for imported in _imports(path) if _unit(imported) in ("trainer", "inference"))
    assert not up, "daemon/ imports a role:\n" + "\n".join(up)
    assert not {target for rel, target in EXCEPTIONS if rel.startswith("daemon/")} & {"trainer", "inference"}
    assert not ALLOWED["daemon"] & {"trainer", "inference", "roles"}


#: net/ by what it is: sub-folder -> the net/ sub-folders it may import (docs/ARCHITECTURE.md)
NET_ALLOWED: dict[str, set[str]] = {
    "peers": set(),
    "local": {"peers"},
    "wire": {"local", "peers"},
    "dht": {"local", "peers", "wire"},
}


def test_net_is_split_by_what_it_is() -> None:
    """net/ holds its three things apart (the local RPC, the DHT worker, the wire worker) plus
    what a peer may do; no module sits loose in net/, and the sub-folders import one way."""
    net = PKG / "net"
    loose = sorted(p.name for p in net.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules loose in net/ (put each in the folder it belongs to): {loose}"
    assert {p.name for p in net.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(NET_ALLOWED)
    bad = []
    for module, path in _modules().items():
        if not module.startswith("pulse_node.net.") or module.count(".") < 3:
            continue
        sub = module.split(".")[2]
        for imported in _imports(path):
            parts = imported.split(".")
            if imported.startswith("pulse_node.net.") and len(parts) > 2:
                if parts[2] != sub and parts[2] not in NET_ALLOWED[sub]:
                    bad.append(f"{path.relative_to(PKG).as_posix()} imports {imported}")
    assert not bad, "net/ sub-folders importing against the table:\n" + "\n".join(sorted(bad))


def test_no_import_cycle_between_modules() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        graph[module] = {m for m in _imports(path) if m in modules and m != module}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_no_module_over_500_lines() -> None:
    long = {p.relative_to(PKG).as_posix(): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


ARCHITECTURE = PKG.parent / "docs" / "ARCHITECTURE.md"
LEADING_NAME = re.compile(r"[A-Za-z_][\w.]*")


def _path_section() -> str:
    text = ARCHITECTURE.read_text()
    start = text.index("## The path of one version")
    return text[start:text.index("\n## ", start + 1)]


def _defined_names() -> set[str]:
    names: set[str] = set()
    for path in PKG.rglob("*.py"):
        names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def _module_named(owner: list[str]) -> Path | None:
    """``wire_transfer`` in ``wire_transfer.push``: the one module of that name, if it is one."""
    found = list(PKG.rglob(f"{owner[-1]}.py")) if len(owner) == 1 else []
    return found[0] if len(found) == 1 else None


def test_the_path_of_one_version_names_code_that_exists() -> None:
    """Every file and function the walk-through of docs/ARCHITECTURE.md names is in the code."""
    defined, missing = _defined_names(), []
    for span in re.findall(r"`([^`]+)`", _path_section(), flags=re.S):
        if span.endswith(".py"):
            if not (PKG / span).is_file():
                missing.append(span)
            continue
        match = LEADING_NAME.match(span)
        if match is None:
            continue
        *owner, name = match.group().split(".")
        module = PKG.joinpath(*owner).with_suffix(".py") if owner else None
        module = module if module is not None and module.is_file() else _module_named(owner)
        if module is not None:
            ok = name in {n.name for n in ast.walk(ast.parse(module.read_text())) if hasattr(n, "name")}
        else:
            ok = name in defined and all(o in defined for o in owner)
        if not ok:
            missing.append(span)
    assert not missing, f"docs/ARCHITECTURE.md's path of one version names what the code lacks: {missing}"
