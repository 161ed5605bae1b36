"""Who sends rollouts to the trainers, and what came of it: one row per (trainer, sender).

Read from each trainer's declared ``rollout_senders`` (``daemon/status_model.SenderReport``,
kept by ``trainer/intake.py``): batches accepted and refused by reason, strikes, bans. A
sender is named as the dashboard names the node when one of its statuses has that peer id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pydantic

from pulse_node.daemon.status_model import StatusReport
from pulse_node.vocab import BatchRefusal

#: rows shown at most (senders with refusals and the most batches first)
MAX_SENDERS_SHOWN = 40


class SenderView(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    trainer: str
    sender: str  # the node's name when known, else the start of its peer id
    peer_id: str
    accepted: int
    accepted_rollouts: int
    refused: int
    reasons: dict[BatchRefusal, int]
    strikes: int
    banned: bool
    queued: int


def sender_views(statuses: Sequence[tuple[str, StatusReport]]) -> list[SenderView]:
    """Rows of every trainer's per-sender tallies, refused senders first, then by batches."""
    names: Mapping[str, str] = {st.peer_id: name for name, st in statuses if st.peer_id}
    rows = [SenderView(trainer=name, sender=names.get(pid, pid[:12]), peer_id=pid, accepted=t.accepted,
                       accepted_rollouts=t.accepted_rollouts, refused=sum(t.rejected.values()),
                       reasons=dict(t.rejected), strikes=t.strikes, banned=t.banned, queued=t.queued)
            for name, st in statuses if st.role == "trainer" for pid, t in st.rollout_senders.items()]
    rows.sort(key=lambda r: (not r.banned, -r.refused, -r.accepted, r.trainer, r.sender))
    return rows[:MAX_SENDERS_SHOWN]
