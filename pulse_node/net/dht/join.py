"""Starting this node's DHT daemon and joining the swarm, with failures a user can act on.

Two things go wrong in the field (FIELD.md #1, #2): the local p2p daemon does not start, or
the bootstrap peers cannot be reached and nobody can tell whether the fault is local or
remote. So joining is done in explicit, individually bounded steps:

1. start ``p2pd`` *without* bootstrap peers (it would exit with a bare "failed to connect to
   bootstrap peers"), so a failure here is always local (port, address, binary);
2. dial every bootstrap address ourselves, in parallel, retrying "refused" (the bootstrap may
   still be starting) until the deadline, and keep the last libp2p error of each, classified
   (refused, no answer, wrong peer id at that address, other);
3. only then let hivemind's ``DHTNode`` ping the peers it is now connected to.

Every failure raises ``JoinError`` with one message saying what to check next.
"""

from __future__ import annotations

import asyncio
import time

from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import ValidationError
from hivemind.dht.validation import CompositeValidator, RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.utils.multiaddr import Multiaddr

from pulse_node.net.dht.config import DhtConfig
from pulse_node.net.local.rpc_server import StartFailed

DAEMON_START_TIMEOUT_S = 15.0
DHT_WAIT_TIMEOUT_S = 3.0
_REDIAL_PAUSE_S = 0.5


class JoinError(StartFailed):
    """The node could not start its DHT; ``kind`` is config | daemon | bootstrap."""


class UnreachableError(JoinError):
    """The bootstrap's ping back did not reach this node's DHT: a NAT or firewall, or another live node
    holding our peer id (the bootstrap's connection to that id reached it); ``worker.py`` tells which."""


def parse_bootstrap(maddrs: list[str]) -> list[tuple[str, Multiaddr, PeerID]]:
    """Each full multiaddr -> (text, transport address, peer id); ``JoinError`` if malformed."""
    out = []
    for text in maddrs:
        try:
            addr = Multiaddr(text)
            peer = PeerID.from_base58(addr["p2p"])
        except Exception:
            raise JoinError("config", f"bootstrap address {text!r} is not a full multiaddr "
                            "like /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...: copy the line that "
                            "`pulse-node bootstrap` prints") from None
        out.append((text, addr.decapsulate(Multiaddr(f"/p2p/{addr['p2p']}")), peer))
    return out


async def start_daemon(opts: DhtConfig, identity_path: str) -> P2P:
    """Start this node's p2pd; ``JoinError('daemon')`` with the cause and a next step."""
    for maddr in opts.announce_maddrs:
        if "/tcp/0" in maddr + "/" or "/udp/0/" in maddr + "/":
            raise JoinError("config", f"--announce-maddrs {maddr}: an announced address needs "
                            "an explicit port (the one you forwarded), not 0")
    try:
        return await P2P.create(
            host_maddrs=opts.host_maddrs, announce_maddrs=opts.announce_maddrs or None,
            identity_path=identity_path, use_relay=opts.use_relay, use_auto_relay=opts.use_auto_relay,
            dht_mode="client" if opts.client_mode else "server", check_if_identity_free=False,
            startup_timeout=DAEMON_START_TIMEOUT_S)
    except (P2PDaemonError, ValueError, OSError) as exc:
        raise JoinError("daemon", _daemon_message(str(exc), opts)) from None


def _daemon_message(cause: str, opts: DhtConfig) -> str:
    low = cause.lower()
    if "address already in use" in low:
        hint = "another process already listens on that port: pick another port in --host-maddrs, or stop it"
    elif "assign requested address" in low:
        hint = "that IP is not on this machine: listen on /ip4/0.0.0.0/... or one of this host's IPs"
    elif "failed to start in" in low:
        hint = "the machine may be overloaded; retry, and check that nothing kills p2pd (seccomp, antivirus)"
    else:
        hint = "check --host-maddrs and that the hivemind package (which ships p2pd) is installed intact"
    return (f"the DHT daemon (p2pd) did not start with --host-maddrs {' '.join(opts.host_maddrs)}: "
            f"{cause.strip()}. Next step: {hint}")


async def connect_bootstrap(p2p: P2P, maddrs: list[str], *, timeout: float) -> list[str]:
    """Dial the bootstrap peers until one connects or ``timeout``; return the connected ones."""
    parsed = parse_bootstrap(maddrs)
    deadline = time.monotonic() + timeout
    tasks = {asyncio.create_task(_dial_until(p2p, item, deadline)): item[0] for item in parsed}
    connected: list[str] = []
    failures: list[str] = []
    try:
        for next_done in asyncio.as_completed(tasks):
            reason = await next_done
            if reason is None:
                connected = [t for task, t in tasks.items() if task.done() and task.result() is None]
                break
            failures.append(reason)
    finally:
        for task in tasks:
            task.cancel()
    if not connected:
        raise JoinError("bootstrap", _bootstrap_message(failures, timeout))
    return connected


