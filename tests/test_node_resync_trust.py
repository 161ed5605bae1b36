"""A trainer cannot be rolled back nor have its store wiped by a peer: re-sync adopts only a state
that a trainer-set member signed for this run, served by a member, no older than its own; a
pushed head counts only if its sender signed it and is a member.

The attack of issue 13: a peer with a fresh key and a lower peer id pushes a head record claiming
another state at a version the trainer published, then serves a genuine but older trainer state
(copied from a real trainer). Before, the trainer re-synced to it and wiped its store.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import tiny_overrides

from pulse_node.chain.identity import Identity
from pulse_node.chain.layout import store_path
from pulse_node.chain.record import encode_record, make_record
from pulse_node.chain.store import VersionStore
from pulse_node.codec.statehash import state_hash
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus
from pulse_node.errors import IntegrityError
from pulse_node.net.wire.serving import store_resolver
from pulse_node.testing.adversaries import announce, peer_id
from pulse_node.testing.faults import ForgedChain
from pulse_node.testing.memory import MemoryHub
from pulse_node.torchbits import module_state
from pulse_node.trainer.state import export_trainer_state
from pulse_node.vocab import DEFAULT_RUN_ID

RUN = DEFAULT_RUN_ID
HONEST = Identity.generate()  # another member of the trainer set


def _me_and_rogue() -> tuple[Identity, Identity]:
    """Our identity and a rogue's whose peer id sorts lower (it would be the one we converge on)."""
    me = Identity.generate()
    while True:
        rogue = Identity.generate()
        if peer_id(rogue).encode() < peer_id(me).encode():
            return me, rogue


@pytest.fixture
def trainer(tmp_path):
    from pulse_node.trainer.role import TrainerRole

    me, rogue = _me_and_rogue()
    hub = MemoryHub()
    cfg = TrainerConfig.model_validate({
        **tiny_overrides(str(tmp_path / "cache")), "data_dir": str(tmp_path / "me"), "eval_every": 0,
        "grpo": {"warmstart_steps": 0}, "chain": {"trusted_trainers": [me.public_key_hex, HONEST.public_key_hex]}})
    store = VersionStore(tmp_path / "me" / "store")
    ctx = RoleContext(cfg=cfg, identity=me, store=store, status=NodeStatus(role="trainer", peer_id=peer_id(me), run_id=RUN),
                      transport=hub.join(peer_id(me), store_resolver(store.root)))
    role = TrainerRole(ctx)
    for _ in range(4):
        role._publish()  # versions 0..3 in our store (each publish announces us on the hub)
    yield role, hub, rogue
    store.close()


def _state_file(role, root: Path, signer: Identity, *, version: int, run_id: str = RUN,
                digest: str | None = None) -> None:
    """A trainer-state file of ``version`` with our own weights, its record signed by ``signer``
    (naming ``digest`` as its state hash, by default the weights' own)."""
    digest = digest or state_hash(module_state(role.global_params.items()))
    parent = dataclasses.replace(ForgedChain(run_id, signer).record(1), version=version - 1)
    record = make_record(signer, run_id=run_id, version=version, parent=parent, state_hash=digest, patch=b"p",
                         anchor_version=0, is_anchor=False, codec="pulsesync/compact/1",
                         rollout_settings=role.publisher.rollout_settings)  # what an honest member declares
    export_trainer_state(root, params=role.global_params, momentum=role.outer.momentum, record=record,
                         ledger=role.outer.ledger)
    path = store_path(root, "record", version)  # served like a trainer's store serves its records
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_record(record))


def _server(tmp_path: Path, hub, ident: Identity, role, signer: Identity, *, version: int, run_id: str = RUN,
            node_key: str | None = None, digest: str | None = None):
    root = tmp_path / f"srv-{peer_id(ident)[-6:]}-{version}-{run_id}"
    _state_file(role, root, signer, version=version, run_id=run_id, digest=digest)
    return announce(hub, ident, store_resolver(root), role="trainer", version=version, node_key=node_key)


