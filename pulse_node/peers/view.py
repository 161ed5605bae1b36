"""What the transport's worker processes know of peers: one typed value, sent in one call.

The wire worker gives trainer-set members their own stream pool and larger shares, and peers
with standing shares of their own (everyone else shares the newcomers' allotments together,
``net/peers/budget.py``); the DHT worker's push plane serves members first and its record read
takes members' and standing peers' records first. The node tells both through
``Transport.set_view(PeerView)`` whenever the book's view changes (``RoleContext.peers``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: peers with standing a view names, at most (best first)
VIEW_STANDING = 256


@dataclass(frozen=True)
class PeerView:
    """The trainer-set members' peer ids, and the peer ids of non-members with standing, best first."""

    members: frozenset[str] = frozenset()
    standing: tuple[str, ...] = ()
