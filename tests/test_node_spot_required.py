"""In a swarm that runs spot checks, a trainer cannot dodge them by leaving its inner-step commitment out (issue 32).

``config.runs_spot_checks`` (``loco.spot.rate`` > 0 with ``chain.open_trainers`` or
``loco.spot.keyed``) is computed alike by every trainer. Then a round commitment must carry an
inner commitment a check can draw on (``loco/roundcommit.check_terms``: a step at least, this
model's size, at most ``loco.inner_steps`` steps, our inner-step settings), else it is refused
(``spot_terms``) and not held, so its trainer is left out of the round; without a strike (a
trainer configured otherwise sends just that). A trainer that cannot record its inner steps
(without ``grpo.bf16_compute``) refuses to start in such a swarm; one on several processes records
(``tests/test_trainer_shard_record.py``) and starts.
Agreements under real libp2p peer ids on one in-memory hub, stepped by hand, as in
``test_node_open_trainers.py``.
"""

from __future__ import annotations

import pytest
from helpers import commit_to, hub_agreement, inner_commitment, tiny_overrides
from test_node_open_trainers import BASE, EPOCH, ROUND, SHAPES, W, _announce, _payload

from pulse_node.chain.identity import Identity
from pulse_node.config import SwarmConfig, TrainerConfig, recording_problem, runs_spot_checks
from pulse_node.errors import ConfigError, IntegrityError
from pulse_node.loco.decision import payload_digest
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.roundcommit import encode_commit, make_commit
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.vocab import DEFAULT_RUN_ID

SETTINGS = b"\x5e" * 32  # our inner-step settings' digest, as the role hands it over


def _agreement(tmp_path, hub: MemoryHub, me: Identity, keys: list[str], *, checks: bool, open_trainers: bool = False,
               inner_steps: int = 4) -> RoundAgreement:
    loco = {"inner_steps": inner_steps, "spot": {"keyed": checks, "rate": 0.3 if checks or open_trainers else 0.0}}
    return hub_agreement(tmp_path, hub, me, {"loco": loco, "chain": {"trusted_trainers": keys,
                                                                    "open_trainers": open_trainers}},
                         round=ROUND, epoch=EPOCH, base=(BASE, W), shapes=SHAPES, inner_settings=lambda: SETTINGS)


def _commit(ident: Identity, *, params: int = 64, steps: int = 1, settings: bytes = SETTINGS,
            inner: bool = True) -> bytes:
    """``ident``'s round commitment to its payload, with (or without) an inner commitment of these terms."""
    pid = peer_id(ident)
    digest = payload_digest(_payload(pid))
    spot = inner_commitment(ident, pid, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, payload=digest, params=params,
                            settings=settings, steps=steps) if inner else b""
    return encode_commit(make_commit(ident, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND, base=BASE, trainer=pid,
                                     payload=digest, spot=spot))


@pytest.fixture
def keyed():
    me, member = Identity.generate(), Identity.generate()
    return MemoryHub(), me, member, [me.public_key_hex, member.public_key_hex]


def test_a_members_commitment_without_inner_steps_is_refused_and_it_is_left_out(tmp_path, keyed):
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, checks=True)
    mid = _announce(hub, member)
    with pytest.raises(IntegrityError, match="carries no inner-step commitment"):
        ag.offer_commit(mid, _commit(member, inner=False))
    assert ag.commits.of(ROUND, mid) is None, "held: the member is never drawn yet keeps its weight"
    assert ag.ctx.status.snapshot().trainer.loco_refused == {"spot_terms": 1}
    assert not ag.ctx.book.strikes[mid], "a trainer configured otherwise was struck"
    ag.offer_payload(mid, _payload(mid))  # revealed anyway: without a commitment held it never counts
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(me), base_hash=BASE), _payload(peer_id(me)))
    d = ag._decide(ag._open, ag._live(), pull=False)
    assert mid not in d.trainer_ids and mid not in d.commitments
    ag.ctx.store.close()


def test_with_checks_off_a_commitment_without_inner_steps_is_held(tmp_path, keyed):
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, checks=False)
    assert not runs_spot_checks(ag.ctx.cfg)
    mid = _announce(hub, member)
    ag.offer_commit(mid, _commit(member, inner=False))
    assert ag.commits.of(ROUND, mid) is not None
    ag.ctx.store.close()


