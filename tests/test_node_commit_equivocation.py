"""Two different round commitments of one key for one round convict it (``trainer/commits.py``).

A key that signs two commitments for one (run, epoch, round, base) that differ has equivocated:
the second is refused, the pair is evidence (``chain/evidence.py`` kind ``commitment``) the peer
book convicts it with, a member or an open trainer alike, and any other node convicts it from the
evidence alone without blaming whoever relayed it. Two commitments of one round number on two
chains (a restart's new epoch, a re-sync's other base) convict nobody, and a trainer restarting
within a round it committed to sends its earlier commitment again rather than sign a second one.
"""

from __future__ import annotations

import pytest
from helpers import inner_commitment
from test_node_open_trainers import BASE, EPOCH, ROUND, _agreement, _announce, _payload

from pulse_node.chain.evidence import MAX_EVIDENCE_BYTES, decode_evidence
from pulse_node.chain.identity import Identity
from pulse_node.config import TrainerConfig
from pulse_node.errors import IntegrityError
from pulse_node.loco.decision import payload_digest
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.roundcommit import MAX_ROUNDCOMMIT_BYTES, encode_commit, make_commit
from pulse_node.net.wire.protocol import PUSH_CAPS, LocoPayloadRequest
from pulse_node.net.wire.serving import resolve
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Reported
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.vocab import DEFAULT_RUN_ID


def _commit(ident: Identity, value: float, *, epoch: bytes = EPOCH, base: bytes = BASE) -> bytes:
    """``ident``'s commitment to its payload of ``value`` (with an inner commitment: checks are on)."""
    pid = peer_id(ident)
    digest = payload_digest(_payload(pid, value))
    spot = inner_commitment(ident, pid, run_id=DEFAULT_RUN_ID, round=ROUND, base=base, payload=digest, params=64)
    return encode_commit(make_commit(ident, run_id=DEFAULT_RUN_ID, epoch=epoch, round=ROUND, base=base, trainer=pid,
                                     payload=digest, spot=spot))


@pytest.mark.parametrize("who", ["member", "open trainer"])
def test_two_commitments_of_one_key_for_one_round_convict_it_everywhere(tmp_path, who):
    hub, me, member = MemoryHub(), Identity.generate(), Identity.generate()
    keys = [me.public_key_hex, member.public_key_hex]
    ag = _agreement(tmp_path, hub, me, keys, open_trainers=True)
    relay = peer_id(member)
    _announce(hub, member)
    liar = member if who == "member" else Identity.generate()
    lid = _announce(hub, liar)
    ag.offer_commit(lid, _commit(liar, 1e-4))
    ag.offer_commit(relay, _commit(liar, 2e-4))  # the other one, relayed by a member
    book = ag.ctx.book
    assert book.convicted(liar.public_key_hex), "two commitments for one round convicted nobody"
    assert not ag.peers.may_contribute(lid) and not book.strikes[relay]
    (ev,) = book.convictions()
    assert (ev.kind, ev.at) == ("commitment", ROUND) and decode_evidence(ev.encode())[0] == "commitment"
    assert ag.ctx.status.snapshot().trainer.loco_refused == {"equivocation": 1}
    # gossiped: another node convicts it from the evidence alone; its reporter did not lie
    cfg = TrainerConfig.model_validate({"data_dir": str(tmp_path / "other"),
                                        "chain": {"trusted_trainers": keys, "open_trainers": True}})
    other = PeerBook.for_node(cfg)
    other.judge("reporter", Reported(evidence=ev.encode()))
    assert other.convicted(liar.public_key_hex) and not other.strikes["reporter"]
    ag.ctx.store.close()


@pytest.mark.parametrize("elsewhere", [{"epoch": b"\x0f" * 32}, {"base": b"\x02" * 32}])
def test_one_round_number_committed_on_two_chains_convicts_nobody(tmp_path, elsewhere):
    """A restart (another epoch) or a re-sync (another base) commits to a round number again."""
    hub, me, member = MemoryHub(), Identity.generate(), Identity.generate()
    keys = [me.public_key_hex, member.public_key_hex]
    ag = _agreement(tmp_path, hub, me, keys, open_trainers=True)
    mid = _announce(hub, member)
    ag.offer_commit(mid, _commit(member, 1e-4))
    ag.offer_commit(mid, _commit(member, 2e-4, **elsewhere))
    assert not ag.ctx.book.convictions() and ag.peers.is_member(mid)
    assert ag.ctx.status.snapshot().trainer.loco_refused == {"duplicate": 1}
    ag.ctx.store.close()


