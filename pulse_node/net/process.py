"""Start, supervise and stop one worker process (``python -m pulse_node.net.<worker>``).

Workers are separate interpreters started with ``subprocess`` (never fork). Each serves the
framed RPC of ``ipc.py`` on a Unix socket given by ``--ipc``; ``WorkerProcess`` waits for the
worker's ``ping`` with a deadline, and ``stop`` asks it to shut down, then terminates, then
kills it, each step bounded in time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pulse_node.net.ipc import RpcClient, RpcError


class WorkerProcess:
    """One running worker and its RPC client."""

    def __init__(self, module: str, args: list[str], *, name: str, start_timeout: float = 60.0,
                 log_path: Path | None = None) -> None:
        self.name = name
        self._dir = tempfile.mkdtemp(prefix=f"pulse-{name}-")
        self.socket_path = os.path.join(self._dir, "rpc.sock")
        cmd = [sys.executable, "-m", module, "--ipc", self.socket_path, *args]
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT if log_path else None)
        self.client = self._wait_ready(start_timeout)

    def _wait_ready(self, timeout: float) -> RpcClient:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RpcError(f"{self.name} worker exited with code {self.proc.returncode} during start")
            if os.path.exists(self.socket_path):
                client = RpcClient(self.socket_path, connect_timeout=5.0)
                client.call("ping", timeout=max(1.0, deadline - time.monotonic()))
                return client
            time.sleep(0.05)
        self.stop()
        raise RpcError(f"{self.name} worker did not start within {timeout:.0f}s")

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        return self.client.call(method, params, timeout=timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Graceful shutdown, then SIGTERM, then SIGKILL; never waits longer than ~2*timeout."""
        if self.proc.poll() is None:
            try:
                self.client.call("shutdown", timeout=1.0)
            except Exception:
                pass
            try:
                self.proc.wait(timeout=timeout / 2)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=timeout / 2)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=timeout)
        try:
            if hasattr(self, "client"):
                self.client.close()
        except Exception:
            pass
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        for p in (self.socket_path,):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass
