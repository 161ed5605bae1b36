"""Commit lists and check verdicts: the signed statements that close a round's commit phase (torch-free).

- ``CheckVerdict``: a drawn verifier's signed outcome of a spot check of ``target``'s round
  ``round`` (``trainer/spot_round.py``): passed, or failed with a reason, and for a mismatch the
  digest of the ``loco/spot_evidence.py`` evidence it pushed (any node re-checks it).
- ``CommitList``: the round's coordinator, once the commit phase closes, signs every round
  commitment it holds (``loco/roundcommit.py``, carried whole), which of their keys are members
  (root or admitted), and every verdict it holds that no earlier round's decision named. Nobody
  reveals a payload before a list is accepted, and a trainer refuses a list that leaves out a
  commitment or a verdict it held in time (``loco/roundrules.py``), keeping both statements.

Wire formats (1): the signed-statement envelope (``chain/statement.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated

import blake3
from pydantic import Field

from pulse_node.chain.identity import Identity
from pulse_node.chain.statement import U63, Digest32, Hex64, RunId, Signature, Statement
from pulse_node.loco.roundcommit import MAX_ROUNDCOMMIT_BYTES, RoundCommit, TrainerId, decode_commit, slot_conflict

LIST_MAGIC = "pulseloco/commit-list"
VERDICT_MAGIC = "pulseloco/check-verdict"
MAX_LISTED = 512
MAX_VERDICTS = 256
MAX_VERDICT_BYTES = 1024
MAX_LIST_BYTES = 8 << 20
REASONS = ("", "batch", "gradient", "weights", "payload", "link", "unanswered")


@dataclass(frozen=True)
class CheckVerdict:
    """``verifier``'s signed outcome of the check of ``target``'s round ``round``."""

    run_id: RunId
    epoch: Digest32
    round: U63
    target: TrainerId
    verifier: TrainerId
    passed: bool
    reason: Annotated[str, Field(max_length=16)]
    evidence: Annotated[bytes, Field(max_length=32)]  # digest of the spot evidence (a failed check on data)
    signer: Hex64
    signature: Signature

    @property
    def key(self) -> tuple[int, str, str]:
        return self.round, self.target, self.verifier


def _verdict_rules(v: CheckVerdict) -> Iterator[str]:
    if v.reason not in REASONS or (v.passed != (v.reason == "")):
        yield f"reason must be one of {REASONS}, empty exactly when the check passed"
    if v.target == v.verifier:
        yield "a trainer never checks itself"
    if len(v.evidence) not in (0, 32) or (bool(v.evidence) != (v.reason not in ("", "unanswered"))):
        yield "a failed check on the target's data names its evidence's 32-byte digest, nothing else does"


VERDICTS = Statement(CheckVerdict, magic=VERDICT_MAGIC, format=1, max_bytes=MAX_VERDICT_BYTES, max_str=128,
                     max_bin=64, max_array=16, rules=_verdict_rules)


def make_verdict(identity: Identity, *, run_id: str, epoch: bytes, round: int, target: str, verifier: str,
                 reason: str = "", evidence: bytes = b"") -> CheckVerdict:
    """Our signed verdict (``reason`` empty: passed)."""
    return VERDICTS.seal(identity, CheckVerdict(run_id, bytes(epoch), round, target, verifier, reason == "", reason,
                                                bytes(evidence), identity.public_key_hex, b""))


@dataclass(frozen=True)
class CommitList:
    """The commitments (and verdicts) round ``round`` counts, signed by its coordinator."""

    run_id: RunId
    epoch: Digest32
    round: U63
    base: Digest32
    coordinator: TrainerId
    commits: Annotated[tuple[Annotated[bytes, Field(max_length=MAX_ROUNDCOMMIT_BYTES)], ...],
                       Field(max_length=MAX_LISTED)]
    members: Annotated[tuple[TrainerId, ...], Field(max_length=MAX_LISTED)]
    verdicts: Annotated[tuple[Annotated[bytes, Field(max_length=MAX_VERDICT_BYTES)], ...],
                        Field(max_length=MAX_VERDICTS)]
    signer: Hex64
    signature: Signature

    def listed(self) -> dict[str, RoundCommit]:
        """trainer id -> its commitment as listed (decoded; signatures are the receiver's to check)."""
        return {c.trainer: c for c in map(decode_commit, self.commits)}

    def digest(self) -> bytes:
        return blake3.blake3(LISTS.encode(self)).digest()

    def checked(self) -> list[CheckVerdict]:
        return [VERDICTS.decode(v) for v in self.verdicts]


def _list_rules(lst: CommitList) -> Iterator[str]:
    try:
        trainers = [c.trainer for c in map(decode_commit, lst.commits)]
        verdicts = [VERDICTS.decode(v) for v in lst.verdicts]
    except Exception as exc:  # WireError from a nested statement: reported as a rule
        yield f"a listed statement is malformed: {exc}"
        return
    keys = [t.encode() for t in trainers]
    if any(a >= b for a, b in itertools.pairwise(keys)):
        yield "commitments must be sorted by trainer id without repeats"
    if not set(lst.members) <= set(trainers) | {v.target for v in verdicts}:
        yield "members must be listed trainers or checked targets"
    if len({v.key for v in verdicts}) != len(verdicts):
        yield "a verdict is listed twice"


LISTS = Statement(CommitList, magic=LIST_MAGIC, format=1, max_bytes=MAX_LIST_BYTES, max_str=128,
                  max_bin=MAX_ROUNDCOMMIT_BYTES, max_array=MAX_LISTED, rules=_list_rules)


def make_list(identity: Identity, *, run_id: str, epoch: bytes, round: int, base: bytes, coordinator: str,
              commits: Iterable[bytes], members: Iterable[str], verdicts: Iterable[bytes]) -> CommitList:
    """Our signed list of ``commits`` (encoded round commitments, any order)."""
    ordered = sorted(set(commits), key=lambda data: decode_commit(data).trainer.encode())
    lst = CommitList(run_id, bytes(epoch), round, bytes(base), coordinator, tuple(ordered),
                     tuple(sorted(set(members), key=str.encode)), tuple(sorted(set(verdicts))),
                     identity.public_key_hex, b"")
    return LISTS.seal(identity, lst)


def lists_conflict(first: bytes, second: bytes, run_id: str) -> tuple[str, int]:
    """(signer, round) if both are lists of ``run_id`` one key validly signed for one round of one
    chain (same epoch and base) that differ; ``IntegrityError`` / ``WireError`` otherwise."""
    return slot_conflict(LISTS.decode(first), LISTS.decode(second), run_id=run_id, statement=LISTS, what="list")
