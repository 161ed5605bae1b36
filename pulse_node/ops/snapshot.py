"""One picture of a swarm: ``build_snapshot(nodes, peers) -> SwarmSnapshot`` (pure, no I/O).

Inputs are what the sources gathered: each node's parsed status (``/status`` or status.json,
a ``StatusReport``, see ``daemon/status_model.py``) wrapped in a ``NodeInput``, and the DHT's
peer records (``PeerRecord`` dumps). They are merged by peer id; the result says, per node,
which version it holds and how far behind the head it is, whether its state hash agrees with
every other node at the same version, bytes moved and saved against a dense sync; per version,
how many nodes hold it and whether they agree, patch size, BF16 changed fraction, size against
dense BF16 and against the reference codec, eval and reward; catch-up patches against the
patches they replaced; per trainer, its rollout senders' accepted and refused batches; and the
alerts an operator must act on (``Alert``, declared in ``daemon/status_model.py``: forks, versions
without contributors, rounds closed without an update, a node failing the same way again and
again, duplicate identities, lagging, stale or dead nodes, statuses of an unknown schema).
``pulse-node status --once --json`` prints ``SwarmSnapshot.model_dump(mode="json")``; schema
changes bump ``v``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import pydantic

from pulse_node.daemon.status_model import Alert, StatusReport, VersionEntry
from pulse_node.ops.alerts import duplicate_alerts, learning_alerts, trust_alerts
from pulse_node.ops.senders import SenderView, sender_views
from pulse_node.ops.trust import TrustView, trust_views

SCHEMA_VERSION: Literal[4] = 4
#: a status not refreshed for this long is stale (nodes write it every 0.5 s)
STALE_AFTER_S = 15.0
#: a live node this many versions behind the head is reported as lagging
LAG_WARN_VERSIONS = 2
MAX_ERRORS_SHOWN = 12
MAX_VERSIONS_SHOWN = 200
#: version 0 is the genesis anchor (a full checkpoint), not a patch: kept out of byte savings
FIRST_PATCH_VERSION = 1

NodeState = Literal["live", "stale", "stopped", "down", "starting", "record-only", "unknown-schema"]


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
    #: nodes whose status names a state hash at this version, and whether those hashes agree
    holders: int = 0
    agree: bool | None = None
    patch_bytes: int | None = None
    dense_bytes: int | None = None
    reference_bytes: int | None = None
    #: fraction of BF16 entries this version changed
    changed: float | None = None
    #: dense BF16 bytes / patch bytes
    compression: float | None = None
    #: the reference codec's bytes / patch bytes
    vs_reference: float | None = None
    eval: float | None = None
    reward: float | None = None
    #: payloads averaged into it (its publishers' histories; 0: closed without an update)
    contributors: int | None = None


class HashCheck(_Model):
    version: int
    agree: bool
    #: state hash -> names of the nodes that hold it at this version
    hashes: dict[str, list[str]]


class ErrorLine(_Model):
    at: float
    node: str
    message: str


class Totals(_Model):
    """Sums over the versions in ``versions`` (patches only: the genesis anchor is left out)."""

    patch_bytes: int = 0
    dense_bytes: int = 0
    saved_bytes: int = 0
    ratio: float | None = None
    reference_bytes: int = 0
    #: reference codec bytes / patch bytes, over versions where both are known
    reference_ratio: float | None = None
    changed_mean: float | None = None
    #: catch-up patches applied whose replaced patches are all in ``versions``, their bytes and
    #: the bytes of the patches they replaced (what the receivers would have fetched instead)
    catchups: int = 0
    catchup_bytes: int = 0
    catchup_replaced_bytes: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0


class SwarmSnapshot(_Model):
    v: Literal[4] = SCHEMA_VERSION
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
    senders: list[SenderView] = pydantic.Field(default_factory=list)  # rollout senders per trainer
    trust: list[TrustView] = pydantic.Field(default_factory=list)  # each trainer's weight in the last round


@dataclass(frozen=True)
class NodeInput:
    """One node as a source saw it: its parsed status (None if none) and what else the source knows."""

    name: str
    status: StatusReport | None = None
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
    #: the node answered with a status this pulse-node cannot read (another schema): why
    unreadable: str | None = None
    #: the peer id the source knows it by, when it has no readable status
    peer_id: str = ""
    #: the source started the node and its process runs, though it wrote no status yet
    starting: bool = False


# ---- merging --------------------------------------------------------------------------------
@dataclass
class _Merged:
    name: str
    status: StatusReport | None
    record: Mapping[str, Any]
    sources: list[str]
    problem: str | None
    node_key: str | None
    seen_at: float | None = None
    log_error: str | None = None
    unreadable: str | None = None
    starting: bool = False


def _fresher(new: StatusReport | None, old: StatusReport | None) -> bool:
    return new is not None and (old is None or new.updated_at > old.updated_at)


def _merge(nodes: Sequence[NodeInput], peers: Sequence[Mapping[str, Any]]) -> list[_Merged]:
    merged: list[_Merged] = []
    by_peer: dict[str, _Merged] = {}
    for n in nodes:
        st = n.status
        m = _Merged(n.name, st, {}, [n.source], n.problem, n.node_key or (st.node_key if st else None), n.seen_at,
                    n.log_error, n.unreadable, n.starting and st is None)
        pid = st.peer_id if st else n.peer_id
        if pid and pid in by_peer:  # two sources of one node: keep the fresher status
            old = by_peer[pid]
            if _fresher(st, old.status):
                old.status, old.unreadable = st, None
            old.seen_at = max(filter(None, (old.seen_at, n.seen_at)), default=None)
            old.sources.append(n.source)
            continue
        merged.append(m)
        if pid:
            by_peer[pid] = m
    for rec in peers:
        pid = str(rec.get("peer_id", ""))
        known = by_peer.get(pid)
        if known is None:
            known = _Merged(f"{rec.get('role', 'peer')}-{pid[-6:]}", None, rec, [], None, rec.get("node_key"))
            merged.append(known)
            by_peer[pid] = known
        known.record = rec
        known.sources.append("dht")
    return merged


def _state(m: _Merged, now: float) -> tuple[NodeState, float | None]:
    s = m.status
    if s is None:
        if m.unreadable:
            return "unknown-schema", None
        if m.starting:
            return "starting", None
        return ("record-only" if m.record else "down"), None
    seen = m.seen_at if m.seen_at is not None else s.updated_at
    age = max(0.0, now - seen)
    if s.stopped:
        return "stopped", age
    return ("stale" if age > STALE_AFTER_S else "live"), age


def _version(m: _Merged) -> int | None:
    """The version the node holds: its own status says, else its DHT record; None if none yet."""
    v = _num(m.status.version if m.status is not None else m.record.get("version"))
    return int(v) if v is not None and v >= 0 else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _record_counter(m: _Merged, key: str) -> int:
    return int((m.record.get("counters") or {}).get(key, 0))


def _history(m: _Merged) -> list[VersionEntry]:
    return m.status.history if m.status is not None else []


# ---- per-version views ----------------------------------------------------------------------
_PUBLISHED = ("patch_bytes", "dense_bytes", "reference_bytes", "changed", "eval", "reward", "contributors")


def _version_table(merged: Sequence[_Merged], groups: dict[int, dict[str, set[str]]],
                   reward_samples: Mapping[int, float]) -> dict[int, VersionView]:
    """What the publishers' histories say per version (trainers first), who holds it, and ratios."""
    rows: dict[int, dict[str, Any]] = {}
    ordered = sorted(merged, key=lambda m: (m.status is None or m.status.role != "trainer", m.name))
    for m in ordered:
        for h in _history(m):
            if h.dense_bytes is None:  # not a publisher's entry
                continue
            row = rows.setdefault(h.version, {"version": h.version})
            for key in _PUBLISHED:
                if row.get(key) is None and getattr(h, key) is not None:
                    row[key] = getattr(h, key)
    for v, r in reward_samples.items():
        rows.setdefault(v, {"version": v}).setdefault("reward", r)
    out = {}
    for v in sorted(rows)[-MAX_VERSIONS_SHOWN:]:
        row = rows[v]
        p, d, ref = row.get("patch_bytes"), row.get("dense_bytes"), row.get("reference_bytes")
        holders = groups.get(v, {})
        row.update(compression=round(d / p, 2) if p and d else None,
                   vs_reference=round(ref / p, 2) if p and ref else None,
                   holders=sum(len(names) for names in holders.values()),
                   agree=(len(holders) == 1) if sum(len(n) for n in holders.values()) >= 2 else None)
        out[v] = VersionView(**row)
    return out


