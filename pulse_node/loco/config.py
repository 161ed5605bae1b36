"""The PULSELoCo configuration section (torch-free, validated by pydantic)."""

from __future__ import annotations

from typing import Literal

import pydantic

from pulse_node.configload import StrictModel


class AggregateConfig(StrictModel):
    """How a round's payloads are combined (``loco/aggregate.py``); the same on every trainer.

    ``"robust"``: each payload weighted by CenteredClip around the outer momentum, so a trainer
    far from the others counts as one at the clip radius (what is clipped off an honest payload
    goes back into its error feedback); ``"mean"``: the plain mean (every payload whole).
    Measured against Byzantine trainers: bench/byzantine.py."""

    rule: Literal["robust", "mean"] = "robust"
    tau_scale: float = pydantic.Field(1.0, gt=0.0, le=100.0)
    """Clip radius as a multiple of the upper median of the payloads' distances from the centre."""
    iterations: int = pydantic.Field(2, ge=1, le=10)
    """CenteredClip iterations (each one pass over every payload and the model's tensors)."""
    power: int = pydantic.Field(1, ge=1, le=4)
    """A payload at distance ``D > tau`` from the centre weighs ``(tau / D) ** power``: 1 is
    CenteredClip (it counts as one at distance ``tau``); more gives far payloads less but starves
    an honest trainer that stays farthest (bench/RESULTS.md "Byzantine trainers")."""


class TrustConfig(StrictModel):
    """How the trust ledger (``loco/ledger.py``) weighs trainers; the same on every trainer.

    A member (root or admitted key) weighs 1. An open trainer (``chain.open_trainers``) earns
    weight by spot checks passed; until it passed ``newcomer_checks`` it is a newcomer, and all
    newcomers of a round share ``newcomer_weight`` together (1 or 1,000 new keys weigh the same)."""

    newcomer_weight: float = pydantic.Field(0.5, ge=0.0, le=1.0)
    """What all newcomers of a round weigh together (a member weighs 1)."""
    newcomer_checks: int = pydantic.Field(3, ge=0, le=1000)
    """Checks an open trainer must pass before it stops being a newcomer (checked every round until then)."""
    earn_checks: int = pydantic.Field(10, ge=1, le=100_000)
    """Checks passed (less twice those failed) at which an open trainer weighs as a member."""
    open_per_round: int = pydantic.Field(2, ge=0, le=64)
    """Newcomers that enter one round at most (drawn by the last decision's digest)."""
    max_entries: int = pydantic.Field(1024, ge=16, le=65_536)
    """Keys the ledger keeps at most (the oldest idle newcomers are forgotten first)."""


class SpotConfig(StrictModel):
    """Spot recomputation of inner steps in the rounds (``trainer/spot_round.py``); the same on every trainer."""

    rate: float = pydantic.Field(0.3, ge=0.0, le=1.0)
    """Probability that a trainer with earned weight is checked in a round (newcomers and members
    that passed no check yet: every round); 0 turns checks off. With the weighing, the record and
    the answers counted, spot checks at 0.3 cost 8.4% of a trainer's swarm round at 16 x 8
    rollouts, H = 10, 10 rounds (7.2% once every member passed a check; ``spotdraw.max_rate``
    allows ~0.25 there). A member that cheats only after its first check (the sleeper) is caught
    within 1 / (0.3 x the honest share of verifiers) rounds on average: 1-7 rounds in the bench
    (bench/RESULTS.md "bench/byzantine.py, 3 seeds, on the session's main")."""
    newcomer_verifiers: int = pydantic.Field(2, ge=1, le=4)
    """Verifiers drawn for a newcomer (one verifier colluding with its target passes it)."""
    keep_rounds: int = pydantic.Field(2, ge=2, le=8)
    """Rounds of inner-step records a trainer keeps to answer checks (the checked round and the next)."""
    keyed: bool = False
    """Check members in a swarm without ``chain.open_trainers`` too (with it, checks always run:
    an open trainer earns weight only by checks passed)."""
    answer_wait_s: float = pydantic.Field(30.0, gt=0.0, le=3600.0)
    """How long a verifier waits for its target's answer after the round applied; then the check is
    ``unanswered`` (the target owes a check: out of the rounds until it passes one)."""


