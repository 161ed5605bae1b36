"""``chain.open_trainers``: any key announcing the trainer role may contribute payloads, never decide.

Agreements under real libp2p peer ids on one in-memory hub, stepped by hand, in a keyed trainer
set {me, member}: a fresh key's committed payload is taken (only with ``open_trainers``), is never
waited for nor in the coordinator order, and a decision names it as an open trainer; of many
newcomers only ``loco.trust.open_per_round`` enter a round, drawn by the ledger, sharing one
capped weight; a decision letting in another newcomer is refused; an open trainer's own node
never coordinates.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from helpers import commit_to, hub_agreement, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.errors import IntegrityError
from pulse_node.loco.decision import encode_decision, make_decision, payload_digest
from pulse_node.loco.ledger import Entry, RoundFacts
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.loco.roundcommit import commit_digest
from pulse_node.loco.roundrules import unrevealed
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.commits import MAX_OPEN
from pulse_node.trainer.decisions import coordinator_order
from pulse_node.vocab import DEFAULT_RUN_ID

SHAPES = {"w": (64,)}
BASE = b"\x01" * 32
ROUND = 3
EPOCH = b"\x0e" * 32
W = {"w": (np.random.default_rng(0).standard_normal(64) * 0.02).astype(np.float32)}


def _announce(hub: MemoryHub, ident: Identity) -> str:
    pid = peer_id(ident)
    hub.join(pid, lambda request: None).publish(PeerStatus(role="trainer", version=ROUND, node_key=ident.public_key_hex))
    return pid


def _agreement(tmp_path: Path, hub: MemoryHub, me: Identity, keys: list[str], *, open_trainers: bool,
               **loco: float) -> RoundAgreement:
    return hub_agreement(tmp_path, hub, me, {"loco": loco, "chain": {"trusted_trainers": keys, "open_trainers": open_trainers}},
                         round=ROUND, epoch=EPOCH, base=(BASE, W), shapes=SHAPES)


def _payload(trainer: str, value: float = 1e-4) -> bytes:
    p = LocoPayload(round=ROUND, trainer_id=trainer, base_hash=BASE, numel={"w": 64},
                    tensors={"w": (np.array([1, 5, 9], np.int64), np.array([value, -value, value], np.float32))})
    return encode_payload(p, base=W)


def _contribute(ag: RoundAgreement, ident: Identity, pid: str) -> bytes:
    data = _payload(pid)
    commit_to(ag, ident, pid, data, round=ROUND, base=BASE)
    ag.offer_payload(pid, data)
    return data


@pytest.fixture
def keyed(tmp_path):
    hub, me, member = MemoryHub(), Identity.generate(), Identity.generate()
    yield hub, me, member, [me.public_key_hex, member.public_key_hex]


@pytest.mark.parametrize("open_trainers", [False, True])
def test_an_open_trainer_contributes_only_when_enabled_and_is_never_waited_for(tmp_path, keyed, open_trainers):
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, open_trainers=open_trainers)
    _announce(hub, member)
    volunteer = Identity.generate()
    vid = _announce(hub, volunteer)
    if not open_trainers:
        with pytest.raises(IntegrityError, match="not a trusted trainer-set member"):
            _contribute(ag, volunteer, vid)
        return
    _contribute(ag, volunteer, vid)
    assert vid in ag.inbox[ROUND] and vid not in ag._live()
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(me), base_hash=BASE), _payload(peer_id(me)))
    assert vid not in ag._open.order, "an open trainer is in the coordinator order"
    d = ag._decide(ag._open, ag._live(), pull=False)
    assert vid in d.trainer_ids and d.open == (vid,)
    own = make_decision(volunteer, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=vid,
                        contributors={vid: payload_digest(_payload(vid))})
    with pytest.raises(IntegrityError, match="not a trusted trainer-set member"):  # it never decides
        ag.offer_decision(vid, encode_decision(own))
    ag.ctx.store.close()


def test_newcomers_enter_by_the_ledgers_draw_and_share_one_capped_weight(tmp_path, keyed):
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, open_trainers=True)
    _announce(hub, member)
    flood = {_announce(hub, k): k for k in (Identity.generate() for _ in range(5))}
    for pid, ident in flood.items():
        _contribute(ag, ident, pid)
    _contribute(ag, member, peer_id(member))
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(me), base_hash=BASE), _payload(peer_id(me)))
    d = ag._decide(ag._open, ag._live(), pull=False)
    ledger = ag.intake.ledger()
    drawn = ledger.entrants(flood)
    assert len(drawn) == ledger.cfg.open_per_round == 2 and set(d.open) == drawn
    assert set(d.commitments) == {*flood, peer_id(me), peer_id(member)}, "every commitment is named"
    weights = ledger.weights(d.trainer_ids, members={peer_id(me), peer_id(member)})
    assert weights[peer_id(me)] == weights[peer_id(member)] == 1.0
    assert sum(weights[k] for k in drawn) == pytest.approx(ledger.cfg.newcomer_weight)  # 1 or 1,000: one weight
    # a member's decision letting in a newcomer the draw did not pick is refused here
    other = next(k for k in flood if k not in drawn)
    held = {k: ag.commits.of(ROUND, k) for k in (*flood, peer_id(me), peer_id(member))}
    contributors = {k: payload_digest(_payload(k)) for k in (*drawn, other, peer_id(me), peer_id(member))}
    bad = make_decision(member, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=peer_id(member),
                        contributors=contributors, committed={k: commit_digest(h.data) for k, h in held.items()},
                        open=[*drawn, other])
    with pytest.raises(IntegrityError, match="does not let in"):
        ag.offer_decision(peer_id(member), encode_decision(bad))
    ag.ctx.store.close()


def test_an_open_trainers_own_node_never_coordinates(tmp_path, keyed):
    hub, _me, member, keys = keyed
    volunteer = Identity.generate()
    ag = _agreement(tmp_path, hub, volunteer, keys, open_trainers=True)  # our key is in no trainer set
    _announce(hub, member)
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(volunteer), base_hash=BASE), _payload(peer_id(volunteer)))
    assert ag._open.order == [peer_id(member)] and not ag.peers.i_am_member()
    ag._open.t0 -= 1e6  # long past every deadline: still not our turn
    assert not ag._my_turn(ROUND, ag._open.order, {}, ag._open.t0, 0.0)
    ag.ctx.store.close()


def test_a_silent_open_committer_holds_a_round_only_its_short_reveal_window(tmp_path):
    """An open trainer drawn into a round that commits and never reveals: the coordinator decides
    ``open_wait_s`` after the members' payloads are in (not at ``deadline_s``), the decision names
    its commitment but not its payload, and the ledger counts it unrevealed, which costs it weight."""
    hub, member = MemoryHub(), Identity.generate()
    me = next(k for k in iter(Identity.generate, None)  # we coordinate the round
              if coordinator_order(DEFAULT_RUN_ID, ROUND, [peer_id(k), peer_id(member)])[0] == peer_id(k))
    ag = _agreement(tmp_path, hub, me, [me.public_key_hex, member.public_key_hex], open_trainers=True,
                    deadline_s=60.0, open_wait_s=0.5)
    _announce(hub, member)
    silent = Identity.generate()
    sid = _announce(hub, silent)
    commit_to(ag, silent, sid, _payload(sid), round=ROUND, base=BASE)  # committed, never revealed
    _contribute(ag, member, peer_id(member))
    t0 = time.monotonic()
    ag.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(me), base_hash=BASE), _payload(peer_id(me)))
    result = wait_for(ag.step, timeout=30, what="the round to close")
    assert 0.5 <= time.monotonic() - t0 < 5.0, "the round waited for the silent committer past its reveal window"
    d = result.decision
    assert sid in d.commitments and d.trainer_ids == sorted([peer_id(me), peer_id(member)])
    ledger = ag.intake.ledger()
    silent_ones = unrevealed(d.commitments, contributors=d.trainer_ids, members=set(d.trainer_ids), ledger=ledger)
    assert silent_ones == (sid,)
    ledger.entries[sid] = Entry(first_round=0, last_round=0, passed=ledger.cfg.earn_checks)  # it had earned full weight
    ledger.record(RoundFacts(ROUND, unrevealed=silent_ones))
    assert ledger.entries[sid].unrevealed == 1 and ledger.earned(sid) < 1.0, "a silent commitment cost nothing"
    ag.ctx.store.close()


def test_a_flood_of_fresh_keys_crowds_out_no_earned_trainer_and_members_hold_the_same_commitments(tmp_path, keyed):
    """An open trainer that earned weight, and 2 x ``MAX_OPEN`` fresh keys committing to the round,
    the flood first: members keep the open trainers' commitments the ledger ranks first (earned
    ones, then newcomers in the entry draw's order), not the first to arrive. So the earned trainer
    is held, and two members each sent the flood in another order (one half first, or the other)
    hold the same commitments: no coordinator's decision leaves out what another member holds."""
    hub, me, member, keys = keyed
    a = _agreement(tmp_path / "a", hub, me, keys, open_trainers=True)
    b = _agreement(tmp_path / "b", hub, member, keys, open_trainers=True)
    earned, flood = Identity.generate(), [Identity.generate() for _ in range(2 * MAX_OPEN)]
    for ag in (a, b):
        ag.intake.ledger().entries[peer_id(earned)] = Entry(0, 0, passed=ag.intake.ledger().cfg.newcomer_checks)
    ids = {_announce(hub, k): k for k in (earned, *flood)}
    for ag, order in ((a, flood), (b, flood[MAX_OPEN:] + flood[:MAX_OPEN])):
        for k in (*order, earned):
            commit_to(ag, k, peer_id(k), _payload(peer_id(k)), round=ROUND, base=BASE)
    held_a, held_b = set(a.commits.round(ROUND)), set(b.commits.round(ROUND))
    assert peer_id(earned) in held_a, "a flood of fresh keys crowded out a trainer that earned weight"
    assert len(held_a) == MAX_OPEN and held_a == held_b, "the order of a flood decides what a member holds"
    ledger = a.intake.ledger()
    assert held_a - {peer_id(earned)} == set(sorted(set(ids) - {peer_id(earned)}, key=ledger.rank)[:MAX_OPEN - 1])
    b.ctx.store.close()
    a.open_round(LocoPayload(round=ROUND, trainer_id=peer_id(me), base_hash=BASE), _payload(peer_id(me)))
    a._open.closed = time.monotonic() - 1  # our commit phase is over: a late better-ranked key displaces nobody
    late = next(k for k in iter(Identity.generate, None) if ledger.rank(peer_id(k)) < min(map(ledger.rank, held_a)))
    _announce(hub, late)
    commit_to(a, late, peer_id(late), _payload(peer_id(late)), round=ROUND, base=BASE)
    assert set(a.commits.round(ROUND)) == held_a | {peer_id(me)}
    a.table.open = None  # closed here and decided: still nobody displaced
    a.table.decisions[ROUND] = make_decision(me, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH,
                                             coordinator=peer_id(me), contributors={peer_id(me): b"\x03" * 32})
    commit_to(a, late, peer_id(late), _payload(peer_id(late)), round=ROUND, base=BASE)
    assert set(a.commits.round(ROUND)) == held_a | {peer_id(me)}
    a.ctx.store.close()


