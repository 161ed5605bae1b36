"""The swarm's shared vocabulary, defined once: message kinds, the inbound event, the run id.

Every layer speaks these names: roles, the ``Transport`` implementations (P2P and in-memory),
both worker processes, the wire protocol (push kinds travel as these strings; fetch kinds name
the ``/pulse/<kind>/<version>`` protocols), fault injection and configs. Nothing translates one
spelling into another. Pure: no I/O, importable from every layer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from pulse_node.errors import WireError

#: what one peer may push into another's event queue
PushKind = Literal["rollouts", "loco", "head", "loco_decision", "evidence"]
#: what one peer may fetch from another's store
FetchKind = Literal["record", "patch", "anchor", "catchup", "trainer_state", "loco_payload", "loco_decision"]
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
