"""A node's observable state: ``/metrics`` (Prometheus), ``/health``, ``/status`` and status.json.

``NodeStatus`` is a plain dict-like snapshot the role updates as it works; ``StatusServer``
serves it on a local port (0 = any free port) and the node also writes it atomically to
``data_dir/status.json`` so local tools (the swarm launcher, ``status``) can read it without
the network.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from pulse_node.fsutil import write_atomic

#: numeric status fields exported as Prometheus gauges (pulse_<name>)
GAUGES = {
    "version": "newest version this node holds",
    "rounds": "PULSELoCo rounds completed (trainers)",
    "patches_applied": "patches applied (inference)",
    "patch_bytes_total": "bytes of patches published or received",
    "catchups": "catch-up patches applied instead of several patches (inference)",
    "catchup_bytes_total": "bytes of catch-up patches received (inference)",
    "dense_bytes_total": "bytes a dense BF16 sync of the same versions would have sent",
    "bytes_in": "data-plane bytes received",
    "bytes_out": "data-plane bytes sent",
    "rollouts_sent": "rollouts sent to trainers (inference)",
    "rollouts_used": "rollouts consumed by GRPO steps (trainers)",
    "reward_mean": "mean reward of the latest rollouts",
    "eval_accuracy": "held-out accuracy of the latest evaluated version",
    "errors": "errors recorded",
    "rejected": "peer inputs rejected (bad signature, digest or hash)",
    "loco_base_mismatch": "PULSELoCo payloads not decoded: made on another global state (trainers)",
    "peers": "live peers seen in the DHT",
}


class NodeStatus:
    """Thread-safe status snapshot of one node."""

    def __init__(self, *, role: str, peer_id: str, run_id: str) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {"role": role, "peer_id": peer_id, "run_id": run_id,
                                      "version": -1, "state_hash": "", "started_at": time.time(),
                                      "recent_errors": [], "history": []}
        self.registry = CollectorRegistry()
        self._gauges = {k: Gauge(f"pulse_{k}", doc, registry=self.registry) for k, doc in GAUGES.items()}

    def update(self, **fields: Any) -> None:
        with self._lock:
            self._data.update(fields)
            self._data["updated_at"] = time.time()
            for k, g in self._gauges.items():
                v = self._data.get(k)
                if isinstance(v, (int, float)):
                    g.set(v)

    def add(self, key: str, amount: float = 1) -> None:
        with self._lock:
            self._data[key] = self._data.get(key, 0) + amount
        self.update()

    def error(self, message: str) -> None:
        with self._lock:
            errs = self._data["recent_errors"]
            errs.append({"at": time.time(), "message": message[:300]})
            del errs[:-20]
            self._data["errors"] = self._data.get("errors", 0) + 1
        self.update()

    def record_version(self, entry: dict[str, Any]) -> None:
        """Append a per-version history entry (bounded) for dashboards and the swarm summary."""
        with self._lock:
            hist = self._data["history"]
            hist.append(entry)
            del hist[:-200]
        self.update()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._data, default=str))

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.snapshot(), indent=1).encode())


class StatusServer:
    """``/metrics``, ``/health`` and ``/status`` on a local port, in a daemon thread."""

    def __init__(self, status: NodeStatus, *, host: str = "127.0.0.1", port: int = 0,
                 healthy: "callable | None" = None) -> None:
        handler = _make_handler(status, healthy or (lambda: True))
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="status-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _make_handler(status: NodeStatus, healthy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path == "/metrics":
                self._send(200, generate_latest(status.registry), "text/plain; version=0.0.4")
            elif self.path == "/health":
                ok = bool(healthy())
                self._send(200 if ok else 503, json.dumps({"ok": ok}).encode(), "application/json")
            elif self.path == "/status":
                self._send(200, json.dumps(status.snapshot()).encode(), "application/json")
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
