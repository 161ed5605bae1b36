"""Inbound streams of peers without standing, admitted before protocol negotiation.

Refusing a stream used to cost this node about what opening it cost the sender: py-libp2p
negotiated the protocol (multistream-select, several framed round trips in Python) and only then
did ``StreamPools.open`` find the newcomers' request bucket empty and write a ``busy`` reply
(bench/RESULTS.md: +7-13 CPU s per 20 s window of a catch-up Sybil attack). py-libp2p asks its
resource manager about every inbound stream before negotiating (``acquire_stream``); a refusal
there is a bare muxer reset. ``StreamGate`` is py-libp2p's own default resource manager (what
``new_host`` makes when given none: same limits, same connection guards) with one rule added:
an inbound stream of a newcomer (no membership, no standing) is refused there when the streams
already open would get it refused after negotiation anyway (its own 4, or the newcomers' shared
slots), and otherwise must take a token from the newcomers' shared request bucket
(``StreamPools.admit``), so 1 or 1,000 fresh keys together get at most the newcomers' rate of
negotiated streams. Members and peers with standing pass untouched (their own buckets are taken
after negotiation, as before, and a refusal still reaches them as a typed ``busy``).
"""

from __future__ import annotations

from libp2p.rcmgr import ResourceManager
from libp2p.rcmgr.manager import Direction

from pulse_node.net.peers.budget import StreamPools


class StreamGate(ResourceManager):
    """py-libp2p's default resource manager, plus the newcomers' admission before negotiation."""

    def __init__(self, pools: StreamPools) -> None:
        # the arguments ``libp2p.rcmgr.new_resource_manager`` (what new_host uses by default) passes
        super().__init__(enable_connection_pooling=False, enable_memory_pooling=True)
        self.pools = pools
        pools.gated = True

    def acquire_stream(self, peer_id: str, direction: Direction) -> bool:
        if direction == Direction.INBOUND and not self.pools.admit(str(peer_id)):
            return False  # the muxer resets the stream: no negotiation, no reply (counted by ``admit``)
        return super().acquire_stream(peer_id, direction)
