"""Local RPC between a node process and its worker processes (Unix socket, framed msgpack).

Frame: 4-byte big-endian length, then a msgpack map. Requests are
``{"id": int, "method": str, "params": map}``; responses are
``{"id": int, "ok": bool, "result": any}`` or ``{"id": int, "ok": false, "error": str}``.
A frame larger than ``MAX_FRAME`` is a protocol error. Bulk data (patches, anchors) is passed
as file paths, not bytes. Servers live in the workers (asyncio for hivemind, trio for libp2p)
and use ``encode_frame``/``decode_body``; ``RpcClient`` is the blocking client used by the node.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from typing import Any

import msgpack

from pulse_node.errors import PulseError, WireError

MAX_FRAME = 64 * 1024 * 1024
_LEN = struct.Struct(">I")


class RpcError(PulseError):
    """The worker answered a call with an error, or did not answer in time."""


def encode_frame(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    (n,) = _LEN.unpack(header)
    if n > MAX_FRAME:
        raise WireError(f"declared frame of {n} bytes exceeds {MAX_FRAME}")
    return n


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"malformed frame: {exc}") from None
    if not isinstance(msg, dict):
        raise WireError("frame is not a map")
    return msg


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
    """Blocking, thread-safe client: one call at a time per client, each with a timeout."""

    def __init__(self, path: str, *, connect_timeout: float = 10.0) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
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

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        """Invoke ``method`` and return its result; raises RpcError on error or timeout."""
        with self._lock:
            call_id = next(self._ids)
            deadline = time.monotonic() + timeout
            try:
                self._sock.settimeout(timeout)
                self._sock.sendall(encode_frame({"id": call_id, "method": method, "params": params or {}}))
                n = frame_length(_recv_exact(self._sock, 4, deadline))
                reply = decode_body(_recv_exact(self._sock, n, deadline))
            except (TimeoutError, socket.timeout):
                self._reset()
                raise RpcError(f"{method}: no answer within {timeout:.1f}s") from None
            except (ConnectionError, OSError) as exc:
                self._reset()
                raise RpcError(f"{method}: worker connection lost ({exc})") from None
        if reply.get("id") != call_id:
            raise RpcError(f"{method}: reply for another call")
        if not reply.get("ok"):
            raise RpcError(f"{method}: {reply.get('error', 'unknown error')}")
        return reply.get("result")

    def _reset(self) -> None:
        """After a timeout the stream may hold a late reply: reconnect so calls stay paired."""
        try:
            self._sock.close()
        finally:
            self._sock = self._connect(5.0)

    def close(self) -> None:
        self._sock.close()