def _hash_groups(merged: Sequence[_Merged]) -> dict[int, dict[str, set[str]]]:
    """version -> state hash -> node names, from current states and version histories."""
    groups: dict[int, dict[str, set[str]]] = {}
    for m in merged:
        held = m.status.held() if m.status is not None else {}
        v, h = _version(m), m.record.get("state_hash")
        if m.status is None and v is not None and isinstance(h, str) and h:
            held[v] = h
        for version, state_hash in held.items():
            if version >= 0 and state_hash:
                groups.setdefault(version, {}).setdefault(state_hash, set()).add(m.name)
    return groups


# ---- alerts ---------------------------------------------------------------------------------
def _node_alerts(views: Sequence[NodeView], head: int | None) -> list[Alert]:
    if not views:
        return [Alert(kind="node", level="warn",
                      message="no nodes found: is the swarm running, and are --run-dir / --run-id right?")]
    out: list[Alert] = []
    for n in views:
        if n.state == "down":
            out.append(Alert(kind="node", level="warn", message=f"{n.name} is not running: {n.problem or 'no status'}"))
        elif n.state == "unknown-schema":
            out.append(Alert(kind="node", level="warn", message=f"{n.name}: unknown status schema: {n.problem}"))
        elif n.state == "stale":
            why = f"; log: {n.log_error}" if n.log_error else " (hung or killed?)"
            out.append(Alert(kind="node", level="warn", message=f"{n.name} status not updated for {n.age_s:.0f}s{why}"))
        elif n.state == "live" and n.lag is not None and n.lag >= LAG_WARN_VERSIONS:
            out.append(Alert(kind="node", level="warn", message=f"{n.name} is {n.lag} versions behind the head"))
        elif n.state == "live" and n.version is None and head is not None and head >= FIRST_PATCH_VERSION:
            out.append(Alert(kind="node", level="warn", message=f"{n.name} holds no version yet while the head is v{head}"))
    return out


