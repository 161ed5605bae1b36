"""A muzzled peer's new inbound streams wait; the connection they came on keeps being read.

py-libp2p runs one loop per connection that awaits ``muxed_conn.accept_stream()`` for every
stream the peer opens and hands it on at once (negotiation, then our handler). ``hold_accepts``
wraps that accept: while the ``Muzzle`` holds the connection's peer, each new stream is accepted
from the muxer (so the muxer keeps reading the connection, and this node's own streams to that
peer go on) but parked, not handed on, until the muzzle ends: the peer's request waits instead of
being refused and asked again at once. Parked streams cost their muxer buffers (each bounded by
its flow-control window); a peer that keeps opening streams while ``HELD_STREAMS`` wait is held
whole, as before: its next stream is not accepted, the muxer's queue of new streams fills, the
muxer stops reading the connection and TCP stops the sender. Kept apart from ``gate.py`` (which
needs libp2p's classes) so it runs on trio alone.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import TYPE_CHECKING

import trio

from pulse_node.net.peers.budget import Muzzle

if TYPE_CHECKING:  # types only: this module runs without libp2p's classes (see above)
    from libp2p.abc import IMuxedConn, IMuxedStream

#: new streams of a muzzled peer parked at once, before its whole connection is held: an honest
#: newcomer has at most its 4 streams open (one it gave up on is reset, and no longer counts); with
#: the muxer's own queue (10) at most 26 streams' windows (256 KiB each) buffered per connection
HELD_STREAMS = 16
#: the muxers whose accept is wrapped already
_HELD: weakref.WeakSet[IMuxedConn] = weakref.WeakSet()


def _gone(stream: IMuxedStream) -> bool:
    """Whether the peer already reset or closed a parked stream (it no longer counts)."""
    return bool(getattr(stream, "reset_received", False) or getattr(stream, "closed", False))


def hold_accepts(muxed: IMuxedConn, muzzle: Muzzle) -> None:
    """Wrap ``muxed.accept_stream`` (the loop py-libp2p runs per connection calls it for every
    new stream): while ``muzzle`` holds the connection's peer, new streams are taken from the
    muxer and parked until the muzzle ends (or the connection closes). Once per muxer:
    connections that share one (py-libp2p's duplicate wrappers) are held by one wrap."""
    if muxed in _HELD:
        return
    _HELD.add(muxed)
    accept, peer = muxed.accept_stream, str(muxed.peer_id)
    closed = getattr(muxed, "event_closed", None)
    parked: deque[IMuxedStream] = deque()

    async def wait_out(left: float) -> None:
        """The muzzle's remaining ``left`` seconds, or until the connection closes."""
        with trio.move_on_after(left):
            if closed is None:
                await trio.sleep(left)
            else:
                await closed.wait()

    async def accept_stream() -> IMuxedStream:
        while True:
            for gone in [s for s in parked if _gone(s)]:
                parked.remove(gone)
            left = muzzle.wait_s(peer)
            if parked and (left <= 0 or (closed is not None and closed.is_set())):
                return parked.popleft()  # released (or handed on to find its connection closed)
            if left > 0 and len(parked) >= HELD_STREAMS:
                await wait_out(left)  # it keeps opening streams while held: its connection waits
                continue
            stream: IMuxedStream | None = None
            with trio.move_on_after(left if left > 0 else float("inf")):
                stream = await accept()  # the connection is read meanwhile; our streams go on
            if stream is None:
                continue  # the muzzle ended with nothing new: hand on what is parked
            if muzzle.wait_s(peer) <= 0 and not parked:
                return stream
            parked.append(stream)

    setattr(muxed, "accept_stream", accept_stream)  # noqa: B010 (this one connection's method, on purpose)
