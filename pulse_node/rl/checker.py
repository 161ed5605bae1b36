"""The bounded answer checker: math-verify in a worker process, every call under a CPU deadline.

``MathChecker.equal(gold, pred, budget=...)`` asks the worker (``rl/checker_worker.py``, one per
process, started on first use, ``PYTHONHASHSEED=0`` so sympy's set orders are the same on every
node) for math-verify's verdict on two rendered answers. Each call may spend at most
``CALL_CPU_S`` seconds of the worker's CPU and no more than the caller's ``CheckerBudget`` has
left (a trainer gives each batch one budget, ``verify.checker_cpu_s``): past it the verdict is
None, which scores 0 and is never compared with a producer's claim (``rl/verify.py``). A worker
that does not answer within ``WALL_FACTOR`` times its deadline plus a second (stuck outside
Python, where the CPU timer's signal cannot land) is killed and replaced. Verdicts are cached by
(gold, pred). The caller blocks; one request at a time (a lock), so threads may share it.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

CALL_CPU_S = 1.0
WALL_FACTOR = 4
START_S = 120.0  # importing sympy and math-verify, on a loaded machine
CACHE = 8192


@dataclass
class CheckerBudget:
    """CPU seconds the checker may still spend for one batch (``left`` <= 0: no more calls)."""

    left: float

    def spend(self, seconds: float) -> None:
        self.left -= seconds


class MathChecker:
    """math-verify verdicts from a worker process under a CPU deadline (see the module docstring)."""

    def __init__(self, *, call_cpu_s: float = CALL_CPU_S) -> None:
        self.call_cpu_s = call_cpu_s
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self.timeouts = 0  # calls cut short by the deadline (tests, status)
        self.restarts = 0  # workers replaced after missing the wall deadline

    def equal(self, gold: str, pred: str, *, budget: CheckerBudget | None = None) -> bool | None:
        """math-verify's verdict, or None when the deadline or the budget ran out first."""
        key = (gold, pred)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        cpu = self.call_cpu_s if budget is None else min(self.call_cpu_s, budget.left)
        if cpu <= 0:
            return None
        with self._lock:
            verdict, used = self._ask(gold, pred, cpu)
        if budget is not None:
            budget.spend(used)
        if verdict is None:
            self.timeouts += 1
            return None
        self._cache[key] = verdict
        if len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        return verdict

    def _ask(self, gold: str, pred: str, cpu: float) -> tuple[bool | None, float]:
        proc = self._worker()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"gold": gold, "pred": pred, "cpu": cpu}) + "\n")
            proc.stdin.flush()
            line = _read_line(proc, WALL_FACTOR * cpu + 1.0)
        except OSError:
            line = None
        if line is None:
            self._kill()
            self.restarts += 1
            return None, cpu
        reply = json.loads(line)
        return reply["equal"], float(reply["cpu"])

    def _worker(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        self._proc = subprocess.Popen([sys.executable, "-m", "pulse_node.rl.checker_worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
        if _read_line(self._proc, START_S) != "ready":
            self._kill()
            raise RuntimeError("the answer checker's worker did not start (is math-verify installed?)")
        return self._proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    f.close()

    def close(self) -> None:
        with self._lock:
            self._kill()


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """One line from the worker within ``timeout`` seconds (None: no answer in time, or it died)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return None
    line = proc.stdout.readline()
    return line.strip() if line else None


_DEFAULT: MathChecker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_checker() -> MathChecker:
    """The process's checker (its worker is started on first use and ended at exit)."""
    global _DEFAULT  # noqa: PLW0603 (one checker per process, started on first use)
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathChecker()
            atexit.register(_DEFAULT.close)
        return _DEFAULT
