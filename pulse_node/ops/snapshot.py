"""One picture of a swarm: ``build_snapshot(nodes, peers) -> SwarmSnapshot`` (pure, no I/O).

Inputs are what the sources gathered: each node's status dict (``/status`` or status.json,
see ``daemon/status.py``) wrapped in a ``NodeInput``, and the DHT's peer records (``PeerRecord``
dumps). They are merged by peer id; the result says, per node, which version it holds and how
far behind the head it is, whether its state hash agrees with every other node at the same
version, bytes moved and saved against a dense sync; per version, patch size, sparsity and
compression, eval and reward; and the alerts an operator must act on (diverged replicas,
duplicate identities, lagging, stale or dead nodes). ``pulse-node status --once --json``
prints ``SwarmSnapshot.model_dump(mode="json")``; schema changes bump ``v``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import pydantic

SCHEMA_VERSION = 1
#: a status not refreshed for this long is stale (nodes write it every 0.5 s)
STALE_AFTER_S = 15.0
#: a live node this many versions behind the head is reported as lagging
LAG_WARN_VERSIONS = 2
MAX_ERRORS_SHOWN = 12
MAX_VERSIONS_SHOWN = 200
#: version 0 is the genesis anchor (a full checkpoint), not a patch: kept out of byte savings
FIRST_PATCH_VERSION = 1

NodeState = Literal["live", "stale", "stopped", "down", "record-only"]


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class NodeView(_Model):
    name: str
    role: str
    peer_id: str = ""
    state: NodeState
    sources: list[str]
    version: int | None = None
    lag: int | None = None
    state_hash: str = ""
    chain_hash: str = ""
    #: True/False: its hash agrees/disagrees with other nodes at its version; None: nobody to compare
    hash_agrees: bool | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    patch_bytes: int = 0
    dense_bytes: int = 0
    saved_bytes: int = 0
    reward_mean: float | None = None
    eval_accuracy: float | None = None
    errors: int = 0
    rejected: int = 0
    age_s: float | None = None
    metrics_url: str | None = None
    node_key: str | None = None
    problem: str | None = None
    #: a current error line of its log (run-dir source)
    log_error: str | None = None


class VersionView(_Model):
    version: int
    patch_bytes: int | None = None
    dense_bytes: int | None = None
    changed: float | None = None
    compression: float | None = None
    eval: float | None = None
    reward: float | None = None


class HashCheck(_Model):
    version: int
    agree: bool
    #: state hash -> names of the nodes that hold it at this version
    hashes: dict[str, list[str]]


class ErrorLine(_Model):
    at: float
    node: str
    message: str


class Alert(_Model):
    level: Literal["warn", "fail"]
    message: str


class Totals(_Model):
    patch_bytes: int = 0
    dense_bytes: int = 0
    saved_bytes: int = 0
    ratio: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0


class SwarmSnapshot(_Model):
    v: Literal[1] = SCHEMA_VERSION
    taken_at: float
    run_id: str | None = None
    source: str = ""
    bootstrap: str | None = None
    head: int | None = None
    roles: dict[str, int]
    nodes: list[NodeView]
    versions: list[VersionView]
    hash_checks_total: int
    hash_disagreements: list[HashCheck]
    totals: Totals
    errors: list[ErrorLine]
    alerts: list[Alert]


@dataclass(frozen=True)
class NodeInput:
    """One node as a source saw it: its status dict ({} if none) and what else the source knows."""

    name: str
    status: Mapping[str, Any] = field(default_factory=dict)
    source: str = "status"
    #: why there is no usable status (e.g. the last error line of its log)
    problem: str | None = None
    #: public key of the identity file on disk, when the source can read it
    node_key: str | None = None
    #: when the source last saw the node alive (status.json mtime, time of the /status answer);
    #: None: judge by the status's own ``updated_at`` (which only moves when something changes)
    seen_at: float | None = None
    #: a current error line from the node's log (failures a node logs but does not count)
    log_error: str | None = None


# ---- merging --------------------------------------------------------------------------------
@dataclass
class _Merged:
    name: str
    status: Mapping[str, Any]
    record: Mapping[str, Any]
    sources: list[str]
    problem: str | None
    node_key: str | None
    seen_at: float | None = None
    log_error: str | None = None


def _merge(nodes: Sequence[NodeInput], peers: Sequence[Mapping[str, Any]]) -> list[_Merged]:
    merged: list[_Merged] = []
    by_peer: dict[str, _Merged] = {}
    for n in nodes:
        m = _Merged(n.name, n.status, {}, [n.source], n.problem, n.node_key or n.status.get("node_key"), n.seen_at,
                    n.log_error)
        pid = str(n.status.get("peer_id") or "")
        if pid and pid in by_peer:  # two sources of one node: keep the fresher status
            old = by_peer[pid]
            if float(n.status.get("updated_at", 0)) > float(old.status.get("updated_at", 0)):
                old.status = n.status
            old.seen_at = max(filter(None, (old.seen_at, n.seen_at)), default=None)
            old.sources.append(n.source)
            continue
        merged.append(m)
        if pid:
            by_peer[pid] = m
    for rec in peers:
        pid = str(rec.get("peer_id", ""))
        m = by_peer.get(pid)
        if m is None:
            m = _Merged(f"{rec.get('role', 'peer')}-{pid[-6:]}", {}, rec, [], None, rec.get("node_key"))
            merged.append(m)
            by_peer[pid] = m
        m.record = rec
        m.sources.append("dht")
    return merged


def _state(m: _Merged, now: float) -> tuple[NodeState, float | None]:
    s = m.status
    if not s:
        return ("record-only" if m.record else "down"), None
    seen = m.seen_at if m.seen_at is not None else float(s.get("updated_at", s.get("started_at", now)))
    age = max(0.0, now - seen)
    if s.get("stopped"):
        return "stopped", age
    return ("stale" if age > STALE_AFTER_S else "live"), age


def _version(m: _Merged) -> int | None:
    """The version the node holds: its own status says, else its DHT record; None if none yet."""
    v = m.status.get("version") if m.status.get("version") is not None else m.record.get("version")
    return int(v) if _num(v) is not None and v >= 0 else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _counter(m: _Merged, key: str) -> int:
    if key in m.status:
        return int(_num(m.status.get(key)) or 0)
    return int((m.record.get("counters") or {}).get(key, 0))


# ---- per-version views ----------------------------------------------------------------------
def _version_table(merged: Sequence[_Merged], reward_samples: Mapping[int, float]) -> dict[int, VersionView]:
    """Patch/dense/changed/eval per version from the publishers' histories (trainers first)."""
    rows: dict[int, dict[str, Any]] = {}
    ordered = sorted(merged, key=lambda m: (m.status.get("role") != "trainer", m.name))
    for m in ordered:
        for h in m.status.get("history") or []:
            v = h.get("version")
            if not isinstance(v, int) or "dense_bytes" not in h:
                continue
            row = rows.setdefault(v, {"version": v})
            for src, dst in (("patch_bytes", "patch_bytes"), ("dense_bytes", "dense_bytes"),
                             ("changed", "changed"), ("eval", "eval"), ("reward", "reward")):
                if row.get(dst) is None and _num(h.get(src)) is not None:
                    row[dst] = h[src]
    for v, r in reward_samples.items():
        rows.setdefault(v, {"version": v}).setdefault("reward", r)
    out = {}
    for v in sorted(rows)[-MAX_VERSIONS_SHOWN:]:
        row = rows[v]
        p, d = row.get("patch_bytes"), row.get("dense_bytes")
        row["compression"] = round(d / p, 2) if p and d else None
        out[v] = VersionView(**row)
    return out


