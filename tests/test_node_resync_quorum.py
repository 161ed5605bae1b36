"""A trainer re-syncs only to a state a majority of the trainer set holds (``trainer/resync_quorum.py``).

A trainer of a three-member set (us, an honest member, a lying member) on an in-memory hub: the
liar's head for a version we published, with another state, is outvoted; the liar announcing and
serving a far version is not adopted; the honest member's newer state is.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import tiny_overrides
from test_node_resync_trust import RUN, _server

from pulse_node.chain.identity import Identity
from pulse_node.chain.record import encode_record, signing_bytes
from pulse_node.chain.store import VersionStore
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus
from pulse_node.net.wire.serving import store_resolver
from pulse_node.testing.adversaries import announce, peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.resync_quorum import majority

HONEST, LIAR = Identity.generate(), Identity.generate()


def test_majority_needs_more_than_half_and_two_voters_break_ties_by_peer_id():
    from pulse_node.chain.identity import peer_id_of_key

    a, b, c = (Identity.generate().public_key_hex for _ in range(3))
    assert majority({a: "h1", b: "h1", c: "h2"}) == "h1"
    assert majority({a: "h1", b: "h2", c: "h3"}) is None
    assert majority({a: "h1", b: "", c: ""}) is None, "members not holding the version were outvoted"
    assert majority({a: "h1"}) == "h1"
    assert majority({a: "ha", b: "hb"}) is None, "a tie between two others was broken"
    low = min((a, b), key=lambda k: peer_id_of_key(k).encode())
    want = {a: "ha", b: "hb"}[low]
    assert majority({a: "ha", b: "hb"}, me=a) == want == majority({b: "hb", a: "ha"}, me=b)


def _signed_by(ident, rec):
    """``rec`` signed by ``ident`` (what another member publishes for the same version)."""
    unsigned = dataclasses.replace(rec, signer=ident.public_key_hex)
    return dataclasses.replace(unsigned, signature=ident.sign(signing_bytes(unsigned)))


@pytest.fixture
def trio(tmp_path):
    from pulse_node.trainer.role import TrainerRole

    me, hub = Identity.generate(), MemoryHub()
    keys = [me.public_key_hex, HONEST.public_key_hex, LIAR.public_key_hex]
    cfg = TrainerConfig.model_validate({
        **tiny_overrides(str(tmp_path / "cache")), "data_dir": str(tmp_path / "me"), "eval_every": 0,
        "grpo": {"warmstart_steps": 0}, "chain": {"trusted_trainers": keys}})
    store = VersionStore(tmp_path / "me" / "store")
    ctx = RoleContext(cfg=cfg, identity=me, store=store, status=NodeStatus(role="trainer", peer_id=peer_id(me), run_id=RUN),
                      transport=hub.join(peer_id(me), store_resolver(store.root)))
    role = TrainerRole(ctx)
    for _ in range(4):
        role._publish()  # versions 0..3
    yield role, hub
    store.close()


def test_one_members_conflicting_head_is_outvoted_not_a_resync(trio, tmp_path):
    role, hub = trio
    ours = role.publisher.head
    honest = announce(hub, HONEST, lambda request: None, role="trainer", version=3)
    liar = announce(hub, LIAR, lambda request: None, role="trainer", version=3)
    other = dataclasses.replace(ours, state_hash="cd" * 32)
    from pulse_node.chain.record import chain_hash
    other = dataclasses.replace(other, chain_hash=chain_hash(parent_chain_hash=other.parent_chain_hash, version=3,
                                                             patch_digest=other.patch_digest, state_hash=other.state_hash))
    role._take_head(honest.peer_id, encode_record(_signed_by(HONEST, ours)))
    role._take_head(liar.peer_id, encode_record(_signed_by(LIAR, other)))
    role._check_agreement()
    assert role.version == 3 and not role.ctx.status.snapshot().trainer.resyncs, "re-synced on one member's head"


def test_a_far_version_one_member_serves_is_not_adopted_the_majoritys_is(trio, tmp_path):
    role, hub = trio

    def errors() -> str:
        return " ".join(e.message for e in role.ctx.status.snapshot().recent_errors)

    honest = _server(tmp_path, hub, HONEST, role, HONEST, version=5)
    role._take_head(honest.peer_id, encode_record(_signed_by(HONEST, role.publisher.head)))  # seen at 3
    far = _server(tmp_path, hub, LIAR, role, LIAR, version=10**12 - 1)
    assert not role._resync(far) and role.version == 3
    assert "past what the live trainer set signed" in errors()
    far = _server(tmp_path, hub, LIAR, role, LIAR, version=50)  # within the step: the quorum refuses it
    assert not role._resync(far) and role.version == 3 and "no majority" in errors()
    assert not role._resync(honest), "adopted with one of three members holding it"  # the liar serves no 5
    hub.records.pop(far.peer_id, None)  # the liar leaves: of the live members, the honest one holds it
    assert role._resync(honest) and role.version == 5
