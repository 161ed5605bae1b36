"""``pulse-node doctor``: is this machine ready to join a swarm, and if not, what to do next.

``run_doctor(DoctorOptions(...)) -> list[Check]`` runs the environment checks of ``checks.py``
and the network checks here, each bounded in time:

- ``daemon``: our p2p daemon starts with no peers (a failure here is local, FIELD #1);
- ``bootstrap``: a DHT node with the bootstrap as initial peer joins (a failure names the
  cause: refused, silent, wrong peer id, cannot connect back; FIELD #2);
- ``reachable``: the addresses peers would dial, public or private, and what to do if private;
- ``clocks``: live peers' record times against ours (records are signed with times);
- ``identity``: whether this node's identity key is already live in the swarm (a copied key;
  such a second node refuses to start, FIELD #14);
- ``model`` (with a config): which model, revision and local path the node would load, or the
  command that caches it (the check itself comes from the caller: ``ops`` does not import ``rl``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulse_node.errors import PulseError
from pulse_node.ops.checks import (
    Check,
    address_scope,
    check_accelerator,
    check_dependencies,
    check_disk,
    check_import,
    check_python,
    run_probes,
    timed,
)
from pulse_node.vocab import DEFAULT_RUN_ID

if TYPE_CHECKING:
    from pulse_node.net.dht.client import DhtClient

ENV_CHECKS = ("python", "torch", "hivemind", "libp2p", "dependencies", "accelerator", "disk", "model")
NET_CHECKS = ("daemon", "bootstrap", "reachable", "clocks", "identity")
ALL_CHECKS = ENV_CHECKS + NET_CHECKS
#: peers' record times may differ from ours by this much before we warn
CLOCK_WARN_S = 30.0
#: a record is refreshed every ttl/3 (<= 10 s by default): older than this means a slow clock
RECORD_MAX_AGE_S = 60.0
NAT_FIX = ("peers outside this network cannot dial you. An inference node works anyway: it opens the "
           "connections and peers answer on them (measured across a real NAT, bench/nat.py). To be dialable "
           "too (to serve peers that never contacted you), forward TCP ports, listen on them and announce "
           "them: --set 'net.dht_listen=[\"/ip4/0.0.0.0/tcp/<port>\"]' --announce /ip4/<public-ip>/tcp/<port>, "
           "and net.wire_listen with --wire-announce for the data plane (net.use_auto_relay gave no relay "
           "address in that measurement, and the data plane does not use relays)")


@dataclass
class DoctorOptions:
    bootstrap: list[str] = field(default_factory=list)
    run_id: str = DEFAULT_RUN_ID
    data_dir: Path = Path("./pulse-data")
    identity: Path | None = None
    timeout: float = 15.0
    listen: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    only: frozenset[str] | None = None
    model_check: Callable[[], Check] | None = None  # None: no config given, nothing to report

    def wants(self, name: str) -> bool:
        return self.only is None or name in self.only


def environment_checks(opts: DoctorOptions) -> list[Check]:
    checks: list[Check] = []
    if opts.wants("python"):
        checks.append(timed("python", check_python))
    probes = [n for n in ("torch", "hivemind", "libp2p")
              if opts.wants(n) or (n == "torch" and opts.wants("accelerator"))]
    t0 = time.monotonic()
    facts = run_probes(probes) if probes else {}
    took = round(time.monotonic() - t0, 2)
    checks.extend(check_import(name, facts[name]).model_copy(update={"seconds": took})
                  for name in ("torch", "hivemind", "libp2p") if opts.wants(name))
    if opts.wants("dependencies"):
        checks.append(timed("dependencies", check_dependencies))
    if opts.wants("accelerator"):
        checks.append(check_accelerator(facts["torch"]))
    if opts.wants("disk"):
        checks.append(timed("disk", check_disk, opts.data_dir))
    if opts.wants("model"):
        checks.append(timed("model", opts.model_check) if opts.model_check else
                      Check(name="model", status="SKIP", detail="no --config given (the model is named there)"))
    return checks


# ---- network ---------------------------------------------------------------------------------
def _start_client(opts: DoctorOptions, log_dir: str, *, peers: list[str]) -> DhtClient:
    from pulse_node.net.dht.client import DhtClient, DhtConfig

    cfg = DhtConfig(run_id=opts.run_id, initial_peers=peers, host_maddrs=opts.listen,
                    bootstrap_timeout_s=opts.timeout)
    return DhtClient.start(cfg, log_path=Path(log_dir) / ("bootstrap.log" if peers else "daemon.log"))


def check_daemon(opts: DoctorOptions, log_dir: str) -> Check:
    t0 = time.monotonic()
    try:
        client = _start_client(opts, log_dir, peers=[])
    except PulseError as exc:
        return Check(name="daemon", status="FAIL", detail=str(exc),
                     fix="the fault is on this machine (port, address, p2pd binary); see the message")
    try:
        addrs = client.info().visible_maddrs
    finally:
        client.stop()
    return Check(name="daemon", status="PASS",
                 detail=f"p2p daemon started in {time.monotonic() - t0:.1f} s, listening on {', '.join(addrs[:3])}")


def _bootstrap_fix(kind: str) -> str:
    return {"bootstrap": "the fault is on the way to the bootstrap (this machine's daemon starts): check the "
                         "address (copy the line `pulse-node bootstrap` prints), that it runs, and firewalls",
            "config": "fix the --bootstrap address: a full multiaddr ending in /p2p/<peer id>",
            "duplicate": "give this node its own identity (delete the copied identity.key)"}.get(
        kind, "see the message; run with a longer --timeout if the network is slow")


@dataclass
class Joined:
    """The outcome of joining through the bootstrap: its check, and on success a live client."""

    check: Check
    client: Any = None
    peers: list[Any] | None = None
    #: why the start failed (config | daemon | bootstrap | duplicate | internal), "" if it did not
    failure: str = ""
    #: whether our daemon was started at all (False for a malformed address)
    attempted: bool = True


def _fail(detail: str, kind: str, *, attempted: bool = True) -> Joined:
    return Joined(Check(name="bootstrap", status="FAIL", detail=detail, fix=_bootstrap_fix(kind)),
                  failure=kind or "internal", attempted=attempted)


def check_bootstrap(opts: DoctorOptions, log_dir: str) -> Joined:
    """Join through the bootstrap; the caller stops ``Joined.client``."""
    from pulse_node.net.dht.client import DhtStartError

    malformed = [b for b in opts.bootstrap if "/p2p/" not in b]
    if malformed:
        return _fail(f"{malformed[0]} has no /p2p/<peer id> part", "config", attempted=False)
    t0 = time.monotonic()
    try:
        client = _start_client(opts, log_dir, peers=opts.bootstrap)
    except DhtStartError as exc:
        return _fail(str(exc), exc.kind)
    except PulseError as exc:
        return _fail(str(exc), "")
    took = time.monotonic() - t0
    try:
        peers = client.peers()
    except PulseError as exc:
        client.stop()
        return _fail(f"joined, but reading peer records failed: {exc} (an incompatible pulse-node version?)", "")
    roles: dict[str, int] = {}
    for p in peers:
        roles[p.role] = roles.get(p.role, 0) + 1
    listing = ", ".join(f"{n} {r}" for r, n in sorted(roles.items())) or "none"
    detail = f"joined through {opts.bootstrap[0]} in {took:.1f} s; live peers in run {opts.run_id!r}: {listing}"
    if not peers:
        return Joined(Check(name="bootstrap", status="WARN", detail=detail, fix="the bootstrap answers but nobody "
                            f"publishes under run id {opts.run_id!r}: check --run-id"), client, peers)
    return Joined(Check(name="bootstrap", status="PASS", detail=detail), client, peers)


def daemon_from_join(joined: Joined) -> Check:
    """The daemon check as the join attempt answered it (our daemon starts before any dial)."""
    if joined.failure == "daemon":
        return Check(name="daemon", status="FAIL", detail=joined.check.detail,
                     fix="the fault is on this machine (port, address, p2p daemon binary); see the message")
    return Check(name="daemon", status="PASS", detail="p2p daemon started (while joining through the bootstrap)",
                 seconds=joined.check.seconds)


def check_reachable(client: Any, opts: DoctorOptions) -> Check:
    addrs = client.info().visible_maddrs
    scopes = {a: address_scope(a) for a in addrs}
    listing = ", ".join(f"{a} ({s})" for a, s in list(scopes.items())[:4])
    if any(s in ("public", "dns") for s in scopes.values()):
        return Check(name="reachable", status="PASS", detail=f"announced addresses include a public one: {listing}")
    if any(s == "relay" for s in scopes.values()):
        return Check(name="reachable", status="PASS", detail=f"reachable through a relay: {listing}")
    boot_scopes = {address_scope(b) for b in opts.bootstrap}
    if boot_scopes <= {"private", "loopback"}:
        return Check(name="reachable", status="PASS",
                     detail=f"private addresses only, and so is the bootstrap (a LAN/local swarm): {listing}",
                     fix="for peers on the internet: " + NAT_FIX)
    return Check(name="reachable", status="WARN", detail=f"no public address: {listing}", fix=NAT_FIX)


def check_clocks(peers: list[Any], *, now: float | None = None) -> Check:
    now = time.time() if now is None else now
    if not peers:
        return Check(name="clocks", status="SKIP", detail="no live peer records to compare with")
    ahead = [(p, p.updated_at - now) for p in peers if p.updated_at - now > CLOCK_WARN_S]
    behind = [(p, now - p.updated_at) for p in peers if now - p.updated_at > RECORD_MAX_AGE_S]
    if not ahead and not behind:
        return Check(name="clocks", status="PASS", detail=f"{len(peers)} peers' record times agree with this clock "
                     f"within {CLOCK_WARN_S:.0f} s")
    parts = [f"{p.role} {p.peer_id[-8:]} is {d:.0f} s ahead" for p, d in ahead[:3]]
    parts += [f"{p.role} {p.peer_id[-8:]} is ~{d:.0f} s behind" for p, d in behind[:3]]
    return Check(name="clocks", status="WARN", detail="; ".join(parts),
                 fix="enable NTP on this machine (timedatectl set-ntp true); if only one peer is off, its clock is "
                 "wrong: records dated in the future are refused by every peer")


def check_identity(opts: DoctorOptions, peers: list[Any] | None) -> Check:
    path = opts.identity or Path(opts.data_dir) / "identity.key"
    if not Path(path).exists():
        return Check(name="identity", status="PASS", detail=f"no identity at {path} yet: one is created at first start")
    from pulse_node.chain.identity import Identity
    from pulse_node.net.dht.validator import peer_id_of

    try:
        peer_id = peer_id_of(Identity.load(path))
    except PulseError as exc:
        return Check(name="identity", status="FAIL", detail=str(exc),
                     fix=f"move the damaged file away ({path}); a new identity is created at the next start")
    if peers is None:
        return Check(name="identity", status="PASS", detail=f"{path}: peer id {peer_id} (not checked against a swarm)")
    live = [p for p in peers if p.peer_id == peer_id]
    if not live:
        return Check(name="identity", status="PASS", detail=f"{path}: peer id {peer_id}, not in use in the swarm")
    where = ", ".join(live[0].dht_maddrs[:2]) or "an unknown address"
    return Check(name="identity", status="WARN",
                 detail=f"{path}: peer id {peer_id} is in use by a live {live[0].role} node at {where}",
                 fix="fine if that is this machine's own running node; otherwise the key was copied: a second node "
                 "with it refuses to start. Delete the copy (a new identity is created) or use another --data-dir")


def network_checks(opts: DoctorOptions) -> list[Check]:
    """Join through the bootstrap (which also proves the daemon starts), else start the daemon alone."""
    checks: list[Check] = []
    wants_join = any(opts.wants(n) for n in ("daemon", "bootstrap", "reachable", "clocks", "identity"))
    with tempfile.TemporaryDirectory(prefix="pulse-doctor-") as log_dir:
        joined = None
        if opts.bootstrap and wants_join:
            t0 = time.monotonic()
            joined = check_bootstrap(opts, log_dir)
            joined.check = joined.check.model_copy(update={"seconds": round(time.monotonic() - t0, 2)})
        if opts.wants("daemon"):
            attempted = joined if joined is not None and joined.attempted else None
            checks.append(daemon_from_join(attempted) if attempted else timed("daemon", check_daemon, opts, log_dir))
        if opts.wants("bootstrap"):
            checks.append(joined.check if joined else Check(
                name="bootstrap", status="SKIP", detail="no --bootstrap given",
                fix="pass --bootstrap MULTIADDR (the line `pulse-node bootstrap` prints)"))
        client = joined.client if joined else None
        try:
            checks += _joined_checks(opts, client, joined.peers if joined else None)
        finally:
            if client is not None:
                client.stop()
    return checks


def _joined_checks(opts: DoctorOptions, client: Any, peers: list[Any] | None) -> list[Check]:
    why = "no --bootstrap given" if not opts.bootstrap else "the bootstrap check failed"
    out: list[Check] = []
    for name, fn in (("reachable", lambda: check_reachable(client, opts)),
                     ("clocks", lambda: check_clocks(peers or []))):
        if opts.wants(name):
            out.append(timed(name, fn) if client is not None else Check(name=name, status="SKIP", detail=why))
    if opts.wants("identity"):
        out.append(timed("identity", check_identity, opts, peers))
    return out


def run_doctor(opts: DoctorOptions, *, on_check: Callable[[Check], None] | None = None) -> list[Check]:
    """Every selected check, environment first; ``on_check`` sees each batch as it completes."""
    with ThreadPoolExecutor(1) as pool:
        net = pool.submit(network_checks, opts)  # network waits overlap the import probes
        checks = environment_checks(opts)
        if on_check is not None:
            for c in checks:
                on_check(c)
        more = net.result()
    if on_check is not None:
        for c in more:
            on_check(c)
    return checks + more
