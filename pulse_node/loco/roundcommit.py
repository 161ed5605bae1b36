"""Round commitments: a trainer binds its payload (and its inner-step commitment) before anyone reveals (torch-free).

Commit-reveal (``trainer/commits.py``): in round ``r`` every trainer first pushes a signed
``RoundCommit`` naming the BLAKE3 digest of the payload it will reveal and carrying its
inner-step commitment (``loco/commit.py``: what the payload was made from, for spot checks).
Nobody reveals a payload before the round's commitments are fixed by a signed ``CommitList``
(``loco/commitlist.py``), so no payload can be crafted after seeing an honest one. A commitment
names the run, the epoch (the genesis chain hash of the chain the round extends), the round and
its base (the outer state hash), so one of another life of the swarm, another round or another
state means nothing here.

``check_commit`` is what a receiver checks before keeping one: ``check_signed`` (signature by the
key the trainer's peer id encodes; run, round; the inner commitment's signature; epoch and base,
whose mismatch is ``OtherState``: a trainer on another state, not a forger)
and ``check_terms`` (with spot checks on, an inner commitment must be there; its header: this
run, round, base, payload, model size, steps, and our inner-step settings). Two different commitments
one key signed for one (epoch, round, base) are equivocation evidence (``commits_conflict``).

Wire format (``ROUNDCOMMIT_FORMAT`` 1): the signed-statement envelope (``chain/statement.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Annotated, Any

import blake3
from pydantic import Field

from pulse_node.chain.identity import Identity
from pulse_node.chain.statement import U63, Digest32, Hex64, RunId, Signature, Statement
from pulse_node.errors import IntegrityError
from pulse_node.loco.commit import MAX_COMMIT_BYTES, InnerCommitment, check_header, decode_commitment, verify_commitment
from pulse_node.loco.payload import MAX_TRAINER_ID

ROUNDCOMMIT_MAGIC = "pulseloco/round-commit"
ROUNDCOMMIT_FORMAT = 1
MAX_ROUNDCOMMIT_BYTES = MAX_COMMIT_BYTES + 1024

TrainerId = Annotated[str, Field(min_length=1, max_length=MAX_TRAINER_ID)]


@dataclass(frozen=True)
class RoundCommit:
    """``trainer`` commits to the payload of digest ``payload`` for ``round`` on ``base`` in ``epoch``."""

    run_id: RunId
    epoch: Digest32
    round: U63
    base: Digest32
    trainer: TrainerId
    payload: Digest32
    spot: Annotated[bytes, Field(max_length=MAX_COMMIT_BYTES)]  # the encoded inner commitment (empty: none)
    signer: Hex64
    signature: Signature


COMMITS = Statement(RoundCommit, magic=ROUNDCOMMIT_MAGIC, format=ROUNDCOMMIT_FORMAT, max_bytes=MAX_ROUNDCOMMIT_BYTES,
                    max_str=MAX_TRAINER_ID, max_bin=MAX_COMMIT_BYTES, max_array=16)


def make_commit(identity: Identity, *, run_id: str, epoch: bytes, round: int, base: bytes, trainer: str,
                payload: bytes, spot: bytes = b"") -> RoundCommit:
    """Our signed commitment (``payload``: the digest of the payload bytes; ``spot``: our encoded inner commitment)."""
    return COMMITS.seal(identity, RoundCommit(run_id, bytes(epoch), round, bytes(base), trainer, bytes(payload),
                                              bytes(spot), identity.public_key_hex, b""))


def encode_commit(c: RoundCommit) -> bytes:
    return COMMITS.encode(c)


def decode_commit(data: bytes) -> RoundCommit:
    """Hostile bytes -> a commitment; ``WireError`` if malformed (no signature check)."""
    return COMMITS.decode(data)


def commit_digest(data: bytes) -> bytes:
    """What a list names a commitment by: BLAKE3 of its encoded bytes."""
    return blake3.blake3(data).digest()


class OtherState(IntegrityError):
    """A commitment validly signed for this round, on another epoch or base: its trainer is on another
    state (a fork, a restart, a re-sync under way). Not ours to hold, and no lie: nobody is struck."""


@dataclass(frozen=True)
class Expect:
    """What a receiver expects of this round's commitments."""

    run_id: str
    epoch: bytes
    round: int
    base: bytes
    params: int = 0  # the model's size (0: the inner commitment is not checked)
    inner_steps: int = 0
    settings: bytes | None = None  # our inner-step settings' digest (None: not compared)
    spot_required: bool = False


