"""The node's memory policy: arrays of a version freed by a worker thread go back to the OS."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator policy")

# a worker thread frees a 16 MB mapped block (glibc then raises its mmap threshold to 16 MB),
# then makes and frees fifty 4 MB arrays with small ones kept between them: what stays resident
_PROBE = """
import sys, threading
import numpy as np
from pulse_node.sysmem import return_large_frees

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))

if sys.argv[1] == "policy":
    assert return_large_frees()

def work():
    big = np.ones(16 << 20, np.uint8)
    del big
    kept, arrays = [], []
    for _ in range(50):
        arrays.append(np.ones(4 << 20, np.uint8))
        kept.append(np.ones(100, np.uint8))
    del arrays

t = threading.Thread(target=work)
before = rss_mb()
t.start()
t.join()
print(rss_mb() - before)
"""


def _kept_mb(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, check=True)
    return int(out.stdout.strip())


def test_freed_version_arrays_leave_the_process_with_the_policy_and_stay_without() -> None:
    with_policy, default = _kept_mb("policy"), _kept_mb("default")
    assert with_policy <= 20
    assert default >= with_policy + 100  # the probe does show glibc's retention
