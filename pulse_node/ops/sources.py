"""Where the dashboard's inputs come from: a local run dir, or the swarm's DHT plus each node's /status.

- ``read_run_dir(root)``: every node dir under ``root`` (the layout of ``pulse-node swarm``:
  ``<name>/status.json``, ``identity.key``, ``log.txt``; ``bootstrap/maddrs.txt``). A node
  without a status gets the last error line of its log as its problem (e.g. "identity ...
  is already used by another running node"), so refusals are visible, not silent.
- ``DhtSource``: a client-mode DHT node (``DhtClient``) that reads the signed peer records;
  each record's ``metrics_url`` is asked for ``/status`` (short timeout, in parallel).

Statuses are parsed into ``StatusReport`` (``daemon/status_model.py``); one of another schema
version becomes a node shown as "unknown-schema" with the reason, never an exception.
A record's ``metrics_url`` is the peer's claim, so asking it is bounded (``status_target``,
``fetch_status``): plain http only, to a host among the addresses the same record announces
(never a third party); a name (``/dns4/...``) is resolved here and every address it resolves to
is checked, and the request goes to that checked address (no second lookup to rebind): a loopback
or private address only when the bootstrap itself is one (a local swarm), a link-local,
unspecified or multicast one never, unless the operator named that very address; no redirects;
one overall deadline of 2 s for connecting, sending and the whole answer (a peer dripping one
byte at a time cannot hold it longer), at most ``MAX_STATUS_BYTES`` read.
"""

from __future__ import annotations

import ipaddress
import socket
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pulse_node.daemon.status_model import StatusReport, StatusSchemaError, parse_status, read_status
from pulse_node.errors import PulseError
from pulse_node.ops.snapshot import NodeInput

HTTP_TIMEOUT_S = 2.0
MAX_STATUS_BYTES = 4 << 20
LOG_TAIL_BYTES = 8192
#: a live node's log error counts as current if it is among the log's last lines
RECENT_LOG_LINES = 20
_MARKERS = ("status.json", "identity.key", "node.toml", "log.txt")


def _is_error(line: str) -> bool:
    low = line.lower()
    return any(w in low for w in ("error", "exception", "failed", "traceback"))


