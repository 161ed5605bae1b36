"""A node's equivocation evidence: its trust policy with the book on disk, gossip and status.

``node_trust`` builds the ``TrustPolicy`` every role uses, with the node's ``EvidenceBook``
(``<data_dir>/evidence``, every kind ``loco/equivocation.py`` checks) and ``chain.max_version_step``.
``EvidencePlane`` takes ``evidence`` pushes (verified by the book itself, whoever sent them; one
that does not check out strikes its sender) and, for every evidence this node newly verified,
found itself or received, pushes it once to every peer in the background and lists the convicted
key in ``status.json`` (``evidence``). A peer that shows up later (it joined after the gossip) is
pushed every evidence this node holds, once (``tell_new_peers``, at most every 10 s). A convicted
key is refused by the trust policy from then on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from pulse_node.chain.evidence import Evidence, EvidenceBook
from pulse_node.chain.identity import key_id_of
from pulse_node.chain.trainerset import TrainerSet
from pulse_node.chain.trust import TrustPolicy
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status_model import EvidenceEntry
from pulse_node.daemon.transport import push_to_all
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.equivocation import evidence_checkers

_PUSH_TIMEOUT_S = 5.0
_TELL_EVERY_S = 10.0
_TOLD_CAP = 4096  # peers remembered as told


def node_trust(cfg: Any, *, min_signers: int = 1) -> TrustPolicy:
    """The trust policy of a node with config ``cfg`` (its trainer set, evidence book, version step)."""
    book = EvidenceBook(run_id=cfg.run_id, directory=Path(cfg.data_dir) / "evidence", checkers=evidence_checkers())
    return TrustPolicy(TrainerSet.from_config(cfg.chain, run_id=cfg.run_id), min_signers=min_signers,
                       max_version_step=cfg.chain.max_version_step, evidence=book)


class EvidencePlane:
    """Receives, spreads and reports the evidence of one node's trust policy."""

    def __init__(self, ctx: RoleContext, trust: TrustPolicy) -> None:
        self.ctx, self.trust = ctx, trust
        self.book = trust.evidence
        self.book.on_new = self._spread
        self._told: set[str] = set()  # peers pushed every evidence held when they were first seen
        self._told_at = float("-inf")
        self._report()

    def take(self, sender: str, data: bytes) -> None:
        """Verify a pushed evidence and convict its key (``_spread`` follows); a bad one strikes ``sender``."""
        try:
            self.book.add_bytes(data)
        except (WireError, IntegrityError) as exc:
            with self.ctx.status.node() as counters:
                counters.rejected += 1
            self.trust.strike(sender)
            self.ctx.log.warning("refused evidence from %s: %s", sender[:12], exc)

    def tell_new_peers(self) -> None:
        """Push every evidence held to the peers not told yet (cheap when there is none)."""
        now = time.monotonic()
        if not self.book.convicted or now - self._told_at < _TELL_EVERY_S:
            return
        self._told_at = now
        fresh = [p for p in self.ctx.peers() if p.peer_id not in self._told and not self.trust.convicted(p.peer_id)]
        fresh = fresh[:max(0, _TOLD_CAP - len(self._told))]
        if not fresh:
            return
        self._told.update(p.peer_id for p in fresh)
        bodies = [e.encode() for e in self.book.entries()]

        def push() -> None:
            for data in bodies:
                push_to_all(self.ctx.transport, fresh, "evidence", data, timeout=_PUSH_TIMEOUT_S)

        threading.Thread(target=push, name="push-evidence", daemon=True).start()

    def _spread(self, ev: Evidence) -> None:
        self._report()
        self.ctx.status.error(f"trainer key {key_id_of(ev.key)} convicted of equivocation (two signed {ev.kind}s "
                              f"for {ev.at}); refused from now on")
        peers = [p for p in self.ctx.peers() if not self.trust.convicted(p.peer_id)]
        threading.Thread(target=push_to_all, args=(self.ctx.transport, peers, "evidence", ev.encode()),
                         kwargs={"timeout": _PUSH_TIMEOUT_S}, name="push-evidence", daemon=True).start()

    def _report(self) -> None:
        self.ctx.status.update(evidence=[EvidenceEntry(key=e.key, kind=e.kind, at=e.at, found_at=e.found_at)
                                         for e in self.book.entries()])
