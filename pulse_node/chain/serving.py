"""What a node serves to peers: maps a fetch request to a file of its version store.

The wire worker (another process) and the in-memory test transport both resolve requests
through ``resolve``, so the set of servable files is defined once, next to the store layout.
Trainers also serve the PULSELoCo payloads and round decisions of their last few rounds
(``<root>/loco/<round>/``, see ``trainer/agreement.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulse_node.chain.layout import catchup_path, store_path
from pulse_node.errors import PulseError

if TYPE_CHECKING:
    from pulse_node.chain.catchup_producer import CatchupProducer

_MAX_VERSION = 10**12
_HEX64 = re.compile(r"[0-9a-f]{64}")
LOCO_DIR = "loco"


def _version(params: dict[str, Any], key: str = "version") -> int | None:
    v = params.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_VERSION else None


def loco_payload_path(root: Path, round: int, digest_hex: str) -> Path:
    """Where a trainer keeps a payload of a recent round, named by its BLAKE3 digest (hex)."""
    return Path(root) / LOCO_DIR / str(round) / f"{digest_hex}.payload"


def loco_decision_path(root: Path, round: int) -> Path:
    """Where a trainer keeps the signed decision of a recent round it accepted."""
    return Path(root) / LOCO_DIR / str(round) / "decision"


def _loco(root: Path, kind: str, params: dict[str, Any]) -> Path | None:
    r, digest = _version(params, "round"), params.get("digest")
    if r is None:
        return None
    if kind == "loco_decision":
        return loco_decision_path(root, r)
    return loco_payload_path(root, r, digest) if isinstance(digest, str) and _HEX64.fullmatch(digest) else None


def resolve(root: Path, kind: str, params: dict[str, Any]) -> Path | None:
    """The file answering ``kind``/``params`` under ``root``, or None (never raises on bad input)."""
    try:
        if kind in ("record", "patch", "anchor"):
            v = _version(params)
            return None if v is None else store_path(root, kind, v)
        if kind == "catchup":
            a, b = _version(params, "base"), _version(params, "target")
            return None if a is None or b is None or a >= b else catchup_path(root, a, b)
        if kind == "trainer_state":
            return root / "trainer" / "state.safetensors"
        if kind in ("loco_payload", "loco_decision"):
            return _loco(Path(root), kind, params)
    except PulseError:
        return None
    return None


def store_resolver(root: Path, producer: CatchupProducer | None = None) -> Callable[[str, dict[str, Any]], Path | None]:
    """A resolver bound to one store root; with ``producer``, missing catch-ups are made on demand.

    (The wire worker calls ``producer.request`` itself, on a thread, to keep its event loop
    serving.) Production errors propagate: ``BusyError`` (ask again) or a ``PulseError`` saying
    why this node cannot make the catch-up.
    """
    root = Path(root)

    def resolver(kind: str, params: dict[str, Any]) -> Path | None:
        path = resolve(root, kind, params)
        if kind == "catchup" and producer is not None and path is not None and not path.exists():
            return producer.request(params["base"], params["target"])
        return path
    return resolver
