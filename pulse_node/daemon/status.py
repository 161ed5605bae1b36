"""A node's observable state: ``/metrics`` (Prometheus), ``/health``, ``/status`` and status.json.

``NodeStatus`` holds the node's ``StatusReport`` (declared in ``daemon/status_model.py``) and
is the only way a role changes it. Counters are written by attribute, under the holder's lock,
so a misspelt counter fails the type checker, not a run::

    with status.trainer() as c:          # TrainerCounters (StatusFieldError on an inference node)
        c.decisions_made += 1
        count(c.loco_refused, LocoRefusal.BANNED)

``node()`` holds the counters of every node, ``inference()`` an inference node's;
``update(version=...)`` sets top-level fields (keywords typed by ``StatusFields``; undeclared
names refused at run time too: ``StatusFieldError``),
``set_data_plane(transport.stats())``, ``record_version(VersionEntry(...))`` and ``error(message)``
the rest. ``StatusServer`` serves it on a
local port (0 = any free port); the node also writes it atomically to ``data_dir/status.json``
so local tools (the swarm launcher, ``status``) can read it without the network. ``/metrics``
exports every numeric field the model declares (``gauge_fields``), read at scrape time. The
server answers on at most ``MAX_STATUS_THREADS`` threads; a connection past them is closed at
once, and one that sends nothing for ``idle_timeout`` seconds is dropped, so idle or dripping
connections cannot make it start threads without bound.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from pulse_node.daemon.status_model import (
    ERROR_CHARS,
    ERRORS_KEPT,
    HISTORY_LEN,
    SECTIONS,
    DataPlane,
    ErrorEntry,
    EvalPoint,
    InferenceCounters,
    NodeCounters,
    StatusFieldError,
    StatusFields,
    StatusReport,
    TrainerCounters,
    VersionEntry,
    gauge_fields,
    new_report,
)
from pulse_node.fsutil import write_atomic

if TYPE_CHECKING:
    from typing_extensions import Unpack


class NodeStatus:
    """Thread-safe holder of one node's ``StatusReport``."""

    def __init__(self, *, role: str, peer_id: str, run_id: str) -> None:
        self._lock = threading.Lock()
        self._report = new_report(role=role, peer_id=peer_id, run_id=run_id)
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))

    def update(self, **fields: Unpack[StatusFields]) -> None:
        """Set declared top-level fields (e.g. ``version``, ``reward_mean``): their names and types
        are ``StatusFields``'s (checked by the type checker), checked again on assignment."""
        with self._lock:
            for name, value in fields.items():
                if name not in _settable():
                    raise StatusFieldError(f"status has no field {name!r} to set; declared: "
                                           f"{', '.join(_settable())}")
                setattr(self._report, name, value)
            self._report.updated_at = time.time()

    @contextmanager
    def node(self) -> Iterator[NodeCounters]:
        """The counters of every node, to change by attribute while the lock is held."""
        with self._lock:
            yield self._report.counters
            self._report.updated_at = time.time()

    @contextmanager
    def trainer(self) -> Iterator[TrainerCounters]:
        """A trainer's counters, to change by attribute; ``StatusFieldError`` on another role."""
        with self._lock:
            if self._report.trainer is None:
                raise StatusFieldError(f"a {self._report.role} node has no trainer counters")
            yield self._report.trainer
            self._report.updated_at = time.time()

    @contextmanager
    def inference(self) -> Iterator[InferenceCounters]:
        """An inference node's counters, to change by attribute; ``StatusFieldError`` on another role."""
        with self._lock:
            if self._report.inference is None:
                raise StatusFieldError(f"a {self._report.role} node has no inference counters")
            yield self._report.inference
            self._report.updated_at = time.time()

    def set_data_plane(self, stats: DataPlane | Mapping[str, Any]) -> None:
        """What the transport reports (``Transport.stats()``; a map is checked against ``DataPlane``)."""
        plane = stats if isinstance(stats, DataPlane) else DataPlane.model_validate(dict(stats))
        with self._lock:
            self._report.data_plane = plane
            self._report.updated_at = time.time()

    def error(self, message: str) -> None:
        with self._lock:
            errs = self._report.recent_errors
            errs.append(ErrorEntry(at=time.time(), message=message[:ERROR_CHARS]))
            del errs[:-ERRORS_KEPT]
            self._report.counters.errors += 1
            self._report.updated_at = time.time()

    def record_version(self, entry: VersionEntry) -> None:
        """Append a per-version history entry (the last ``HISTORY_LEN`` are kept)."""
        if not isinstance(entry, VersionEntry):
            raise StatusFieldError(f"a history entry is a VersionEntry, not {type(entry).__name__}")
        with self._lock:
            hist = self._report.history
            hist.append(entry)
            del hist[:-HISTORY_LEN]
            if entry.eval is not None and self._report.first_eval is None:
                self._report.first_eval = EvalPoint(version=entry.version, accuracy=entry.eval)
            self._report.updated_at = time.time()

    @property
    def version(self) -> int:
        """The version this node holds (cheap: for log prefixes)."""
        return self._report.version

    @property
    def role(self) -> str:
        return self._report.role

    @property
    def peer_id(self) -> str:
        return self._report.peer_id

    @property
    def metrics_url(self) -> str | None:
        return self._report.metrics_url

    def snapshot(self) -> StatusReport:
        """A deep copy of the report (safe to read while the node goes on)."""
        with self._lock:
            return self._report.model_copy(deep=True)

    def to_json(self) -> str:
        with self._lock:
            return self._report.to_json()

    def write(self, path: Path) -> None:
        write_atomic(path, self.to_json().encode())

    def gauges(self) -> list[tuple[str, float, str]]:
        with self._lock:
            return list(gauge_fields(self._report))


