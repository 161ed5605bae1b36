"""Drawing a ``SwarmSnapshot`` with rich: header, alerts, nodes, versions, reward chart, errors.

Every string a peer chose (names, roles, hashes, reasons, error text) goes into a table cell
through ``rich.markup.escape``: drawn as the text it is, never as markup.

``render(snapshot)`` returns one renderable: the one screen of ``pulse-node status`` (live and
``--once``) and of ``pulse-node swarm``'s live view (which puts its own header above it);
``render_text(snapshot, width=...)`` returns it as plain text (captures, tests).
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pulse_node.ops.snapshot import FIRST_PATCH_VERSION, NodeView, SwarmSnapshot, VersionView

SPARK = "▁▂▃▄▅▆▇█"
VERSIONS_SHOWN = 8
CHART_POINTS = 40
_STATE_STYLE = {"live": "green", "stale": "yellow", "stopped": "dim", "down": "red", "starting": "dim",
                "record-only": "cyan", "unknown-schema": "magenta"}


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def sparkline(values: Sequence[float | None], *, lo: float | None = None, hi: float | None = None) -> str:
    """One character per value (``·`` for a missing one), scaled between lo and hi."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo = min(known) if lo is None else lo
    hi = max(known) if hi is None else hi
    span = hi - lo
    out = []
    for v in values:
        if v is None:
            out.append("·")
        else:
            idx = int((v - lo) / span * (len(SPARK) - 1)) if span > 0 else len(SPARK) // 2
            out.append(SPARK[max(0, min(len(SPARK) - 1, idx))])
    return "".join(out)


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _header(s: SwarmSnapshot) -> Text:
    roles = ", ".join(f"{n} {r}" for r, n in sorted(s.roles.items())) or "no nodes"
    t = Text()
    t.append("pulse-node status", style="bold")
    t.append(f"  run {s.run_id or '?'}  head v{s.head if s.head is not None else '-'}  {roles}")
    t.append(f"  {time.strftime('%H:%M:%S', time.localtime(s.taken_at))}\n", style="dim")
    t.append(f"source: {s.source}", style="dim")
    if s.bootstrap:
        t.append(f"\nbootstrap: {s.bootstrap}", style="dim")
    return t


def _alerts(s: SwarmSnapshot) -> RenderableType:
    if not s.alerts:
        checked = f"state hashes agree at every shared version ({s.hash_checks_total} checked)"
        return Text(f"OK  {checked}; no alerts", style="green")
    lines = Text()
    for i, a in enumerate(s.alerts):
        lines.append(("FAIL " if a.level == "fail" else "WARN ") + a.message + ("\n" if i < len(s.alerts) - 1 else ""),
                     style="bold red" if a.level == "fail" else "yellow")
    return Panel(lines, title="alerts", border_style="red" if any(a.level == "fail" for a in s.alerts) else "yellow")


def _agree_mark(n: NodeView) -> Text:
    if n.hash_agrees is None:
        return Text("-", style="dim")
    return Text("yes", style="green") if n.hash_agrees else Text("NO", style="bold red")


def _nodes_table(s: SwarmSnapshot) -> Table:
    t = Table(title="nodes", title_justify="left", expand=False, pad_edge=False, box=box.SIMPLE_HEAD,
              padding=(0, 1, 0, 0), show_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("node", "left"), ("role", "left"), ("state", "left"), ("ver", "right"), ("lag", "right"),
        ("state hash", "left"), ("agree", "left"), ("in", "right"), ("out", "right"),
        ("saved", "right"), ("reward", "right"), ("eval", "right"), ("err", "right"))
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)
    for n in sorted(s.nodes, key=lambda n: (n.role, n.name)):
        t.add_row(escape(n.name), escape(n.role), Text(n.state, style=_STATE_STYLE.get(n.state, "")),
                  "-" if n.version is None else str(n.version),
                  Text("-" if n.lag is None else str(n.lag), style="yellow" if (n.lag or 0) >= 2 else ""),
                  escape(n.state_hash[:12]) or "-", _agree_mark(n), human_bytes(n.bytes_in), human_bytes(n.bytes_out),
                  human_bytes(n.saved_bytes) if n.saved_bytes else "-", _fmt(n.reward_mean), _fmt(n.eval_accuracy),
                  Text(str(n.errors), style="red" if n.errors else ""))
    return t


def _holders(r: VersionView) -> Text:
    if r.agree is None:
        return Text(str(r.holders or "-"), style="dim")
    return Text(f"{r.holders} ok", style="green") if r.agree else Text(f"{r.holders} NO", style="bold red")


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1f}x"


