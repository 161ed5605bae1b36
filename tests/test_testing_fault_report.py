"""Fault injection reports what it injected apart from the node's status: the status model has no
testing fields, and a ``FaultyTransport`` writes its counts to ``faults.json``, which the chaos
ledger sums over every life of every node."""

from __future__ import annotations

from pathlib import Path

from pulse_node.chain.peer import PeerStatus
from pulse_node.daemon.status_model import DataPlane
from pulse_node.testing.chaos import ChaosLedger
from pulse_node.testing.faults import FAULTS_FILE, FaultRates, FaultyTransport, read_fault_report
from pulse_node.testing.memory import MemoryHub, announced


def test_injected_faults_are_counted_in_their_own_file_not_in_the_status(tmp_path: Path) -> None:
    assert not {"fault_injection", "faults", "faulted"} & set(DataPlane.model_fields)
    hub = MemoryHub()
    faulty = FaultyTransport(hub.join("a", lambda request: None), FaultRates(drop=1.0), seed=1,
                             report_to=tmp_path / FAULTS_FILE)
    hub.join("b", lambda request: None)
    assert read_fault_report(tmp_path) is None  # nothing written before the first status refresh
    for _ in range(3):
        faulty.push(announced("b", PeerStatus(role="inference")), "head", b"x", timeout=1.0)  # dropped
    assert not hub.inboxes["b"]  # nothing arrived
    assert isinstance(faulty.stats(), DataPlane)  # the status refresh writes the report
    report = read_fault_report(tmp_path)
    assert report is not None and report.faults == {"drop": 3} and report.faulted == {"head:drop": 3}


def test_the_ledger_sums_the_reports_of_every_life(tmp_path: Path) -> None:
    class Child:  # what the ledger reads of a node: its name, role and data dir
        def __init__(self, name: str, data_dir: Path) -> None:
            self.name, self.role, self.data_dir = name, "inference", data_dir

        def status(self) -> None:
            return None

    hub, ledger = MemoryHub(), ChaosLedger()
    child = Child("i0", tmp_path)
    for life in range(2):  # a restarted node starts counting again, in a new report
        faulty = FaultyTransport(hub.join(f"a{life}", lambda request: None), FaultRates(drop=1.0), seed=life,
                                 report_to=tmp_path / FAULTS_FILE)
        faulty.started_at += life  # two lives, two start times
        faulty.push(announced("nobody", PeerStatus(role="inference")), "loco", b"x", timeout=1.0)
        faulty.stats()
        ledger.poll([child])  # type: ignore[list-item]
    assert ledger.faults() == ({"drop": 2}, {"loco:drop": 2})
