"""A node's equivocation evidence on the wire: taken from peers, spread once, listed in the status.

``EvidencePlane.take`` hands every ``evidence`` push to the peer book as ``Reported`` (the book
checks it itself, whoever sent it; one that does not check out is its sender's lie). ``tick``,
called by the role every pass, spreads each evidence the book holds and this plane has not
spread yet (found by the version gate, the round agreement, or received) once to every peer in
the background (the node's one pusher, ``RoleContext.push_in_background``), lists the convicted
key in ``status.json`` (``evidence``), and pushes every evidence held to peers that showed up
since (they joined after the gossip), at most every 10 s. A convicted key is refused by the
book from then on.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

from pulse_node.chain.identity import key_id_of
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status_model import EvidenceEntry
from pulse_node.peers.outcomes import Lied, Reported

_PUSH_TIMEOUT_S = 5.0
_TELL_EVERY_S = 10.0
_TOLD_CAP = 4096  # peers remembered as told

C = TypeVar("C", bound=TrainerConfig | InferenceConfig)


class EvidencePlane(Generic[C]):
    """Receives, spreads and reports the evidence of one node's peer book."""

    def __init__(self, ctx: RoleContext[C]) -> None:
        self.ctx, self.book = ctx, ctx.book
        self._spread = {e.key for e in self.book.convictions()}  # kept from an earlier run: told to new peers
        self._told: set[str] = set()  # peers pushed every evidence held when they were first seen
        self._told_at = float("-inf")
        self._tells = 0
        self._report()

    def take(self, sender: str, data: bytes) -> None:
        """Hand a pushed evidence to the book (which convicts its key, or strikes ``sender``)."""
        judged = self.book.judge(sender, Reported("pushed evidence", evidence=data))
        if isinstance(judged, Lied):
            with self.ctx.status.node() as counters:
                counters.rejected += 1
            self.ctx.log.warning("refused evidence from %s: %s", sender[:12], judged.why)
        self.tick()

    def tick(self) -> None:
        """Spread what the book convicted since the last tick; tell peers not told yet (cheap when
        there is nothing)."""
        fresh = [e for e in self.book.convictions() if e.key not in self._spread]
        for ev in fresh:
            self._spread.add(ev.key)
            self.ctx.status.error(f"trainer key {key_id_of(ev.key)} convicted of equivocation (two signed "
                                  f"{ev.kind}s for {ev.at}); refused from now on")
            peers = self.book.heeded(self.ctx.peers())
            self.ctx.push_in_background("evidence", ev.encode(), peers, job=f"evidence:{ev.key}",
                                        timeout=_PUSH_TIMEOUT_S, newcomers=len(peers))
        if fresh:
            self._report()
        self._tell_new_peers()

    def _tell_new_peers(self) -> None:
        now = time.monotonic()
        if not self._spread or now - self._told_at < _TELL_EVERY_S:
            return
        self._told_at = now
        fresh = [p for p in self.book.heeded(self.ctx.peers()) if p.peer_id not in self._told]
        fresh = fresh[:max(0, _TOLD_CAP - len(self._told))]
        if not fresh:
            return
        self._told.update(p.peer_id for p in fresh)
        self._tells += 1
        for ev in self.book.convictions():
            self.ctx.push_in_background("evidence", ev.encode(), fresh, job=f"evidence:{ev.key}:{self._tells}",
                                        timeout=_PUSH_TIMEOUT_S, newcomers=len(fresh))

    def _report(self) -> None:
        self.ctx.status.update(evidence=[EvidenceEntry(key=e.key, kind=e.kind, at=e.at, found_at=e.found_at)
                                         for e in self.book.convictions()])
