"""The answer checker's worker process: math-verify verdicts under a CPU-time deadline.

Started by ``rl/checker.py`` as ``python -m pulse_node.rl.checker_worker``; reads one JSON request
per line on stdin (``{"gold": text, "pred": text, "cpu": seconds}``), answers one JSON line on
stdout (``{"equal": true | false | null, "cpu": seconds used}``; null: the deadline passed). The
deadline is CPU time of this process (``ITIMER_PROF``), not wall time, so a loaded machine does
not cut an answer short; its signal interrupts sympy between bytecodes and unwinds to here
(``OverBudget`` is a ``BaseException``: library code catching ``Exception`` lets it pass). Parsed
answers are cached by their text; ``WARM_UP`` runs before ``ready`` (sympy initialises lazily,
and a request must not pay for it); a parsed answer of more than ``MAX_NODES`` sympy nodes is
judged unequal without comparing. Says ``ready`` once math-verify is imported.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import time
from typing import Any

MAX_NODES = 400
#: comparisons run before "ready": the parser, simplify, trigonometry, sets, intervals, matrices
WARM_UP = [("\\boxed{(x+1)^2}", "\\boxed{x^2+2x+1}"), ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\boxed{\\frac{\\sqrt{2}}{2}}"),
           ("\\boxed{\\tan^2(y)+1}", "\\boxed{\\sec^2(y)}"), ("\\boxed{\\{1,2\\}}", "\\boxed{[0,1)}"),
           ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\boxed{x \\ne 2}"), ("\\boxed{0.5}", "1000,99")]


class OverBudget(BaseException):
    """The request's CPU deadline passed."""


def _over(signum: int, frame: Any) -> None:
    raise OverBudget


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> tuple[object, ...]:
    from math_verify import parse

    return tuple(parse(text, parsing_timeout=None, raise_on_error=False))


def _nodes(expr: Any) -> int:
    from sympy import Basic, preorder_traversal  # type: ignore[import-untyped]

    if not isinstance(expr, Basic):
        return 1
    count = 0
    for _ in preorder_traversal(expr):
        count += 1
        if count > MAX_NODES:
            break
    return count


def equal(gold: str, pred: str) -> bool:
    """math-verify's verdict on two rendered answers (both parsed with its default extraction)."""
    from math_verify import verify

    g, p = _parsed(gold), _parsed(pred)
    if not g or not p or any(_nodes(x) > MAX_NODES for x in (*g, *p)):
        return False
    return bool(verify(list(g), list(p), timeout_seconds=None, raise_on_error=False))


def serve(inp: Any, out: Any) -> None:
    signal.signal(signal.SIGPROF, _over)
    for line in inp:
        req = json.loads(line)
        start = time.process_time()
        verdict: bool | None
        try:
            signal.setitimer(signal.ITIMER_PROF, max(1e-3, float(req["cpu"])))
            verdict = equal(str(req["gold"]), str(req["pred"]))
            signal.setitimer(signal.ITIMER_PROF, 0)
        except OverBudget:
            verdict = None
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        out.write(json.dumps({"equal": verdict, "cpu": time.process_time() - start}) + "\n")
        out.flush()


def main() -> None:
    logging.disable(logging.WARNING)  # math-verify warns that its own timeout is off: ours is on
    import math_verify  # noqa: F401  (imported before "ready": the first request is not charged for it)

    for gold, pred in WARM_UP:  # sympy initialises lazily: its first simplify must not be charged to a request
        equal(gold, pred)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