def _hash_groups(merged: Sequence[_Merged]) -> dict[int, dict[str, set[str]]]:
    """version -> state hash -> node names, from current states and version histories."""
    groups: dict[int, dict[str, set[str]]] = {}

    def add(v: Any, h: Any, name: str) -> None:
        if isinstance(v, int) and v >= 0 and isinstance(h, str) and h:
            groups.setdefault(v, {}).setdefault(h, set()).add(name)

    for m in merged:
        for h in m.status.get("history") or []:
            add(h.get("version"), h.get("state_hash"), m.name)
        add(_version(m), m.status.get("state_hash") or m.record.get("state_hash"), m.name)
    return groups


# ---- alerts ---------------------------------------------------------------------------------
def _duplicate_alerts(merged: Sequence[_Merged], peers: Sequence[Mapping[str, Any]]) -> list[Alert]:
    out: list[Alert] = []
    by_key: dict[str, list[str]] = {}
    for m in merged:
        if m.node_key:
            by_key.setdefault(m.node_key, []).append(m.name)
        if m.status.get("duplicate"):
            out.append(Alert(level="fail", message=f"{m.name}: {m.status['duplicate']}"))
    for key, names in by_key.items():
        if len(names) > 1:
            out.append(Alert(level="fail", message=f"duplicate identity: {', '.join(sorted(names))} share node key "
                             f"{key[:16]}...; give each node its own identity.key (delete the copied one)"))
    sessions: dict[str, set[str]] = {}
    for rec in peers:
        sessions.setdefault(str(rec.get("peer_id")), set()).add(str(rec.get("session")))
    for pid, ss in sessions.items():
        if len(ss) > 1:
            out.append(Alert(level="fail", message=f"peer id {pid} is published by {len(ss)} live sessions: "
                             "two machines run with the same identity file"))
    return out


