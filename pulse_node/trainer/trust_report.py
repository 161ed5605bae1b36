"""The trust ledger as a node reports it (``status.json`` ``trust``; ``pulse-node status``)."""

from __future__ import annotations

from collections.abc import Mapping

from pulse_node.daemon.status_model import TrustEntry
from pulse_node.loco.ledger import Ledger

MAX_REPORTED = 64  # keys reported at most: last round's first, then owing and convicted ones


def trust_report(ledger: Ledger, weights: Mapping[str, float]) -> list[TrustEntry]:
    """Each key the last round weighed (``weights``: trainer id -> its weight), then the keys
    owing a check or convicted, then the others the ledger holds (weight 0 in the last round)."""
    entries = ledger.report()
    keys = sorted(weights, key=str.encode)
    rest = sorted((k for k in entries if k not in weights),
                  key=lambda k: (not (entries[k].owing or entries[k].convicted), -entries[k].contributed, k.encode()))
    keys += rest
    out = []
    for key in keys[:MAX_REPORTED]:
        e = entries.get(key)
        out.append(TrustEntry(key=key, weight=float(weights.get(key, 0.0)), member=bool(e and e.member),
                              contributed=e.contributed if e else 0, passed=e.passed if e else 0,
                              failed=e.failed if e else 0, unrevealed=e.unrevealed if e else 0,
                              owing=bool(e and e.owing), convicted=bool(e and e.convicted)))
    return out
