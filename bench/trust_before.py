"""Run today's tests of issue 32 items 3-6 and of a contained exception (issue 34) against an old
checkout (fe579b4), to show each fails there; bench/RESULTS.md, "Trust defects (issue 32 items
3-6) and contained exceptions (issue 34)".

The test bodies are today's. Only what did not exist on fe579b4 is swapped, in a copy under a
temporary directory: ``tests/test_trust_defects.py``'s helper section (the only lines that speak
the peer book's API; fe579b4 had ``chain/trust.TrustPolicy`` instead, and no epochs), four import
paths, the resolver signature of the in-memory hub, and a stand-in ``contained`` fixture
(fe579b4 contained nothing). Usage::

    git -C /work/main worktree add --detach /tmp/trust-before fe579b4
    python bench/trust_before.py /tmp/trust-before      # pytest's summary: every test fails there
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"

IMPORTS = {
    "from pulse_node.chain.admission import Admission": "from pulse_node.chain.trainerset import Admission",
    "from pulse_node.chain.evidence import encode_evidence\n": "from pulse_node.chain.evidence import Evidence\n",
    "from pulse_node.peers.book import PeerBook\n": "from pulse_node.chain.trust import TrustPolicy as PeerBook\n",
    "from pulse_node.peers.evidence import EvidenceBook": "from pulse_node.chain.evidence import EvidenceBook",
    "from pulse_node.peers.outcomes import Fault, Reported\n": "",
    "from pulse_node.peers.trainerset import TrainerSet": "from pulse_node.chain.trainerset import TrainerSet",
    "from pulse_node.net.wire.serving import store_resolver": "from pulse_node.chain.serving import store_resolver",
    "lambda request: None": "lambda kind, params: None",
}

OLD_API = '''# ---- the same helpers on fe579b4's API (chain/trust.TrustPolicy) -----------------------------
def _book(*roots, **kw):
    return PeerBook(TrainerSet(run_id=RUN, keys=[i.public_key_hex for i in roots]), **kw)


def _check(book, rec, *, sender):
    book.verify(rec, sender=sender)


def _quorum(book, rec, *, sender):
    return book.check(rec, sender=sender)


def _report(book, evidence, *, sender):
    book.evidence.add_bytes(evidence)
    book.observe([])


def _convicted(book, ident):
    return ident.public_key_hex in book.evidence


def encode_evidence(kind, first, second):
    return Evidence(kind, "", 0, first, second).encode()


def _genesis(ident, nonce):  # no epochs on fe579b4: a genesis is its state alone
    return make_record(ident, run_id=RUN, version=0, parent=None, state_hash="00" * 32, patch=None,
                       anchor_version=0, is_anchor=True, codec=CODEC)


'''

CONFTEST = '''from types import SimpleNamespace

import pytest


@pytest.fixture
def contained():
    """fe579b4 contained nothing: a stand-in (the test fails before it reads it)."""
    return SimpleNamespace(total=0)
'''


def old_trust_defects(text: str) -> str:
    """``tests/test_trust_defects.py`` with its helper section on fe579b4's API."""
    head, rest = text.split("# ---- the peer book's API", 1)
    _, rest = rest.split("# ---- records", 1)
    return _swap(head) + OLD_API + _swap("# ---- records" + rest)


def _swap(text: str) -> str:
    for new, old in IMPORTS.items():
        text = text.replace(new, old)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="a checkout of the old commit (fe579b4)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trust-before-") as tmp:
        out = Path(tmp)
        (out / "conftest.py").write_text(CONFTEST)
        (out / "test_trust_defects_before.py").write_text(old_trust_defects((TESTS / "test_trust_defects.py").read_text()))
        (out / "test_trainer_contain_before.py").write_text(_swap((TESTS / "test_trainer_contain.py").read_text()))
        env = {**os.environ, "PYTHONPATH": f"{args.checkout}{os.pathsep}{args.checkout / 'tests'}"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", tmp, "-c", os.devnull,
               "-o", "addopts=", tmp]
        return subprocess.run(cmd, env=env, cwd=tmp, check=False).returncode  # cwd: not this tree's pulse_node


if __name__ == "__main__":
    sys.exit(main())
