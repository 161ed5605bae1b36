"""The trust defects of issue 32 (items 3-6), each as the scenario the issue found on fe579b4.

- Item 3, *grow the club*: admissions count only from the configured keys (or members within
  ``chain.admission_depth``), never from a convicted key, and fall with a convicted endorser;
  admitted keys, however many, never outvote the configured ones in the fork check and re-sync
  vote (``trainer/resync_quorum.py``).
- Item 4, *be believed alone*: with two members live, one member's signed version moves no node.
- Item 5, *replayed evidence*: statements of two chains (a restart, a resume, a re-sync) convict
  nobody, not even from a file an older rule kept.
- Item 6, *a dead member caps the survivors*: the version ceiling follows the live members.

The helpers below the imports are the only lines that speak the peer book's API.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import tiny_overrides

from pulse_node.chain.admission import Admission
from pulse_node.chain.evidence import encode_evidence
from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.record import chain_hash, encode_record, make_record, signing_bytes
from pulse_node.config import ChainConfig
from pulse_node.errors import IntegrityError
from pulse_node.loco.decision import encode_decision, make_decision
from pulse_node.loco.equivocation import decisions_conflict, evidence_checkers
from pulse_node.peers.book import PeerBook
from pulse_node.peers.evidence import EvidenceBook
from pulse_node.peers.outcomes import Fault, Reported
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub, announced
from pulse_node.vocab import DEFAULT_RUN_ID

RUN = DEFAULT_RUN_ID
CODEC = "pulsesync/compact/1"


# ---- the peer book's API ---------------------------------------------------------------------
def _book(*roots: Identity, **kw) -> PeerBook:
    return PeerBook(TrainerSet(run_id=RUN, keys=[i.public_key_hex for i in roots]), **kw)


def _check(book: PeerBook, rec, *, sender: str) -> None:
    """``rec`` through the book's version gate as ``sender`` sent it; ``IntegrityError`` if refused."""
    got = book.ask(sender, lambda: book.gate.verify(rec))
    if isinstance(got, Fault):
        raise IntegrityError(got.why)


def _quorum(book: PeerBook, rec, *, sender: str) -> bool:
    """Whether the node would apply ``rec`` now (enough members signed its version)."""
    return book.gate.check(rec)


def _report(book: PeerBook, evidence: bytes, *, sender: str) -> None:
    book.judge(sender, Reported(evidence=evidence))


def _convicted(book: PeerBook, ident: Identity) -> bool:
    return book.convicted(ident.public_key_hex)


def _genesis(ident: Identity, nonce: bytes):
    return make_record(ident, run_id=RUN, version=0, parent=None, state_hash="00" * 32, patch=None,
                       anchor_version=0, is_anchor=True, codec=CODEC, nonce=nonce)


# ---- records ----------------------------------------------------------------------------------
def _chain(ident: Identity, top: int, *, salt: str = "a", nonce: bytes = b"\1" * 16, start=None) -> dict:
    """``ident``'s records 1..``top`` on the genesis of ``nonce`` (or after ``start``), states salted."""
    base = start or _genesis(ident, nonce)
    out = {base.version: base}
    for v in range(base.version + 1, top + 1):
        out[v] = make_record(ident, run_id=RUN, version=v, parent=out[v - 1], state_hash=f"{salt}{v:063x}",
                             patch=b"%s%d" % (salt.encode(), v), anchor_version=0, is_anchor=False, codec=CODEC)
    return out


def _signed_by(ident: Identity, rec):
    """``rec`` (the same chain hash) signed by ``ident``: what another member publishes for it."""
    unsigned = dataclasses.replace(rec, signer=ident.public_key_hex)
    return dataclasses.replace(unsigned, signature=ident.sign(signing_bytes(unsigned)))


def _live(book: PeerBook, *idents: Identity, head: int = 0) -> None:
    """Discovery shows ``idents`` as the live trainers, announcing ``head``."""
    book.observe([announced(peer_id(i), PeerStatus(role="trainer", version=head, node_key=i.public_key_hex))
                  for i in idents])


A, B, C = (Identity.generate() for _ in range(3))


# ---- item 3: grow the club ------------------------------------------------------------------------
def _carrier(ident: Identity, adm: Admission):
    return announced(peer_id(ident), PeerStatus(role="trainer", node_key=ident.public_key_hex, admission=adm.encode()))


