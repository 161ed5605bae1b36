"""Round-decision equivocation: one key signing two different decisions for one round.

The coordinator of a round signs one decision (``loco/decision.py``); two that name other
payloads for the same round of the same epoch on the same base, both validly signed by the same
key, prove that it told trainers different things (a fork on purpose). Decisions of another
epoch or base are no conflict: a trainer that restarted, resumed alone or re-synced decides the
round's number again on another chain. ``decisions_conflict`` is the ``chain/evidence.py`` checker for them,
``commits_conflict`` (``loco/roundcommit.py``) the one for two round commitments (the same rule: one
epoch, one base); ``evidence_checkers`` is every kind a node verifies.
"""

from __future__ import annotations

from pulse_node.chain.evidence import Checker, heads_conflict
from pulse_node.errors import IntegrityError
from pulse_node.loco.decision import decode_decision, verify_decision
from pulse_node.loco.roundcommit import commits_conflict


def decisions_conflict(first: bytes, second: bytes, run_id: str) -> tuple[str, int]:
    """(signer, round) if both are decisions of ``run_id`` validly signed by one key for one round
    of one epoch on one base that name other payloads; ``IntegrityError`` / ``WireError`` otherwise."""
    a, b = decode_decision(first), decode_decision(second)
    if a.signer != b.signer or a.round != b.round:
        raise IntegrityError("the two decisions are not one key's decisions for one round")
    if (a.epoch, a.base) != (b.epoch, b.base):
        raise IntegrityError(f"the two decisions of round {a.round} are of other epochs or bases "
                             "(a restart, a resume or a re-sync): no conflict")
    if a.contributors == b.contributors:
        raise IntegrityError(f"the two decisions of round {a.round} agree: no conflict")
    for d in (a, b):
        if d.run_id != run_id:
            raise IntegrityError(f"round {d.round} decision is for run {d.run_id!r}")
        verify_decision(d, signer_key=a.signer)
    return a.signer, a.round


def evidence_checkers() -> dict[str, Checker]:
    """Every kind of evidence a node verifies."""
    return {"head": heads_conflict, "decision": decisions_conflict, "commitment": commits_conflict}