def _node_alerts(views: Sequence[NodeView], head: int | None) -> list[Alert]:
    if not views:
        return [Alert(level="warn",
                      message="no nodes found: is the swarm running, and are --run-dir / --run-id right?")]
    out: list[Alert] = []
    for n in views:
        if n.state == "down":
            out.append(Alert(level="warn", message=f"{n.name} is not running: {n.problem or 'no status'}"))
        elif n.state == "stale":
            why = f"; log: {n.log_error}" if n.log_error else " (hung or killed?)"
            out.append(Alert(level="warn", message=f"{n.name} status not updated for {n.age_s:.0f}s{why}"))
        elif n.state == "live" and n.lag is not None and n.lag >= LAG_WARN_VERSIONS:
            out.append(Alert(level="warn", message=f"{n.name} is {n.lag} versions behind the head"))
        elif n.state == "live" and n.version is None and head is not None and head >= FIRST_PATCH_VERSION:
            out.append(Alert(level="warn", message=f"{n.name} holds no version yet while the head is v{head}"))
    return out


# ---- the snapshot ---------------------------------------------------------------------------
def _node_view(m: _Merged, *, now: float, head: int | None, groups: dict[int, dict[str, set[str]]],
               table: Mapping[int, VersionView]) -> NodeView:
    state, age = _state(m, now)
    version = _version(m)
    s, rec = m.status, m.record
    at_v = groups.get(version, {}) if version is not None else {}
    holders = sum(len(names) for names in at_v.values())
    held = [h.get("version") for h in s.get("history") or [] if isinstance(h.get("version"), int)]
    held = sorted({v for v in held if v >= FIRST_PATCH_VERSION})
    dense = sum(table[v].dense_bytes or 0 for v in held if v in table)
    patch = int(_num(s.get("patch_bytes_total")) or 0)
    return NodeView(
        name=m.name, role=str(s.get("role") or rec.get("role") or "?"),
        peer_id=str(s.get("peer_id") or rec.get("peer_id") or ""),
        state=state, sources=m.sources, version=version,
        lag=(head - version) if head is not None and version is not None else None,
        state_hash=str(s.get("state_hash") or rec.get("state_hash") or ""),
        chain_hash=str(s.get("chain_hash") or rec.get("chain_hash") or ""),
        hash_agrees=(len(at_v) == 1) if holders >= 2 else None,
        bytes_in=_counter(m, "bytes_in"), bytes_out=_counter(m, "bytes_out"),
        patch_bytes=patch, dense_bytes=dense, saved_bytes=max(0, dense - patch) if dense else 0,
        reward_mean=_num(s.get("reward_mean")), eval_accuracy=_num(s.get("eval_accuracy")),
        errors=_counter(m, "errors"), rejected=int(_num(s.get("rejected")) or 0), age_s=age,
        metrics_url=s.get("metrics_url") or rec.get("metrics_url"), node_key=m.node_key, problem=m.problem,
        log_error=m.log_error)


