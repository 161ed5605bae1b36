"""Chaos kills find a node's worker by the module its process runs (``LocalSwarm.kill``)."""

from __future__ import annotations

from pulse_node.net.dht.client import DhtClient
from pulse_node.net.wire.client import WireClient
from pulse_node.swarm.launcher import _worker_tree, worker_module


class FakeProc:
    def __init__(self, *cmdline: str) -> None:
        self._cmdline = list(cmdline)

    def cmdline(self) -> list[str]:
        return self._cmdline

    def children(self, recursive: bool = False) -> list[FakeProc]:
        return []


def test_the_kill_modes_find_the_worker_processes_the_clients_start() -> None:
    role = FakeProc("python", "-m", "pulse_node", "join")
    dht = FakeProc("python", "-m", DhtClient.module, "--ipc", "x.sock")
    wire = FakeProc("python", "-m", WireClient.module, "--ipc", "y.sock")
    tree = [role, dht, wire]
    assert _worker_tree(tree, worker_module("dht")) == [dht]
    assert _worker_tree(tree, worker_module("wire")) == [wire]