# ---- the snapshot ---------------------------------------------------------------------------
class _Common(TypedDict):
    """The ``NodeView`` fields of a node whether its status or only its DHT record is known."""

    name: str
    state: NodeState
    sources: list[str]
    version: int | None
    age_s: float | None
    node_key: str | None
    lag: int | None
    hash_agrees: bool | None
    problem: str | None
    log_error: str | None


def _node_view(m: _Merged, *, now: float, head: int | None, groups: dict[int, dict[str, set[str]]],
               table: Mapping[int, VersionView]) -> NodeView:
    state, age = _state(m, now)
    version = _version(m)
    s, rec = m.status, m.record
    at_v = groups.get(version, {}) if version is not None else {}
    holders = sum(len(names) for names in at_v.values())
    common: _Common = dict(name=m.name, state=state, sources=m.sources, version=version, age_s=age,
                           node_key=m.node_key, lag=(head - version) if head is not None and version is not None else None,
                           hash_agrees=(len(at_v) == 1) if holders >= 2 else None,
                           problem=m.problem or m.unreadable, log_error=m.log_error)
    if s is None:
        return NodeView(**common, role=str(rec.get("role") or "?"), peer_id=str(rec.get("peer_id") or ""),
                        state_hash=str(rec.get("state_hash") or ""), chain_hash=str(rec.get("chain_hash") or ""),
                        bytes_in=_record_counter(m, "bytes_in"), bytes_out=_record_counter(m, "bytes_out"),
                        errors=_record_counter(m, "errors"), metrics_url=rec.get("metrics_url"))
    held = sorted({h.version for h in s.history if h.version >= FIRST_PATCH_VERSION})
    dense = sum(table[v].dense_bytes or 0 for v in held if v in table)
    section = s.trainer or s.inference
    patch = section.patch_bytes_total if section is not None else 0
    return NodeView(**common, role=s.role, peer_id=s.peer_id, state_hash=s.state_hash, chain_hash=s.chain_hash,
                    bytes_in=s.data_plane.bytes_in, bytes_out=s.data_plane.bytes_out,
                    patch_bytes=patch, dense_bytes=dense, saved_bytes=max(0, dense - patch) if dense else 0,
                    reward_mean=s.reward_mean, eval_accuracy=s.eval_accuracy, errors=s.counters.errors,
                    rejected=s.counters.rejected, metrics_url=s.metrics_url or rec.get("metrics_url"))


