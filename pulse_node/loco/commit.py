"""Inner-step commitments: what a trainer's PULSELoCo payload says it was made from (torch-free).

A trainer signs one ``InnerCommitment`` per round, next to its payload, before any check is
drawn. It names the round's inputs and every inner step, so that a verifier picked later by a
round-seeded draw can re-run one step and replay the round at a few coordinates
(``trainer/recompute.py``), and anyone can re-check a mismatch from the signed commitment.

What "state" means here, and why. A bit-exact digest of the weights after a step cannot be
reproduced on another machine: a gradient summed in another order (thread count, micro-batches,
CUDA vs CPU) differs in its last bits, and AdamW carries that into every weight. So each step
commits, exactly, to what a verifier *can* compare within a tolerance, and to nothing it would
have to reproduce bit for bit:

- ``grad_root``: a Merkle root (``loco/merkle.py``) over the step's clipped FP32 gradient, the
  input of AdamW. The state after step ``k`` (weights, Adam moments) is a per-coordinate function
  of the round's start state and the gradients ``0..k``, so a root per gradient binds the state
  after every step at a third of the bytes a root over (weights, m, v) would hash. A verifier
  re-runs one step's forward and backward and compares its gradient with the opened leaves
  (relative error: ~1e-7 honest, ~1-2 for the cheats measured; bench/RESULTS.md "Spot
  recomputation").
- ``weights``: the state hash of the BF16 weights that step's forward ran on (the straight-through
  BF16 forward, ``grpo.bf16_compute``). That is exact and cheap to reproduce, and it is all the
  forward needs: a verifier of step ``k > 0`` gets those weights as a sparse BF16 patch from the
  round's base (a few % of the weights after a few steps), checked against this hash.
- ``state_root`` over the round's start state: the inner AdamW moments ``m``, ``v`` (step count
  ``adam_step``), the error feedback ``e`` and, with ``outer_placement = "trainer"``, the
  trainer's outer momentum ``u``. A verifier opens it at the drawn leaves to replay the round
  there; the next round's commitment opened at the same leaves links the rounds (the replayed
  end state must be the next start), so a trainer cannot reset or inflate its private state.
- ``batches``: per step, the verified rollout batches it trained on, each as (producer, version,
  batch index) -- the batch key, which seeds the batch's prompts and every token draw, the only
  randomness of a step -- and the BLAKE3 digest of the batch's bytes as the trainer used them
  (``encode_rollouts`` of the verified rollouts, so anyone re-verifies them as the producer's).
- ``base``: the outer state hash the round starts from; ``payload``: the BLAKE3 digest of the
  encoded payload this commitment stands behind; ``settings``: a digest of the inner-step settings
  (``settings_digest``). A stale or replayed commitment names another round's base, and a trainer
  configured otherwise (another learning rate, an FP32 forward) names other settings: both are
  refused by ``check_header`` before anything is recomputed, and neither is accused.

Wire format (``COMMIT_FORMAT`` 2): the signed-statement envelope (``chain/statement.py``) of an
``InnerCommitment``, each field declared there with its bounds; ``steps`` travel as
``[[[[producer, version, index, digest], ...], weights, grad_root, grad_norm], ...]`` (``grad_root``
empty for a step that had no informative rollout and so took no AdamW step). ``decode_commitment``
treats its input as hostile (``WireError``); ``verify_commitment`` checks the signature
(``IntegrityError``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated

import blake3
import msgpack
from pydantic import Field

from pulse_node.chain.identity import Identity
from pulse_node.chain.statement import U63, Digest32, Finite, Hex64, RunId, Signature, Statement
from pulse_node.errors import IntegrityError
from pulse_node.loco.payload import MAX_TRAINER_ID

COMMIT_MAGIC = "pulse/inner-commitment"
COMMIT_FORMAT = 2
MAX_COMMIT_BYTES = 256 << 10
MAX_STEPS = 1024
MAX_BATCHES_PER_STEP = 64
MAX_PARAMS = 1 << 40
LEAF_SIZES = tuple(1 << k for k in range(8, 17))  # 256 .. 65536 values per leaf
#: the start-state arrays, in leaf order: Adam moments, error feedback, and the trainer's outer momentum
STATE_GLOBAL = ("m", "v", "e")
STATE_TRAINER = ("m", "v", "e", "u")
DIGEST_LEN = 32
_SETTINGS_DOMAIN = b"pulse/inner-settings/1\0"

PeerId = Annotated[str, Field(min_length=1, max_length=MAX_TRAINER_ID)]


@dataclass(frozen=True)
class BatchRef:
    """One verified rollout batch a step trained on: its key (producer, version, index) and digest."""

    producer: PeerId
    version: U63
    index: U63
    digest: Digest32


@dataclass(frozen=True)
class StepCommit:
    """One inner step: its batches, the BF16 weights its forward ran on, its clipped gradient."""

    batches: Annotated[tuple[BatchRef, ...], Field(min_length=1, max_length=MAX_BATCHES_PER_STEP)]
    weights: Digest32
    grad_root: Annotated[bytes, Field(max_length=DIGEST_LEN)]  # empty, or a 32-byte root
    grad_norm: Finite

    @property
    def stepped(self) -> bool:
        """Whether the step had an informative rollout and so took an AdamW step."""
        return bool(self.grad_root)


@dataclass(frozen=True)
class InnerCommitment:
    """A trainer's signed account of one round's inner steps (see the module docstring)."""

    run_id: RunId
    round: U63
    trainer: PeerId
    signer: Hex64
    base: Digest32
    payload: Digest32
    settings: Digest32
    params: Annotated[int, Field(ge=1, le=MAX_PARAMS)]
    leaf: int
    adam_step: U63
    state: tuple[str, ...]
    state_root: Digest32
    steps: Annotated[tuple[StepCommit, ...], Field(max_length=MAX_STEPS)]
    signature: Signature = b""

    @property
    def stepped(self) -> list[int]:
        """Indices of the steps that took an AdamW step."""
        return [k for k, s in enumerate(self.steps) if s.stepped]

    def digest(self) -> bytes:
        """BLAKE3 of the encoded commitment (what a round statement names it by)."""
        return blake3.blake3(encode_commitment(self)).digest()


def _rules(c: InnerCommitment) -> Iterator[str]:
    if c.leaf not in LEAF_SIZES:
        yield f"leaf must be one of {LEAF_SIZES[0]}..{LEAF_SIZES[-1]} (a power of 2)"
    if c.state not in (STATE_GLOBAL, STATE_TRAINER):
        yield f"state must name {STATE_GLOBAL} or {STATE_TRAINER}"
    if any(len(s.grad_root) not in (0, DIGEST_LEN) for s in c.steps):
        yield "a step names an empty or 32-byte gradient root"


COMMITMENTS = Statement(InnerCommitment, magic=COMMIT_MAGIC, format=COMMIT_FORMAT, max_bytes=MAX_COMMIT_BYTES,
                        max_str=MAX_TRAINER_ID, max_bin=64, max_array=max(MAX_STEPS, MAX_BATCHES_PER_STEP),
                        rules=_rules)


def signing_bytes(c: InnerCommitment) -> bytes:
    """The exact bytes the trainer signs: every field but the signature, domain-tagged."""
    return COMMITMENTS.signing_bytes(c)


def sign_commitment(identity: Identity, c: InnerCommitment) -> InnerCommitment:
    """``c`` signed by ``identity`` (its ``signer`` set to the identity's key); ``ValueError`` if invalid."""
    return COMMITMENTS.seal(identity, c)


def encode_commitment(c: InnerCommitment) -> bytes:
    return COMMITMENTS.encode(c)


def decode_commitment(data: bytes) -> InnerCommitment:
    """Parse hostile bytes into a commitment. ``WireError`` if malformed; no signature check here."""
    return COMMITMENTS.decode(data)


def verify_commitment(c: InnerCommitment, *, signer_key: str) -> None:
    """``IntegrityError`` unless ``c`` was signed by ``signer_key`` (public key hex)."""
    COMMITMENTS.verify(c, signer_key=signer_key, tag=f"round {c.round} commitment of {c.trainer[:12]}")


def settings_digest(settings: Mapping[str, object]) -> bytes:
    """BLAKE3 of the canonical encoding of the inner-step settings (``trainer/recompute.py``
    ``inner_settings``: learning rate, betas, clipping, BF16 compute, gate, ...)."""
    return blake3.blake3(_SETTINGS_DOMAIN + msgpack.packb(sorted(settings.items()), use_bin_type=True)).digest()


def check_header(c: InnerCommitment, *, run_id: str, round: int, base: bytes, payload: bytes, params: int,
                 inner_steps: int, settings: bytes | None = None) -> None:
    """The cheap checks every receiver makes on a payload's commitment (``IntegrityError``):
    this run, this round, this round's base, this payload, this model's size, at most
    ``inner_steps`` steps, and (if given) our inner-step settings: a trainer configured otherwise
    is refused here, before anything is recomputed, and never accused. A stale or replayed
    commitment fails here."""
    if (c.run_id, c.round) != (run_id, round):
        raise IntegrityError(f"commitment is for {c.run_id} round {c.round}, not {run_id} round {round}")
    if c.base != base:
        raise IntegrityError(f"round {round} commitment of {c.trainer[:12]} names another base")
    if c.payload != payload:
        raise IntegrityError(f"round {round} commitment of {c.trainer[:12]} names another payload")
    if settings is not None and c.settings != settings:
        raise IntegrityError(f"round {round} commitment of {c.trainer[:12]} was made with other inner-step settings")
    if c.params != params:
        raise IntegrityError(f"commitment covers {c.params} parameters, the model has {params}")
    if len(c.steps) > inner_steps:
        raise IntegrityError(f"commitment names {len(c.steps)} steps, a round has at most {inner_steps}")