def test_evidence_holds_two_of_the_largest_commitments():
    assert MAX_EVIDENCE_BYTES >= 2 * MAX_ROUNDCOMMIT_BYTES + 256
    assert PUSH_CAPS["evidence"] >= MAX_EVIDENCE_BYTES


def test_a_trainer_restarting_within_a_round_it_committed_to_never_signs_a_second_commitment(tmp_path):
    """Its earlier commitment (kept on disk) is sent again; the payload made since is never revealed."""
    me, member = Identity.generate(), Identity.generate()
    keys, mine = [me.public_key_hex, member.public_key_hex], peer_id(me)
    first = _agreement(tmp_path, MemoryHub(), me, keys, open_trainers=True)
    first.open_round(LocoPayload(round=ROUND, trainer_id=mine, base_hash=BASE), _payload(mine, 1e-4))
    before = first.commits.of(ROUND, mine).data
    first.ctx.store.close()
    again = _agreement(tmp_path, MemoryHub(), me, keys, open_trainers=True)  # restarted: same data dir, same base
    other = _payload(mine, 2e-4)
    again.open_round(LocoPayload(round=ROUND, trainer_id=mine, base_hash=BASE), other)
    assert again.commits.of(ROUND, mine).data == before, "a second commitment for one round of one chain"
    o = again._open
    result = again.step()  # alone, with no payload of its own to decide on: the round closes without it
    served = resolve(again.root, LocoPayloadRequest(round=ROUND, digest=payload_digest(other).hex()))
    assert o.revealed and not o.mine and (served is None or not served.exists())
    assert result is not None and result.payloads is None
    again.ctx.store.close()


@pytest.mark.parametrize("elsewhere", [{"epoch": b"\x0f" * 32}, {"base": b"\x02" * 32}])
def test_a_commitment_on_another_state_is_refused_without_a_strike(tmp_path, elsewhere):
    """A member on another state (a fork, a restart, a re-sync under way) commits on its own base: we
    cannot hold it, but it is no lie, so neither the trainer nor an honest member relaying it is struck
    (strikes add up to a ban, which would keep an honest trainer out once it re-synced). A commitment
    signed by another key than its trainer's still is a strike on whoever sent it."""
    hub, me, member, other = MemoryHub(), Identity.generate(), Identity.generate(), Identity.generate()
    keys = [me.public_key_hex, member.public_key_hex, other.public_key_hex]
    ag = _agreement(tmp_path, hub, me, keys, open_trainers=True)
    mid, relay = _announce(hub, member), _announce(hub, other)
    with pytest.raises(IntegrityError, match="another state"):
        ag.offer_commit(mid, _commit(member, 1e-4, **elsewhere))
    with pytest.raises(IntegrityError, match="another state"):
        ag.offer_commit(relay, _commit(member, 1e-4, **elsewhere))
    book = ag.ctx.book
    assert not book.strikes[mid] and not book.strikes[relay] and ag.peers.may_contribute(mid)
    assert ag.ctx.status.snapshot().trainer.loco_refused == {"other_state": 2}
    assert ag.commits.of(ROUND, mid) is None  # not held: a decision on our base need not name it
    forged = make_commit(other, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND, base=b"\x02" * 32, trainer=mid,
                         payload=payload_digest(_payload(mid, 1e-4)))
    with pytest.raises(IntegrityError, match="not signed by the expected key"):
        ag.offer_commit(relay, encode_commit(forged))  # signed by another key: forged, a strike
    assert book.strikes[relay]
    ag.offer_commit(mid, _commit(member, 1e-4))  # its commitment on our state, once it re-synced, is held
    assert ag.commits.of(ROUND, mid) is not None
    ag.ctx.store.close()