def _errors(merged: Sequence[_Merged], now: float) -> list[ErrorLine]:
    lines = [ErrorLine(at=e.at, node=m.name, message=e.message)
             for m in merged if m.status is not None for e in m.status.recent_errors]
    counted = {e.message for e in lines}
    lines += [ErrorLine(at=m.seen_at or now, node=m.name, message=f"log: {m.log_error}")
              for m in merged if m.log_error and not any(c in m.log_error for c in counted)]
    return sorted(lines, key=lambda e: e.at)[-MAX_ERRORS_SHOWN:]


def _catchups(merged: Sequence[_Merged], table: Mapping[int, VersionView]) -> tuple[int, int, int]:
    """(count, bytes, bytes of the patches they replaced) of the catch-up patches in the nodes'
    histories whose replaced patches are all in ``table``."""
    count = got = replaced = 0
    for m in merged:
        for h in _history(m):
            if h.catchup_from is None:
                continue
            wanted = range(h.catchup_from + 1, h.version + 1)
            sizes = [size for v in wanted if v in table and (size := table[v].patch_bytes) is not None]
            if wanted and len(sizes) == len(wanted):
                count, got, replaced = count + 1, got + h.patch_bytes, replaced + sum(sizes)
    return count, got, replaced


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 2) if num and den else None


def _totals(merged: Sequence[_Merged], views: Sequence[NodeView], table: Mapping[int, VersionView]) -> Totals:
    patches = [v for v in table.values()
               if v.version >= FIRST_PATCH_VERSION and v.dense_bytes and v.patch_bytes is not None]
    patch = sum(v.patch_bytes or 0 for v in patches)
    dense = sum(v.dense_bytes or 0 for v in patches)
    with_ref = [v for v in patches if v.reference_bytes is not None]
    changed = [v.changed for v in patches if v.changed is not None]
    catchups, catchup_bytes, replaced = _catchups(merged, table)
    return Totals(patch_bytes=patch, dense_bytes=dense, saved_bytes=max(0, dense - patch), ratio=_ratio(dense, patch),
                  reference_bytes=sum(v.reference_bytes or 0 for v in with_ref),
                  reference_ratio=_ratio(sum(v.reference_bytes or 0 for v in with_ref),
                                         sum(v.patch_bytes or 0 for v in with_ref)),
                  changed_mean=sum(changed) / len(changed) if changed else None,
                  catchups=catchups, catchup_bytes=catchup_bytes, catchup_replaced_bytes=replaced,
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
    table = _version_table(merged, groups, reward_samples or {})
    views = [_node_view(m, now=now, head=head, groups=groups, table=table) for m in merged]
    shared = {v: g for v, g in groups.items() if sum(len(n) for n in g.values()) >= 2}
    bad = [HashCheck(version=v, agree=False, hashes={h: sorted(n) for h, n in g.items()})
           for v, g in sorted(shared.items()) if len(g) > 1]
    alerts = [Alert(kind="fork", level="fail", message=f"FORK: state hashes disagree at version {c.version}: "
                    + "; ".join(f"{h[:12]} on {', '.join(n)}" for h, n in c.hashes.items())) for c in bad[-5:]]
    empty = [v for v, row in table.items() if row.contributors == 0]
    alerts += learning_alerts(merged, empty) + duplicate_alerts(merged, peers) + trust_alerts(merged)
    alerts += _node_alerts(views, head) + list(notes)
    roles: dict[str, int] = {}
    for n in views:
        if n.state != "down":
            roles[n.role] = roles.get(n.role, 0) + 1
    return SwarmSnapshot(taken_at=now, run_id=run_id or _run_id(merged), source=source, bootstrap=bootstrap,
                         head=head, roles=roles, nodes=views, versions=list(table.values()),
                         hash_checks_total=len(shared), hash_disagreements=bad, totals=_totals(merged, views, table),
                         errors=_errors(merged, now), alerts=alerts,
                         senders=sender_views([(m.name, m.status) for m in merged if m.status is not None]),
                         trust=trust_views([(m.name, m.status) for m in merged if m.status is not None]))


def _run_id(merged: Sequence[_Merged]) -> str | None:
    ids = {m.status.run_id for m in merged if m.status is not None and m.status.run_id}
    return ", ".join(sorted(ids)) if ids else None
