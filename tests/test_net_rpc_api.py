"""The node's typed requests are the workers' handlers: one request per ``@rpc`` handler, the
same names, types and defaults (``net/rpc_api.py``), so no call is named by a string and no
argument is unchecked until the worker sees it."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

from pulse_node.errors import WireError
from pulse_node.net import dht_rpc, wire_rpc
from pulse_node.net.rpc_api import Request
from pulse_node.net.rpc_server import rpc_names

PKG = Path(__file__).resolve().parents[1] / "pulse_node"


def _service(name: str) -> type:
    if name == "dht":
        from pulse_node.net.dht_worker import DhtWorker

        return DhtWorker
    from pulse_node.net.wire_worker import WireService

    return WireService


def _requests(module, base: type) -> dict[str, type[Request]]:
    return {cls.rpc_method: cls for cls in vars(module).values()
            if isinstance(cls, type) and issubclass(cls, base) and cls.rpc_method}


@pytest.mark.parametrize(("name", "module", "base"), [("dht", dht_rpc, dht_rpc.DhtRequest),
                                                      ("wire", wire_rpc, wire_rpc.WireRequest)])
def test_every_handler_has_one_request_with_its_exact_arguments(name, module, base) -> None:
    service, requests = _service(name), _requests(module, base)
    assert set(requests) == set(rpc_names(service)), "a handler without a request, or a request without one"
    for method, req in requests.items():
        fn = getattr(service, method)
        hints = typing.get_type_hints(fn)
        params = {p.name: p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}
        fields = req.model_fields
        assert set(fields) == set(params), method
        for arg, p in params.items():
            assert fields[arg].annotation == hints[arg], f"{method}.{arg}: {fields[arg].annotation} != {hints[arg]}"
            assert fields[arg].is_required() == (p.default is p.empty), f"{method}.{arg}: required"
            assert fields[arg].is_required() or fields[arg].default == p.default, f"{method}.{arg}: default"


def test_a_request_is_checked_before_it_is_sent_and_its_reply_on_arrival() -> None:
    with pytest.raises(WireError, match="fetch: bad params: kind"):
        wire_rpc.Fetch(peer="x", kind="rollout", params={}, dest="/tmp/x", timeout=1)  # type: ignore[arg-type]
    req = wire_rpc.Fetch(peer="x", kind="patch", params={"version": 3}, dest="/tmp/x", timeout=1)
    assert req.rpc_params()["timeout"] == 1.0 and req.rpc_method == "fetch"
    assert req.rpc_reply({"bytes": 5, "seconds": 0.1, "peer": "p", "total": 5}) == wire_rpc.FetchResult(5, 0.1, "p", 5)
    with pytest.raises(WireError, match="fetch: bad reply: bytes"):
        req.rpc_reply({"bytes": "five", "seconds": 0.1, "peer": "p"})
    events = dht_rpc.Events().rpc_reply([{"kind": "loco", "sender": "s", "received_at": 1.0, "path": "/x", "size": 9}])
    assert events[0].path == "/x" and events[0].data == b""
    with pytest.raises(WireError, match="events: bad params: wait_s"):
        dht_rpc.Events(wait_s="soon")  # type: ignore[arg-type]


def test_no_call_names_a_worker_method_by_string() -> None:
    calls = [f"{p.relative_to(PKG)}:{i}" for p in PKG.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.call\(\s*['\"]", line)]
    assert not calls, calls
