"""A target's answer to a drawn spot check, and its signed receipt (torch-free).

The drawn target of a check (``loco/spotdraw.py``) computes the draw itself and publishes what
its verifiers need beyond what every trainer holds (``trainer/spot_answers.py``): the answer is
served by its digest (fetch kind ``loco_payload``), and an ``AnswerReceipt`` signed by the
target (push kind ``spot_answer``: run, epoch, round, target, the answer's digest and size) goes
to every member, which relays it once like a commitment; a fetch is capped by the signed size.
An answer is the opening of its inner commitment at the drawn leaves (``loco/opening.py``, checked against its signed roots), the
drawn step's rollout batches (checked against their digests in the commitment) and a BF16 patch
to the weights that step ran on (none for step 0; checked against the signed weights hash).
Nothing in it is taken on trust: ``trainer/recompute.py`` checks every part.

Size: ``answer_cap`` bounds an honest answer by the target's signed commitment and the swarm's
shared settings: the opening at ``DEFAULT_LEAVES`` leaves (``opening_bytes``), the drawn step's
batches at the rollout batch cap each, a BF16 patch of the model's weights at the patch cap
(``codec/limits.py``: 4 B per weight + 1 MiB; none for step 0), at most ``MAX_ANSWER_BYTES``. A
receipt signing more is its target's lie (``trainer/spot_answers.py``). At 0.5 B weights the patch
alone may reach 1 GiB, so only a step-0 answer is bounded tighter there (bench/RESULTS.md).

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
from pulse_node.codec.limits import patch_cap_of
from pulse_node.errors import WireError
from pulse_node.loco.commit import MAX_BATCHES_PER_STEP, InnerCommitment
from pulse_node.loco.merkle import leaf_count
from pulse_node.loco.opening import RoundOpening, decode_opening, encode_opening, opening_bytes
from pulse_node.loco.payload import MAX_TRAINER_ID
from pulse_node.loco.spotdraw import DEFAULT_LEAVES

ANSWER_MAGIC = "pulse/spot-answer"
ANSWER_FORMAT = 1
MAX_ANSWER_BYTES = 1 << 30  # as a ``loco_payload`` fetch body; a fetch is capped by the receipt's size
RECEIPT_MAGIC = "pulse/spot-answer-receipt"
MAX_RECEIPT_BYTES = 1024
FRAMING = 1024  # an answer's msgpack framing: magic, format, round, target (<= 256 B), step, bin headers


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


def answer_cap(c: InnerCommitment, *, params: int, inner_steps: int, batch_bytes: int, step: int | None = None) -> int:
    """The most bytes an honest answer to a check drawn on ``c`` takes (module docstring): at
    ``step`` (None: any step), each batch at most ``batch_bytes``; ``c`` counts as naming at most
    ``params`` values (the model's) and ``inner_steps`` steps, as ``check_header`` holds it to."""
    steps = c.steps if step is None else c.steps[step:step + 1]
    batches = max((len(s.batches) for s in steps), default=0)
    n = min(c.params, params)
    opening = opening_bytes(params=n, leaf=c.leaf, arrays=len(c.state) + min(len(c.stepped), inner_steps),
                            leaves=min(DEFAULT_LEAVES, leaf_count(n, c.leaf)))
    patch = 0 if step == 0 or len(c.steps) < 2 else patch_cap_of(2 * n)  # BF16 weights: 2 B each
    return min(MAX_ANSWER_BYTES, FRAMING + opening + batches * (batch_bytes + 8) + patch)


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
