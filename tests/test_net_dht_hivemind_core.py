"""The DHT worker's process loads hivemind's DHT without torch (``net/dht/hivemind_core.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys

import pytest
from pulse_node.net.dht.hivemind_core import load_core
loaded = load_core()
import pulse_node.net.dht.worker
from hivemind.dht.node import DHTNode
from hivemind.utils import MSGPackSerializer, get_dht_time, get_logger
print(loaded, sorted(m for m in ("torch", "scipy", "numpy") if m in sys.modules), load_core())
"""


def test_the_worker_imports_hivemind_dht_without_torch_scipy_or_numpy():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "True [] False", done.stdout  # loaded once, nothing heavy, idempotent


@pytest.mark.slow  # imports all of hivemind (torch) in a process: ~4 s
def test_where_hivemind_is_imported_already_nothing_changes():
    probe = ("import hivemind, sys\nfrom pulse_node.net.dht.hivemind_core import load_core\n"
             "print(load_core(), hasattr(hivemind, 'DHT'), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "False True True", done.stdout
