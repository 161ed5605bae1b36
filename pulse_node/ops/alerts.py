"""The alerts of a swarm snapshot that come from the nodes' own statuses (``ops/snapshot.py`` adds
forks and node states): versions without contributors, rounds closed without an update, a node
failing the same way again and again, duplicate identities, open trust, equivocation. Pure."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pulse_node.daemon.status_model import Alert, StatusReport

#: this many of a node's recent errors alike (digits aside) make a ``repeated_error`` alert
REPEATED_ERRORS = 5
_DIGITS = re.compile(r"\d+")


class Node(Protocol):
    """What the alerts read of a node the snapshot merged."""

    name: str
    status: StatusReport | None
    node_key: str | None


def learning_alerts(merged: Sequence[Node], empty: Sequence[int]) -> list[Alert]:
    """Versions without contributors, trainers closing rounds without an update, and nodes whose
    recent errors repeat one failure (digits aside) ``REPEATED_ERRORS`` times or more. ``empty``:
    the versions published with no contributors."""
    out = []
    if empty:
        shown = ", ".join(f"v{v}" for v in empty[-8:])
        out.append(Alert(kind="no_contributors", level="fail", message=f"{len(empty)} version(s) published with no "
                         f"contributors ({shown}): no update was averaged in, learning stopped there"))
    for m in merged:
        st = m.status
        if st is not None and st.trainer is not None and st.trainer.forks:
            out.append(Alert(kind="round_without_update", level="fail", message=f"{m.name} closed {st.trainer.forks} "
                             "round(s) without an update (decided payloads unavailable, no re-sync)"))
        repeated = Counter(_DIGITS.sub("#", e.message) for e in (st.recent_errors if st is not None else []))
        for text, n in repeated.most_common(1):
            if n >= REPEATED_ERRORS:
                out.append(Alert(kind="repeated_error", level="warn", message=f"{m.name} keeps failing the same way "
                                 f"({n} of its last {len(st.recent_errors) if st else 0} errors): {text[:160]}"))
    return out


def duplicate_alerts(merged: Sequence[Node], peers: Sequence[Mapping[str, Any]]) -> list[Alert]:
    out: list[Alert] = []
    by_key: dict[str, list[str]] = {}
    for m in merged:
        if m.node_key:
            by_key.setdefault(m.node_key, []).append(m.name)
        if m.status is not None and m.status.data_plane.duplicate:
            out.append(Alert(kind="duplicate_identity", level="fail", message=f"{m.name}: another live node publishes under its identity "
                             "(a copied identity.key)"))
    for key, names in by_key.items():
        if len(names) > 1:
            out.append(Alert(kind="duplicate_identity", level="fail", message=f"duplicate identity: {', '.join(sorted(names))} share node key "
                             f"{key[:16]}...; give each node its own identity.key (delete the copied one)"))
    sessions: dict[str, set[str]] = {}
    for rec in peers:
        sessions.setdefault(str(rec.get("peer_id")), set()).add(str(rec.get("session")))
    for pid, ss in sessions.items():
        if len(ss) > 1:
            out.append(Alert(kind="duplicate_identity", level="fail", message=f"peer id {pid} is published by {len(ss)} live sessions: "
                             "two machines run with the same identity file"))
    return out


def trust_alerts(merged: Sequence[Node]) -> list[Alert]:
    """One warning for nodes in open trust mode; one line per member a node convicted of equivocation."""
    statuses = [(m.name, m.status) for m in merged if m.status is not None]
    out: list[Alert] = []
    open_mode = sorted(name for name, st in statuses if st.trust_mode == "open")
    if open_mode:
        out.append(Alert(kind="open_trust", level="warn", message=f"OPEN trust mode on {', '.join(open_mode)}: any peer announcing the "
                         "trainer role is a member (keys are free: equivocation bans and quorums do not bind)"))
    convicted: dict[str, tuple[Any, list[str]]] = {}
    for name, st in statuses:
        for e in st.evidence:
            convicted.setdefault(e.key, (e, []))[1].append(name)
    for key, (e, names) in sorted(convicted.items()):
        out.append(Alert(kind="equivocation", level="warn", message=f"member {key[:16]}... banned for equivocation (two signed {e.kind}s "
                         f"for {e.at}) by {len(names)}/{len(statuses)} nodes"))
    return out