def test_fresh_keys_park_no_payloads_and_get_none_decoded_without_a_commitment(tmp_path, keyed):
    """Payloads cost memory (up to the model's cap each) and a decode against our base: an open
    trainer's is decoded and kept only once its commitment is held (at most ``MAX_OPEN`` a round,
    ``trainer/commits.py``); without one, or of a coming round, it is dropped (a decided one is
    fetched). So 1 or 1,000 fresh keys pushing payloads hold nothing here. A member's payload of a
    coming round is still parked."""
    hub, me, member, keys = keyed
    ag = _agreement(tmp_path, hub, me, keys, open_trainers=True)
    _announce(hub, member)
    flood = {_announce(hub, k): k for k in (Identity.generate() for _ in range(8))}
    for pid in flood:
        ag.offer_payload(pid, _payload(pid))  # no commitment: nothing decoded, nothing held
        ahead = LocoPayload(round=ROUND + 1, trainer_id=pid, base_hash=BASE, numel={"w": 64},
                            tensors={"w": (np.array([1], np.int64), np.array([1e-4], np.float32))})
        ag.offer_payload(pid, encode_payload(ahead, base=W))
    assert not ag.payloads.unbacked.get(ROUND) and not ag.payloads.pending.get(ROUND + 1), \
        "fresh keys' payloads held without a commitment"
    ahead = LocoPayload(round=ROUND + 1, trainer_id=peer_id(member), base_hash=BASE)
    ag.offer_payload(peer_id(member), encode_payload(ahead))
    assert set(ag.payloads.pending[ROUND + 1]) == {peer_id(member)}
    pid, ident = next(iter(flood.items()))
    _contribute(ag, ident, pid)  # committed: taken
    assert pid in ag.inbox[ROUND]
    ag.ctx.store.close()
