"""What a node serves to peers: maps a fetch request to a file of its version store.

The wire worker (another process) and the in-memory test transport both resolve requests
through ``resolve``, so the set of servable files is defined once, next to the store layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulse_node.chain.layout import catchup_path, store_path
from pulse_node.errors import PulseError

if TYPE_CHECKING:
    from pulse_node.chain.catchup_producer import CatchupProducer

_MAX_VERSION = 10**12


def _version(params: dict[str, Any], key: str = "version") -> int | None:
    v = params.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_VERSION else None


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
    except PulseError:
        return None
    return None


def store_resolver(root: Path, producer: "CatchupProducer | None" = None):
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
