"""``pulse-node status --bootstrap`` asks peers for /status at the URL their record announces: a
record cannot make it request a third party's URL (blind SSRF). Only plain http, to a host the
record itself announces, to a private host only for a local swarm, no redirects, bounded size."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from pulse_node.ops.sources import MAX_STATUS_BYTES, fetch_status, statuses_of_peers

PID = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


class _Server:
    """A local HTTP server that records every path asked; ``/redirect`` points elsewhere."""

    def __init__(self, *, body: bytes, redirect_to: str = "") -> None:
        self.asked: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
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
