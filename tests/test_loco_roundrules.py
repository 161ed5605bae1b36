"""Round commitments and commit lists: signed, scoped to one round of one chain, and the list rules
(a list leaving out a commitment held in time is refused; a late one is not owed) (torch-free)."""

from __future__ import annotations

import pytest

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.errors import IntegrityError
from pulse_node.loco.commitlist import VERDICTS, CommitList, make_list, make_verdict
from pulse_node.loco.ledger import Ledger
from pulse_node.loco.roundcommit import (
    Expect,
    check_commit,
    commit_digest,
    commits_conflict,
    decode_commit,
    encode_commit,
    make_commit,
)
from pulse_node.loco.roundrules import Held, entered, list_problems

RUN, EPOCH, BASE = "run-a", b"\x01" * 32, b"\x02" * 32
KEYS = [Identity.generate() for _ in range(3)]
IDS = [peer_id_of_key(k.public_key_hex) for k in KEYS]


def commit(i: int, payload: bytes = b"p", *, round: int = 5, base: bytes = BASE) -> bytes:
    return encode_commit(make_commit(KEYS[i], run_id=RUN, epoch=EPOCH, round=round, base=base, trainer=IDS[i],
                                     payload=commit_digest(payload)))


def test_a_commitment_is_checked_against_its_key_and_round() -> None:
    expect = Expect(RUN, EPOCH, 5, BASE)
    c = decode_commit(commit(0))
    assert check_commit(c, key=KEYS[0].public_key_hex, expect=expect) is None  # carries no inner commitment
    with pytest.raises(IntegrityError):
        check_commit(c, key=KEYS[1].public_key_hex, expect=expect)
    with pytest.raises(IntegrityError):
        check_commit(decode_commit(commit(0, round=6)), key=KEYS[0].public_key_hex, expect=expect)
    with pytest.raises(IntegrityError):
        check_commit(decode_commit(commit(0, base=b"\x03" * 32)), key=KEYS[0].public_key_hex, expect=expect)
    with pytest.raises(IntegrityError):
        check_commit(c, key=KEYS[0].public_key_hex, expect=Expect(RUN, EPOCH, 5, BASE, spot_required=True))


def test_two_commitments_of_one_round_convict_but_not_across_bases() -> None:
    assert commits_conflict(commit(0, b"x"), commit(0, b"y"), RUN) == (KEYS[0].public_key_hex, 5)
    with pytest.raises(IntegrityError):
        commits_conflict(commit(0, b"x"), commit(0, b"x"), RUN)
    with pytest.raises(IntegrityError):  # a restart on another base: no conflict
        commits_conflict(commit(0, b"x"), commit(0, b"y", base=b"\x04" * 32), RUN)


def _problems(listed: list[int], held: dict[int, float], *, verdict_at: float | None = None) -> list[str]:
    verdict = make_verdict(KEYS[2], run_id=RUN, epoch=EPOCH, round=4, target=IDS[0], verifier=IDS[2])
    lst = make_list(KEYS[0], run_id=RUN, epoch=EPOCH, round=5, base=BASE, coordinator=IDS[0],
                    commits=[commit(i) for i in listed], members=[IDS[i] for i in listed], verdicts=[])
    commits = {IDS[i]: Held(commit_digest(commit(i)), at) for i, at in held.items()}
    verdicts = {} if verdict_at is None else {verdict.key: Held(b"", verdict_at)}
    out = list_problems(lst, commits=commits, verdicts=verdicts, is_member=lambda k: True,
                        convicted=lambda k: False, arrived=1.0, skew=0.5)
    return [p.message for p in out]


def test_a_list_must_name_every_commitment_held_in_time() -> None:
    assert _problems([0, 1, 2], {0: 0.0, 1: 0.0, 2: 0.0}) == []
    dropped = _problems([0, 1], {0: 0.0, 1: 0.0, 2: 0.0})
    assert len(dropped) == 1 and "leaves out the commitment" in dropped[0]
    assert _problems([0, 1], {0: 0.0, 1: 0.0, 2: 0.9}) == []  # arrived here within the skew: not owed
    assert "leaves out the verdict" in _problems([0, 1, 2], {0: 0.0}, verdict_at=0.0)[0]


def test_a_key_failing_a_check_the_list_names_enters_no_payload_that_round() -> None:
    """The failing verdict a list names keeps its target out of that round already (the ledger makes
    it owe a check only once the round is applied); a passing one does not."""
    def lst(passed: bool) -> CommitList:
        v = make_verdict(KEYS[2], run_id=RUN, epoch=EPOCH, round=4, target=IDS[1], verifier=IDS[2],
                         reason="" if passed else "unanswered")
        return make_list(KEYS[0], run_id=RUN, epoch=EPOCH, round=5, base=BASE, coordinator=IDS[0],
                         commits=[commit(0), commit(1)], members=IDS[:2], verdicts=[VERDICTS.encode(v)])

    assert entered(lst(True), Ledger()) == {IDS[0], IDS[1]}
    assert entered(lst(False), Ledger()) == {IDS[0]}
