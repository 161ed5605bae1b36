"""What a node serves to peers: a typed fetch request -> a file of its version store.

The wire worker (another process) and the in-memory test transport both resolve a peer's
``FetchRequest`` (``protocol.py``, decoded and bounded already) through ``resolve``, so the set of
servable files is defined once, on the store's layout (``chain/layout.py``, ``chain/serving.py``:
the PULSELoCo payloads, round commitments and round decisions trainers keep of their last few
rounds).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from pulse_node.chain.catchup_producer import CatchupProducer
from pulse_node.chain.layout import catchup_path, store_path
from pulse_node.chain.serving import loco_commit_path, loco_decision_path, loco_payload_path
from pulse_node.errors import PulseError
from pulse_node.net.wire.protocol import (
    AnchorRequest,
    CatchupRequest,
    FetchRequest,
    LocoCommitRequest,
    LocoDecisionRequest,
    PatchRequest,
    RecordRequest,
    TrainerStateRequest,
)

_MAX_VERSION = 10**12
_HEX64 = re.compile(r"[0-9a-f]{64}")

#: a store's answer to a request: the file, or None (not held)
Resolver = Callable[[FetchRequest], "Path | None"]


def _servable(*numbers: int) -> bool:
    return all(n < _MAX_VERSION for n in numbers)


def resolve(root: Path, request: FetchRequest) -> Path | None:
    """The file answering ``request`` under ``root``, or None (never raises on a peer's request;
    the head record, ``RecordRequest(version=None)``, is the worker's own, not a file)."""
    try:
        return _path(Path(root), request)
    except PulseError:
        return None


def _path(root: Path, r: FetchRequest) -> Path | None:
    if isinstance(r, (RecordRequest, PatchRequest, AnchorRequest)):
        kind = "record" if isinstance(r, RecordRequest) else "patch" if isinstance(r, PatchRequest) else "anchor"
        return store_path(root, kind, r.version) if r.version is not None and _servable(r.version) else None
    if isinstance(r, CatchupRequest):
        return catchup_path(root, r.base, r.target) if r.base < r.target and _servable(r.target) else None
    if isinstance(r, TrainerStateRequest):
        return root / "trainer" / "state.safetensors"
    if not _servable(r.round):
        return None
    if isinstance(r, LocoDecisionRequest):
        return loco_decision_path(root, r.round)
    if not _HEX64.fullmatch(r.digest):
        return None
    if isinstance(r, LocoCommitRequest):
        return loco_commit_path(root, r.round, r.digest)
    return loco_payload_path(root, r.round, r.digest)


def store_resolver(root: Path, producer: CatchupProducer | None = None) -> Resolver:
    """A resolver bound to one store root; with ``producer``, missing catch-ups are made on demand.

    (The wire worker calls ``producer.request`` itself, on a thread, to keep its event loop
    serving.) Production errors propagate: ``BusyError`` (ask again) or a ``PulseError`` saying
    why this node cannot make the catch-up.
    """
    root = Path(root)

    def resolver(request: FetchRequest) -> Path | None:
        path = resolve(root, request)
        if isinstance(request, CatchupRequest) and producer is not None and path is not None and not path.exists():
            return producer.request(request.base, request.target)
        return path
    return resolver
