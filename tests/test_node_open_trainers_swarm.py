"""An open trainer in a running in-process swarm of two keyed trainers (``chain.open_trainers``).

A third trainer whose key is in no trainer set joins the running swarm and catches up: its committed payloads enter the rounds at
the newcomers' capped weight, it never coordinates, and the members stay bit-identical and keep
publishing; ``status.json`` reports its weight (``trust``).
"""

from __future__ import annotations

import pytest
from helpers import all_at_version, assert_trainers_identical, node_version, open_trainers_chain, read_status, wait_for

from pulse_node.config import TrainerConfig
from pulse_node.testing.inprocess import InProcessSwarm

MEMBERS = ("trainer-a", "trainer-b")
OPEN = "trainer-o"
# spot checks off: its weight stays the newcomers' share (checks earning weight: test_node_spot_swarm.py)
LOCO = {"inner_steps": 2, "deadline_s": 6.0, "decision_wait_s": 2.0, "spot": {"rate": 0.0}}


@pytest.mark.slow
def test_an_open_trainer_contributes_at_the_newcomers_weight_and_never_decides(node_cfg, tmp_path):
    chain = open_trainers_chain(tmp_path, MEMBERS)
    swarm = InProcessSwarm()
    try:
        dirs = {n: swarm.start(n, node_cfg(TrainerConfig, n, loco=LOCO, chain=chain)) for n in MEMBERS}
        members = {n: dirs[n] for n in MEMBERS}
        # it joins a running swarm: it must catch up with rounds that do not wait for it (they close
        # as soon as the members are in, but for a short window, trainer/pace.py)
        wait_for(all_at_version(members.values(), 2), timeout=300, what="the members at version 2")
        dirs[OPEN] = swarm.start(OPEN, node_cfg(TrainerConfig, OPEN, loco=LOCO, chain=chain))

        def open_in(d) -> bool:  # a round past version 2 with the open trainer in it
            return any((h.contributors or 0) >= 3 and h.version > 2 for h in read_status(d).history)

        wait_for(lambda: all(node_version(d) >= 5 and open_in(d) for d in members.values()), timeout=300,
                 what="the members at version 5, the open trainer in a round")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    assert_trainers_identical(members, range(1, 6))
    opened = read_status(dirs[OPEN])
    assert not opened.trainer.decisions_made, "an open trainer decided a round"
    for name, d in members.items():
        st = read_status(d)
        assert max(h.contributors or 0 for h in st.history) == 3, (name, [h.contributors for h in st.history])
        weights = {e.key: e.weight for e in st.trust}
        assert weights.get(opened.peer_id) in (0.0, 0.5), weights  # alone among newcomers: their whole share (0: not in the last round)
        assert any(e.key == opened.peer_id and not e.member and e.contributed >= 1 for e in st.trust), st.trust
        assert "not_member" not in st.trainer.decisions_refused, st.trainer.decisions_refused  # it relays none