def check_commit(c: RoundCommit, *, key: str, expect: Expect) -> InnerCommitment | None:
    """``IntegrityError`` unless ``c`` is ``key``'s valid commitment for the round ``expect`` names
    (``check_signed``) on ``expect``'s terms (``check_terms``); its inner commitment (None if it
    carries none)."""
    inner = check_signed(c, key=key, expect=expect)
    check_terms(c, inner, expect=expect)
    return inner


def check_signed(c: RoundCommit, *, key: str, expect: Expect) -> InnerCommitment | None:
    """``IntegrityError`` unless ``c`` is ``key``'s validly signed commitment for the round ``expect``
    names, and its inner commitment (if any) ``key``'s for the same trainer: what fails here was
    forged or damaged. Its inner commitment (None if it carries none)."""
    COMMITS.verify(c, signer_key=key, tag=f"round {c.round} commitment of {c.trainer[:12]}")
    if (c.run_id, c.round) != (expect.run_id, expect.round):
        raise IntegrityError(f"commitment of {c.trainer[:12]} is for {c.run_id} round {c.round}, not this round")
    if (c.epoch, c.base) != (expect.epoch, expect.base):
        raise OtherState(f"round {c.round} commitment of {c.trainer[:12]} is on another state (epoch "
                         f"{c.epoch.hex()[:8]}, base {c.base.hex()[:8]}): its trainer forked or re-synced")
    if not c.spot:
        return None
    inner = decode_commitment(c.spot)
    verify_commitment(inner, signer_key=key)
    if inner.trainer != c.trainer:
        raise IntegrityError(f"round {c.round} commitment of {c.trainer[:12]} carries another trainer's steps")
    return inner


def check_terms(c: RoundCommit, inner: InnerCommitment | None, *, expect: Expect) -> None:
    """``IntegrityError`` unless ``c``'s inner commitment ``inner`` is one this round's spot checks
    can draw on: present if ``expect.spot_required`` (then naming a step at least: a draw skips a
    commitment of none), and with ``expect.params`` its header (``check_header``: this run,
    round, base, payload, model size, at most ``inner_steps`` steps, our settings). What fails
    here is what a trainer configured otherwise sends: refused, never a lie."""
    if inner is None:
        if expect.spot_required:
            raise IntegrityError(f"round {c.round} commitment of {c.trainer[:12]} carries no inner-step commitment, "
                                 "and this swarm runs spot checks (chain.open_trainers or loco.spot.keyed)")
        return
    if expect.spot_required and not inner.steps:
        raise IntegrityError(f"round {c.round} commitment of {c.trainer[:12]} names no inner step: nothing to check")
    if expect.params:
        check_header(inner, run_id=expect.run_id, round=expect.round, base=expect.base, payload=c.payload,
                     params=expect.params, inner_steps=expect.inner_steps, settings=expect.settings)


def commits_conflict(first: bytes, second: bytes, run_id: str) -> tuple[str, int]:
    """(signer, round) if both are commitments of ``run_id`` one key validly signed for one round of
    one chain (same epoch and base) that differ; ``IntegrityError`` / ``WireError`` otherwise."""
    a, b = decode_commit(first), decode_commit(second)
    return slot_conflict(a, b, run_id=run_id, statement=COMMITS, what="commitment")


def slot_conflict(a: Any, b: Any, *, run_id: str, statement: Statement[Any], what: str) -> tuple[str, int]:
    """(signer, round) if ``a`` and ``b`` (decoded round statements: a commitment, a commit list) are
    one key's, validly signed, for one round of one chain of ``run_id``, and differ but for their
    signature; ``IntegrityError`` otherwise."""
    if (a.signer, a.round, a.epoch, a.base) != (b.signer, b.round, b.epoch, b.base):
        raise IntegrityError(f"the two {what}s are not one key's for one round of one chain")
    if replace(a, signature=b"") == replace(b, signature=b""):
        raise IntegrityError(f"the two {what}s of round {a.round} agree: no conflict")
    for x in (a, b):
        if x.run_id != run_id:
            raise IntegrityError(f"round {x.round} {what} is for run {x.run_id!r}")
        statement.verify(x, signer_key=a.signer)
    return a.signer, a.round


def problems(c: RoundCommit) -> Iterator[str]:
    """What is wrong with ``c``'s fields (nothing if valid)."""
    return COMMITS.problems(c)