class LocoConfig(StrictModel):
    """Knobs of one PULSELoCo swarm; every trainer of a swarm must use the same values
    (except ``base_coding``).

    ``gate="bf16"`` sends an entry of ``s = e + d`` only if it would change the BF16 model
    (``bf16(theta) != bf16(theta - s)``, bitwise); ``gate="none"`` sends every entry (dense
    DiLoCo through the same pipeline; the error-feedback buffer then stays zero).
    """

    inner_steps: int = pydantic.Field(10, ge=1, le=100_000)
    outer_lr: float = pydantic.Field(0.7, gt=0.0, le=10.0)
    outer_momentum: float = pydantic.Field(0.9, ge=0.0, lt=1.0)
    nesterov: bool = True
    gate: Literal["bf16", "none"] = "bf16"
    gate_scale: float = pydantic.Field(1.0, gt=0.0, le=1000.0)
    """Scale c of the BF16 gate: an entry of ``s`` fires iff ``bf16(theta) != bf16(theta - c*s)``.
    1.0 is the reference gate. Only the firing decision changes: a fired entry is still sent as
    the exact FP32 ``s`` (so ``sent + kept == s`` holds). c < 1 fires fewer entries (they wait
    longer in the error-feedback buffer), c > 1 more; c = outer_lr * (1 + outer_momentum) / N asks
    whether the outer step's gain on one trainer's entry would change the BF16 weight.
    Measured on the RL bench: bench/RESULTS.md, "Gate scale sweep (2026-11-22)"."""
    outer_placement: Literal["global", "trainer"] = "global"
    """Where the outer Nesterov step runs. ``"global"`` (the reference): trainers gate their
    pseudo-gradient ``d`` and the averaged payloads drive one shared outer step (``outer_lr``,
    ``outer_momentum``) on the global weights. ``"trainer"``: each trainer runs that outer step
    on its own ``d`` with its own momentum buffer, gates and error-feeds the resulting update
    ``u``, and the global weights move by the plain mean of the sent ``u`` (the shared momentum
    stays zero). The step is linear, so with every trainer contributing the mean of the ``u`` is
    the reference's step; the gate then holds back only what would not change the BF16 model
    yet, at the price of firing on the amplified update. Measured on the RL bench (3 seeds): 98% of
    DiLoCo's gain at 6.6-12.9x fewer bytes than DiLoCo, against 46-69% at 15-34x for ``"global"``
    (bench/RESULTS.md, "Where the bytes/quality frontier lies")."""
    deadline_s: float = pydantic.Field(60.0, gt=0.0)
    """Wall time after the round opens within which a payload must arrive to be averaged; its
    commitment must arrive within the first half (the commit phase, ``trainer/commits.py``)."""
    decision_wait_s: float = pydantic.Field(10.0, gt=0.0)
    """How long past its own deadline a trainer waits for the round's decision before the next
    trainer in id order decides instead; also the budget for fetching decided payloads it lacks."""
    open_wait_s: float = pydantic.Field(5.0, ge=0.0)
    """How long a round waits for open trainers (``chain.open_trainers``) once the live members
    are in, at most: for the commitments of those in discovery, then for the payloads of those
    that committed (``trainer/pace.py``); never past ``deadline_s``."""
    min_contributors: int = pydantic.Field(1, ge=1)
    """Below this many on-time payloads the round applies no update (the round still closes)."""
    max_payload_bytes: int = pydantic.Field(1 << 30, ge=1024)
    """Encoded payloads above this size are refused before decoding."""
    value_bound_margin: float = pydantic.Field(4.0, ge=1.0, le=1e6)
    """Margin of the payload value bound (``loco/bound.py``) over the largest entry an honest
    round can produce; a payload with a larger entry is refused, never signed nor applied."""
    aggregate: AggregateConfig = pydantic.Field(default_factory=AggregateConfig)
    trust: TrustConfig = pydantic.Field(default_factory=TrustConfig)
    spot: SpotConfig = pydantic.Field(default_factory=SpotConfig)
    zstd_level: int = pydantic.Field(3, ge=1, le=19)
    base_coding: bool = True
    """Code our payloads with the round's FP32 global weights as context (~2.5 B per fired entry
    instead of ~3.5 B). Receivers decode both kinds, so trainers of one swarm may differ here."""
