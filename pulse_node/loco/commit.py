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

Wire format (``COMMIT_FORMAT`` 1): a msgpack array ``[COMMIT_MAGIC, COMMIT_FORMAT, run_id,
round, trainer, signer, base, payload, settings, params, leaf, adam_step, state, state_root,
steps, signature]`` with ``steps = [[[[producer, version, index, digest], ...], weights, grad_root,
grad_norm], ...]`` (``grad_root`` empty for a step that had no informative rollout and so took
no AdamW step). The signed message is the array without the signature behind a domain tag.
``decode_commitment`` treats its input as hostile: size cap before parsing, msgpack limits,
exact fields and types (``WireError``); ``verify_commitment`` checks the signature
(``IntegrityError``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import blake3
import msgpack

from pulse_node.chain.identity import Identity, verify_signature
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.payload import MAX_TRAINER_ID
from pulse_node.vocab import RUN_ID_RULE, is_run_id

COMMIT_MAGIC = "pulse/inner-commitment"
COMMIT_FORMAT = 1
MAX_COMMIT_BYTES = 256 << 10
MAX_STEPS = 1024
MAX_BATCHES_PER_STEP = 64
MAX_PARAMS = 1 << 40
LEAF_SIZES = tuple(1 << k for k in range(8, 17))  # 256 .. 65536 values per leaf
#: the start-state arrays, in leaf order: Adam moments, error feedback, and the trainer's outer momentum
STATE_GLOBAL = ("m", "v", "e")
STATE_TRAINER = ("m", "v", "e", "u")
DIGEST_LEN = 32
_SIGN_DOMAIN = b"pulse/inner-commitment/sign/1\0"
_SETTINGS_DOMAIN = b"pulse/inner-settings/1\0"
_MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class BatchRef:
    """One verified rollout batch a step trained on: its key (producer, version, index) and digest."""

    producer: str
    version: int
    index: int
    digest: bytes


@dataclass(frozen=True)
class StepCommit:
    """One inner step: its batches, the BF16 weights its forward ran on, its clipped gradient."""

    batches: tuple[BatchRef, ...]
    weights: bytes
    grad_root: bytes
    grad_norm: float

    @property
    def stepped(self) -> bool:
        """Whether the step had an informative rollout and so took an AdamW step."""
        return bool(self.grad_root)


@dataclass(frozen=True)
class InnerCommitment:
    """A trainer's signed account of one round's inner steps (see the module docstring)."""

    run_id: str
    round: int
    trainer: str
    signer: str
    base: bytes
    payload: bytes
    settings: bytes
    params: int
    leaf: int
    adam_step: int
    state: tuple[str, ...]
    state_root: bytes
    steps: tuple[StepCommit, ...]
    signature: bytes = b""

    @property
    def stepped(self) -> list[int]:
        """Indices of the steps that took an AdamW step."""
        return [k for k, s in enumerate(self.steps) if s.stepped]

    def digest(self) -> bytes:
        """BLAKE3 of the encoded commitment (what a round statement names it by)."""
        return blake3.blake3(encode_commitment(self)).digest()


_FIELDS = tuple(f.name for f in fields(InnerCommitment))


def _body(c: InnerCommitment) -> list[Any]:
    steps = [[[[b.producer, b.version, b.index, b.digest] for b in s.batches], s.weights, s.grad_root,
              float(s.grad_norm)] for s in c.steps]
    return [COMMIT_MAGIC, COMMIT_FORMAT, c.run_id, c.round, c.trainer, c.signer, c.base, c.payload, c.settings,
            c.params, c.leaf, c.adam_step, list(c.state), c.state_root, steps]


def signing_bytes(c: InnerCommitment) -> bytes:
    """The exact bytes the trainer signs: every field but the signature, domain-tagged."""
    return _SIGN_DOMAIN + msgpack.packb(_body(c), use_bin_type=True)


def sign_commitment(identity: Identity, c: InnerCommitment) -> InnerCommitment:
    """``c`` signed by ``identity`` (its ``signer`` set to the identity's key); ``ValueError`` if invalid."""
    unsigned = replace(c, signer=identity.public_key_hex, signature=b"")
    problem = next(_problems(unsigned, unsigned_ok=True), None)
    if problem:
        raise ValueError(f"invalid inner commitment: {problem}")
    encoded = encode_commitment(unsigned)
    if len(encoded) > MAX_COMMIT_BYTES:
        raise ValueError(f"inner commitment is {len(encoded)} bytes, limit {MAX_COMMIT_BYTES}")
    return replace(unsigned, signature=identity.sign(signing_bytes(unsigned)))


def encode_commitment(c: InnerCommitment) -> bytes:
    return msgpack.packb([*_body(c), c.signature], use_bin_type=True)


def _unpack(data: bytes) -> list[Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("inner commitment must be bytes")
    if len(data) > MAX_COMMIT_BYTES:
        raise WireError(f"inner commitment is {len(data)} bytes, limit {MAX_COMMIT_BYTES}")
    try:
        items = msgpack.unpackb(bytes(data), raw=False, use_list=True, strict_map_key=True,
                                max_str_len=max(MAX_TRAINER_ID, 64), max_bin_len=64, max_map_len=0,
                                max_array_len=max(MAX_STEPS, MAX_BATCHES_PER_STEP, len(_FIELDS) + 2), max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"inner commitment is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(items, list) or len(items) < 2 or items[0] != COMMIT_MAGIC:
        raise WireError("not an inner commitment")
    if items[1] != COMMIT_FORMAT:
        raise WireError(f"inner commitment format {items[1]!r} is not supported (want {COMMIT_FORMAT})")
    if len(items) != 2 + len(_FIELDS):
        raise WireError(f"inner commitment has {len(items) - 2} fields, expected {len(_FIELDS)}")
    return items[2:]


def _batch(raw: Any) -> BatchRef:
    if not (isinstance(raw, list) and len(raw) == 4 and type(raw[0]) is str and type(raw[1]) is int
            and type(raw[2]) is int and type(raw[3]) is bytes):
        raise WireError("a batch reference must be [producer, version, index, digest]")
    return BatchRef(*raw)


def _step(raw: Any) -> StepCommit:
    if not (isinstance(raw, list) and len(raw) == 4 and isinstance(raw[0], list) and type(raw[1]) is bytes
            and type(raw[2]) is bytes and type(raw[3]) is float):
        raise WireError("a step must be [batches, weights, grad_root, grad_norm]")
    return StepCommit(tuple(_batch(b) for b in raw[0]), raw[1], raw[2], raw[3])


def decode_commitment(data: bytes) -> InnerCommitment:
    """Parse hostile bytes into a commitment. ``WireError`` if malformed; no signature check here."""
    items = _unpack(data)
    kinds = (str, int, str, str, bytes, bytes, bytes, int, int, int, list, bytes, list, bytes)
    if any(type(v) is not k for v, k in zip(items, kinds)):
        raise WireError("inner commitment fields have the wrong types")
    if not all(type(s) is str for s in items[10]):
        raise WireError("inner commitment state names must be strings")
    c = InnerCommitment(run_id=items[0], round=items[1], trainer=items[2], signer=items[3], base=items[4],
                        payload=items[5], settings=items[6], params=items[7], leaf=items[8], adam_step=items[9],
                        state=tuple(items[10]), state_root=items[11], steps=tuple(_step(s) for s in items[12]),
                        signature=items[13])
    problem = next(_problems(c, unsigned_ok=False), None)
    if problem:
        raise WireError(f"invalid inner commitment for round {c.round}: {problem}")
    return c


def _problems(c: InnerCommitment, *, unsigned_ok: bool) -> Iterator[str]:
    if not is_run_id(c.run_id):
        yield f"run_id must be {RUN_ID_RULE}"
    if not 0 <= c.round <= _MAX_INT or not 0 <= c.adam_step <= _MAX_INT:
        yield "round and adam_step must be non-negative 63-bit integers"
    if not 0 < len(c.trainer) <= MAX_TRAINER_ID:
        yield f"trainer must be a peer id of 1..{MAX_TRAINER_ID} characters"
    if len(c.signer) != 64 or any(ch not in "0123456789abcdef" for ch in c.signer):
        yield "signer must be 64 lowercase hex characters"
    if any(len(d) != DIGEST_LEN for d in (c.base, c.payload, c.settings, c.state_root)):
        yield f"base, payload, settings and state_root must be {DIGEST_LEN}-byte digests"
    if not 0 < c.params <= MAX_PARAMS or c.leaf not in LEAF_SIZES:
        yield f"params must be 1..2^40 and leaf one of {LEAF_SIZES[0]}..{LEAF_SIZES[-1]} (a power of 2)"
    if c.state not in (STATE_GLOBAL, STATE_TRAINER):
        yield f"state must name {STATE_GLOBAL} or {STATE_TRAINER}"
    if len(c.steps) > MAX_STEPS:
        yield f"at most {MAX_STEPS} steps"
    yield from (p for s in c.steps for p in _step_problems(s))
    if not (unsigned_ok and c.signature == b"") and len(c.signature) != 64:
        yield "signature must be 64 bytes"


def _step_problems(s: StepCommit) -> Iterator[str]:
    if not 0 < len(s.batches) <= MAX_BATCHES_PER_STEP:
        yield f"a step names 1..{MAX_BATCHES_PER_STEP} batches"
    for b in s.batches:
        if not 0 < len(b.producer) <= MAX_TRAINER_ID or len(b.digest) != DIGEST_LEN:
            yield "a batch names a producer peer id and a 32-byte digest"
        if not (0 <= b.version <= _MAX_INT and 0 <= b.index <= _MAX_INT):
            yield "a batch's version and index must be non-negative"
    if len(s.weights) != DIGEST_LEN or len(s.grad_root) not in (0, DIGEST_LEN):
        yield "a step names its weights' 32-byte state hash and an empty or 32-byte gradient root"
    if not (math.isfinite(s.grad_norm) and s.grad_norm >= 0.0):
        yield "a step's gradient norm must be finite and non-negative"


def verify_commitment(c: InnerCommitment, *, signer_key: str) -> None:
    """``IntegrityError`` unless ``c`` was signed by ``signer_key`` (public key hex)."""
    if c.signer != signer_key.lower():
        raise IntegrityError(f"round {c.round} commitment of {c.trainer[:12]} is not signed by its key")
    if not verify_signature(c.signer, signing_bytes(c), c.signature):
        raise IntegrityError(f"round {c.round} commitment of {c.trainer[:12]}: bad signature")


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
