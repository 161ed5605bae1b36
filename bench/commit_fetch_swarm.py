"""A hostile coordinator naming a partner's commitment honest members refused, in a running swarm (issue 32).

    python bench/commit_fetch_swarm.py [--versions 6]

Five keyed trainers in one process on the in-memory hub (``testing/inprocess.py``, the tests'
tiny model), spot checks on (``loco.spot.keyed``, rate 0.05). The partner ``trainer-a`` commits
without an inner commitment (every honest member refuses it, ``spot_terms``); the hostile
``trainer-b`` holds it anyway and, in the rounds it coordinates (3 and 4 of the first 6), signs a
decision naming it and its payload; both follow every other decision (no omission refusals). The
honest ``trainer-c``, ``-d``, ``-e`` run the tree's code. Run it with a tree's ``pulse_node`` first
on ``PYTHONPATH`` to measure that tree. Printed: per trainer, the decisions and commitments it
refused by reason, the commitments it fetched, and the contributors of each version it published;
last line JSON. Exit 1 if the honest trainers did not publish identical states.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import all_at_version, node_config, published, read_status, wait_for  # noqa: E402

from pulse_node.chain.identity import Identity  # noqa: E402
from pulse_node.config import TrainerConfig  # noqa: E402
from pulse_node.loco.roundcommit import Expect  # noqa: E402
from pulse_node.testing.inprocess import InProcessSwarm  # noqa: E402
from pulse_node.trainer.commits import CommitIntake  # noqa: E402
from pulse_node.trainer.decisions import DecisionIntake, coordinator_order  # noqa: E402
from pulse_node.vocab import DEFAULT_RUN_ID  # noqa: E402

NAMES = ("trainer-a", "trainer-b", "trainer-c", "trainer-d", "trainer-e")
HOSTILE, PARTNER = "trainer-b", "trainer-a"
HONEST = ("trainer-c", "trainer-d", "trainer-e")
LOCO = {"inner_steps": 2, "deadline_s": 6.0, "decision_wait_s": 2.0, "spot": {"keyed": True, "rate": 0.05}}


def hostile_pair() -> None:
    """Patch the pair's behaviour in (every node runs in this process: keyed on the node's own id)."""
    make_own, expect, omission = CommitIntake.make_own, CommitIntake._expect, DecisionIntake._omission

    def own(self, r, *, base, payload, spot=b""):  # type: ignore[no-untyped-def]
        return make_own(self, r, base=base, payload=payload, spot=b"" if self.peers.me == PARTNER else spot)

    def expecting(self, r):  # type: ignore[no-untyped-def]
        e = expect(self, r)
        return Expect(e.run_id, e.epoch, e.round, e.base) if self.peers.me == HOSTILE else e

    def omitting(self, d, o, *, elsewhere):  # type: ignore[no-untyped-def]
        return None if self.me in (HOSTILE, PARTNER) else omission(self, d, o, elsewhere=elsewhere)

    CommitIntake.make_own, CommitIntake._expect = own, expecting  # type: ignore[method-assign]
    DecisionIntake._omission = omitting  # type: ignore[method-assign]


def run(tmp: Path, versions: int) -> dict:
    hostile_pair()
    keys = [Identity.load_or_create(tmp / n / "identity.key").public_key_hex for n in NAMES]
    swarm = InProcessSwarm()
    try:
        dirs = {n: swarm.start(n, node_config(TrainerConfig, tmp, n, cache_dir=tmp / "cache", loco=LOCO,
                                              chain={"trusted_trainers": keys})) for n in NAMES}
        wait_for(all_at_version([dirs[n] for n in HONEST], versions), timeout=900,
                 what=f"the honest trainers at version {versions}")
    finally:
        swarm.stop_all()
    out: dict = {"hostile_rounds": [r for r in range(versions) if coordinator_order(DEFAULT_RUN_ID, r, NAMES)[0] == HOSTILE],
                 "errors": swarm.errors}
    for n, d in dirs.items():
        t = read_status(d).trainer
        out[n] = {"decisions_refused": dict(t.decisions_refused), "loco_refused": dict(t.loco_refused),
                  "commits_fetched": getattr(t, "commits_fetched", None),
                  "contributors": {h.version: h.contributors for h in read_status(d).history if 0 < h.version <= versions}}
    states = {n: {v: s for v, s in published(dirs[n]).items() if 0 < v <= versions} for n in HONEST}
    out["honest_identical"] = len({json.dumps(s, sort_keys=True) for s in states.values()}) == 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = run(Path(tmp), args.versions)
    for n in NAMES:
        print(f"{n}: {out[n]}")
    print(json.dumps(out, default=str))
    sys.exit(0 if out["honest_identical"] and not out["errors"] else 1)


if __name__ == "__main__":
    main()
