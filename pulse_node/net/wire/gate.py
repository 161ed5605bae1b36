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

A reset costs this node ~0.3-0.6 ms, but the sender may open the next stream at once: an
attacker on its own CPU re-opened thousands per node per 20 s and saturated a one-core swarm
(bench/RESULTS.md, "The whole adversary bench with the attacker on a CPU of its own").
``HeldAccepts`` wraps each connection's stream accept (``held.hold_accepts``): while the
``Muzzle`` holds a newcomer (refused repeatedly while newcomers together were refused too often
within a second), its new streams are parked, not served nor reset, while the connection is still
read (this node's own streams to that peer go on); one that keeps opening streams past
``held.HELD_STREAMS`` has its whole connection held, and TCP flow control stops it.
"""

from __future__ import annotations

from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.rcmgr import Direction, ResourceManager
from multiaddr import Multiaddr

from pulse_node.net.peers.budget import Muzzle, StreamPools
from pulse_node.net.wire.held import hold_accepts


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


class HeldAccepts(INotifee):
    """Every new connection's stream accept held by the ``Muzzle`` (``hold_accepts``)."""

    def __init__(self, muzzle: Muzzle) -> None:
        self.muzzle = muzzle

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        hold_accepts(conn.muxed_conn, self.muzzle)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        return None

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        return None

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        return None