#: fields fixed when the node starts (set by ``new_report``)
_FIXED = ("schema_version", "role", "peer_id", "run_id", "started_at")


def _settable() -> list[str]:
    return [n for n in StatusReport.model_fields if n not in SECTIONS and n not in _FIXED]


class _Collector:
    """``/metrics``: one gauge ``pulse_<name>`` per numeric field of the report, at scrape time."""

    def __init__(self, status: NodeStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, value, doc in self.status.gauges():
            yield GaugeMetricFamily(f"pulse_{name}", doc, value=value)


#: connections the status server handles at once (more are closed at once)
MAX_STATUS_THREADS = 8
IDLE_TIMEOUT_S = 5.0


class _BoundedServer(HTTPServer):
    """An HTTP server whose connections are handled on at most ``MAX_STATUS_THREADS`` threads."""

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(addr, handler)
        self.slots = threading.BoundedSemaphore(MAX_STATUS_THREADS)
        self.busy = 0
        self._count = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # all threads busy: refused, not queued
            return
        with self._count:
            self.busy += 1
        threading.Thread(target=self._handle, args=(request, client_address), daemon=True).start()

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._count:
                self.busy -= 1
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a peer that hung up or timed out: nothing to report


class StatusServer:
    """``/metrics``, ``/health`` and ``/status`` on a local port, in a daemon thread."""

    def __init__(self, status: NodeStatus, *, host: str = "127.0.0.1", port: int = 0,
                 healthy: Callable[[], bool] | None = None, idle_timeout: float = IDLE_TIMEOUT_S) -> None:
        handler = _make_handler(status, healthy or (lambda: True), idle_timeout=idle_timeout)
        self.httpd = _BoundedServer((host, port), handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="status-http", daemon=True)
        self._thread.start()

    def busy(self) -> int:
        """Connections being handled now."""
        return self.httpd.busy

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _make_handler(status: NodeStatus, healthy, *, idle_timeout: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = idle_timeout  # per read: an idle connection is dropped

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(status.registry), "text/plain; version=0.0.4")
            elif self.path == "/health":
                ok = bool(healthy())
                self._send(200 if ok else 503, json.dumps({"ok": ok}).encode(), "application/json")
            elif self.path == "/status":
                self._send(200, status.to_json().encode(), "application/json")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    return Handler
