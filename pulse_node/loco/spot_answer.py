"""A target's answer to a drawn spot check, as it travels (push kind ``spot_answer``; torch-free).

The drawn target of a check (``loco/spotdraw.py``) computes the draw itself and pushes each of
its verifiers what the check needs beyond what every trainer holds: the opening of its inner
commitment at the drawn leaves (``loco/opening.py``, checked against its signed roots), the
drawn step's rollout batches (checked against their digests in the commitment) and a BF16 patch
to the weights that step ran on (none for step 0; checked against the signed weights hash).
Nothing in it is taken on trust: ``trainer/recompute.py`` checks every part.

Wire format (``ANSWER_FORMAT`` 1): msgpack ``[magic, format, round, target, step, opening,
[batch, ...], patch]`` (``patch`` empty for none), at most ``MAX_ANSWER_BYTES``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from pulse_node.errors import WireError
from pulse_node.loco.commit import MAX_BATCHES_PER_STEP
from pulse_node.loco.opening import RoundOpening, decode_opening, encode_opening
from pulse_node.loco.payload import MAX_TRAINER_ID

ANSWER_MAGIC = "pulse/spot-answer"
ANSWER_FORMAT = 1
MAX_ANSWER_BYTES = 48 << 20


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
