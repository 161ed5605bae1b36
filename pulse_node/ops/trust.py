"""Each trainer's trust weight in the last round and its spot checks, for ``pulse-node status``.

Every trainer holds the same trust ledger (part of the replicated outer state, ``loco/ledger.py``)
and reports it in ``status.json`` (``trust``); the dashboard shows the report of the trainer at
the newest version (one table: the ledger is one).
"""

from __future__ import annotations

from collections.abc import Sequence

import pydantic

from pulse_node.daemon.status_model import StatusReport


class TrustView(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    trainer: str  # the node's name when known, else the start of its peer id
    peer_id: str
    weight: float
    member: bool
    contributed: int
    passed: int
    failed: int
    unrevealed: int = 0  # commitments it entered a round with and never revealed
    state: str  # "", "owing" or "convicted"


def trust_views(statuses: Sequence[tuple[str, StatusReport]]) -> list[TrustView]:
    """Rows of the trust report of the trainer holding the newest version."""
    trainers = [(name, st) for name, st in statuses if st.role == "trainer" and st.trust]
    if not trainers:
        return []
    names = {st.peer_id: name for name, st in statuses if st.peer_id}
    _, newest = max(trainers, key=lambda t: (t[1].version, t[1].updated_at))
    return [TrustView(trainer=names.get(e.key, e.key[:12]), peer_id=e.key, weight=e.weight, member=e.member,
                      contributed=e.contributed, passed=e.passed, failed=e.failed, unrevealed=e.unrevealed,
                      state="convicted" if e.convicted else "owing" if e.owing else "") for e in newest.trust]
