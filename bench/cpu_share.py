"""CPU seconds per process tree, for ``bench/adversary.py``: how much CPU the honest nodes (split
into the role process, the DHT worker, its p2pd, the wire worker) and the attacker used during a
window. On one shared machine the attacker's processes take CPU from the honest nodes, which a
real attacker on its own machine cannot; these figures separate that from the work the attack
makes the honest nodes do."""

from __future__ import annotations

import psutil


def _part(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    for mark, part in (("p2pd", "p2pd"), ("-m pulse_node.net.dht.worker", "dht"), ("wire.worker", "wire")):
        if mark in cmd:
            return part
    return "role"


def snapshot(trees: dict[str, int]) -> dict[tuple[str, int], tuple[str, float]]:
    """``{(tree, pid): (part, cpu seconds)}`` for every live process of each named tree (root pid)."""
    out: dict[tuple[str, int], tuple[str, float]] = {}
    for name, pid in trees.items():
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                out[(name, p.pid)] = (_part(p), t.user + t.system)
            except psutil.Error:
                continue
    return out


def used(before: dict[tuple[str, int], tuple[str, float]],
         after: dict[tuple[str, int], tuple[str, float]]) -> dict[str, dict[str, float]]:
    """CPU seconds used between two snapshots, ``{tree: {part: s}}`` (processes that ended between
    them are not counted; new ones count from zero)."""
    out: dict[str, dict[str, float]] = {}
    for key, (part, cpu) in after.items():
        d = cpu - before.get(key, (part, 0.0))[1]
        tree = out.setdefault(key[0], {})
        tree[part] = tree.get(part, 0.0) + max(0.0, d)
    return {name: {k: round(v, 1) for k, v in sorted(c.items())} for name, c in sorted(out.items())}
