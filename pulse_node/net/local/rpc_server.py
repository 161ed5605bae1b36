"""The worker side of the local RPC, shared by both workers: one server, one handler signature,
one process runtime. anyio runs it on asyncio (the DHT worker, hivemind) and on trio (the wire
worker, py-libp2p).

A worker is a ``Service`` whose RPC methods are marked ``@rpc``: ``async def name(self, *, arg:
T, ...) -> result``. Each request's params are validated against the method's signature (strict
pydantic: no coercion, no unknown or missing arguments: a ``WireError``); a result may be plain
msgpack data, a pydantic model or a dataclass. Whatever a handler raises becomes an error reply
(``ipc.error_reply``): a ``PulseError`` with its own type name, anything else as ``RpcError``
(logged: it is a bug). A malformed frame gets an error reply and the connection is closed;
nothing a client sends stops the worker. Every worker also answers ``ping`` (the names of its
methods) and ``stop``.

``run_worker`` is the whole process: ``python -m pulse_node.net.<worker> --ipc SOCK --config
FILE [--error-file FILE]``, where FILE is the worker's validated config model as JSON (written by
``process.WorkerClient``). It opens the service; a start failure (``StartFailed``, or any
``PulseError``) is written to the error file as a ``StartFailure``, printed to stderr, and the
process exits 2. Then it serves until ``stop``, SIGTERM, SIGINT or the parent process going away,
closes the service (bounded by the service) and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import os
import signal
import sys
import typing
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from functools import partial
from pathlib import Path
from typing import TypeVar, cast

import anyio
import anyio.abc
import anyio.lowlevel
import pydantic

from pulse_node.errors import PulseError, WireError
from pulse_node.net.local import ipc

log = logging.getLogger("pulse_node.rpc")

EXIT_START_FAILED = 2
PARENT_POLL_S = 1.0
FIRST_RECEIVE = 64 << 10  # a whole small request in one receive
RECEIVE_CHUNK = 1 << 20  # the rest of a large one in at most this much per receive
_RPC_MARK = "__pulse_rpc__"
_PARAMS = pydantic.ConfigDict(strict=True, extra="forbid", arbitrary_types_allowed=True)

Handler = Callable[..., Awaitable[object]]
#: method name -> (its coroutine, its params model)
Handlers = dict[str, tuple[Handler, type[pydantic.BaseModel]]]
C = TypeVar("C", bound=pydantic.BaseModel)


class StartFailed(Exception):
    """A worker could not start; ``kind`` is one of ``ipc.StartFailure.kind``."""

    def __init__(self, kind: ipc.StartKind, message: str) -> None:
        super().__init__(message)
        self.kind: ipc.StartKind = kind


def rpc(fn: Handler) -> Handler:
    """Mark an ``async def name(self, *, ...)`` method of a ``Service`` as callable over the RPC."""
    setattr(fn, _RPC_MARK, True)
    return fn


class Service:
    """Base of a worker's RPC surface: ``@rpc`` methods plus optional background work."""

    async def run(self) -> None:
        """Background work while the worker serves (cancelled at stop); none by default."""


def rpc_names(service_type: type) -> list[str]:
    return sorted(n for n, f in inspect.getmembers(service_type, inspect.isfunction) if getattr(f, _RPC_MARK, False))


def _params_model(fn: Handler) -> type[pydantic.BaseModel]:
    """A strict model of ``fn``'s keyword-only parameters (the RPC params it accepts)."""
    hints = typing.get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    namespace: dict[str, object] = {p.name: p.default for p in params if p.default is not p.empty}
    namespace.update(__annotations__={p.name: hints[p.name] for p in params}, __module__=__name__, model_config=_PARAMS)
    return cast("type[pydantic.BaseModel]", type(f"{fn.__name__}_params", (pydantic.BaseModel,), namespace))


def handlers_of(service: Service) -> dict[str, tuple[Handler, type[pydantic.BaseModel]]]:
    """``name -> (bound method, params model)`` for every ``@rpc`` method of ``service``."""
    return {name: (getattr(service, name), _params_model(getattr(type(service), name)))
            for name in rpc_names(type(service))}


def _plain(value: object) -> object:
    """A handler's result as msgpack-able data (models and dataclasses as maps)."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


async def dispatch(handlers: Handlers, msg: ipc.Message) -> ipc.Message:
    """One request map -> one reply map; every failure is an error reply, never an exception."""
    call_id, method, params = msg.get("id"), msg.get("method"), msg.get("params", {})
    try:
        entry = handlers.get(method) if isinstance(method, str) else None
        if entry is None:
            raise WireError(f"unknown method {method!r}")
        fn, model = entry
        if not isinstance(params, dict):
            raise WireError(f"{method}: params must be a map")
        try:
            args = model.__pydantic_validator__.validate_python(params)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "params"
            raise WireError(f"{method}: bad params: {where}: {first['msg']}") from None
        result = await fn(**args.__dict__)  # the validated fields, nested models kept as models
        return {"id": call_id, "ok": True, "result": _plain(result)}
    except PulseError as exc:
        return ipc.error_reply(call_id, exc)
    except Exception as exc:  # a bug must not take the worker down: report it to the caller
        log.exception("rpc %s failed", method)
        return ipc.error_reply(call_id, ipc.RpcError(f"{method}: internal error: {type(exc).__name__}: {exc}"))


class _Connection:
    """One client connection's bytes. A receive or send goes straight to the non-blocking socket
    when it is ready and through the event loop only when it is not: each trip through the DHT
    worker's busy asyncio loop cost ~16 us per ``events`` poll (bench/rpc.py). Reads are
    buffered, so a small request takes one receive."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        self.buf = b""

    async def next_frame(self) -> bytes | None:
        """The next frame's body, or None once the client closed the connection."""
        header = await self._exactly(4)
        return None if header is None else await self._exactly(ipc.frame_length(header))

    async def _exactly(self, n: int) -> bytes | None:
        parts, got = [self.buf], len(self.buf)
        while got < n:
            try:
                chunk = await self._receive(max(FIRST_RECEIVE, min(n - got, RECEIVE_CHUNK)))
            except anyio.EndOfStream:
                return None
            parts.append(chunk)
            got += len(chunk)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.buf = data[n:]
        return data if len(data) == n else data[:n]

    async def _receive(self, n: int) -> bytes:
        try:
            data = self.sock.recv(n)
        except (BlockingIOError, InterruptedError):
            return await self.stream.receive(n)
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, frame: bytes) -> None:
        try:
            sent = self.sock.send(frame)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(frame):
            await self.stream.send(frame[sent:])
        if self.buf:  # a client that pipelines requests still lets the worker's other tasks run
            await anyio.lowlevel.checkpoint()


