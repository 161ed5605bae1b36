"""The swarm's shared vocabulary, defined once: message kinds, the inbound event, the run id,
and why a peer's input is refused.

Every layer speaks these names: roles, the ``Transport`` implementations (P2P and in-memory),
both worker processes, the wire protocol (push kinds travel as these strings; fetch kinds name
the ``/pulse/<kind>/<version>`` protocols), fault injection and configs. Nothing translates one
spelling into another. Pure: no I/O, importable from every layer.

Refusal reasons are string enums (``Reason``, a ``StrEnum`` Python 3.10 lacks): a member *is* its string, so the counters keyed by them in
``status.json`` read as before (``{"too_large": 1}``), while code names a reason by attribute and
the type checker refuses one that does not exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Literal, get_args

from pulse_node.errors import WireError

#: what one peer may push into another's event queue
PushKind = Literal["rollouts", "loco", "loco_commit", "head", "loco_decision", "evidence", "spot_answer", "spot_verdict",
                   "spot_evidence"]
#: what one peer may fetch from another's store
FetchKind = Literal["record", "patch", "anchor", "catchup", "trainer_state", "loco_payload", "loco_decision",
                    "loco_commit"]
#: any message kind (fault injection faults pushes and fetches alike)
Kind = Literal[PushKind, FetchKind]

#: what a node is (its DHT record says it)
NodeRole = Literal["bootstrap", "trainer", "inference"]

PUSH_KINDS: tuple[PushKind, ...] = get_args(PushKind)
FETCH_KINDS: tuple[FetchKind, ...] = get_args(FetchKind)

def check_push_kind(kind: object) -> PushKind:
    """``kind`` if it is a push kind; ``WireError`` naming the known ones otherwise."""
    for known in PUSH_KINDS:
        if kind == known:
            return known
    raise WireError(f"unknown push kind {kind!r}; expected one of {', '.join(PUSH_KINDS)}")


def check_fetch_kind(kind: object) -> FetchKind:
    """``kind`` if it is a fetch kind; ``WireError`` naming the known ones otherwise."""
    for known in FETCH_KINDS:
        if kind == known:
            return known
    raise WireError(f"unknown fetch kind {kind!r}; expected one of {', '.join(FETCH_KINDS)}")


#: a run id names one swarm: its DHT keys (``pulse/<run>/...``), signed records and decisions
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RUN_ID_RULE = "1-64 characters of [A-Za-z0-9._-], starting with a letter or digit"
#: the run every command and config uses unless told otherwise (bootstrap, join, swarm, status)
DEFAULT_RUN_ID = "pulse-local"
_RUN_ID = re.compile(RUN_ID_PATTERN)


def is_run_id(text: object) -> bool:
    return isinstance(text, str) and _RUN_ID.fullmatch(text) is not None


def check_run_id(text: str) -> str:
    """``text`` if it is a valid run id; ``ValueError`` (pydantic shows its message) otherwise."""
    if not is_run_id(text):
        raise ValueError(f"run id {text!r} must be {RUN_ID_RULE}")
    return text


@dataclass(frozen=True)
class Event:
    """One push a peer sent us: its kind, the authenticated sender's peer id, the body, the arrival time.

    ``sender`` is the peer id the transport authenticated (the Noise/p2pd handshake of the
    stream), never anything the peer wrote."""

    kind: PushKind
    sender: str
    data: bytes
    received_at: float


class Reason(str, Enum):
    """A string enum: a member equals, hashes, prints, formats and JSON-encodes as its value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class BudgetRefusal(Reason):
    """Why a peer's request was refused by its per-peer budget (``net/peers/budget.py``;
    counted in ``data_plane.refused``)."""

    STREAMS_PEER = "streams_peer"
    STREAMS_POOL = "streams_pool"
    STREAMS_NEWCOMERS = "streams_newcomers"
    RATE = "rate"
    PUSH_SHARE = "push_share"
    PUSH_POOL = "push_pool"
    SLOW = "slow"
    DEADLINE = "deadline"
    EVICTED = "evicted"
    CATCHUP_BUDGET = "catchup_budget"
    BULK_BUDGET = "bulk_budget"
    DHT_NEWCOMERS = "dht_newcomers"  # a newcomer's DHT record this node declined to store (net/dht/capped_storage.py)
    MUZZLED = "muzzled"  # a newcomer refused too fast: its connection is not read for a while (net/wire/gate.py)