def test_admissions_come_from_the_configured_keys_never_a_convicted_one_and_fall_with_it():
    new, third, late = (Identity.generate() for _ in range(3))
    book = _book(A, B, C)  # quorum: 2 of 3
    book.observe([_carrier(new, Admission(RUN, new.public_key_hex).endorse(A).endorse(B))])
    assert book.is_member(new.public_key_hex)
    book.observe([_carrier(third, Admission(RUN, third.public_key_hex).endorse(A).endorse(new))])
    assert not book.is_member(third.public_key_hex), "an admitted key endorsed at depth 1"
    # A equivocates (two records on one parent) and is convicted: it endorses nothing from now on
    one = _chain(A, 3)
    two = _chain(A, 3, salt="b", start=one[2])
    _report(book, encode_evidence("head", encode_record(one[3]), encode_record(two[3])), sender="reporter")
    assert _convicted(book, A)
    book.observe([_carrier(late, Admission(RUN, late.public_key_hex).endorse(A).endorse(B))])
    assert not book.is_member(late.public_key_hex), "a convicted key endorsed a new member"
    assert not book.is_member(new.public_key_hex), "a member its convicted endorser admitted stayed"


@pytest.fixture
def crowd(tmp_path):
    """A trainer (root) at version 3, two honest roots and two colluding roots; the colluders
    (admission quorum 2) admitted four Sybil keys, all on the hub."""
    from pulse_node.chain.store import VersionStore
    from pulse_node.config import TrainerConfig
    from pulse_node.daemon.context import RoleContext
    from pulse_node.daemon.status import NodeStatus
    from pulse_node.net.wire.serving import store_resolver
    from pulse_node.trainer.role import TrainerRole

    me, hub = Identity.generate(), MemoryHub()
    honest, liars, sybils = [A, B], [Identity.generate() for _ in range(2)], [Identity.generate() for _ in range(4)]
    roots = [me, *honest, *liars]
    cfg = TrainerConfig.model_validate({
        **tiny_overrides(str(tmp_path / "cache")), "data_dir": str(tmp_path / "me"), "eval_every": 0,
        "grpo": {"warmstart_steps": 0},
        "chain": {"trusted_trainers": [i.public_key_hex for i in roots], "admission_quorum": 2}})
    store = VersionStore(tmp_path / "me" / "store")
    ctx = RoleContext(cfg=cfg, identity=me, store=store, status=NodeStatus(role="trainer", peer_id=peer_id(me), run_id=RUN),
                      transport=hub.join(peer_id(me), store_resolver(store.root)))
    role = TrainerRole(ctx)
    for _ in range(4):
        role._publish()  # versions 0..3
    for ident in (*honest, *liars, *sybils):
        adm = Admission(RUN, ident.public_key_hex).endorse(liars[0]).endorse(liars[1]) if ident in sybils else None
        hub.join(peer_id(ident), lambda request: None).publish(
            PeerStatus(role="trainer", version=3, node_key=ident.public_key_hex, admission=adm.encode() if adm else None))
    yield role, honest, liars + sybils
    store.close()


def test_a_sybil_key_majority_wins_neither_the_fork_check_nor_the_resync_vote(crowd):
    role, honest, crowd_ = crowd
    ours = role.publisher.head
    other = dataclasses.replace(ours, state_hash="cd" * 32)
    other = dataclasses.replace(other, chain_hash=chain_hash(parent_chain_hash=other.parent_chain_hash, version=3,
                                                             patch_digest=other.patch_digest, state_hash=other.state_hash))
    assert len(role._member_trainers()) == len(honest) + len(crowd_), "the Sybils were not admitted"
    for ident in honest:
        role._take_head(peer_id(ident), encode_record(_signed_by(ident, ours)))
    for ident in crowd_:
        role._take_head(peer_id(ident), encode_record(_signed_by(ident, other)))
    assert role._quorum_state(3) == ours.state_hash, "the re-sync vote went to the key majority"
    role._check_agreement()
    errors = " ".join(e.message for e in role.ctx.status.snapshot().recent_errors)
    assert "differs from the majority" not in errors and role.version == 3


