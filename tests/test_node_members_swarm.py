"""A member test swarm (issue 21): two keyed trainers and an inference node on an in-process hub,
plus a third admitted key held by an attacker that pre-signs decisions, equivocates (decisions
and heads) and announces a far version. Every honest node refuses it with the evidence named in
its ``status.json``; the swarm keeps making versions, bit-identical on both trainers; the
inference node never targets the far version.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from helpers import all_at_version, assert_trainers_identical, read_status, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.layout import store_path
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.record import decode_record
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.errors import PulseError
from pulse_node.testing.inprocess import InProcessSwarm, node_version
from pulse_node.testing.member_attackers import conflicting_heads, equivocating_decisions, far_head, presigned_decisions
from pulse_node.testing.memory import announced
from pulse_node.vocab import DEFAULT_RUN_ID

LOCO = {"inner_steps": 2, "deadline_s": 10.0, "decision_wait_s": 2.0}
TRAINERS = ("trainer-a", "trainer-b")


def _member(swarm: InProcessSwarm, ident: Identity, dirs: dict, stop: threading.Event) -> None:
    """The member's attacks, pushed to every honest node once a second until stopped."""
    me = "member-m"
    t = swarm.hub.join(me, lambda request: None)
    t.publish(PeerStatus(role="inference", node_key=ident.public_key_hex))  # a member key, not a live trainer
    while not stop.wait(1.0):
        v = max((node_version(d) for n, d in dirs.items() if n in TRAINERS), default=0)
        epoch = _epoch(dirs[TRAINERS[0]])  # decisions in the swarm's epoch: refused for what they sign, not where
        pushes = [("loco_decision", d) for d in presigned_decisions(ident, me, DEFAULT_RUN_ID, max(v, 0), epoch=epoch)]
        pushes += [("loco_decision", d) for d in equivocating_decisions(ident, me, DEFAULT_RUN_ID, max(v, 0), epoch=epoch)]
        pushes += [("head", h) for h in conflicting_heads(ident, DEFAULT_RUN_ID, max(v, 1))]
        pushes += [("head", far_head(ident, DEFAULT_RUN_ID))]
        for name in dirs:
            for kind, data in pushes:
                if kind == "loco_decision" and name not in TRAINERS:
                    continue
                try:
                    t.push(announced(name, PeerStatus(role="trainer")), kind, data, timeout=1.0)
                except Exception:  # a node not up yet
                    pass


def _epoch(data_dir: Path) -> bytes | None:
    """The epoch of the genesis record in a trainer's store (None before it holds one)."""
    try:
        return bytes.fromhex(decode_record(store_path(data_dir / "store", "record", 0).read_bytes()).epoch)
    except (OSError, PulseError):
        return None


@pytest.mark.slow
def test_a_member_presigning_equivocating_and_far_is_refused_everywhere_and_the_swarm_goes_on(node_cfg, tmp_path):
    member = Identity.generate()
    keys = [Identity.load_or_create(tmp_path / n / "identity.key").public_key_hex for n in TRAINERS]
    chain = {"trusted_trainers": [*keys, member.public_key_hex]}
    swarm, stop, dirs = InProcessSwarm(), threading.Event(), {}
    attacker = threading.Thread(target=_member, args=(swarm, member, dirs, stop), daemon=True)
    try:
        for n in TRAINERS:
            dirs[n] = swarm.start(n, node_cfg(TrainerConfig, n, loco=LOCO, chain=chain))
        dirs["infer-a"] = swarm.start("infer-a", node_cfg(InferenceConfig, "infer-a", chain=chain))
        wait_for(all_at_version([dirs[n] for n in TRAINERS], 2), timeout=300, what="both trainers at version 2")
        attacker.start()

        def convicted_everywhere() -> bool:
            return all(any(e.key == member.public_key_hex for e in read_status(d).evidence) for d in dirs.values())

        wait_for(convicted_everywhere, timeout=120, what="every honest node to name the member's evidence")
        start = max(node_version(dirs[n]) for n in TRAINERS)
        wait_for(all_at_version([dirs[n] for n in TRAINERS], start + 3), timeout=180, what="three more versions")
        wait_for(lambda: node_version(dirs["infer-a"]) >= start + 1, timeout=120, what="the inference node to follow")
    finally:
        stop.set()
        swarm.stop_all()
        attacker.join(timeout=10)
    assert not swarm.errors, swarm.errors
    assert_trainers_identical({n: dirs[n] for n in TRAINERS}, range(1, start + 4))
    for name, d in dirs.items():
        st = read_status(d)
        (ev,) = [e for e in st.evidence if e.key == member.public_key_hex]
        assert ev.kind in ("head", "decision"), (name, ev)
        assert st.version < 1000, f"{name} took the far version"
        if name in TRAINERS:
            assert not st.trainer.forks and st.trainer.resyncs <= 1, (name, st.trainer)