def _versions_table(rows: Sequence[VersionView]) -> Table:
    t = Table(title=f"versions (last {min(len(rows), VERSIONS_SHOWN)})", title_justify="left", pad_edge=False,
              padding=(0, 1, 0, 0),
              box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("ver", "nodes", "patch", "dense", "changed", "vs dense", "vs ref", "eval", "reward"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows[-VERSIONS_SHOWN:]:
        t.add_row(str(r.version), _holders(r), human_bytes(r.patch_bytes), human_bytes(r.dense_bytes),
                  "-" if r.changed is None else f"{r.changed * 100:.3g}%",
                  _times(r.compression), _times(r.vs_reference), _fmt(r.eval), _fmt(r.reward))
    return t


def _senders_table(s: SwarmSnapshot) -> Table:
    t = Table(title="rollout senders", title_justify="left", pad_edge=False, padding=(0, 1, 0, 0),
              box=box.SIMPLE_HEAD, show_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("trainer", "left"), ("sender", "left"), ("accepted", "right"), ("rollouts", "right"),
        ("refused", "right"), ("why", "left"), ("strikes", "right"), ("queued", "right"))
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)
    for r in s.senders:
        why = ", ".join(f"{k} {n}" for k, n in sorted(r.reasons.items(), key=lambda kv: -kv[1])[:3]) or "-"
        t.add_row(escape(r.trainer), Text(r.sender + (" BANNED" if r.banned else ""), style="bold red" if r.banned else ""),
                  str(r.accepted), str(r.accepted_rollouts), Text(str(r.refused), style="red" if r.refused else ""),
                  escape(why), str(r.strikes), str(r.queued))
    return t


def _trust_table(s: SwarmSnapshot) -> Table:
    t = Table(title="trainers' trust (last round)", title_justify="left", pad_edge=False, padding=(0, 1, 0, 0),
              box=box.SIMPLE_HEAD, show_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("trainer", "left"), ("class", "left"), ("weight", "right"), ("rounds", "right"),
        ("checks passed", "right"), ("failed", "right"), ("unrevealed", "right"), ("state", "left"))
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)
    for r in s.trust:
        t.add_row(escape(r.trainer), "member" if r.member else "open", f"{r.weight:.3f}", str(r.contributed),
                  str(r.passed), Text(str(r.failed), style="red" if r.failed else ""),
                  Text(str(r.unrevealed), style="red" if r.unrevealed else ""),
                  Text(r.state or "-", style="bold red" if r.state else ""))
    return t


def _charts(s: SwarmSnapshot) -> Text:
    rows = [r for r in s.versions if r.version >= FIRST_PATCH_VERSION][-CHART_POINTS:]  # v0: the genesis anchor
    t = Text()
    if not rows:
        return t
    span = f"v{rows[0].version}..v{rows[-1].version}"
    for label, vals in (("reward", [r.reward for r in rows]), ("eval", [r.eval for r in rows]),
                        ("changed", [r.changed for r in rows])):
        known = [v for v in vals if v is not None]
        if not known:
            continue
        t.append(f"{label:>8} {span} ", style="dim")
        t.append(sparkline(vals), style="cyan")
        t.append(f"  {min(known):.3g}..{max(known):.3g}  last {known[-1]:.3g}\n")
    tot = s.totals
    if tot.dense_bytes:
        t.append(f"   bytes  patches {human_bytes(tot.patch_bytes)} vs dense {human_bytes(tot.dense_bytes)} per "
                 f"receiver: saved {human_bytes(tot.saved_bytes)} ({tot.ratio or 0:.1f}x smaller)")
        if tot.reference_ratio is not None:
            t.append(f"; reference codec {human_bytes(tot.reference_bytes)} ({tot.reference_ratio:.1f}x ours)")
        t.append("\n")
    if tot.catchups:
        t.append(f"catch-up  {tot.catchups} patches {human_bytes(tot.catchup_bytes)} instead of "
                 f"{human_bytes(tot.catchup_replaced_bytes)} of patches "
                 f"({_times(tot.catchup_replaced_bytes / max(tot.catchup_bytes, 1))} smaller)\n")
    t.append(f"  totals  in {human_bytes(tot.bytes_in)}  out {human_bytes(tot.bytes_out)}  errors {tot.errors}")
    return t


def _errors(s: SwarmSnapshot) -> RenderableType:
    if not s.errors:
        return Text("recent errors: none", style="dim")
    t = Table(title="recent errors", title_justify="left", show_header=False, pad_edge=False, box=None)
    t.add_column("at", style="dim", no_wrap=True)
    t.add_column("node", no_wrap=True)
    t.add_column("message", overflow="fold")
    for e in s.errors[-6:]:
        t.add_row(time.strftime("%H:%M:%S", time.localtime(e.at)), escape(e.node), escape(e.message))
    return t


def render(snapshot: SwarmSnapshot) -> RenderableType:
    """The whole dashboard screen for one snapshot."""
    parts: list[RenderableType] = [_header(snapshot), _alerts(snapshot), _nodes_table(snapshot)]
    if snapshot.senders:
        parts.append(_senders_table(snapshot))
    if snapshot.trust:
        parts.append(_trust_table(snapshot))
    if snapshot.versions:
        parts += [_versions_table(snapshot.versions), _charts(snapshot)]
    parts.append(_errors(snapshot))
    return Group(*parts)


def render_text(snapshot: SwarmSnapshot, *, width: int = 120) -> str:
    """The screen as plain text (no colour codes)."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(render(snapshot))
    return buf.getvalue()
