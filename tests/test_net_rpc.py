"""The local RPC layer itself (``net/local/ipc.py``, ``net/local/rpc_server.py``, ``net/local/process.py``), on both backends.

A small ``Service`` is served in a thread of this process by the same server the workers run,
once on asyncio and once on trio; the node's blocking client talks to it. No worker process, no
hivemind, no py-libp2p: fast.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Generic, Literal, TypeVar

import anyio
import msgpack
import pytest

from pulse_node.chain.peer import PeerStatus
from pulse_node.errors import IntegrityError, NotFound, PeerBusy, WireError
from pulse_node.net.local import ipc
from pulse_node.net.local.process import ConnectionPool, WorkerClient
from pulse_node.net.local.rpc_api import Request
from pulse_node.net.local.rpc_server import Service, handlers_of, rpc, serve

pytestmark = pytest.mark.timeout(60)
R = TypeVar("R")


class Toy(Service):
    """Handlers that exercise every path of the server."""

    def __init__(self) -> None:
        self.calls = 0

    @rpc
    async def echo(self, *, data: bytes, times: int = 1, kind: Literal["a", "b"] = "a") -> dict:
        self.calls += 1
        return {"data": data * times, "kind": kind}

    @rpc
    async def status(self, *, status: PeerStatus) -> PeerStatus:
        return status.model_copy(update={"version": (status.version or 0) + 1})

    @rpc
    async def fail(self, *, error: str) -> None:
        raise {"NotFound": NotFound("no patch 8"), "PeerBusy": PeerBusy("making it"),
               "IntegrityError": IntegrityError("sha256 mismatch"), "bug": ValueError("oops")}[error]

    @rpc
    async def slow(self, *, seconds: float) -> str:
        await anyio.sleep(seconds)
        return "late"


class ToyRequest(Request[R], Generic[R]):
    """The toy service's requests."""


class Echo(ToyRequest[dict[str, Any]]):
    data: bytes


class Fail(Request[None]):
    """A request of no toy client: the toy service has the handler, the client may not send it."""

    error: str


class ToyClient(WorkerClient):
    """A client whose requests are the toy service's."""

    name = "toy"
    api = ToyRequest

    def echo(self, data: bytes) -> dict[str, Any]:
        return self.request(Echo(data=data), timeout=5)


