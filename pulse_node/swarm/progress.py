"""Plain progress lines of ``pulse-node swarm`` when nobody watches a terminal (piped, systemd, docker).

``ProgressLines.update(snapshot)`` writes one line per new version once it has settled (every
node holds it, or the head is ``SETTLE_VERSIONS`` past it): the version, whether the state
hashes of the nodes that hold it agree, patch bytes against dense BF16 and the reference codec,
the BF16 changed fraction, reward and held-out accuracy. With nothing new for ``heartbeat_s``
it writes where every node is instead, so a silent log always means a stuck swarm.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pulse_node.daemon.status_model import Alert
from pulse_node.ops.render import human_bytes
from pulse_node.ops.snapshot import FIRST_PATCH_VERSION, SwarmSnapshot, VersionView

#: a version counts as settled once the head is this far past it, even if a node lags
SETTLE_VERSIONS = 2
HEARTBEAT_S = 15.0
#: alerts that get a line of their own (node lag and start-up states only show in the heartbeat)
ALERT_KINDS = ("fork", "no_contributors", "round_without_update", "repeated_error", "duplicate_identity",
               "equivocation", "open_trust")


def alert_line(a: Alert) -> str:
    """One alert as a plain line."""
    return f"ALERT {a.level.upper()} {a.kind}: {a.message}"


def _agreement(v: VersionView) -> str:
    if v.agree is None:
        return f"held by {v.holders} node{'s' if v.holders != 1 else ''}"
    return f"hashes agree on {v.holders} nodes" if v.agree else f"HASHES DISAGREE on {v.holders} nodes"


def _num(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def version_line(v: VersionView) -> str:
    """One version as a plain line (no colours, no terminal needed)."""
    sizes = [f"{v.compression:.1f}x smaller than dense"] if v.compression else []
    sizes += [f"{v.vs_reference:.1f}x smaller than ref codec"] if v.vs_reference else []
    patch = f"patch {human_bytes(v.patch_bytes)}" + (f" ({', '.join(sizes)})" if sizes else "")
    if v.version < FIRST_PATCH_VERSION:
        patch = f"genesis anchor {human_bytes(v.dense_bytes)}"
    changed = "-" if v.changed is None else f"{v.changed * 100:.3g}%"
    if v.contributors == 0:
        return (f"v{v.version}  {_agreement(v)}  NO CONTRIBUTORS: the round closed without an update (learning "
                f"stopped)  reward {_num(v.reward)}  eval {_num(v.eval)}")
    who = "" if v.contributors is None else f"  {v.contributors} contributor{'s' if v.contributors != 1 else ''}"
    return (f"v{v.version}  {_agreement(v)}{who}  {patch}  changed {changed}  reward {_num(v.reward)}  "
            f"eval {_num(v.eval)}")


class ProgressLines:
    """Turns successive snapshots into progress lines written by ``write``."""

    def __init__(self, write: Callable[[str], None], *, heartbeat_s: float = HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write, self.heartbeat_s, self.clock = write, heartbeat_s, clock
        self.t0 = self.last_line = clock()
        self.printed = -1  # highest version written
        self.alerted: set[str] = set()  # alert lines written

    def update(self, snap: SwarmSnapshot, *, final: bool = False) -> None:
        """Write the versions settled since the last call (``final``: every version left)."""
        live = [n.version if n.version is not None else -1 for n in snap.nodes if n.state == "live"]
        low = min(live, default=-1)
        head = snap.head if snap.head is not None else -1
        for v in snap.versions:
            if v.version <= self.printed or v.dense_bytes is None:
                continue
            if not (final or low >= v.version or head >= v.version + SETTLE_VERSIONS):
                break
            self._emit(version_line(v))
            self.printed = v.version
        for a in snap.alerts:
            line = alert_line(a)
            if a.kind in ALERT_KINDS and line not in self.alerted:
                self.alerted.add(line)
                self._emit(line)
        if not final and self.clock() - self.last_line >= self.heartbeat_s:
            self._emit(self.waiting_line(snap))

    def waiting_line(self, snap: SwarmSnapshot) -> str:
        where = ", ".join(f"{n.name} {'v' + str(n.version) if n.version is not None else n.state}"
                          for n in sorted(snap.nodes, key=lambda n: n.name))
        alerts = f"; {len(snap.alerts)} alerts: {snap.alerts[0].message}" if snap.alerts else ""
        return f"waiting: {where or 'no nodes yet'}{alerts}"

    def _emit(self, line: str) -> None:
        now = self.clock()
        self.write(f"[{now - self.t0:6.0f}s] {line}")
        self.last_line = now