def test_forged_lower_id_head_neither_rolls_back_nor_wipes_the_store(trainer, tmp_path) -> None:
    role, hub, rogue = trainer
    rogue_peer = _server(tmp_path, hub, rogue, role, HONEST, version=1)  # a genuine, older state
    ours = role.publisher.head
    forged_head = dataclasses.replace(ours, state_hash="cd" * 32)  # "I hold another state at your version"
    hub.join(peer_id(rogue), store_resolver(tmp_path)).push(
        next(p for p in hub.records.values() if p.peer_id == role.ctx.transport.peer_id), "head",
        encode_record(forged_head), timeout=1.0)
    role._drain_events()
    role._check_agreement()
    assert role.version == 3 and role.ctx.store.versions() == [0, 1, 2, 3], "rolled back or wiped"
    assert not role.ctx.status.snapshot().trainer.resyncs
    assert not role._resync(rogue_peer), "adopted a state from a peer outside the trainer set"
    assert role.version == 3 and role.ctx.store.versions() == [0, 1, 2, 3]


@pytest.mark.parametrize("case", ["older", "other_run", "signed_by_stranger", "stolen_key"])
def test_resync_refuses_any_state_not_newer_signed_by_a_member_of_this_run(trainer, tmp_path, case) -> None:
    role, hub, rogue = trainer
    if case == "stolen_key":  # a peer announcing the member's key under its own peer id
        peer = _server(tmp_path, hub, rogue, role, HONEST, version=5, node_key=HONEST.public_key_hex)
    else:
        version, run_id, signer = {"older": (2, RUN, HONEST), "other_run": (5, "elsewhere", HONEST),
                                   "signed_by_stranger": (5, RUN, rogue)}[case]
        peer = _server(tmp_path, hub, HONEST, role, signer, version=version, run_id=run_id)
    assert not role._resync(peer)
    assert role.version == 3 and role.ctx.store.versions() == [0, 1, 2, 3]
    errors = " ".join(e.message for e in role.ctx.status.snapshot().recent_errors)
    assert {"older": "older than ours", "other_run": "run 'elsewhere'", "signed_by_stranger": "not a trusted",
            "stolen_key": "not a member"}[case] in errors


def test_resync_refuses_weights_that_are_not_the_signed_state(trainer, tmp_path) -> None:
    """A member signed version 5 as another state than the file's weights: the trust gate's one
    hash of the state (``VersionGate.admit``) refuses it before anything of ours is touched."""
    role, hub, _ = trainer
    peer = _server(tmp_path, hub, HONEST, role, HONEST, version=5, digest="ab" * 32)
    assert not role._resync(peer)
    assert role.version == 3 and role.ctx.store.versions() == [0, 1, 2, 3]
    assert "record says" in " ".join(e.message for e in role.ctx.status.snapshot().recent_errors)


def test_a_member_state_newer_than_ours_is_adopted(trainer, tmp_path) -> None:
    role, hub, _ = trainer
    peer = _server(tmp_path, hub, HONEST, role, HONEST, version=5)
    assert role._resync(peer) and role.version == 5


def test_pushed_heads_count_only_when_signed_by_their_member_sender(trainer) -> None:
    role, hub, rogue = trainer
    honest_id = announce(hub, HONEST, lambda request: None, role="trainer").peer_id
    genuine = ForgedChain(RUN, HONEST).record(3)
    for sender, rec in ((peer_id(rogue), genuine),                              # replayed by another peer
                        (peer_id(rogue), ForgedChain(RUN, rogue).record(3)),    # signed by a non-member
                        (honest_id, ForgedChain("elsewhere", HONEST).record(3))):  # another run
        with pytest.raises(IntegrityError):
            role._take_head(sender, encode_record(rec))
    assert not role.peer_heads
    role._take_head(honest_id, encode_record(genuine))
    assert role.peer_heads == {3: {HONEST.public_key_hex: genuine.state_hash}}  # the signer's ballot
