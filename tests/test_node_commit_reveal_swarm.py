"""A coordinator dropping an honest payload in a running in-process swarm of three keyed trainers.

``trainer-b`` leaves ``trainer-c``'s commitment and payload out of every decision it coordinates.
The two honest trainers refuse each such decision (``omits_commitment``, both signed statements
kept), the next coordinator in turn decides with every payload, and the model keeps going: the
honest trainers stay bit-identical and average both honest payloads in every round.
"""

from __future__ import annotations

import pytest
from helpers import all_at_version, assert_trainers_identical, read_status, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.config import TrainerConfig
from pulse_node.testing.inprocess import InProcessSwarm
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.decisions import coordinator_order
from pulse_node.vocab import DEFAULT_RUN_ID

NAMES = ("trainer-a", "trainer-b", "trainer-c")
DROPPER, VICTIM = "trainer-b", "trainer-c"  # b coordinates rounds 0, 3, 4 and 5
LOCO = {"inner_steps": 2, "deadline_s": 4.0, "decision_wait_s": 1.5}
VERSIONS = 5


@pytest.mark.slow
def test_a_coordinator_dropping_an_honest_payload_is_refused_and_the_model_keeps_going(node_cfg, tmp_path,
                                                                                      monkeypatch):
    dropped_rounds = [r for r in range(VERSIONS) if coordinator_order(DEFAULT_RUN_ID, r, NAMES)[0] == DROPPER]
    assert dropped_rounds, "the dropper coordinates none of the rounds under test"
    decide = RoundAgreement._decide

    def dropping(self, o, live, *, pull):  # the dropper's agreement only (every node runs in this process)
        if self.me == DROPPER:
            self.inbox.get(o.round, {}).pop(VICTIM, None)
            self.commits.held.get(o.round, {}).pop(VICTIM, None)
        return decide(self, o, live, pull=pull)

    monkeypatch.setattr(RoundAgreement, "_decide", dropping)
    keys = [Identity.load_or_create(tmp_path / n / "identity.key").public_key_hex for n in NAMES]
    swarm = InProcessSwarm()
    try:
        dirs = {n: swarm.start(n, node_cfg(TrainerConfig, n, loco=LOCO, chain={"trusted_trainers": keys}))
                for n in NAMES}
        honest = {n: d for n, d in dirs.items() if n != DROPPER}
        wait_for(all_at_version(honest.values(), VERSIONS), timeout=400, what=f"the honest trainers at {VERSIONS}")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    assert_trainers_identical(honest, range(1, VERSIONS + 1))
    for name, d in honest.items():
        st = read_status(d)
        assert st.trainer.decisions_refused.get("omits_commitment", 0) >= 1, (name, st.trainer.decisions_refused)
        assert not st.trainer.forks, (name, st.trainer)
        assert not st.trainer.rounds_left_out, (name, st.trainer)  # the victim's payload is in every round
        contributors = {h.version: h.contributors for h in st.history if h.version > 0}
        # both honest payloads in every round; the dropper's own only while it holds their state
        # (applying its own decisions forks it until the agreement check re-syncs it)
        assert all(n is not None and n >= 2 for n in contributors.values()) and contributors[1] == 3, contributors