def _errors(merged: Sequence[_Merged], now: float) -> list[ErrorLine]:
    lines = [ErrorLine(at=float(e.get("at", 0)), node=m.name, message=str(e.get("message", "")))
             for m in merged for e in m.status.get("recent_errors") or [] if isinstance(e, Mapping)]
    counted = {e.message for e in lines}
    lines += [ErrorLine(at=m.seen_at or now, node=m.name, message=f"log: {m.log_error}")
              for m in merged if m.log_error and not any(c in m.log_error for c in counted)]
    return sorted(lines, key=lambda e: e.at)[-MAX_ERRORS_SHOWN:]


def _totals(views: Sequence[NodeView], table: Mapping[int, VersionView]) -> Totals:
    patches = [v for v in table.values()
               if v.version >= FIRST_PATCH_VERSION and v.dense_bytes and v.patch_bytes is not None]
    patch = sum(v.patch_bytes or 0 for v in patches)
    dense = sum(v.dense_bytes or 0 for v in patches)
    return Totals(patch_bytes=patch, dense_bytes=dense, saved_bytes=max(0, dense - patch),
                  ratio=round(dense / patch, 2) if patch and dense else None,
                  bytes_in=sum(n.bytes_in for n in views), bytes_out=sum(n.bytes_out for n in views),
                  errors=sum(n.errors for n in views))


def build_snapshot(nodes: Sequence[NodeInput], peers: Sequence[Mapping[str, Any]] = (), *, now: float,
                   run_id: str | None = None, source: str = "", bootstrap: str | None = None,
                   reward_samples: Mapping[int, float] | None = None, notes: Sequence[Alert] = ()) -> SwarmSnapshot:
    """Merge node statuses and peer records into one ``SwarmSnapshot`` (pure: same input, same output).

    ``reward_samples`` (version -> mean reward) fills the reward column where the histories
    carry none (the live dashboard collects them from inference nodes between refreshes);
    ``notes`` are alerts of the sources themselves (e.g. a failed DHT read).
    """
    merged = _merge(nodes, peers)
    versions = [v for v in (_version(m) for m in merged) if v is not None]
    head = max(versions, default=None)
    groups = _hash_groups(merged)
    table = _version_table(merged, reward_samples or {})
    views = [_node_view(m, now=now, head=head, groups=groups, table=table) for m in merged]
    shared = {v: g for v, g in groups.items() if sum(len(n) for n in g.values()) >= 2}
    bad = [HashCheck(version=v, agree=False, hashes={h: sorted(n) for h, n in g.items()})
           for v, g in sorted(shared.items()) if len(g) > 1]
    alerts = [Alert(level="fail", message=f"state hashes disagree at version {c.version}: "
                    + "; ".join(f"{h[:12]} on {', '.join(n)}" for h, n in c.hashes.items())) for c in bad[-5:]]
    alerts += _duplicate_alerts(merged, peers) + _node_alerts(views, head) + list(notes)
    roles: dict[str, int] = {}
    for n in views:
        if n.state != "down":
            roles[n.role] = roles.get(n.role, 0) + 1
    return SwarmSnapshot(taken_at=now, run_id=run_id or _run_id(merged), source=source, bootstrap=bootstrap,
                         head=head, roles=roles, nodes=views, versions=list(table.values()),
                         hash_checks_total=len(shared), hash_disagreements=bad, totals=_totals(views, table),
                         errors=_errors(merged, now), alerts=alerts)


def _run_id(merged: Sequence[_Merged]) -> str | None:
    ids = {str(m.status["run_id"]) for m in merged if m.status.get("run_id")}
    return ", ".join(sorted(ids)) if ids else None