def log_tail(log: Path) -> list[str]:
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            return [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return []


def last_error_line(log: Path, *, within: int | None = None) -> str | None:
    """The last error-looking line of a log (among its last ``within`` lines); without
    ``within``, the last line if none looks like an error."""
    lines = log_tail(log)
    recent = lines[-within:] if within else lines
    for line in reversed(recent):
        if _is_error(line):
            return _clip(line)
    return None if within or not lines else _clip(lines[-1])


def _clip(line: str, limit: int = 400) -> str:
    """Keep a line's head (what failed) when it is too long for a dashboard row."""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _node_key(path: Path) -> str | None:
    if not path.exists():
        return None
    from pulse_node.chain.identity import Identity

    try:
        return Identity.load(path).public_key_hex
    except PulseError:
        return None


def _mtime(path: Path) -> float | None:
    """A running node rewrites its status.json twice a second: the file's age is the node's silence."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def bootstrap_address(root: Path) -> str | None:
    """The first address the local swarm's bootstrap printed, if any."""
    for f in (root / "bootstrap" / "maddrs.txt", *sorted(root.glob("*/*.maddrs"))):
        try:
            words = f.read_text().split()
        except OSError:
            continue
        if words:
            return words[0]
    return None


def read_run_dir(root: Path) -> list[NodeInput]:
    """One ``NodeInput`` per node dir under ``root`` (bootstrap and helper dirs skipped)."""
    out = []
    for d in sorted(p for p in Path(root).iterdir() if p.is_dir()) if Path(root).is_dir() else []:
        if d.name == "bootstrap" or (d / "maddrs.txt").exists() or not any((d / m).exists() for m in _MARKERS):
            continue
        out.append(read_node_dir(d))
    return out


def read_node_dir(d: Path, *, name: str | None = None, starting: bool = False) -> NodeInput:
    """One node's ``NodeInput`` from its data dir (status.json, identity.key, log.txt);
    ``starting``: its process is known to run (shown as starting until it writes a status)."""
    status, unreadable, problem = None, None, None
    try:
        status = read_status(d / "status.json")
    except StatusSchemaError as exc:
        unreadable = problem = f"{d / 'status.json'}: {exc}"
    if status is None and unreadable is None:
        problem = f"no status.json; log: {last_error_line(d / 'log.txt') or 'empty'}"
    elif status is not None and status.stopped:
        problem = f"stopped; log: {last_error_line(d / 'log.txt') or 'empty'}"
    return NodeInput(name=name or d.name, status=status, source="run_dir", problem=problem,
                     node_key=_node_key(d / "identity.key"), seen_at=_mtime(d / "status.json"),
                     log_error=last_error_line(d / "log.txt", within=RECENT_LOG_LINES) if status else None,
                     unreadable=unreadable, starting=starting)


def status_url(metrics_url: str) -> str:
    """A node's ``/status`` URL from the ``metrics_url`` it announces (base or .../metrics)."""
    base = metrics_url.rstrip("/")
    for suffix in ("/metrics", "/status", "/health"):
        base = base.removesuffix(suffix)
    return base + "/status"


def fetch_status(metrics_url: str, *, timeout: float = HTTP_TIMEOUT_S) -> StatusReport | str:
    """A node's /status, or a one-line reason it could not be read (http only, no redirects, at
    most ``MAX_STATUS_BYTES``, all within ``timeout``; ``StatusSchemaError``: it answered with a
    status of another schema)."""
    if not metrics_url.startswith("http://"):
        return f"metrics url {metrics_url[:80]!r} is not plain http"
    try:
        code, body = http_get(status_url(metrics_url), timeout=timeout, max_bytes=MAX_STATUS_BYTES)
    except _TooLarge:
        return f"/status is larger than {MAX_STATUS_BYTES} bytes"
    except (OSError, ValueError) as exc:
        return f"/status unreachable ({exc or type(exc).__name__})"
    if code != 200:
        return f"/status answered HTTP {code}" + (" (redirects are not followed)" if 300 <= code < 400 else "")
    return parse_status(body)


class _TooLarge(ValueError):
    pass


def http_get(url: str, *, timeout: float, max_bytes: int) -> tuple[int, bytes]:
    """(status code, body) of a plain HTTP/1.0 GET, everything within one deadline of ``timeout``
    seconds (``TimeoutError`` past it, however the peer paces its bytes); ``_TooLarge`` past
    ``max_bytes`` of body. No redirects, no keep-alive."""
    deadline = time.monotonic() + timeout
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url[:80]!r} is not a plain http URL")

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no complete answer within {timeout:g} s")
        return remaining

    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    buf = bytearray()
    with socket.create_connection((parts.hostname, parts.port or 80), timeout=left()) as sock:
        sock.settimeout(left())
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        while True:
            sock.settimeout(left())
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > max_bytes + 65536:  # the body's cap plus room for headers
                raise _TooLarge(f"body larger than {max_bytes} bytes")
    head, sep, body = bytes(buf).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status) < 2 or not status[0].startswith(b"HTTP/") or not status[1].isdigit():
        raise ValueError("not an HTTP answer")
    if len(body) > max_bytes:
        raise _TooLarge(f"body larger than {max_bytes} bytes")
    return int(status[1]), body


def _maddr_host(maddr: str) -> str | None:
    parts = maddr.split("/")
    return parts[2] if len(parts) > 2 and parts[1] in ("ip4", "ip6", "dns", "dns4", "dns6") else None


def _private(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_unspecified


def is_private_maddr(maddr: str) -> bool:
    """Whether a multiaddr names a loopback, private or link-local host (a local swarm)."""
    host = _maddr_host(maddr)
    return host is not None and _private(host)


def _addresses(host: str) -> list[str]:
    """Every address ``host`` resolves to (an IP: itself)."""
    if _is_ip(host):
        return [host]
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


#: how names are resolved (tests replace it; nothing else should)
resolve: Callable[[str], list[str]] = _addresses


def allowed_address(ip: str, *, allow_private: bool, named: Collection[str] = ()) -> bool:
    """Whether the status fetch may connect to ``ip``: one the operator named, else a public one,
    else (a local swarm) a loopback or private one; link-local, unspecified, multicast and
    reserved ones only when named."""
    if ip in named:
        return True
    addr = ipaddress.ip_address(ip)
    if addr.is_link_local or addr.is_unspecified or addr.is_multicast or addr.is_reserved:
        return False
    return allow_private or not (addr.is_private or addr.is_loopback)


def status_target(peer: Mapping[str, Any], *, allow_private: bool, named: Collection[str] = ()) -> str:
    """The URL to ask a peer record for its /status, its host replaced by the checked address it
    resolved to; ``ValueError`` saying why not."""
    announced = [str(m) for m in [*(peer.get("dht_maddrs") or []), *(peer.get("wire_maddrs") or [])]]
    url = dialable_url(str(peer.get("metrics_url") or ""), [m for m in announced if m.startswith("/ip4/")])
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or parsed.username or parsed.password:
        raise ValueError(f"metrics url {url[:80]!r} is not a plain http URL")
    if parsed.hostname not in {_maddr_host(m) for m in announced}:
        raise ValueError(f"metrics url host {parsed.hostname!r} is not an address the record announces")
    if _private(parsed.hostname) and not allow_private and parsed.hostname not in named:
        raise ValueError(f"metrics url host {parsed.hostname!r} is private and the swarm is not")
    try:
        ips = resolve(parsed.hostname)
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"metrics url host {parsed.hostname!r} does not resolve ({exc})") from None
    bad = [ip for ip in ips if not allowed_address(ip, allow_private=allow_private, named=named)]
    if not ips or bad:
        raise ValueError(f"metrics url host {parsed.hostname!r} resolves to {', '.join(bad) or 'nothing'}, "
                         "an address the status fetch does not ask")
    host = f"[{ips[0]}]" if ":" in ips[0] else ips[0]
    return urllib.parse.urlunsplit(parsed._replace(netloc=f"{host}:{parsed.port}" if parsed.port else host))


