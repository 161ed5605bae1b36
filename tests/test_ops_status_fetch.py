"""``pulse-node status --bootstrap`` asks peers for /status at the URL their record announces: a
record cannot make it request a third party's URL (blind SSRF). Only plain http, to a host the
record itself announces, to a private host only for a local swarm, no redirects, bounded size."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import wait_for

from pulse_node.ops.sources import MAX_STATUS_BYTES, fetch_status, statuses_of_peers

PID = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


class _Server:
    """A local HTTP server that records every path asked; ``/redirect`` points elsewhere."""

    def __init__(self, *, body: bytes, redirect_to: str = "") -> None:
        self.asked: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked.append(self.path)
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.end_headers()
                    return
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def victim() -> Iterator[_Server]:
    s = _Server(body=json.dumps({"peer_id": PID, "secret": 1}).encode())
    yield s
    s.close()


def _record(metrics_url: str, *hosts: str) -> dict:
    return {"peer_id": PID, "role": "trainer", "metrics_url": metrics_url,
            "dht_maddrs": [f"/ip4/{h}/tcp/4001/p2p/{PID}" for h in hosts]}


def test_a_record_cannot_point_the_dashboard_at_a_host_it_does_not_announce(victim) -> None:
    """The 'victim' here is 127.0.0.1; a record announcing another address gets no request made."""
    assert statuses_of_peers([_record(victim.url, "198.51.100.7")], allow_private=True) == []
    assert statuses_of_peers([_record(victim.url, "127.0.0.1")], allow_private=False) == []  # public swarm
    assert statuses_of_peers([_record(victim.url.replace("http", "https"), "127.0.0.1")], allow_private=True) == []
    assert victim.asked == []
    statuses_of_peers([_record(victim.url, "127.0.0.1")], allow_private=True)  # a local swarm: its own host
    assert victim.asked == ["/status"]


def test_redirects_are_not_followed_and_bodies_are_capped(victim) -> None:
    redirector = _Server(body=b"", redirect_to=victim.url + "/status")
    huge = _Server(body=b" " * (MAX_STATUS_BYTES + 10))
    try:
        assert isinstance(fetch_status(redirector.url), str) and victim.asked == []
        assert "larger than" in fetch_status(huge.url)
    finally:
        redirector.close()
        huge.close()


class _Drip:
    """A local TCP server that answers one byte at a time, forever (never finishes)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                for b in b"HTTP/1.0 200 OK\r\nX-Drip: " + b"a" * 10_000:
                    if self.stop.wait(0.05):
                        break
                    try:
                        conn.sendall(bytes([b]))
                    except OSError:
                        break

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_a_drip_cannot_hold_the_fetch_past_its_timeout() -> None:
    """One deadline for the whole answer, not per read: a byte every 50 ms never resets it."""
    import time

    drip = _Drip()
    try:
        t0 = time.monotonic()
        res = fetch_status(drip.url, timeout=0.6)
        took = time.monotonic() - t0
        assert isinstance(res, str) and "unreachable" in res and took < 1.5, (res, took)
    finally:
        drip.close()


def test_a_name_resolving_to_loopback_or_link_local_is_not_asked(victim, monkeypatch) -> None:
    """A record announcing ``/dns4/<name>`` whose name resolves to loopback (or link-local, the
    cloud metadata address) gets no request in a public swarm: the results are checked, not the
    name; the operator's own named address is still asked, at the address checked."""
    from pulse_node.ops import sources

    port = victim.url.rsplit(":", 1)[1]
    table = {"sneaky.example": ["127.0.0.1"], "meta.example": ["169.254.169.254"], "fine.example": ["127.0.0.1"]}
    monkeypatch.setattr(sources, "resolve", lambda host: table[host])

    def rec(name: str) -> dict:
        return {"peer_id": PID, "role": "trainer", "metrics_url": f"http://{name}:{port}",
                "dht_maddrs": [f"/dns4/{name}/tcp/4001/p2p/{PID}"]}

    assert statuses_of_peers([rec("sneaky.example")], allow_private=False) == []
    assert statuses_of_peers([rec("meta.example")], allow_private=True) == []  # link-local: not even locally
    assert victim.asked == []
    with pytest.raises(ValueError, match="resolves to 127.0.0.1"):
        sources.status_target(rec("sneaky.example"), allow_private=False)
    url = sources.status_target(rec("fine.example"), allow_private=False, named={"127.0.0.1"})
    assert url == f"http://127.0.0.1:{port}"  # pinned to the checked address: no second lookup
    statuses_of_peers([rec("fine.example")], allow_private=False, named={"127.0.0.1"})
    assert victim.asked == ["/status"]


def test_remote_text_is_drawn_as_text_not_markup() -> None:
    """An error message or name a peer chose, full of rich markup, is shown literally (and
    cannot break the screen with an unbalanced tag)."""
    from rich.console import Console

    from pulse_node.ops.render import render
    from pulse_node.ops.snapshot import ErrorLine, SwarmSnapshot, Totals

    hostile = "[/bold][link=http://evil]click[/link] [red]x"
    snap = SwarmSnapshot(taken_at=0.0, source="test", roles={}, nodes=[], versions=[], hash_checks_total=0,
                         hash_disagreements=[], totals=Totals(), alerts=[],
                         errors=[ErrorLine(at=0.0, node=hostile, message=hostile)])
    console = Console(record=True, width=200)
    console.print(render(snap))
    out = console.export_text()
    assert "[link=http://evil]click[/link]" in out and "[/bold]" in out


def test_the_status_server_serves_with_a_bounded_pool() -> None:
    """Many idle connections hold at most the pool; the status still answers once they go."""
    import socket
    import urllib.request

    from pulse_node.daemon.status import MAX_STATUS_THREADS, NodeStatus, StatusServer

    server = StatusServer(NodeStatus(role="trainer", peer_id=PID, run_id="r"), idle_timeout=120.0)  # the test closes them
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_STATUS_THREADS)]
    try:
        wait_for(lambda: server.busy() >= MAX_STATUS_THREADS, timeout=10, what="the pool full")
        threads = threading.active_count()
        extra = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        for s in extra:  # refused at once: closed without an answer
            s.settimeout(5)
            assert s.recv(1) == b""
            s.close()
        assert server.busy() == MAX_STATUS_THREADS and threading.active_count() <= threads  # no thread per refused one
        for s in idle:
            s.close()
        wait_for(lambda: not server.busy(), timeout=10, what="the pool free")
        with urllib.request.urlopen(server.url + "/status", timeout=10) as resp:
            assert json.loads(resp.read())["peer_id"] == PID
    finally:
        for s in idle:
            s.close()
        server.close()
