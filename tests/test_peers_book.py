"""The peer book is the one owner of judging peers (``peers/book.py``): each outcome, handed in as
a value, is recorded once in every ledger it concerns; a call's fault becomes a value in one place
(``ask``, ``outcome_of``); what it keeps per peer and per version stays bounded."""

from __future__ import annotations

import pytest
from test_node_members import RUN, _records

from pulse_node.chain import gate as gate_mod
from pulse_node.chain.identity import Identity
from pulse_node.errors import BusyError, IntegrityError, PeerUnavailable, WireError
from pulse_node.peers import strikes as strikes_mod
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Accepted, Busy, Delivered, Failed, Lied, Relayed, Reported, Unreached
from pulse_node.peers.strikes import Strikes
from pulse_node.peers.trainerset import TrainerSet


def _book(*idents: Identity) -> PeerBook:
    return PeerBook(TrainerSet(run_id=RUN, keys=[i.public_key_hex for i in idents]))


def test_each_outcome_is_recorded_once_in_every_ledger_it_concerns() -> None:
    book = _book(Identity.generate())
    marks = book.standing.marks
    book.judge("liar", Lied("forged"))
    assert book.strikes["liar"] == 1 and marks["liar"].strikes == 1 and book.rejected == 1
    book.judge("flaky", Failed("timeout"))
    assert book.ledger.failures["flaky"] == 1 and marks["flaky"].fail_streak == 1 and not book.strikes["flaky"]
    book.judge("flaky", Delivered())  # a delivery ends the streak everywhere
    assert "flaky" not in book.ledger.failures and marks["flaky"].fail_streak == 0 and marks["flaky"].delivered == 1
    book.judge("far", Unreached("push timed out"))  # demoted, never cooled down
    assert marks["far"].fail_streak == 1 and "far" not in book.ledger.failures
    book.judge("worker", Accepted(rollouts=8))
    book.judge("relay", Relayed())
    assert marks["worker"].accepted == 1 and marks["relay"].heads == 1
    assert book.known("flaky") and book.known("worker") and not book.known("relay") and not book.known("liar")


def test_a_fault_becomes_a_value_in_one_place() -> None:
    a, b = Identity.generate(), Identity.generate()
    book = _book(a, b)

    def raises(exc: Exception):
        def call() -> None:
            raise exc
        return call

    assert book.ask("p", lambda: 7, then=Delivered()) == 7 and book.standing.marks["p"].delivered == 1
    assert book.ask("q", lambda: None, then=Delivered()) is None and "q" not in book.standing.marks
    assert isinstance(book.ask("p", raises(IntegrityError("bad digest"))), Lied) and book.strikes["p"] == 1
    assert isinstance(book.ask("p", raises(PeerUnavailable("gone"))), Failed) and book.strikes["p"] == 1
    assert isinstance(book.ask("p", raises(WireError("garbage")), lies=(WireError,)), Lied) and book.strikes["p"] == 2
    busy = book.ask("p", raises(BusyError("making it")))
    assert isinstance(busy, Busy) and book.ledger.failures["p"] == 1  # the one Failed above, nothing more
    one, two = _records(a, [3], salt="a")[3], _records(a, [3], salt="b")[3]
    book.gate.verify(one)
    got = book.ask("relay", lambda: book.gate.verify(two))  # the relay told no lie: the signer is convicted
    assert isinstance(got, Reported) and book.convicted(a.public_key_hex) and not book.strikes["relay"]
    assert isinstance(book.ask("relay", lambda: book.gate.verify(_records(a, [4])[4])), Failed)
    assert not book.strikes["relay"] and a.public_key_hex not in book.signers()


def test_the_version_gate_keeps_votes_for_a_bounded_number_of_versions(monkeypatch) -> None:
    """``VersionGate._votes`` gains an entry per version checked; it never holds more than
    ``VOTED_CAP`` (issue 34, item 5), and an adopted version drops those below it."""
    monkeypatch.setattr(gate_mod, "VOTED_CAP", 8)
    a = Identity.generate()
    book = _book(a)
    records = _records(a, range(1, 41))
    for v in range(1, 41):
        assert book.gate.check(records[v])
        assert len(book.gate._votes) <= 8
    assert min(book.gate._votes) == 33
    book.gate.forget_below(38)
    assert sorted(book.gate._votes) == [38, 39, 40]


def test_strikes_remember_a_bounded_number_of_peers(monkeypatch) -> None:
    monkeypatch.setattr(strikes_mod, "MAX_TRACKED", 64)
    now = [0.0]
    ledger = Strikes(max_strikes=3, clock=lambda: now[0])
    book = PeerBook(TrainerSet(run_id=RUN), strikes=ledger)
    for _ in range(3):
        book.judge("banned", Lied())
    for i in range(1000):
        book.judge(f"sybil-{i}", Lied() if i % 2 else Failed())
    assert len(ledger.strikes) + len(ledger.failures) <= 64 + 1
    assert book.ignored("banned"), "a running ban was forgotten"


@pytest.mark.parametrize("evidence", [b"", b"\x93junk"])
def test_evidence_that_does_not_check_out_is_the_reporters_lie(evidence: bytes) -> None:
    book = _book(Identity.generate())
    assert isinstance(book.judge("reporter", Reported(evidence=evidence)), Lied)
    assert book.strikes["reporter"] == 1 and not book.convictions()