def dialable_url(metrics_url: str, dht_maddrs: list[str]) -> str:
    """A node listening on all interfaces announces ``0.0.0.0``: use an IP of its DHT addresses
    instead, a non-loopback one first (a container's 127.0.0.1 is not the container from here)."""
    if "://0.0.0.0:" not in metrics_url:
        return metrics_url
    hosts = [h for h in (_maddr_host(m) for m in dht_maddrs if m.startswith("/ip4/")) if h]
    hosts.sort(key=lambda h: ipaddress.ip_address(h).is_loopback if _is_ip(h) else True)
    return metrics_url.replace("://0.0.0.0:", f"://{hosts[0]}:", 1) if hosts else metrics_url


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def statuses_of_peers(peers: Sequence[Mapping[str, Any]], *, timeout: float = HTTP_TIMEOUT_S,
                      allow_private: bool = False, named: Collection[str] = ()) -> list[NodeInput]:
    """Ask every peer whose record announces an acceptable metrics URL (``status_target``) for
    its /status, in parallel (``named``: addresses the operator gave, e.g. the bootstrap's)."""
    targets, urls = [], []
    for p in peers:
        try:
            urls.append(status_target(p, allow_private=allow_private, named=named))
            targets.append(p)
        except ValueError:
            continue
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        results = list(pool.map(lambda u: _fetch_or_reason(u, timeout), urls))
    answered_at = time.time()
    out = []
    for peer, res in zip(targets, results):
        pid = str(peer["peer_id"])
        name = f"{peer.get('role', 'peer')}-{pid[-6:]}"
        if isinstance(res, StatusReport) and res.peer_id == pid:
            out.append(NodeInput(name=name, status=res, source="http", seen_at=answered_at))
        elif isinstance(res, StatusSchemaError):
            out.append(NodeInput(name=name, source="http", unreadable=f"/status: {res}", peer_id=pid))
    return out


def _fetch_or_reason(url: str, timeout: float) -> StatusReport | StatusSchemaError | str:
    try:
        return fetch_status(url, timeout=timeout)
    except StatusSchemaError as exc:
        return exc


class DhtSource:
    """Reads the swarm's peer records through a client-mode DHT node; ``close`` stops it."""

    def __init__(self, bootstrap: list[str], *, run_id: str, timeout: float = 15.0) -> None:
        from pulse_node.net.dht.client import DhtClient, DhtConfig

        self._logdir = tempfile.TemporaryDirectory(prefix="pulse-status-")
        self.log_path = Path(self._logdir.name) / "dht.log"
        cfg = DhtConfig(run_id=run_id, initial_peers=bootstrap, client_mode=True, bootstrap_timeout_s=timeout)
        self.local = bool(bootstrap) and all(is_private_maddr(m) for m in bootstrap)  # may ask private hosts
        self.named = {h for m in bootstrap if (h := _maddr_host(m))}  # the operator gave these
        try:
            self.client = DhtClient.start(cfg, log_path=self.log_path)
        except BaseException:
            self._logdir.cleanup()
            raise

    def peers(self) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") for r in self.client.peers()]

    def read(self) -> tuple[list[NodeInput], list[dict[str, Any]]]:
        peers = self.peers()
        return statuses_of_peers(peers, allow_private=self.local, named=self.named), peers

    def close(self) -> None:
        try:
            self.client.stop()
        finally:
            self._logdir.cleanup()
