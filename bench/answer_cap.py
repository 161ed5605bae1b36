"""What a spot answer's bound (``loco/spot_answer.answer_cap``) allows a drawn target to make every
member download, against the 1 GiB a receipt could sign before (issue 32).

For commitments of the shapes the configs run (one batch per step, every step stepped, the
trainer's leaf), prints the bound at step 0 (no patch), at a later step and before the draw (any
step), each as bytes and as a ratio of ``MAX_ANSWER_BYTES``; and an honest step-0 answer at those
numbers (an opening of the real leaf and path sizes, a 256-rollout batch of 128 + 512 tokens). No
model is built: the bound is a function of the commitment's numbers.

    python bench/answer_cap.py
"""

from __future__ import annotations

import json

import numpy as np

from pulse_node.loco.commit import STATE_GLOBAL, BatchRef, InnerCommitment, StepCommit
from pulse_node.loco.merkle import leaf_count
from pulse_node.loco.opening import RoundOpening
from pulse_node.loco.spot_answer import MAX_ANSWER_BYTES, SpotAnswer, answer_cap, encode_answer
from pulse_node.loco.spotdraw import draw_check
from pulse_node.rl.rollout import Rollout, encode_rollouts
from pulse_node.trainer.spot_answers import BATCH_BYTES

D = b"\x03" * 32
#: (name, weights, inner steps, leaf): the tiny default model, Qwen2.5-0.5B at H = 3 and at its configs' H = 10
SHAPES = [("tiny default", 210_000, 10, 4096), ("Qwen2.5-0.5B, H=3", 494_032_768, 3, 4096),
          ("Qwen2.5-0.5B, H=10", 494_032_768, 10, 4096)]


def commitment(params: int, steps: int, leaf: int) -> InnerCommitment:
    step = StepCommit((BatchRef("12D3KooWproducer", 4, 1, D),), D, D, 0.5)
    return InnerCommitment(run_id="run", round=4, trainer="t", signer="", base=D, payload=D, settings=D, params=params,
                           leaf=leaf, adam_step=0, state=STATE_GLOBAL, state_root=D, steps=(step,) * steps)


def honest_step0(c: InnerCommitment) -> int:
    leaves = draw_check(b"seed", round=c.round, target=c.trainer, verifier="v", steps=len(c.steps), params=c.params,
                        leaf=c.leaf).leaves
    depth, rng = (leaf_count(c.params, c.leaf) - 1).bit_length(), np.random.default_rng(0)

    def proven(arrays: int) -> tuple[bytes, tuple[bytes, ...]]:
        return rng.bytes(4 * c.leaf * arrays), tuple(rng.bytes(32) for _ in range(depth))

    opening = RoundOpening(c.round, c.trainer, leaves, tuple(proven(len(c.state)) for _ in leaves),
                           tuple(tuple(proven(1) for _ in leaves) for _ in c.stepped))
    batch = encode_rollouts([Rollout(list(range(128)), list(range(512)), [-0.5] * 512, 1.0, 4, "pid", f"g{i // 8}",
                                     batch=1, sample=i) for i in range(256)])
    return len(encode_answer(SpotAnswer(c.round, c.trainer, 0, opening, [batch], None)))


def main() -> None:
    out = {}
    print(f"{'shape':<20} {'honest step 0':>14} {'bound step 0':>13} {'step 1':>10} {'any step':>10}  (ratio of 1 GiB)")
    for name, params, steps, leaf in SHAPES:
        c = commitment(params, steps, leaf)
        caps = {k: answer_cap(c, params=params, inner_steps=steps, batch_bytes=BATCH_BYTES, step=s)
                for k, s in (("step0", 0), ("step1", 1), ("any", None))}
        honest = honest_step0(c)
        assert honest <= caps["step0"]
        out[name] = {"honest_step0": honest, **caps, **{f"{k}_ratio": round(v / MAX_ANSWER_BYTES, 4) for k, v in caps.items()}}
        print(f"{name:<20} {honest / 2**20:>10.2f} MiB {caps['step0'] / 2**20:>9.2f} MiB "
              f"{caps['step1'] / MAX_ANSWER_BYTES:>10.4f} {caps['any'] / MAX_ANSWER_BYTES:>10.4f}")
    print(json.dumps({"old_cap": MAX_ANSWER_BYTES, "shapes": out}))


if __name__ == "__main__":
    main()
