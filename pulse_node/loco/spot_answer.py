"""A target's answer to a drawn spot check, and its signed receipt (torch-free).

The drawn target of a check (``loco/spotdraw.py``) computes the draw itself and publishes what
its verifiers need beyond what every trainer holds (``trainer/spot_answers.py``): the answer is
served by its digest (fetch kind ``loco_payload``), and an ``AnswerReceipt`` signed by the
target (push kind ``spot_answer``: run, epoch, round, target, the answer's digest and size) goes
to every member, which relays it once like a commitment; a fetch is capped by the signed size.
An answer is the opening of its inner
commitment at the drawn leaves (``loco/opening.py``, checked against its signed roots), the
drawn step's rollout batches (checked against their digests in the commitment) and a BF16 patch
to the weights that step ran on (none for step 0; checked against the signed weights hash).
Nothing in it is taken on trust: ``trainer/recompute.py`` checks every part.

Wire formats: an answer (``ANSWER_FORMAT`` 1) is msgpack ``[magic, format, round, target, step,
opening, [batch, ...], patch]`` (``patch`` empty for none), at most ``MAX_ANSWER_BYTES``; a
receipt (format 1) is the signed-statement envelope (``chain/statement.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import blake3
import msgpack
from pydantic import Field

from pulse_node.chain.identity import Identity
from pulse_node.chain.statement import U63, Digest32, Hex64, RunId, Signature, Statement
from pulse_node.errors import WireError
from pulse_node.loco.commit import MAX_BATCHES_PER_STEP
from pulse_node.loco.opening import RoundOpening, decode_opening, encode_opening
from pulse_node.loco.payload import MAX_TRAINER_ID

ANSWER_MAGIC = "pulse/spot-answer"
ANSWER_FORMAT = 1
MAX_ANSWER_BYTES = 1 << 30  # as a ``loco_payload`` fetch body; a fetch is capped by the receipt's size
RECEIPT_MAGIC = "pulse/spot-answer-receipt"
MAX_RECEIPT_BYTES = 1024


@dataclass
class SpotAnswer:
    round: int
    target: str
    step: int
    opening: RoundOpening
    batches: list[bytes]
    patch: bytes | None


def encode_answer(a: SpotAnswer) -> bytes:
    return msgpack.packb([ANSWER_MAGIC, ANSWER_FORMAT, a.round, a.target, a.step, encode_opening(a.opening),
                          list(a.batches), a.patch or b""], use_bin_type=True)


def decode_answer(data: bytes) -> SpotAnswer:
    """Hostile bytes -> an answer; ``WireError`` if malformed or oversized (nothing else is checked here)."""
    if len(data) > MAX_ANSWER_BYTES:
        raise WireError(f"a spot answer of {len(data)} bytes exceeds {MAX_ANSWER_BYTES}")
    try:
        items = msgpack.unpackb(data, raw=False, use_list=True, max_map_len=0, max_ext_len=0,
                                max_str_len=256, max_bin_len=MAX_ANSWER_BYTES, max_array_len=max(16, MAX_BATCHES_PER_STEP))
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"spot answer is not valid msgpack ({type(exc).__name__})") from None
    ok = (isinstance(items, list) and len(items) == 8 and items[:2] == [ANSWER_MAGIC, ANSWER_FORMAT]
          and type(items[2]) is int and 0 <= items[2] < 2**63 and type(items[3]) is str
          and 0 < len(items[3]) <= MAX_TRAINER_ID and type(items[4]) is int and 0 <= items[4] < 2**31
          and type(items[5]) is bytes and isinstance(items[6], list) and all(type(b) is bytes for b in items[6])
          and type(items[7]) is bytes)
    if not ok:
        raise WireError("not a spot answer of a supported format")
    return SpotAnswer(items[2], items[3], items[4], decode_opening(items[5]), items[6], items[7] or None)


@dataclass(frozen=True)
class AnswerReceipt:
    """``target``'s signed word that its answer of round ``round`` is the bytes of ``digest``."""

    run_id: RunId
    epoch: Digest32
    round: U63
    target: Annotated[str, Field(min_length=1, max_length=MAX_TRAINER_ID)]
    digest: Digest32  # BLAKE3 of the encoded answer
    size: Annotated[int, Field(ge=1, le=MAX_ANSWER_BYTES)]
    signer: Hex64
    signature: Signature


RECEIPTS = Statement(AnswerReceipt, magic=RECEIPT_MAGIC, format=1, max_bytes=MAX_RECEIPT_BYTES, max_str=128,
                     max_bin=64, max_array=16)


def make_receipt(identity: Identity, *, run_id: str, epoch: bytes, answer: SpotAnswer, data: bytes) -> AnswerReceipt:
    """The target's signed receipt of ``answer`` (``data``: its encoded bytes)."""
    return RECEIPTS.seal(identity, AnswerReceipt(run_id, bytes(epoch), answer.round, answer.target,
                                                 blake3.blake3(data).digest(), len(data), identity.public_key_hex, b""))
