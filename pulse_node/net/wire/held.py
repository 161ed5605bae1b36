"""A connection's stream accept that waits while the ``Muzzle`` holds its peer.

py-libp2p runs one loop per connection that awaits ``muxed_conn.accept_stream()`` for every
stream the peer opens and hands it on at once. While that loop waits here instead, the muxer's
queue of new streams (10) fills, its reader stops reading the connection, and TCP flow control
stops the sender: a muzzled newcomer waits instead of being reset and asking again at once. Its
waiting costs this node nothing. Kept apart from ``gate.py`` (which needs libp2p's classes) so it
runs on trio alone.
"""

from __future__ import annotations

from typing import Any

import trio

from pulse_node.net.peers.budget import Muzzle


def hold_accepts(muxed: Any, muzzle: Muzzle) -> None:
    """Wrap ``muxed.accept_stream`` (the loop py-libp2p runs per connection calls it for every
    new stream): while ``muzzle`` holds the connection's peer, wait (or until it closes). Once per
    muxer: connections that share one (py-libp2p's duplicate wrappers) are held by one wrap."""
    if getattr(muxed, "_held_by_muzzle", False):
        return
    muxed._held_by_muzzle = True
    accept, peer = muxed.accept_stream, str(muxed.peer_id)
    closed = getattr(muxed, "event_closed", None)

    async def held() -> None:
        while (left := muzzle.wait_s(peer)) > 0:
            with trio.move_on_after(left):
                if closed is None:
                    await trio.sleep(left)
                else:
                    await closed.wait()
            if closed is not None and closed.is_set():
                return  # the accept reports the closed connection

    async def accept_stream() -> Any:
        await held()
        stream = await accept()
        await held()  # the stream the loop was already waiting for when the muzzle began waits too
        return stream

    muxed.accept_stream = accept_stream