def _encoded(reply: ipc.Message) -> bytes:
    try:
        return ipc.encode_frame(reply)
    except (WireError, TypeError, ValueError) as exc:  # result too large or not encodable
        return ipc.encode_frame(ipc.error_reply(reply.get("id"), WireError(f"reply not sendable: {exc}")))


async def _connection(handlers: Handlers, stop: anyio.Event, stream: anyio.abc.SocketStream) -> None:
    """One client connection: frames in, replies out, one call at a time."""
    conn = _Connection(stream)
    async with stream:
        try:
            while True:
                try:
                    body = await conn.next_frame()
                    if body is None:
                        return
                    msg = ipc.decode_body(body)
                except WireError as exc:
                    await conn.send(ipc.encode_frame(ipc.error_reply(None, exc)))
                    return
                await conn.send(_encoded(await dispatch(handlers, msg)))
                if msg.get("method") == "stop":
                    stop.set()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the client went away


def _builtins(handlers: Handlers, stop: anyio.Event) -> Handlers:
    async def ping() -> list[str]:
        return sorted(handlers)

    async def stop_() -> bool:
        return True  # the connection sets ``stop`` once this reply is sent

    empty = pydantic.create_model("no_params", __config__=_PARAMS)
    return {**handlers, "ping": (ping, empty), "stop": (stop_, empty)}


async def serve(path: str, handlers: Handlers, stop: anyio.Event, *,
                task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve ``handlers`` (plus ``ping`` and ``stop``) on the Unix socket ``path`` until cancelled."""
    Path(path).unlink(missing_ok=True)
    listener = await anyio.create_unix_listener(path)
    task_status.started()
    async with listener:
        await listener.serve(partial(_connection, _builtins(handlers, stop), stop))


# ---- the worker process ----------------------------------------------------------------------
async def _watch_parent(parent: int, stop: anyio.Event) -> None:
    """An orphaned worker would keep serving a dead node (and its DHT record alive): stop."""
    while os.getppid() == parent:
        await anyio.sleep(PARENT_POLL_S)
    log.warning("parent process %d is gone; stopping", parent)
    stop.set()


async def _watch_signals(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop.set()
            return


async def _serve_until_stopped(args: argparse.Namespace, service: Service, parent: int) -> None:
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_parent, parent, stop)
        tg.start_soon(_watch_signals, stop)
        tg.start_soon(service.run)
        await tg.start(serve, args.ipc, handlers_of(service), stop)
        await stop.wait()
        tg.cancel_scope.cancel()


async def _amain(name: str, args: argparse.Namespace, config: C,
                 open_service: Callable[[C], AbstractAsyncContextManager[Service]]) -> int:
    parent = os.getppid()
    try:
        async with AsyncExitStack() as stack:
            try:
                service = await stack.enter_async_context(open_service(config))
            except StartFailed as exc:
                return report_start_failure(name, args.error_file, exc.kind, str(exc))
            except PulseError as exc:
                return report_start_failure(name, args.error_file, "config", str(exc))
            await _serve_until_stopped(args, service, parent)
    finally:
        Path(args.ipc).unlink(missing_ok=True)
    log.info("%s worker stopped", name)
    return 0


def report_start_failure(name: str, error_file: Path | None, kind: ipc.StartKind, message: str) -> int:
    print(f"pulse-node {name}: error: {message}", file=sys.stderr, flush=True)
    if error_file is not None:
        error_file.write_text(ipc.StartFailure(kind=kind, message=message).model_dump_json())
    return EXIT_START_FAILED


def parse_args(name: str, argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m pulse_node.net.{name}.worker",
                                description=f"The {name} worker process (started by the node; see net/local/rpc_server.py).")
    p.add_argument("--ipc", required=True, help="Unix socket to serve the local RPC on")
    p.add_argument("--config", required=True, type=Path, help="the worker's config model as JSON")
    p.add_argument("--error-file", type=Path, help="where to write why a start failed (StartFailure JSON)")
    return p.parse_args(argv)


def setup_logging(name: str, level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)


def run_worker(name: str, config_type: type[C], open_service: Callable[[C], AbstractAsyncContextManager[Service]], *,
               backend: str, argv: list[str] | None = None) -> int:
    """Parse the CLI, load and validate the config, serve ``open_service(config)`` on ``backend``."""
    args = parse_args(name, argv)
    try:
        config = config_type.model_validate_json(args.config.read_text())
    except (OSError, pydantic.ValidationError) as exc:
        return report_start_failure(name, args.error_file, "config", f"config {args.config}: {exc}")
    setup_logging(name, getattr(config, "log_level", "info"))
    return anyio.run(_amain, name, args, config, open_service, backend=backend)
