"""The house of docs/ARCHITECTURE.md holds in the code: which folder may import which, no import
cycle between modules, no module over 500 lines, test support never imported by production code,
and judging peers done in peers/ only."""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "pulse_node"
SHARED = {"errors", "vocab", "fsutil", "signals", "sysmem", "configload", "__version__"}
ABOVE_NET = SHARED | {"codec", "chain", "torchbits", "rl", "loco", "net", "config"}
#: folder (or top-level module) -> what it may import; mirrors the house table of docs/ARCHITECTURE.md
ALLOWED: dict[str, set[str]] = {
    **dict.fromkeys(SHARED, SHARED),
    "codec": SHARED,
    "chain": SHARED | {"codec"},
    "torchbits": {"codec"},
    "rl": SHARED | {"codec", "torchbits"},
    "loco": SHARED | {"codec", "chain"},
    "net": SHARED | {"chain"},
    "config": SHARED | {"rl", "loco", "net"},
    "peers": SHARED | {"codec", "chain", "loco", "net", "config"},
    "daemon": ABOVE_NET | {"peers"},
    "trainer": ABOVE_NET | {"daemon", "peers"},
    "inference": ABOVE_NET | {"daemon", "peers"},
    "ops": SHARED | {"chain", "net", "daemon"},
    "roles": ABOVE_NET | {"daemon", "trainer", "inference"},
    "swarm": SHARED | {"chain", "config", "daemon", "ops", "rl"},
    "commands": ABOVE_NET | {"daemon", "peers", "trainer", "inference", "roles", "ops", "swarm", "commands"},
    "cli": SHARED | {"commands"},
    "__main__": {"cli"},
}
#: edges the table names as exceptions: (importing module, imported folder)
EXCEPTIONS = {
    ("commands/join.py", "testing"),  # fault injection, only with net.faults.enabled (chaos runs)
    ("trainer/role.py", "testing"),  # a cheating trainer, only with faults.advantage_flip (tests, bench)
}
MAX_LINES = 500


def _unit(module: str) -> str:
    """``pulse_node.chain.record`` -> ``chain``; ``pulse_node.errors`` -> ``errors``."""
    return module.split(".")[1]


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s syntax tree, parsed once for all the house's tests."""
    return tuple(ast.walk(ast.parse(path.read_text())))


def _imports(path: Path) -> set[str]:
    """Every ``pulse_node.*`` module ``path`` imports (at any depth, lazy imports included)."""
    out: set[str] = set()
    for node in _nodes(path):
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


#: the folders peers/ sits above (they never import it) and below (it never imports them)
BELOW_PEERS = {"codec", "chain", "net", "loco", "rl", "config", "torchbits"} | SHARED
ABOVE_PEERS = {"daemon", "trainer", "inference", "roles", "ops", "swarm", "commands", "cli", "__main__"}


def test_peers_sits_above_chain_and_net_and_below_the_roles() -> None:
    """Judging peers is one layer: nothing below it imports it (not even lazily), it imports
    nothing above it, and the table says so."""
    bad = []
    for module, path in _modules().items():
        unit = _unit(module) if module.count(".") else "__init__"
        for imported in _imports(path):
            target = _unit(imported)
            if (unit in BELOW_PEERS and target == "peers") or (unit == "peers" and target in ABOVE_PEERS):
                bad.append(f"{path.relative_to(PKG).as_posix()} imports {imported}")
    assert not bad, "imports running across peers/ the wrong way:\n" + "\n".join(sorted(bad))
    assert not ALLOWED["peers"] & ABOVE_PEERS
    assert all("peers" not in ALLOWED[u] for u in BELOW_PEERS)
    assert not {target for rel, target in EXCEPTIONS if rel.split("/")[0] in BELOW_PEERS} & {"peers"}


#: the ledgers of peers/: what records a strike, a ban, a failure cool-down, standing, a
#: conviction or a member. Each method of theirs either only reads (``READS``) or records, and a
#: recorder is named ``mark_*``, so the rule below holds for every one added later.
LEDGERS = {"Strikes", "Standing", "EvidenceBook", "TrainerSet"}
READS = {"ignored", "score", "known", "delivered_before", "known_ids", "epoch", "order", "providers", "summary",
         "entries", "members", "is_member", "describe", "from_config", "check", "depth_of"}


def _ledger_methods() -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for path in (PKG / "peers").glob("*.py"):
        for node in _nodes(path):
            if isinstance(node, ast.ClassDef) and node.name in LEDGERS:
                out[node.name] += [f.name for f in node.body if isinstance(f, ast.FunctionDef)]
    return out


def test_the_ledgers_of_peers_name_every_recorder_mark() -> None:
    methods = _ledger_methods()
    assert set(methods) == LEDGERS, f"ledgers not found in peers/: {LEDGERS - set(methods)}"
    loose = sorted(f"{cls}.{name}" for cls, names in methods.items() for name in names
                   if not name.startswith(("_", "mark_")) and name not in READS)
    assert not loose, f"ledger methods that are neither a listed read nor named mark_*: {loose}"


def test_no_module_outside_peers_records_a_strike_a_ban_or_standing() -> None:
    """Only peers/ defines or calls a recorder (``mark_*``), builds a ledger (``Strikes``,
    ``Standing``, ``EvidenceBook``) or reaches into the book's; nothing outside it keeps a strike
    or ban count of its own. Everyone else hands the book an outcome (``PeerBook.judge`` / ``ask``)."""
    bad = []
    for module, path in _modules().items():
        if module.startswith("pulse_node.peers."):
            continue
        rel = path.relative_to(PKG).as_posix()
        for node in _nodes(path):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("mark_"):
                bad.append(f"{rel}:{node.lineno} defines {node.name}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("mark_") \
                    and not ast.unparse(node.value).startswith("torch."):  # torch's own (mark_static_address)
                bad.append(f"{rel}:{node.lineno} calls {ast.unparse(node)}")
            elif isinstance(node, ast.Attribute) and node.attr in {"ledger", "standing", "evidence", "trainers"} \
                    and "book" in ast.unparse(node.value):
                bad.append(f"{rel}:{node.lineno} reaches into {ast.unparse(node)}")
            elif isinstance(node, ast.Name) and node.id in {"Strikes", "Standing", "EvidenceBook"}:
                bad.append(f"{rel}:{node.lineno} names the ledger {node.id}")
            elif isinstance(node, ast.AugAssign) and re.search(r"\b(strikes|bans|failures|fail_streak)\b",
                                                               ast.unparse(node.target)):
                bad.append(f"{rel}:{node.lineno} counts {ast.unparse(node.target)}")
    assert not bad, "strikes, bans or standing recorded outside peers/:\n" + "\n".join(sorted(set(bad)))


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
            if imported.startswith("pulse_node.net.") and len(parts) > 2 and \
                    parts[2] != sub and parts[2] not in NET_ALLOWED[sub]:
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
        for node in _nodes(path):
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
    for span in re.findall(r"`([^`]+)`", _path_section(), flags=re.DOTALL):
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
            ok = name in {n.name for n in _nodes(module) if hasattr(n, "name")}
        else:
            ok = name in defined and all(o in defined for o in owner)
        if not ok:
            missing.append(span)
    assert not missing, f"docs/ARCHITECTURE.md's path of one version names what the code lacks: {missing}"
