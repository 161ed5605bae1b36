"""The rollout: one sampled completion with its behaviour log-probs and policy version.

Rollouts travel from inference nodes to trainers, so the wire format is a declared, versioned
msgpack struct and decoding treats the bytes as hostile: a size cap before parsing, msgpack
limits, exact field sets and types, bounded lengths, finite values. Any violation is a
``WireError``. Token ids are packed as little-endian uint32 and log-probs as float32.

Wire version 3: ``{"wire": 3, "precision": "fp32" | "bf16" | "fp16", "rollouts": [...]}``: the
precision the producer computed its logits in (new in 3: the verifier's tolerances follow from it,
``rl/precision.py``; version 2, without it, still decodes as "fp32"), and one map per rollout with
``p`` prompt ids, ``c`` completion ids, ``l`` behaviour log-probs, ``r`` reward, ``v`` version,
``pid`` problem id, ``g`` GRPO group id, ``f`` finished (ended with EOS), ``b`` the batch index
and ``i`` the sample index within the batch (``rl/assign.py``). Decoding only checks shapes: every
claim (prompts, tokens, reward, log-probs, version) is checked by the trainer (``rl/verify.py``),
and a decoded rollout is never ``local``.
"""

from __future__ import annotations

import array
import math
import sys
from dataclasses import dataclass, field

import msgpack
import numpy as np

from pulse_node.errors import WireError

WIRE_VERSION = 3
PRECISIONS = ("fp32", "bf16", "fp16")
MAX_ROLLOUTS = 65536
MAX_TOKENS = 1 << 16  # per prompt or completion
MAX_ID_LEN = 256
DEFAULT_MAX_BYTES = 64 << 20
_FIELDS = {"p", "c", "l", "r", "v", "pid", "g", "f", "b", "i"}
MAX_BATCH_INDEX = 1 << 20


