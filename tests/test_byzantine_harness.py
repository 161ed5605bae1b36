"""The Byzantine harness (pulse_node/testing/byzantine, bench/byzantine.py) on a small model: its
first-round reuse is exact, and its defence stages change what attacks achieve."""

from __future__ import annotations

import pytest

from pulse_node.config import load_node_config
from pulse_node.testing.byzantine import harness
from pulse_node.testing.byzantine.attacks import Attack, attacks
from pulse_node.testing.byzantine.stages import Defences, EveryCommitment
from pulse_node.testing.byzantine.world import World, peer_of

IDS = [peer_of("b0"), peer_of("b1")]


@pytest.fixture(scope="module")
def world() -> World:
    cfg = load_node_config(None, ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "grpo.warmstart_steps=0",
                                  "sampling.prompts_per_batch=2", "sampling.group_size=2", "loco.inner_steps=1",
                                  "task.eval_size=20", "loco.base_coding=false"], role="trainer")
    return World(cfg)


def _run(world: World, attack: Attack, *, rounds: int = 2, defences: Defences | None = None) -> harness.Outcome:
    return harness.run(world, attack, loco=world.cfg.loco, seed=0, rounds=rounds,
                       defences=defences or Defences.today(world.run_id))


@pytest.mark.slow
def test_first_round_reuse_is_exact(world: World) -> None:
    world.first_rounds.clear()
    first = _run(world, attacks(IDS)["sign_flip"])
    assert len(world.first_rounds) == 6  # four honest trainers and the two that train
    again = _run(world, attacks(IDS)["sign_flip"])
    assert (again.accuracy, again.keep_honest, again.keep_byzantine) == (first.accuracy, first.keep_honest,
                                                                         first.keep_byzantine)


@pytest.mark.slow
def test_decision_stage_decides_whether_a_coordinator_may_drop_honest_payloads(world: World) -> None:
    today = _run(world, attacks(IDS)["coordinator_drop"], rounds=6)  # b0 coordinates round 5
    assert today.left_out > 0
    checked = Defences.today(world.run_id)
    checked.decision = EveryCommitment()
    assert _run(world, attacks(IDS)["coordinator_drop"], rounds=6, defences=checked).left_out == 0


def test_evidence_replayed_after_a_restart_bans_no_honest_trainer(world: World) -> None:
    """Issue 32 item 5 as the harness models it, judged by the node's evidence checkers: decisions
    an honest coordinator signed before a restart (another epoch) convict nobody (on fe579b4 each
    honest coordinator was banned)."""
    out = _run(world, attacks(IDS)["evidence_replay"], rounds=4)
    assert not out.false_bans and not out.caught


@pytest.mark.slow
def test_lying_verifiers_knock_no_honest_trainer_out_and_every_round_is_decided(world: World) -> None:
    """Under the protocol's defences a Byzantine verifier's "it did not answer" of an honest target
    whose answer every trainer holds is refused (before, each such lie left the target out of the
    next round and let the attackers weigh half of it), and a list naming a verdict on a convicted
    member is still accepted (before, every coordinator's list was refused and the round applied
    nothing)."""
    for name in ("scaled_bound", "sign_flip"):
        out = _run(world, attacks(IDS)[name], rounds=4, defences=Defences.protocol(world.run_id))
        assert not out.false_bans and out.honest_owing == 0
        for t in out.trace:
            assert not [k for k in t["out"] if k.startswith("h")], (name, t)
            assert sum(1 for k in t["share"] if k.startswith("h")) == 4, (name, t)


def test_the_sleeper_trains_honestly_until_its_first_check_is_passed() -> None:
    """Round 0's work is checked in round 1 (every member is unproven until it passes one); the
    sleeper trains on the true rewards in rounds 0 and 1 and on inverted ones from round 2."""
    from types import SimpleNamespace

    sleeper = attacks(IDS)["sleeper"]
    sleeper.trainers = {t: SimpleNamespace(invert_rewards=False) for t in IDS}  # type: ignore[attr-defined]
    inverted = []
    for r in range(4):
        inverted.append(all(t.invert_rewards for t in sleeper.trainers.values()))  # type: ignore[attr-defined]
        assert sleeper.payloads(SimpleNamespace(round=r), {}) == {}  # type: ignore[arg-type]
    assert inverted == [False, False, True, True] and not sleeper.invert_rewards
