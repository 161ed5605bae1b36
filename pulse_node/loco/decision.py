"""Round decisions: the signed list of payloads that make up one PULSELoCo round (torch-free).

The coordinator of round ``r`` (see ``trainer/agreement.py``) lists the payloads it holds, each as
(trainer id, BLAKE3 digest of the encoded payload bytes), and every round commitment it holds
(``loco/roundcommit.py``: trainer id, BLAKE3 digest of the signed commitment), revealed or not,
and signs both with its Ed25519 node key. Every trainer then averages exactly those payloads, so
all end the round bit-identical, and refuses a decision that leaves out a commitment it held in
time (``trainer/decisions.py``).

It also names the spot-check verdicts it holds (``loco/commitlist.py`` ``CheckVerdict``, each
signed by its verifier, checks of the last rounds) and the keys their evidence convicts
(``trainer/spot_round.py``), which the trust ledger then applies on every trainer alike.

Wire format (``DECISION_FORMAT`` 6): the signed-statement envelope (``chain/statement.py``) of a
``RoundDecision``, each field declared there with its bounds: ``contributors`` is
``[[trainer_id, digest], ...]`` sorted by the trainer ids' UTF-8 bytes without repeats
(1..``MAX_CONTRIBUTORS`` entries), ``committed`` likewise (0..``MAX_CONTRIBUTORS``, naming
every contributor), ``open`` the contributors that are open trainers (``chain.open_trainers``), ``verdicts`` the
encoded verdicts (0..``MAX_DECISION_VERDICTS``), ``convicted`` keys named as the target or the
verifier of a failed verdict carrying evidence,
``base`` the 32-byte outer state hash the round starts from and
``epoch`` the 32-byte chain hash of the genesis of the chain the round extends
(``chain/record.py``): a decision is taken only in its own epoch, so one signed in an earlier run
(same run id, same keys, same genesis state) means nothing in a later one. ``decode_decision``
treats its input as hostile (``WireError``); ``verify_decision`` checks signer and signature
(``IntegrityError``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated

import blake3
from pydantic import Field

from pulse_node.chain.identity import Identity
from pulse_node.chain.statement import U63, Digest32, Hex64, RunId, Signature, Statement
from pulse_node.loco.payload import MAX_TRAINER_ID

DECISION_MAGIC = "pulseloco/decision"
DECISION_FORMAT = 6  # 6: a failed verdict it names keeps its target out of the round (loco/verdicts.failing)
MAX_DECISION_VERDICTS = 32
MAX_VERDICT_BYTES = 1024
MAX_CONTRIBUTORS = 256
MAX_DECISION_BYTES = 64 << 10
DIGEST_LEN = 32

TrainerId = Annotated[str, Field(min_length=1, max_length=MAX_TRAINER_ID)]


@dataclass(frozen=True)
class RoundDecision:
    """Which payloads round ``round`` averages, signed by the trainer that decided it."""

    run_id: RunId
    round: U63
    base: Digest32
    epoch: Digest32
    coordinator: TrainerId
    contributors: Annotated[tuple[tuple[TrainerId, Digest32], ...], Field(min_length=1, max_length=MAX_CONTRIBUTORS)]
    committed: Annotated[tuple[tuple[TrainerId, Digest32], ...], Field(max_length=MAX_CONTRIBUTORS)]
    open: Annotated[tuple[TrainerId, ...], Field(max_length=MAX_CONTRIBUTORS)]  # contributors that are open trainers
    verdicts: Annotated[tuple[Annotated[bytes, Field(max_length=MAX_VERDICT_BYTES)], ...],
                        Field(max_length=MAX_DECISION_VERDICTS)]  # encoded ``CheckVerdict``s
    convicted: Annotated[tuple[TrainerId, ...], Field(max_length=MAX_DECISION_VERDICTS)]
    signer: Hex64
    signature: Signature

    @property
    def trainer_ids(self) -> list[str]:
        return [tid for tid, _ in self.contributors]

    @property
    def commitments(self) -> dict[str, bytes]:
        """trainer id -> the digest of the round commitment the coordinator held."""
        return dict(self.committed)


def _rules(d: RoundDecision) -> Iterator[str]:
    for name, pairs in (("contributors", d.contributors), ("committed", d.committed)):
        keys = [tid.encode() for tid, _ in pairs]
        if any(a >= b for a, b in itertools.pairwise(keys)):
            yield f"{name} must be sorted by trainer id without repeats"
    if d.committed and not set(d.trainer_ids) <= set(d.commitments):
        yield "every contributor must be named among the commitments"
    if list(d.open) != sorted(set(d.open), key=str.encode) or not set(d.open) <= set(d.trainer_ids):
        yield "open trainers must be contributors, sorted without repeats"
    if list(d.verdicts) != sorted(set(d.verdicts)) or list(d.convicted) != sorted(set(d.convicted), key=str.encode):
        yield "verdicts and convicted keys must be sorted without repeats"


DECISIONS = Statement(RoundDecision, magic=DECISION_MAGIC, format=DECISION_FORMAT, max_bytes=MAX_DECISION_BYTES,
                      max_str=MAX_TRAINER_ID, max_bin=MAX_VERDICT_BYTES, max_array=MAX_CONTRIBUTORS, rules=_rules)


def payload_digest(data: bytes) -> bytes:
    """The digest a decision names a payload by: BLAKE3 of its encoded bytes (32 bytes)."""
    return blake3.blake3(data).digest()


def signing_bytes(d: RoundDecision) -> bytes:
    """The exact bytes the coordinator signs: every field but the signature, domain-tagged."""
    return DECISIONS.signing_bytes(d)


def _ordered(pairs: Mapping[str, bytes]) -> tuple[tuple[str, bytes], ...]:
    return tuple(sorted(((t, bytes(g)) for t, g in pairs.items()), key=lambda c: c[0].encode()))


def make_decision(identity: Identity, *, run_id: str, round: int, base: bytes, epoch: bytes, coordinator: str,
                  contributors: Mapping[str, bytes], committed: Mapping[str, bytes] | None = None,
                  open: Iterable[str] = (), verdicts: Iterable[bytes] = (),
                  convicted: Iterable[str] = ()) -> RoundDecision:
    """Build and sign the decision of ``round`` (contributors: trainer id -> payload digest;
    committed: trainer id -> commitment digest; open: the contributors that are open trainers;
    verdicts: encoded check verdicts; convicted: keys they convict) in ``epoch`` (the genesis chain hash, raw bytes)."""
    return DECISIONS.seal(identity, RoundDecision(
        run_id=run_id, round=round, base=bytes(base), epoch=bytes(epoch), coordinator=coordinator,
        contributors=_ordered(contributors), committed=_ordered(committed or {}),
        open=tuple(sorted(set(open), key=str.encode)), verdicts=tuple(sorted(set(verdicts))),
        convicted=tuple(sorted(set(convicted), key=str.encode)), signer=identity.public_key_hex,
        signature=b""))


def encode_decision(d: RoundDecision) -> bytes:
    """The decision's wire bytes (the statement envelope, see the module docstring)."""
    return DECISIONS.encode(d)


def decode_decision(data: bytes) -> RoundDecision:
    """Parse hostile bytes into a decision. ``WireError`` if malformed; no signature check here."""
    return DECISIONS.decode(data)


def verify_decision(d: RoundDecision, *, signer_key: str) -> None:
    """``IntegrityError`` unless ``d`` was signed by ``signer_key`` (public key hex)."""
    DECISIONS.verify(d, signer_key=signer_key, tag=f"round {d.round} decision from {d.coordinator[:12]}")