class BatchRefusal(Reason):
    """Why a trainer refused a rollout batch (``rl/verify.py``, ``trainer/intake.py``; counted per
    sender in ``rollout_senders[...].rejected``). ``BATCH_STRIKES`` mean the sender lied."""

    MALFORMED = "malformed"
    BATCH_SHAPE = "batch_shape"
    BATCH_INDEX = "batch_index"
    FUTURE_VERSION = "future_version"
    STALE = "stale"
    REPLAYED = "replayed"
    UNKNOWN_VERSION = "unknown_version"
    EVAL_PROMPT = "eval_prompt"
    PROMPT_NOT_ASSIGNED = "prompt_not_assigned"
    GROUP_ID = "group_id"
    TERMINATION = "termination"
    TOKEN_RANGE = "token_range"
    NOT_SAMPLED = "not_sampled"
    WRONG_REWARD = "wrong_reward"
    FORGED_LOGPROBS = "forged_logprobs"
    BANNED = "banned"
    TOO_LARGE = "too_large"
    QUEUE_FULL = "queue_full"


#: batch refusals that strike the sender (it sent something false); the others are nobody's fault
BATCH_STRIKES = frozenset({
    BatchRefusal.MALFORMED, BatchRefusal.BATCH_SHAPE, BatchRefusal.BATCH_INDEX, BatchRefusal.EVAL_PROMPT,
    BatchRefusal.PROMPT_NOT_ASSIGNED, BatchRefusal.GROUP_ID, BatchRefusal.TERMINATION, BatchRefusal.TOKEN_RANGE,
    BatchRefusal.NOT_SAMPLED, BatchRefusal.WRONG_REWARD, BatchRefusal.FORGED_LOGPROBS,
})


class LocoRefusal(Reason):
    """Why a trainer refused a PULSELoCo payload (``trainer/agreement.py``; ``trainer.loco_refused``)."""

    NOT_MEMBER = "not_member"
    OUT_OF_BOUND = "out_of_bound"
    TOO_LARGE = "too_large"
    MALFORMED = "malformed"
    TOO_FAR_AHEAD = "too_far_ahead"
    DUPLICATE = "duplicate"
    BANNED = "banned"
    UNCOMMITTED = "uncommitted"  # a payload (or a commitment) that does not match the sender's commitment
    BAD_COMMITMENT = "bad_commitment"
    EQUIVOCATION = "equivocation"  # a second, different commitment of one key for one round of one chain
    SPOT_TERMS = "spot_terms"  # spot checks on: no inner-step commitment, or one for another model, steps or settings
    OTHER_STATE = "other_state"  # a commitment on another epoch or base (a trainer forked or re-syncing): no strike


class DecisionRefusal(Reason):
    """Why a trainer refused a round decision (``trainer/decisions.py``; ``trainer.decisions_refused``)."""

    NOT_MEMBER = "not_member"
    BAD_DECISION = "bad_decision"
    OUT_OF_BOUND = "out_of_bound"
    EQUIVOCATION = "equivocation"
    BANNED = "banned"
    OTHER_BASE = "other_base"
    NOT_DESIGNATED = "not_designated"
    OMITS_COMMITMENT = "omits_commitment"  # leaves out a commitment this trainer held in time
    OMITS_VERDICT = "omits_verdict"  # leaves out a failed verdict with evidence this trainer held in time
    REFUTED = "refuted"  # names "no answer" of a target whose answer receipt this trainer held in time
    BAD_COMMITMENT = "bad_commitment"  # names a commitment this trainer lacked that, fetched, fails its checks
