"""Peers that lie on purpose, for the tests of what a node accepts (``tests/test_node_sync_bounds.py``,
``tests/test_node_resync_trust.py``): in-process, on a ``MemoryHub``, under real libp2p peer ids.

``LyingServer`` serves a real store (so its records are genuine, signed by real trainers) but
lies about chosen kinds: ``oversize`` (a body far larger than any signed size), ``bad_chunk``
(an anchor whose data region has one flipped byte), ``bad_header`` (an anchor whose header is
not the one its signed record implies). ``served`` counts what it answered, by kind.
``announce`` publishes a discovery record for an identity with any role, version and key.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from pulse_node.chain.anchor import header_length
from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.chain.peer import PeerRecord, PeerStatus, Serves
from pulse_node.fsutil import write_atomic
from pulse_node.net.wire.protocol import FetchRequest, kind_of, params_of
from pulse_node.net.wire.serving import resolve
from pulse_node.testing.memory import announced
from pulse_node.vocab import NodeRole

LIES = ("oversize", "bad_chunk", "bad_header")
OVERSIZE_BYTES = 8 << 20


class LyingServer:
    """A resolver over ``root`` (a store) that lies about the kinds in ``lies`` (kind -> lie)."""

    def __init__(self, root: Path, scratch: Path, *, lies: dict[str, str]) -> None:
        assert set(lies.values()) <= set(LIES), lies
        self.root, self.scratch, self.lies = Path(root), Path(scratch), dict(lies)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.served: Counter[str] = Counter()

    def __call__(self, request: FetchRequest) -> Path | None:
        path, kind = resolve(self.root, request), kind_of(request)
        self.served[kind] += 1
        lie = self.lies.get(kind)
        if lie is None or path is None or not (lie == "oversize" or path.exists()):
            return path
        out = self.scratch / f"{kind}-{lie}-{'-'.join(str(v) for v in params_of(request).values())}"
        if lie == "oversize":
            write_atomic(out, os.urandom(OVERSIZE_BYTES))
        else:
            data = bytearray(path.read_bytes())
            data_start = 8 + header_length(bytes(data[:8]))
            i = data_start + (len(data) - data_start) // 2 if lie == "bad_chunk" else data_start - 3
            data[i] ^= 0x20  # bad_header: a byte of the JSON header's tail (its padding or metadata)
            write_atomic(out, bytes(data))
        return out


def peer_id(identity: Identity) -> str:
    return peer_id_of_key(identity.public_key_hex)


def announce(hub: Any, identity: Identity, resolver: Any, *, role: NodeRole, version: int = -1, lowest: int = -1,
             anchors: tuple[int, ...] = (), node_key: str | None = None) -> PeerRecord:
    """Join ``hub`` under ``identity``'s real peer id and publish a record claiming these things
    (``node_key``: the key it announces, its own by default); returns the record."""
    status = PeerStatus(role=role, version=None if version < 0 else version,
                        serves=Serves(lowest=None if lowest < 0 else lowest, highest=None if version < 0 else version,
                                      anchors=list(anchors)),
                        node_key=identity.public_key_hex if node_key is None else node_key)
    info = announced(peer_id(identity), status)
    hub.join(info.peer_id, resolver).publish(status)
    return info
