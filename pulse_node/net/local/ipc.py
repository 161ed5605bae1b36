"""The local RPC between a node process and its worker processes: frames, errors as data, the client.

Frame: 4-byte big-endian length, then a msgpack map of at most ``MAX_FRAME`` bytes. A request is
``{"id": int, "method": str, "params": map}``, where ``method`` is the handler's name and
``params`` its keyword arguments (a typed ``rpc_api.Request``: ``wire.rpc.FetchAnchor`` calls
``fetch_anchor``). A reply is ``{"id": int, "ok": true, "result": any}`` or, when the handler
raised, ``{"id": int, "ok": false, "error": "<TypeName>", "message": str}``: the client raises
the same exception type (any ``PulseError`` subclass the node process has loaded, e.g.
``NotFound``, ``PeerUnavailable``, ``IntegrityError``) with the same message. ``RpcError`` is
the worker itself failing: no answer in time, a lost connection, a bug in a handler.

Bulk data (patches, anchors, large PULSELoCo payloads) crosses as file paths, never as bytes.
The server is ``rpc_server.py`` (anyio, in both workers); ``RpcClient`` is the blocking client
the node uses (``process.WorkerClient`` pools them).
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from typing import Literal

import msgpack

from pulse_node.configload import StrictModel
from pulse_node.errors import PulseError, WireError

MAX_FRAME = 64 * 1024 * 1024
_LEN = struct.Struct(">I")


#: one frame of the local RPC: a request (``id``, ``method``, ``params``) or a reply (``id``, ``ok``,
#: ``result`` or ``error`` and ``message``); its values are checked where they are read
Message = dict[str, object]


class RpcError(PulseError):
    """The worker did not answer in time, the connection broke, or a handler failed unexpectedly."""


#: what failed when a worker could not start
StartKind = Literal["config", "daemon", "bootstrap", "duplicate", "internal"]


class StartFailure(StrictModel):
    """Why a worker could not start; it writes this to its ``--error-file`` and exits 2."""

    kind: StartKind
    message: str


def encode_frame(message: Message) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    n: int = _LEN.unpack(header)[0]
    if n > MAX_FRAME:
        raise WireError(f"declared frame of {n} bytes exceeds {MAX_FRAME}")
    return n


def decode_body(body: bytes) -> Message:
    try:
        msg: object = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"malformed frame: {exc}") from None
    if not isinstance(msg, dict):
        raise WireError("frame is not a map")
    return msg


def error_reply(call_id: object, exc: BaseException) -> Message:
    """The reply for a handler that raised ``exc``: its type name and message, as data."""
    return {"id": call_id, "ok": False, "error": type(exc).__name__, "message": str(exc)}


def _error_types() -> dict[str, type[PulseError]]:
    """Every loaded ``PulseError`` subclass of this package by name (a name used twice maps to none)."""
    found: dict[str, type[PulseError] | None] = {}
    todo = [PulseError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("pulse_node"):
            found[cls.__name__] = None if found.get(cls.__name__, cls) is not cls else cls
    return {name: cls for name, cls in found.items() if cls is not None}


def raised_error(reply: Message) -> PulseError:
    """The exception an error reply stands for: the worker's type if known here, else ``RpcError``."""
    name, message = reply.get("error"), str(reply.get("message", ""))
    cls = _error_types().get(name) if isinstance(name, str) else None
    if cls is not None:
        try:
            return cls(message)
        except TypeError:  # a subclass with another constructor
            pass
    return RpcError(f"{name}: {message}")


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("worker did not answer in time")
        sock.settimeout(remaining)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("worker closed the connection")
        buf += chunk
    return bytes(buf)


class RpcClient:
    """One blocking connection to a worker: one call at a time, each with a timeout.

    After a timeout or a lost connection the client is ``broken`` (a late reply may still be on
    its way) and must be closed; an error reply leaves it usable."""

    def __init__(self, path: str, *, connect_timeout: float = 5.0) -> None:
        self._path = path
        self._ids = itertools.count(1)
        self.broken = False
        self._sock = self._connect(connect_timeout)

    def _connect(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise RpcError(f"worker socket {self._path} not reachable after {timeout:.0f}s") from None
                time.sleep(0.05)

    def call(self, method: str, params: Message | None = None, *, timeout: float) -> object:
        """Invoke ``method``; its result, the worker's typed error, or ``RpcError`` (timeout, lost worker)."""
        call_id = next(self._ids)
        frame = encode_frame({"id": call_id, "method": method, "params": params or {}})
        deadline = time.monotonic() + timeout
        try:
            self._sock.settimeout(timeout)
            self._sock.sendall(frame)
            n = frame_length(_recv_exact(self._sock, 4, deadline))
            reply = decode_body(_recv_exact(self._sock, n, deadline))
        except WireError as exc:
            self.broken = True
            raise RpcError(f"{method}: unreadable reply ({exc})") from None
        except TimeoutError:
            self.broken = True
            raise RpcError(f"{method}: no answer within {timeout:.1f}s") from None
        except (ConnectionError, OSError) as exc:
            self.broken = True
            raise RpcError(f"{method}: worker connection lost ({exc})") from None
        if reply.get("id") != call_id:
            self.broken = True
            raise RpcError(f"{method}: reply for another call")
        if not reply.get("ok"):
            raise raised_error(reply)
        return reply.get("result")

    def close(self) -> None:
        self._sock.close()
