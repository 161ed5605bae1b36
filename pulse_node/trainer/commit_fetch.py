"""The round commitments a decision names that this member lacks: fetched, checked, held (issue 32).

A decision names every commitment its coordinator held (``loco/decision.py``); the payload check
and the spot draw of a contributor need its commitment (the draw needs the inner one). Before a
member accepts a decision (``trainer/decisions.py``, step 6) it holds every commitment the decision
names whose trainer may contribute here (a key we do not know is none we could check one by; a
contributor always may). One it lacks (a lost push, a partition, one it refused) is fetched by its
digest (``loco_commit``; every trainer serves the commitments it holds, ``trainer/commits.py``)
from, in turn: the decision's sender (a member that accepted the decision holds all it names),
its coordinator (it must serve all it named), the trainer, the other live members. One source
takes at most half the time left, so a stalling one cannot use it all; all fetches of one
decision take ``decision_wait_s / 2`` at most, and are tried again at most that often per
coordinator and round (a decision waiting for them is looked at every step). What came is
checked by its digest, then like a pushed commitment (``CommitIntake.take_named``), and a
contributor's payload digest must be the one its commitment names.
"""

from __future__ import annotations

import math
import time
from typing import Literal

from pulse_node.chain.peer import PeerRecord
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.loco.decision import RoundDecision
from pulse_node.loco.roundcommit import MAX_ROUNDCOMMIT_BYTES, commit_digest, decode_commit
from pulse_node.net.wire.protocol import LocoCommitRequest
from pulse_node.trainer.commits import CommitIntake, NamedFault
from pulse_node.trainer.round_peers import RoundPeers

#: a commitment of ``d`` that fails the checks here: (trainer, its bytes, why)
Failed = tuple[str, bytes, NamedFault]


class CommitFetch:
    """One member's fetches of the commitments decisions name (module docstring)."""

    def __init__(self, ctx: RoleContext[TrainerConfig], *, peers: RoundPeers, commits: CommitIntake) -> None:
        self.ctx, self.peers, self.commits = ctx, peers, commits
        self.tried: dict[tuple[int, str], float] = {}  # (round, coordinator) -> when we last fetched what it named

    def obtain(self, d: RoundDecision, *, sender: str) -> Failed | Literal["unfetched"] | None:
        """None once every commitment ``d`` names that may count here is held; ``unfetched`` if
        one could not be had (now, or already within the last ``decision_wait_s / 2``); else the
        first that fails our checks."""
        missing = [(tid, digest) for tid, digest in d.committed if self._lacks(d.round, tid, digest)]
        if not missing:
            return None
        now, wait = time.monotonic(), self.ctx.cfg.loco.decision_wait_s / 2
        if now < self.tried.get((d.round, d.coordinator), -math.inf) + wait:
            return "unfetched"
        self.tried[d.round, d.coordinator] = now
        contributors = dict(d.contributors)
        for tid, digest in missing:
            data = self._fetch(d, tid, digest, sender=sender, until=now + wait)
            if data is None:
                return "unfetched"
            fault = self.commits.take_named(d.round, tid, data, coordinator=d.coordinator)
            if fault is None and tid in contributors and decode_commit(data).payload != contributors[tid]:
                fault = NamedFault("forged", f"it names a payload of {tid[:12]} this commitment is not to")
            if fault is not None:
                return tid, data, fault
        return None

    def _lacks(self, r: int, tid: str, digest: bytes) -> bool:
        held = self.commits.of(r, tid)
        return (held is None or held.digest != digest) and self.peers.may_contribute(tid)

    def _fetch(self, d: RoundDecision, tid: str, digest: bytes, *, sender: str, until: float) -> bytes | None:
        """The commitment of digest ``digest`` from the first source serving it by ``until``."""
        live, first = self.peers.live(), [sender, d.coordinator, tid]
        sources: list[PeerRecord] = [live[p] for p in dict.fromkeys(first) if p in live]
        sources += [p for pid, p in sorted(live.items(), key=lambda kv: kv[0].encode()) if pid not in first]
        request = LocoCommitRequest(round=d.round, digest=digest.hex())
        for peer in sources:
            left = until - time.monotonic()
            if left <= 0:
                return None
            timeout = max(0.5, min(self.ctx.cfg.net.fetch_timeout_s, left / 2))
            data = self.peers.fetch(peer, request, cap=MAX_ROUNDCOMMIT_BYTES, timeout=timeout)
            if data is not None and commit_digest(data) == digest:
                return data
        return None

    def prune(self, r: int) -> None:
        self.tried = {k: t for k, t in self.tried.items() if k[0] >= r}
