"""A spot answer's bound (``loco/spot_answer.answer_cap``), torch-free: an honest answer at a real
shape (0.5 B weights, no model needed: the commitment's numbers) fits it, and a pushed rollout
batch re-encoded as its trainer used it fits the batch bound the trainer applies."""

from __future__ import annotations

import msgpack
import numpy as np

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.loco.commit import STATE_GLOBAL, BatchRef, InnerCommitment, StepCommit
from pulse_node.loco.merkle import leaf_count
from pulse_node.loco.opening import RoundOpening
from pulse_node.loco.spot_answer import MAX_ANSWER_BYTES, SpotAnswer, answer_cap, encode_answer
from pulse_node.loco.spotdraw import draw_check
from pulse_node.net.wire.protocol import PUSH_CAPS
from pulse_node.rl.rollout import MAX_ROLLOUTS, Rollout, decode_rollouts, encode_rollouts
from pulse_node.trainer.spot_answers import BATCH_BYTES

QWEN_05B = 494_032_768  # Qwen2.5-0.5B's weights
LEAF, STEPS, D = 4096, 10, b"\x03" * 32


def _commitment(trainer: str, *, params: int = QWEN_05B, steps: int = STEPS) -> InnerCommitment:
    step = StepCommit((BatchRef("12D3KooWproducer", 4, 1, D),), D, D, 0.5)
    return InnerCommitment(run_id="run", round=4, trainer=trainer, signer="", base=D, payload=D, settings=D,
                           params=params, leaf=LEAF, adam_step=30, state=STATE_GLOBAL, state_root=D,
                           steps=(step,) * steps)


def _opening(c: InnerCommitment) -> RoundOpening:
    """An opening of ``c`` at its drawn leaves with values and Merkle paths of the real sizes."""
    leaves = draw_check(b"seed", round=c.round, target=c.trainer, verifier="v", steps=len(c.steps), params=c.params,
                        leaf=c.leaf).leaves
    depth = (leaf_count(c.params, c.leaf) - 1).bit_length()
    rng = np.random.default_rng(0)

    def proven(arrays: int) -> tuple[bytes, tuple[bytes, ...]]:
        return rng.bytes(4 * c.leaf * arrays), tuple(rng.bytes(32) for _ in range(depth))

    return RoundOpening(c.round, c.trainer, leaves, tuple(proven(len(c.state)) for _ in leaves),
                        tuple(tuple(proven(1) for _ in leaves) for _ in c.stepped))


def test_an_honest_answer_at_half_a_billion_weights_fits_its_bound() -> None:
    """0.5 B weights, 10 steps: a step-0 answer (opening 1.8 MB, a 256-rollout batch) is bounded to
    ~18 MiB, not 1 GiB. Past step 0 the patch's worst case (4 B per weight + 1 MiB) is past 1 GiB,
    so there the bound stays the receipt's limit."""
    tid = peer_id_of_key(Identity.generate().public_key_hex)
    c = _commitment(tid)
    rollouts = [Rollout(list(range(128)), list(range(512)), [-0.5] * 512, 1.0, 4, "pid", f"g{i // 8}", batch=1, sample=i)
                for i in range(256)]
    answer = SpotAnswer(c.round, tid, 0, _opening(c), [encode_rollouts(rollouts)], None)
    size, cap = len(encode_answer(answer)), answer_cap(c, params=QWEN_05B, inner_steps=STEPS, batch_bytes=BATCH_BYTES,
                                                       step=0)
    assert size <= cap < 20 << 20, (size, cap)
    assert answer_cap(c, params=QWEN_05B, inner_steps=STEPS, batch_bytes=BATCH_BYTES, step=1) == MAX_ANSWER_BYTES
    # a commitment naming more than the model's weights or a round's steps is bounded as if it did not
    huge = _commitment(tid, params=1 << 40, steps=1024)
    assert answer_cap(huge, params=QWEN_05B, inner_steps=STEPS, batch_bytes=BATCH_BYTES, step=0) == cap


def test_a_pushed_batch_as_its_trainer_re_encodes_it_grows_within_the_batch_bound() -> None:
    """A pushed batch of wire 2 (no precision field), each reward a float32, grows when its trainer
    re-encodes it (wire 3, 8-byte rewards) by at most 4 B per rollout + 64: so a batch at the push
    cap, of as many rollouts as a batch may hold, fits ``BATCH_BYTES``."""
    n = 4096
    one = {"p": bytes(204), "c": bytes(4), "l": bytes(4), "r": 0.5, "v": 4, "pid": "p", "g": "g", "f": True, "b": 1}
    data = msgpack.packb({"wire": 2, "rollouts": [one | {"i": i} for i in range(n)]}, use_bin_type=True,
                         use_single_float=True)
    grown = len(encode_rollouts(decode_rollouts(data))) - len(data)
    assert 4 * n <= grown <= 4 * n + 64, grown
    assert PUSH_CAPS["rollouts"] + 4 * MAX_ROLLOUTS + 64 <= BATCH_BYTES
