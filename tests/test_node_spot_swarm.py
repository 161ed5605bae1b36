"""Spot checks in a running in-process swarm: an open trainer on inverted advantages is caught.

Two keyed members, one honest open trainer and one open trainer whose testing-only fault mode
(``faults.advantage_flip``) trains on inverted advantages while committing the verified batches:
the round-seeded draw checks both newcomers every round (and, at rate 1, every trainer once it
earned its weight: the cheat may pass a step whose groups carry no signal), the members re-run a drawn step
(``trainer/spot_round.py``), the cheat's gradient does not match, its evidence is re-checked and
every member's ledger convicts it; the honest open trainer passes its checks and earns more than
the newcomers' share; no honest key is failed; the members stay bit-identical.
"""

from __future__ import annotations

import pytest
from helpers import assert_trainers_identical, open_trainers_chain, read_status, wait_for

from pulse_node.config import TrainerConfig
from pulse_node.daemon.status_model import TrustEntry
from pulse_node.loco.config import TrustConfig
from pulse_node.loco.ledger import Entry, Ledger
from pulse_node.testing.inprocess import InProcessSwarm

MEMBERS = ("trainer-a", "trainer-b")
HONEST, CHEAT = "trainer-h", "trainer-x"
LOCO = {"inner_steps": 2, "deadline_s": 6.0, "decision_wait_s": 2.0,
        "trust": {"earn_checks": 4}, "spot": {"answer_wait_s": 20.0, "rate": 1.0}}
#: rewards that vary within a group (1-digit sums, a longer warm start): a step whose groups all earn
#: the same reward has zero advantages, and inverting them changes nothing a check could see
LEARNS = {"task": {"digits": 1, "eval_size": 20}, "grpo": {"warmstart_steps": 150, "lr": 1e-3}}
NEWCOMERS = TrustConfig().newcomer_weight  # what all newcomers of a round weigh together


def _earned(e: TrustEntry) -> float:
    """The weight the ledger gives an open trainer past its newcomer checks (``Ledger.earned``)."""
    ledger = Ledger(TrustConfig(**LOCO["trust"]))
    ledger.entries[e.key] = Entry(0, 0, passed=e.passed, failed=e.failed)
    return ledger.earned(e.key)


def _trust(d) -> dict:
    st = read_status(d)
    return {e.key: e for e in st.trust} if st is not None else {}


@pytest.mark.slow
def test_an_inverted_advantage_trainer_is_caught_and_an_honest_one_earns_weight(node_cfg, tmp_path):
    chain = open_trainers_chain(tmp_path, MEMBERS)
    swarm = InProcessSwarm()
    try:
        dirs = {n: swarm.start(n, node_cfg(TrainerConfig, n, loco=LOCO, chain=chain, **LEARNS)) for n in MEMBERS}
        dirs[HONEST] = swarm.start(HONEST, node_cfg(TrainerConfig, HONEST, loco=LOCO, chain=chain, **LEARNS))
        dirs[CHEAT] = swarm.start(CHEAT, node_cfg(TrainerConfig, CHEAT, loco=LOCO, chain=chain, **LEARNS,
                                                  faults={"advantage_flip": True}))
        members = {n: dirs[n] for n in MEMBERS}

        def caught_and_earned() -> bool:
            for d in members.values():
                t = _trust(d)
                cheat, honest = t.get(CHEAT), t.get(HONEST)
                if cheat is None or honest is None or not cheat.convicted or cheat.weight or _earned(honest) <= NEWCOMERS:
                    return False
            return True

        wait_for(caught_and_earned, timeout=300, what=lambda: f"the cheat convicted, the honest open trainer "
                 f"earning: {[_trust(d) for d in members.values()]}")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    last = min(read_status(d).version for d in members.values())
    assert_trainers_identical(members, range(1, last + 1))
    for d in members.values():
        t = _trust(d)
        assert t[CHEAT].failed >= 1 and t[CHEAT].weight == 0.0, t[CHEAT]
        assert t[HONEST].contributed >= 1 and t[HONEST].failed == 0 and not t[HONEST].convicted, t[HONEST]
        assert all(not e.convicted and e.failed == 0 for k, e in t.items() if k != CHEAT), t
    drawn = sum(read_status(d).trainer.spot_drawn for d in members.values())
    failed = sum(read_status(d).trainer.spot_failed for d in members.values())
    assert drawn >= 4 and failed >= 1, (drawn, failed)