@dataclass
class Rollout:
    """One completion of one prompt, produced by policy ``version``."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each completion token
    reward: float
    version: int
    problem_id: str
    group_id: str  # rollouts of one prompt in one batch share it (the GRPO group)
    finished: bool = True  # ended with EOS (False: truncated at max_new_tokens)
    batch: int = 0  # batch index of its version's batches by its producer (rl/assign.py)
    sample: int = 0  # position in its batch (seeds its token draws)
    text: str = field(default="", compare=False)  # decoded completion (local only, not sent)
    # reward and log-probs were computed on this node (own sampler or the verifier), never sent
    local: bool = field(default=False, compare=False)
    precision: str = "fp32"  # what the producer computed its logits in (one per batch on the wire)


_ARRAY_LE = sys.byteorder == "little" and array.array("I").itemsize == array.array("f").itemsize == 4


def _le(code: str, values: list[int] | list[float]) -> bytes:
    """Little-endian uint32 (``"I"``) or float32 (``"f"``) bytes of a list: ``array`` is 2-3x
    quicker than NumPy on short lists, with the same bytes (a C cast rounds to the nearest float32
    as NumPy does; a value out of a uint32's range raises in both)."""
    if _ARRAY_LE and isinstance(values, list):
        return array.array(code, values).tobytes()
    return np.asarray(values, dtype="<u4" if code == "I" else "<f4").tobytes()


def _pack_one(r: Rollout, prompt: bytes) -> dict[str, object]:
    """One rollout's map, its prompt ids already packed (``prompt``)."""
    return {
        "p": prompt,
        "c": _le("I", r.completion_ids),
        "l": _le("f", r.logprobs),
        "r": float(r.reward),
        "v": int(r.version),
        "pid": r.problem_id,
        "g": r.group_id,
        "f": bool(r.finished),
        "b": int(r.batch),
        "i": int(r.sample),
    }


def _pack_all(rollouts: list[Rollout]) -> list[dict[str, object]]:
    """Every rollout's map; a prompt list equal to the one before it (a group's rollouts share
    their prompt, often as one list) is packed once."""
    out: list[dict[str, object]] = []
    last: list[int] | None = None
    prompt = b""
    for r in rollouts:
        ids = r.prompt_ids
        if last is None or not (ids is last or (isinstance(ids, list) and ids == last)):
            prompt, last = _le("I", ids), ids if isinstance(ids, list) else None
        out.append(_pack_one(r, prompt))
    return out


def encode_rollouts(rollouts: list[Rollout]) -> bytes:
    """Bytes of a rollout batch (msgpack ``{"wire": 3, "precision": .., "rollouts": [...]}``)."""
    if len(rollouts) > MAX_ROLLOUTS:
        raise ValueError(f"at most {MAX_ROLLOUTS} rollouts per message")
    precision = {r.precision for r in rollouts} or {"fp32"}
    if len(precision) != 1 or not precision <= set(PRECISIONS):
        raise ValueError(f"a batch has one precision of {PRECISIONS}, not {sorted(precision)}")
    for r in rollouts:
        if len(r.logprobs) != len(r.completion_ids):
            raise ValueError("a rollout needs one log-prob per completion token")
    body = {"wire": WIRE_VERSION, "precision": precision.pop(), "rollouts": _pack_all(rollouts)}
    return msgpack.packb(body, use_bin_type=True)


def _ids(raw: object, what: str) -> list[int]:
    if not isinstance(raw, bytes) or len(raw) % 4 or len(raw) // 4 > MAX_TOKENS:
        raise WireError(f"rollout field {what}: expected packed uint32 ids (<= {MAX_TOKENS})")
    arr = np.frombuffer(raw, dtype="<u4")
    if arr.size and int(arr.max()) >= 2**31:
        raise WireError(f"rollout field {what}: token id out of range")
    ids: list[int] = arr.astype(np.int64).tolist()
    return ids


def _logprobs(raw: object, n: int) -> list[float]:
    if not isinstance(raw, bytes) or len(raw) != 4 * n:
        raise WireError("rollout field l: expected one float32 log-prob per completion token")
    arr = np.frombuffer(raw, dtype="<f4")
    if not np.all(np.isfinite(arr)) or (arr.size and float(arr.max()) > 1e-4):
        raise WireError("rollout field l: log-probs must be finite and <= 0")
    logprobs: list[float] = arr.astype(np.float64).tolist()
    return logprobs


def _text(raw: object, what: str) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > MAX_ID_LEN:
        raise WireError(f"rollout field {what}: expected a string of 1..{MAX_ID_LEN} chars")
    return raw


def _int(raw: object, what: str, limit: int) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw < limit:
        raise WireError(f"rollout field {what}: must be an int in [0, {limit})")
    return raw


def _unpack_one(item: object) -> Rollout:
    if not isinstance(item, dict) or set(item) != _FIELDS:
        raise WireError(f"rollout must be a map with fields {sorted(_FIELDS)}")
    completion = _ids(item["c"], "c")
    reward, finished = item["r"], item["f"]
    if not isinstance(reward, float) or not math.isfinite(reward):
        raise WireError("rollout field r: reward must be a finite float")
    version = _int(item["v"], "v", 2**62)
    if not isinstance(finished, bool):
        raise WireError("rollout field f: must be a bool")
    prompt = _ids(item["p"], "p")
    if not prompt or not completion:
        raise WireError("rollout has an empty prompt or completion")
    return Rollout(prompt_ids=prompt, completion_ids=completion,
                   logprobs=_logprobs(item["l"], len(completion)), reward=reward,
                   version=version, problem_id=_text(item["pid"], "pid"),
                   group_id=_text(item["g"], "g"), finished=finished,
                   batch=_int(item["b"], "b", MAX_BATCH_INDEX), sample=_int(item["i"], "i", MAX_ROLLOUTS))


def decode_rollouts(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Rollout]:
    """Rollouts from untrusted bytes; raises ``WireError`` on anything malformed."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("rollout message must be bytes")
    if len(data) > max_bytes:
        raise WireError(f"rollout message of {len(data)} bytes exceeds the {max_bytes} cap")
    try:
        body = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True,
                               max_bin_len=4 * MAX_TOKENS, max_str_len=MAX_ID_LEN * 4,
                               max_array_len=MAX_ROLLOUTS, max_map_len=16, max_ext_len=0)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            TypeError, UnicodeDecodeError) as exc:
        raise WireError(f"rollout message is not valid msgpack: {exc}") from None
    if not isinstance(body, dict) or body.get("wire") not in (2, WIRE_VERSION):
        raise WireError(f"rollout wire version {body.get('wire') if isinstance(body, dict) else None!r} "
                        f"unsupported (want {WIRE_VERSION})")
    fields = {"wire", "rollouts"} | ({"precision"} if body["wire"] == WIRE_VERSION else set())
    if set(body) != fields:
        raise WireError(f"rollout message must be a map with fields {sorted(fields)}")
    precision = body.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise WireError(f"rollout field precision must be one of {PRECISIONS}")
    if not isinstance(body["rollouts"], list):
        raise WireError("rollout message field 'rollouts' must be a list")
    out = [_unpack_one(item) for item in body["rollouts"]]
    for r in out:
        r.precision = precision
    return out