@pytest.fixture(params=["asyncio", "trio"])
def served(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    """(path, stop event, service) of a ``Toy`` served on one backend in a thread."""
    path = str(Path(tempfile.mkdtemp(prefix="pulse-rpc-test-")) / "rpc.sock")
    box: dict = {}
    ready = threading.Event()

    async def main() -> None:
        box["stop"], box["service"] = anyio.Event(), Toy()
        box["token"] = anyio.lowlevel.current_token()
        async with anyio.create_task_group() as tg:
            await tg.start(serve, path, handlers_of(box["service"]), box["stop"])
            ready.set()
            await box["stop"].wait()
            tg.cancel_scope.cancel()

    thread = threading.Thread(target=anyio.run, args=(main,), kwargs={"backend": request.param}, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield SimpleNamespace(path=path, stop=box["stop"], service=box["service"], backend=request.param)
    finally:
        if not box["stop"].is_set():
            anyio.from_thread.run_sync(box["stop"].set, token=box["token"])
        thread.join(10)


def test_results_typed_errors_and_bad_params_cross_as_data(served: SimpleNamespace) -> None:
    pool = ConnectionPool(served.path)
    assert pool.call("ping", None, timeout=5) == ["echo", "fail", "slow", "status"]
    assert pool.call("echo", {"data": b"ab", "times": 3}, timeout=5) == {"data": b"ababab", "kind": "a"}
    assert pool.call("status", {"status": PeerStatus(role="trainer", version=4).model_dump()}, timeout=5)["version"] == 5
    for name, cls in (("NotFound", NotFound), ("PeerBusy", PeerBusy), ("IntegrityError", IntegrityError)):
        with pytest.raises(cls) as info:
            pool.call("fail", {"error": name}, timeout=5)
        assert type(info.value) is cls and str(info.value) in ("no patch 8", "making it", "sha256 mismatch")
    with pytest.raises(ipc.RpcError, match="fail: internal error: ValueError: oops"):
        pool.call("fail", {"error": "bug"}, timeout=5)
    for params, match in (({"data": "text"}, "data: Input should be a valid bytes"),
                          ({"data": b"x", "times": "2"}, "times: Input should be a valid integer"),
                          ({"data": b"x", "kind": "c"}, "kind: Input should be 'a' or 'b'"),
                          ({"data": b"x", "extra": 1}, "extra: Extra inputs are not permitted"),
                          ({}, "data: Field required")):
        with pytest.raises(WireError, match=f"echo: bad params: {match}"):
            pool.call("echo", params, timeout=5)
    with pytest.raises(WireError, match="unknown method 'nope'"):
        pool.call("nope", None, timeout=5)
    assert pool.idle() == 1  # error replies leave the connection usable
    pool.close()


def test_hostile_frames_get_an_error_reply_and_the_server_keeps_serving(served: SimpleNamespace) -> None:
    frames = (b"\xff\xff\xff\xff", b"\x00\x00\x00\x03\xc1\xc1\xc1", ipc.encode_frame([1, 2]))  # type: ignore[arg-type]
    for raw in frames:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(served.path)
            s.sendall(raw)
            reply = ipc.decode_body(s.recv(ipc.frame_length(s.recv(4))))
            assert (reply["ok"], reply["error"]) == (False, "WireError") and reply["message"]
    with socket.socket(socket.AF_UNIX) as s:  # two requests in one write: both answered, in order
        s.settimeout(5)
        s.connect(served.path)
        s.sendall(b"".join(ipc.encode_frame({"id": i, "method": "echo", "params": {"data": b"p", "times": i}})
                           for i in (1, 2)))
        buf, got = b"", []
        while len(got) < 2:
            data = s.recv(4096)
            assert data, "the server closed the connection"
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                n = int.from_bytes(buf[:4], "big")
                got.append(msgpack.unpackb(buf[4:4 + n], raw=False))
                buf = buf[4 + n:]
        assert [(r["id"], r["result"]["data"]) for r in got] == [(1, b"p"), (2, b"pp")]
    assert ConnectionPool(served.path).call("echo", {"data": b"ok"}, timeout=5)["data"] == b"ok"


def test_a_timed_out_connection_is_dropped_so_no_late_reply_pairs_with_the_next_call(served) -> None:
    pool = ConnectionPool(served.path)
    t0 = time.monotonic()
    with pytest.raises(ipc.RpcError, match="no answer within 0.3s"):
        pool.call("slow", {"seconds": 1.0}, timeout=0.3)
    assert time.monotonic() - t0 < 2 and pool.idle() == 0
    assert pool.call("echo", {"data": b"next"}, timeout=5)["data"] == b"next"


def test_calls_from_many_short_lived_threads_reuse_a_bounded_set_of_connections(served) -> None:
    """``push_to_all`` runs every fan-out on fresh threads: one socket per thread would leak."""
    pool = ConnectionPool(served.path)
    for _ in range(20):
        t = threading.Thread(target=pool.call, args=("echo", {"data": b"x"}), kwargs={"timeout": 5})
        t.start()
        t.join(10)
    assert served.service.calls == 20 and pool.idle() == 1
    barrier = threading.Barrier(4)
    slow = [threading.Thread(target=lambda: (barrier.wait(5), pool.call("slow", {"seconds": 0.3}, timeout=5)))
            for _ in range(4)]
    t0 = time.monotonic()
    for t in slow:
        t.start()
    for t in slow:
        t.join(10)
    assert time.monotonic() - t0 < 1.0 and pool.idle() == 4  # calls in flight at once ran at once


def test_the_stop_method_ends_the_server_after_replying(served: SimpleNamespace) -> None:
    assert ConnectionPool(served.path).call("stop", None, timeout=5) is True
    deadline = time.monotonic() + 5
    while not served.stop.is_set():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_client_sends_only_its_own_workers_requests(served: SimpleNamespace) -> None:
    client = ToyClient(SimpleNamespace(socket_path=served.path), config=None)  # type: ignore[arg-type]
    assert client.echo(b"hi")["data"] == b"hi" and "echo" in client.ping()
    with pytest.raises(ipc.RpcError, match="Fail is not a request of the toy worker"):
        client.request(Fail(error="NotFound"), timeout=5)