def test_an_open_newcomer_without_inner_steps_is_refused(tmp_path, keyed):
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, checks=False, open_trainers=True)  # open trainers: checks on
    assert runs_spot_checks(ag.ctx.cfg)
    _announce(hub, member)
    newcomer = Identity.generate()
    nid = _announce(hub, newcomer)
    with pytest.raises(IntegrityError, match="carries no inner-step commitment"):
        ag.offer_commit(nid, _commit(newcomer, inner=False))
    assert ag.commits.of(ROUND, nid) is None and not ag.ctx.book.strikes[nid]
    commit_to(ag, newcomer, nid, _payload(nid), round=ROUND, base=BASE)  # with one on our terms: held
    assert ag.commits.of(ROUND, nid) is not None
    ag.ctx.store.close()


@pytest.mark.parametrize(("terms", "why"), [
    ({"params": 128}, "covers 128 parameters, the model has 64"),
    ({"steps": 5}, "names 5 steps, a round has at most 4"),
    ({"steps": 0}, "names no inner step"),
    ({"settings": b"\x01" * 32}, "other inner-step settings"),
])
def test_an_inner_commitment_on_other_terms_is_refused(tmp_path, keyed, terms, why):
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, checks=True)
    mid = _announce(hub, member)
    with pytest.raises(IntegrityError, match=why):
        ag.offer_commit(mid, _commit(member, **terms))
    assert ag.commits.of(ROUND, mid) is None and not ag.ctx.book.strikes[mid]
    ag.offer_commit(mid, _commit(member))  # the same trainer on our terms
    assert ag.commits.of(ROUND, mid) is not None
    ag.ctx.store.close()


def test_a_forged_inner_commitment_is_still_a_lie(tmp_path, keyed):
    """Only the terms are a trainer's configuration: another key's inner steps remain a strike."""
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, checks=True)
    mid = _announce(hub, member)
    digest = payload_digest(_payload(mid))
    other = inner_commitment(Identity.generate(), mid, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, payload=digest,
                             params=64, settings=SETTINGS)
    forged = make_commit(member, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND, base=BASE, trainer=mid,
                         payload=digest, spot=other)
    with pytest.raises(IntegrityError):
        ag.offer_commit(mid, encode_commit(forged))
    assert ag.ctx.book.strikes[mid] == 1
    assert ag.ctx.status.snapshot().trainer.loco_refused == {"bad_commitment": 1}
    ag.ctx.store.close()


def _trainer_cfg(tmp_path, **sets: object) -> TrainerConfig:
    me = Identity.generate()
    return TrainerConfig.model_validate({**tiny_overrides(str(tmp_path / "cache")), "data_dir": str(tmp_path / "me"),
                                         "chain": {"trusted_trainers": [me.public_key_hex], "open_trainers": True},
                                         **sets})


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_trainer_that_cannot_record_refuses_to_start_where_checks_run(tmp_path, monkeypatch, ranks):
    from pulse_node.chain.store import VersionStore
    from pulse_node.daemon.context import RoleContext
    from pulse_node.daemon.status import NodeStatus
    from pulse_node.net.wire.serving import store_resolver
    from pulse_node.trainer.role import TrainerRole

    cfg = _trainer_cfg(tmp_path, grpo={"bf16_compute": False})
    monkeypatch.setenv("WORLD_SIZE", str(ranks))
    me = Identity.generate()
    store = VersionStore(tmp_path / "me" / "store")
    ctx = RoleContext(cfg=cfg, identity=me, store=store, status=NodeStatus(role="trainer", peer_id=peer_id(me),
                                                                           run_id=cfg.run_id),
                      transport=MemoryHub().join(peer_id(me), store_resolver(store.root)))
    with pytest.raises(ConfigError, match="this swarm runs spot checks .*grpo.bf16_compute off.*Run each trainer with"):
        TrainerRole(ctx)  # before the model is built (the torchrun group: before any rank starts)
    store.close()
    assert recording_problem(cfg.model_copy(update={"chain": cfg.chain.model_copy(update={"open_trainers": False})})) \
        is None, "refused in a swarm without checks"
    assert recording_problem(_trainer_cfg(tmp_path)) is None, "a trainer on any number of processes records"


def test_join_and_swarm_refuse_a_trainer_that_cannot_record(tmp_path, monkeypatch, capsys):
    from pulse_node.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")  # every rank refuses, before anything starts
    code = main(["join", "--role", "trainer", "--data-dir", str(tmp_path / "d"), "--set", "loco.spot.keyed=true",
                 "--set", "grpo.bf16_compute=false"])
    assert code == 1 and "with grpo.bf16_compute off its inner steps are not recorded" in capsys.readouterr().err
    with pytest.raises(ValueError, match="this swarm runs spot checks"):
        SwarmConfig.model_validate({"trainer_ranks": [2], "chain": {"open_trainers": True}, "grpo": {"bf16_compute": False}})
    assert SwarmConfig.model_validate({"trainer_ranks": [2], "chain": {"open_trainers": True}}).trainer_ranks == [2]
