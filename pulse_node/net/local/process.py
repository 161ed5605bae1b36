"""A worker process as the node sees it: started with its config, called, stopped.

``WorkerClient`` is the base of ``DhtClient`` and ``WireClient``. ``start(config)`` writes the
validated config model as JSON into a private temporary directory and runs ``python -m <module>
--ipc <dir>/rpc.sock --config <dir>/config.json --error-file <dir>/error.json`` (a new
interpreter, never fork; ``rpc_server.run_worker`` on the other side), then waits for its
``ping`` within a deadline. A worker that exits during its start raises the client's
``start_error`` with the worker's own one-line explanation.

``request(req)`` sends one typed request (``rpc_api.Request``: a model per worker handler, the
reply validated as its declared type). It borrows a connection from a pool (one per call in flight: a long ``events`` poll never
holds up a ``fetch``; a connection whose call timed out is closed, not reused, so no late reply
can pair with the next call) and raises the worker's typed errors (``ipc.raised_error``). Every
call has a timeout. A client sends only its worker's requests (``api``, plus ``Ping`` and
``Stop``): anything else is refused before it is sent. ``stop`` asks the worker to stop, then SIGTERM, then
SIGKILL, each step bounded. A worker whose parent is gone stops by itself within ~1 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar, Generic, TypeVar

import pydantic

from pulse_node.errors import PulseError
from pulse_node.net.local.ipc import Message, RpcClient, RpcError, StartFailure
from pulse_node.net.local.rpc_api import Ping, Request, Stop

if TYPE_CHECKING:
    from typing_extensions import Self

C = TypeVar("C", bound=pydantic.BaseModel)
R = TypeVar("R")


class WorkerStartError(PulseError):
    """A worker could not start; the message says what to check next, ``kind`` what failed."""

    def __init__(self, message: str, kind: str = "internal") -> None:
        super().__init__(message)
        self.kind = kind


class ConnectionPool:
    """Idle connections to one worker: a call borrows one (or opens one) and gives it back unless it broke."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._idle: list[RpcClient] = []
        self._lock = threading.Lock()
        self._closed = False

    def call(self, method: str, params: Message | None, *, timeout: float) -> object:
        with self._lock:
            if self._closed:
                raise RpcError(f"{method}: the worker client is stopped")
            client = self._idle.pop() if self._idle else None
        if client is None:
            client = RpcClient(self._path, connect_timeout=min(5.0, timeout))
        try:
            return client.call(method, params, timeout=timeout)
        finally:
            with self._lock:
                keep = not client.broken and not self._closed
                if keep:
                    self._idle.append(client)
            if not keep:
                client.close()

    def idle(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for client in idle:
            client.close()


class WorkerProcess:
    """The running interpreter of one worker, its private directory and its log."""

    def __init__(self, module: str, config: pydantic.BaseModel, *, name: str, log_path: Path | None) -> None:
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"pulse-{name}-"))
        self.socket_path = str(self.dir / "rpc.sock")
        self.error_file = self.dir / "error.json"
        config_file = self.dir / "config.json"
        config_file.write_text(config.model_dump_json())
        self._log: IO[bytes] | int = open(log_path, "ab") if log_path else subprocess.DEVNULL
        cmd = [sys.executable, "-m", module, "--ipc", self.socket_path, "--config", str(config_file),
               "--error-file", str(self.error_file)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT if log_path else None)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start_failure(self) -> StartFailure | None:
        """What the worker wrote before exiting during its start, if anything."""
        try:
            return StartFailure.model_validate_json(self.error_file.read_text())
        except (OSError, ValueError):
            return None

    def stop(self, timeout: float) -> None:
        """Wait ``timeout/2`` for an exit already asked for, then SIGTERM, then SIGKILL; clean up."""
        for step, wait in ((None, timeout / 2), (self.proc.terminate, timeout / 2), (self.proc.kill, timeout)):
            if self.proc.poll() is not None:
                break
            if step is not None:
                step()
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        if not isinstance(self._log, int):
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class WorkerClient(Generic[C]):
    """Base of the typed clients: the worker process, a pool of connections to it, stop."""

    module: ClassVar[str]
    name: ClassVar[str]
    api: ClassVar[type[pydantic.BaseModel]] = Request  # the base class of this worker's requests

    def __init__(self, process: WorkerProcess, config: C) -> None:
        self.config = config
        self._process = process
        self._pool = ConnectionPool(process.socket_path)

    @classmethod
    def start(cls, config: C, *, log_path: Path | None = None, start_timeout: float = 60.0) -> Self:
        """Start the worker and wait until it answers ``ping``; ``start_error`` explains a failure."""
        client = cls.spawn(config, log_path=log_path)
        client.wait_ready(start_timeout)
        return client

    @classmethod
    def spawn(cls, config: C, *, log_path: Path | None = None) -> Self:
        """Start the worker's process without waiting for it (``wait_ready`` waits): a node starts
        both its workers at once, so their imports overlap."""
        return cls(WorkerProcess(cls.module, config, name=cls.name, log_path=log_path), config)

    def wait_ready(self, timeout: float) -> None:
        """Wait until the worker answers ``ping``; stopped and ``start_error`` raised on failure."""
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop(timeout=2.0)
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._process.alive():
                failure = self._process.start_failure()
                code = self._process.proc.returncode
                raise self.start_error(failure or StartFailure(
                    kind="internal", message=f"the {self.name} worker exited with code {code} during its start"))
            if os.path.exists(self._process.socket_path):
                self.ping(timeout=max(1.0, deadline - time.monotonic()))
                return
            time.sleep(0.05)
        raise self.start_error(StartFailure(kind="internal",
                                            message=f"the {self.name} worker did not start within {timeout:.0f} s"))

    @classmethod
    def start_error(cls, failure: StartFailure) -> PulseError:
        return WorkerStartError(failure.message, failure.kind)

    def request(self, req: Request[R], *, timeout: float) -> R:
        """Send ``req`` to the worker's handler of that name; its reply within ``timeout`` s."""
        if not isinstance(req, (self.api, Ping, Stop)):
            raise RpcError(f"{type(req).__name__} is not a request of the {self.name} worker")
        return req.rpc_reply(self._pool.call(req.rpc_method, req.rpc_params(), timeout=timeout))

    def ping(self, *, timeout: float = 10.0) -> list[str]:
        """The names of the worker's RPC methods (answered once it serves)."""
        return self.request(Ping(), timeout=timeout)

    @property
    def process(self) -> WorkerProcess:
        return self._process

    def alive(self) -> bool:
        return self._process.alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the worker to stop, then SIGTERM, then SIGKILL; never waits much longer than ``timeout``."""
        if self._process.alive():
            try:
                self.request(Stop(), timeout=1.0)
            except PulseError:
                pass
        self._pool.close()
        self._process.stop(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