def _bootstrap_message(failures: list[str], timeout: float) -> str:
    head = (f"could not join the swarm: none of {len(failures)} bootstrap peer(s) answered within "
            f"{timeout:.0f} s (this node's own daemon started fine, so the fault is on the way to them)")
    return head + "".join(f"\n  - {line}" for line in failures)


async def _dial_until(p2p: P2P, item: tuple[str, Multiaddr, PeerID], deadline: float) -> str | None:
    """None once connected, else the classified reason of the last failed attempt."""
    text, addr, peer = item
    started = time.monotonic()
    reason = f"bootstrap {text} did not answer"
    while time.monotonic() < deadline:
        try:
            await asyncio.wait_for(p2p._client.connect(peer, [addr]),
                                   timeout=max(0.1, deadline - time.monotonic()))
            return None
        except asyncio.TimeoutError:
            break
        except Exception as exc:  # ControlFailure carries the libp2p dial error text
            classified = classify_dial_error(text, str(exc))
            if classified is not None:  # None: libp2p's dial backoff, no news about the peer
                reason, permanent = classified
                if permanent:
                    return reason
        await asyncio.sleep(min(_REDIAL_PAUSE_S, max(0.0, deadline - time.monotonic())))
    waited = time.monotonic() - started
    if "refused" in reason:
        return reason
    return (f"bootstrap {text} did not answer in {waited:.0f} s: check the address, that it is running, "
            "and your firewall")


def classify_dial_error(text: str, error: str) -> tuple[str, bool] | None:
    """A libp2p dial error -> (what to tell the user, whether retrying is pointless), or None
    for a "dial backoff" (libp2p refuses to redial a failed address for a few seconds)."""
    low = error.lower()
    if "dial backoff" in low and "refused" not in low and "deadline" not in low:
        return None
    if "peer id mismatch" in low:
        actual = low.split("remote key matches", 1)[-1].strip().split()[0] if "remote key matches" in low else "?"
        return (f"bootstrap {text}: a different peer ({actual}) answers at that address; the bootstrap's "
                "identity changed (restarted without --identity?): use the address it prints now", True)
    if "connection refused" in low:
        return (f"bootstrap {text} refused the connection: nothing listens there; check that it is "
                "running and the port is right", False)
    if "no route to host" in low or "network is unreachable" in low:
        return f"bootstrap {text}: no route to that host from here; check the IP and your network", False
    if "deadline exceeded" in low or "timeout" in low or "i/o timeout" in low:
        return f"bootstrap {text} did not answer", False
    detail = error.strip().splitlines()[-1].strip(" *")[:200]
    return f"bootstrap {text} unreachable: {detail}", False


async def create_dht_node(p2p: P2P, validator: RecordValidatorBase, *, initial_peers: list[str],
                          client_mode: bool, timeout: float) -> DHTNode:
    """hivemind's DHT node on our daemon; ``JoinError`` if the peers do not speak its protocol."""
    try:
        return await DHTNode.create(
            p2p=p2p, initial_peers=initial_peers or None, record_validator=CompositeValidator([validator]),
            client_mode=client_mode, wait_timeout=DHT_WAIT_TIMEOUT_S,
            bootstrap_timeout=max(1.0, timeout), cache_locally=True,
            cache_nearest=0)  # a read does not push the whole merged dictionary into another node's cache
    except ValidationError as exc:
        if "can't access this node" in str(exc):
            raise UnreachableError("bootstrap", "the bootstrap cannot connect back to this node (NAT or firewall): "
                            "forward a fixed port and announce it (pulse-node join: --set "
                            "'net.dht_listen=[\"/ip4/0.0.0.0/tcp/31338\"]' --announce /ip4/<PUBLIC_IP>/tcp/31338; "
                            "pulse-node bootstrap: --announce-maddrs), or join with --set net.client_mode=true") from None
        raise JoinError("bootstrap", f"joining the DHT failed: {exc} (check this machine's clock: "
                        "peers must agree within 3 s; enable NTP)") from None
    except RuntimeError as exc:
        raise JoinError("bootstrap", f"{exc}; the peers accept libp2p connections but not the DHT "
                        "protocol: are they pulse-node DHT nodes of a compatible version?") from None
