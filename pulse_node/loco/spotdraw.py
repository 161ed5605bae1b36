"""The round-seeded draw of spot checks, and the rate a time budget allows (torch-free).

Once a round's commitments are fixed, a seed nobody could choose alone (``round_seed``: BLAKE3
over a second digest of every decided payload's bytes, which nobody knows before every payload
was committed and revealed; a trainer can only withhold its own, which leaves it out of the
round) picks, for every committed trainer, whether it is checked (probability ``rate``; always while it
is a newcomer), by whom (another trainer, uniformly), which inner step and which leaves of its
commitment get opened. Every trainer computes the same draw, so a verifier cannot pick its
target and a target cannot know in advance which step or which coordinates will be looked at.

Rate and budget: a check costs a verifier ``c`` seconds (re-verifying the step's batches, one
forward and backward, the replay at the opened leaves); a trainer's round takes ``T``; keeping
the commitments costs ``k`` per round. With every trainer checked with probability ``p`` and
the checks spread over the others, a trainer spends ``k + p * n / (n - 1) * c`` per round on
spot checks, so ``max_rate`` solves that for a budget share of ``T`` (10%). A trainer that cheats
on every step of every round is caught with probability ``p`` per round, within ``1 / p`` rounds
on average; one that cheats on ``j`` of ``H`` steps only, with ``p * j / H`` (the replay at the
opened leaves catches a payload that does not follow from the committed gradients whatever
step is drawn).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import blake3

from pulse_node.loco.merkle import leaf_count

DEFAULT_LEAVES = 8
_DOMAIN = b"pulse/spot-draw/1\0"
_SEED_DOMAIN = b"pulse/spot-seed/1\0"


def _uniform(seed: bytes, *parts: str) -> float:
    """A uniform in [0, 1) from the seed and labels (53 bits of a BLAKE3 digest)."""
    h = blake3.blake3(_DOMAIN + seed + b"\0".join(p.encode() for p in parts)).digest()
    word: int = struct.unpack("<Q", h[:8])[0]
    return (word >> 11) / float(1 << 53)


@dataclass(frozen=True)
class SpotDraw:
    """One drawn check: ``verifier`` re-runs inner step ``step`` of ``target`` and opens ``leaves``."""

    round: int
    target: str
    verifier: str
    step: int
    leaves: tuple[int, ...]


def draw_targets(seed: bytes, *, trainers: Sequence[str], rate: float,
                 newcomers: Collection[str] = ()) -> list[tuple[str, str]]:
    """(target, verifier) pairs of a round: each trainer is a target with probability ``rate``
    (always if it is a newcomer), its verifier another trainer picked by the seed."""
    ids = sorted(set(trainers))
    out = []
    for target in ids:
        others = [t for t in ids if t != target]
        if not others or not (target in newcomers or _uniform(seed, "target", target) < rate):
            continue
        out.append((target, others[int(_uniform(seed, "verifier", target) * len(others))]))
    return out


def draw_check(seed: bytes, *, round: int, target: str, verifier: str, steps: int, params: int, leaf: int,
               leaves: int = DEFAULT_LEAVES) -> SpotDraw:
    """The step (of ``steps`` committed) and the distinct leaves (of the ``params`` values cut in
    leaves of ``leaf``) the seed picks for ``target``; ``steps`` must be at least 1."""
    if steps < 1:
        raise ValueError("a commitment with no steps has nothing to re-run")
    n = leaf_count(params, leaf)
    step = int(_uniform(seed, "step", target) * steps)
    picked: list[int] = []
    counter = 0
    while len(picked) < min(leaves, n):
        i = int(_uniform(seed, "leaf", target, str(counter)) * n)
        counter += 1
        if i not in picked:
            picked.append(i)
    return SpotDraw(round, target, verifier, step, tuple(sorted(picked)))


def max_rate(*, check_s: float, round_s: float, commit_s: float = 0.0, trainers: int = 2,
             budget: float = 0.10) -> float:
    """The largest check probability per trainer and round that keeps a trainer's spot-check time
    (its commitments plus its share of the checks) within ``budget`` of its round time."""
    share = trainers / max(1, trainers - 1)
    spare = budget * round_s - commit_s
    return max(0.0, min(1.0, spare / (share * check_s))) if check_s > 0 else 1.0


def rounds_to_catch(rate: float, *, cheated_steps: int = 1, steps: int = 1) -> float:
    """Expected rounds until a trainer cheating on ``cheated_steps`` of ``steps`` every round is drawn
    on a cheated step (a geometric wait)."""
    p = rate * cheated_steps / max(1, steps)
    return float("inf") if p <= 0 else 1.0 / p


def round_seed(round: int, payloads: Mapping[str, bytes]) -> bytes:
    """The seed of round ``round``'s checks: the decided payloads' bytes (trainer id -> bytes), each
    hashed under another domain than the digest its commitment names (so unknown until revealed)."""
    h = blake3.blake3(_SEED_DOMAIN + round.to_bytes(8, "big"))
    for tid in sorted(payloads, key=str.encode):
        h.update(tid.encode() + b"\0" + blake3.blake3(_SEED_DOMAIN + payloads[tid]).digest())
    return h.digest()


@dataclass(frozen=True)
class Shape:
    """What a draw needs of a target's inner commitment: its steps, size and leaf."""

    steps: int
    params: int
    leaf: int


def draw_round(seed: bytes, *, round: int, targets: Mapping[str, Shape], verifiers: Iterable[str], rate: float,
               newcomers: Collection[str] = (), newcomer_verifiers: int = 2) -> list[SpotDraw]:
    """Every check of a round: each target (trainer id -> the shape of its commitment) with
    probability ``rate``, a newcomer always and by ``newcomer_verifiers`` distinct verifiers, each
    verifier one of ``verifiers`` other than the target, picked by the seed."""
    pool = sorted(set(verifiers), key=str.encode)
    out: list[SpotDraw] = []
    for target in sorted(targets, key=str.encode):
        shape, others = targets[target], [v for v in pool if v != target]
        new = target in newcomers
        if shape.steps < 1 or not others or not (new or _uniform(seed, "target", target) < rate):
            continue
        picked: list[str] = []
        for k in range(min(len(others), newcomer_verifiers if new else 1)):
            rest = [v for v in others if v not in picked]
            picked.append(rest[int(_uniform(seed, "verifier", target, str(k)) * len(rest))])
        d = draw_check(seed, round=round, target=target, verifier=picked[0], steps=shape.steps,
                       params=shape.params, leaf=shape.leaf)
        out.extend(SpotDraw(round, target, v, d.step, d.leaves) for v in picked)
    return out