# ---- item 4: be believed alone --------------------------------------------------------------------
def test_one_members_signed_version_moves_no_node_while_another_member_is_live():
    book = _book(A, B, min_signers=ChainConfig().min_signers)
    _live(book, A, B, head=2)
    ours = _chain(A, 2)
    fork = _chain(A, 3, salt="f", start=ours[2])[3]  # A alone signs a version B never signed
    for v in (1, 2):
        assert not _quorum(book, ours[v], sender="relay")
        assert _quorum(book, _signed_by(B, ours[v]), sender="relay"), "two members signed it"
    assert not _quorum(book, fork, sender="relay"), "one member's record was believed alone"
    _live(book, A, head=3)  # B left: a swarm with one trainer still runs
    assert _quorum(book, fork, sender="relay")


def test_a_genesis_one_member_signed_is_believed_once_a_quorum_extends_its_epoch():
    """A node joining long after genesis sees one member's genesis record (the genesis maker's; the
    others adopted it) and no anchor after it: two members' records of a later version name that
    genesis as their epoch, and vouch for it. A genesis of another epoch stays unbelieved."""
    book = _book(A, B)
    _live(book, A, B, head=3)
    ours = _chain(A, 3)
    assert not _quorum(book, ours[0], sender="relay"), "one member's genesis was believed alone"
    assert not _quorum(book, ours[3], sender="relay")
    assert _quorum(book, _signed_by(B, ours[3]), sender="relay")
    assert _quorum(book, ours[0], sender="relay"), "the genesis two members extend was not believed"
    assert not _quorum(book, _genesis(A, b"\7" * 16), sender="relay")


# ---- item 5: replayed evidence ------------------------------------------------------------------
def test_statements_of_two_chains_convict_nobody_even_from_a_file_an_older_rule_kept(tmp_path):
    first = _chain(A, 4, nonce=b"\1" * 16)  # `pulse-node swarm` ran ...
    second = _chain(A, 4, salt="b", nonce=b"\2" * 16)  # ... and restarted with the same key, a fresh store
    majority = _chain(B, 3, salt="d", start=_signed_by(B, first[2]))[3]  # B's version 3, not A's
    resumed = _chain(A, 4, salt="c", start=majority)  # A re-synced to it and went on
    book = _book(A, B)
    for rec in (*first.values(), second[3], resumed[3], second[4], resumed[4]):
        _check(book, rec, sender="relay")
    assert not _convicted(book, A) and not book.strikes["relay"]
    for other in (second[4], resumed[4]):
        _report(book, encode_evidence("head", encode_record(first[4]), encode_record(other)), sender="replayer")
    assert not _convicted(book, A), "a replayed record of another chain convicted an honest trainer"
    kw = {"run_id": RUN, "round": 4, "coordinator": peer_id(A), "contributors": {peer_id(A): b"\1" * 32}}
    old = encode_decision(make_decision(A, base=b"\3" * 32, epoch=b"\5" * 32, **kw))
    for other in (make_decision(A, base=b"\3" * 32, epoch=b"\6" * 32, **{**kw, "contributors": {peer_id(A): b"\2" * 32}}),
                  make_decision(A, base=b"\4" * 32, epoch=b"\5" * 32, **{**kw, "contributors": {peer_id(A): b"\2" * 32}})):
        with pytest.raises(IntegrityError, match="no conflict"):
            decisions_conflict(old, encode_decision(other), RUN)
    kept = tmp_path / "evidence"  # a conviction an older rule persisted: re-checked at start
    kept.mkdir()
    (kept / f"{A.public_key_hex}.ev").write_bytes(encode_evidence("head", encode_record(first[4]),
                                                                  encode_record(second[4])))
    assert A.public_key_hex not in EvidenceBook(run_id=RUN, directory=kept, checkers=evidence_checkers())


# ---- item 6: a dead member caps the survivors ---------------------------------------------------------
def test_a_dead_members_last_version_never_caps_the_survivor():
    book = _book(A, B, max_version_step=8)
    _live(book, A, B, head=10)
    ours = _chain(A, 10)
    for v in range(1, 11):
        _check(book, ours[v], sender="relay")
        _check(book, _signed_by(B, ours[v]), sender="relay")
    _live(book, A, head=80)  # B died at version 10: its record left discovery
    later = _chain(A, 80, start=ours[10])
    for v in range(11, 81):
        _check(book, later[v], sender="relay")
    assert not book.strikes["relay"]
