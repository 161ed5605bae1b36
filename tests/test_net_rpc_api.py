"""The node's typed requests are the workers' handlers: one request per ``@rpc`` handler, the
same names, types and defaults (``net/local/rpc_api.py``), so no call is named by a string and no
argument is unchecked until the worker sees it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pulse_node.errors import WireError
from pulse_node.net.dht import rpc as dht_rpc
from pulse_node.net.local.rpc_api import Request
from pulse_node.net.wire import rpc as wire_rpc
from pulse_node.net.wire.protocol import PatchRequest

PKG = Path(__file__).resolve().parents[1] / "pulse_node"


def _handlers(path: Path, service: str) -> dict[str, dict[str, tuple[str, str | None]]]:
    """``name -> {arg: (annotation source, default source or None)}`` of every ``@rpc`` method of
    class ``service`` in ``path``, read from the source: the DHT worker (hivemind) and the wire
    worker (libp2p) cannot be imported into one process."""
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == service)
    out = {}
    for fn in cls.body:
        if isinstance(fn, ast.AsyncFunctionDef) and any(ast.unparse(d) == "rpc" for d in fn.decorator_list):
            a = fn.args
            out[fn.name] = {arg.arg: (ast.unparse(arg.annotation), None if d is None else ast.unparse(d))
                            for arg, d in zip(a.kwonlyargs, a.kw_defaults)}
    return out


def _requests(module, base: type) -> dict[str, type[Request]]:
    return {cls.rpc_method: cls for cls in vars(module).values()
            if isinstance(cls, type) and issubclass(cls, base) and cls.rpc_method}


@pytest.mark.parametrize(("module", "base", "path", "service"), [
    (dht_rpc, dht_rpc.DhtRequest, "net/dht/worker.py", "DhtWorker"),
    (wire_rpc, wire_rpc.WireRequest, "net/wire/worker.py", "WireService")])
def test_every_handler_has_one_request_with_its_exact_arguments(module, base, path, service) -> None:
    handlers, requests = _handlers(PKG / path, service), _requests(module, base)
    assert handlers and set(requests) == set(handlers), "a handler without a request, or a request without one"
    for method, args in handlers.items():
        req = requests[method]
        assert set(req.model_fields) == set(args), method
        for arg, (annotation, default) in args.items():
            assert req.__annotations__[arg] == annotation, f"{method}.{arg}: {req.__annotations__[arg]} != {annotation}"
            field = req.model_fields[arg]
            assert field.is_required() == (default is None), f"{method}.{arg}: required"
            assert default is None or field.default == eval(default, {"__builtins__": {}}), f"{method}.{arg}: default"


def test_a_request_is_checked_before_it_is_sent_and_its_reply_on_arrival() -> None:
    with pytest.raises(WireError, match="fetch: bad params: kind"):
        wire_rpc.Fetch(peer="x", kind="rollout", request=b"", dest="/tmp/x", timeout=1)  # type: ignore[arg-type]
    req = wire_rpc.Fetch(peer="x", kind="patch", request=PatchRequest(version=3).body(), dest="/tmp/x", timeout=1)
    assert req.rpc_params()["timeout"] == 1.0 and req.rpc_method == "fetch"
    assert req.rpc_reply({"bytes": 5, "seconds": 0.1, "peer": "p", "total": 5}) == wire_rpc.FetchResult(5, 0.1, "p", 5)
    with pytest.raises(WireError, match="fetch: bad reply: bytes"):
        req.rpc_reply({"bytes": "five", "seconds": 0.1, "peer": "p"})
    events = dht_rpc.Events().rpc_reply([{"event": {"kind": "loco", "sender": "s", "data": b"", "received_at": 1.0},
                                          "path": "/x", "size": 9}])
    assert events[0].path == "/x" and events[0].event.data == b"" and events[0].event.kind == "loco"
    with pytest.raises(WireError, match="events: bad reply: 0.event.kind"):
        dht_rpc.Events().rpc_reply([{"event": {"kind": "nonsense", "sender": "s", "data": b"", "received_at": 1.0}}])
    with pytest.raises(WireError, match="events: bad params: wait_s"):
        dht_rpc.Events(wait_s="soon")  # type: ignore[arg-type]


def test_no_call_names_a_worker_method_by_string() -> None:
    calls = [f"{p.relative_to(PKG)}:{i}" for p in PKG.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.call\(\s*['\"]", line)]
    assert not calls, calls
