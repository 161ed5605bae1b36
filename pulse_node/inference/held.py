"""The version an inference node holds: its record, its state (patched in place), and the steps
the live model has not taken yet.

``Held`` is the typed view of the node's state that the syncer (``inference/syncer.py``) and its
recovery (``inference/recovery.py``) share: both read the record and state, and change them only
through ``moved`` (an in-place step) and ``adopt`` (a state loaded whole or caught up to). The
live model follows ``take_changes``: one step from the version it last took, consecutive
in-place applies composed into it; none after a state loaded whole (the live model reloads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pulse_node.chain.record import VersionRecord
from pulse_node.chain.reorder import ReorderBuffer
from pulse_node.codec.inplace import Changes, Move
from pulse_node.codec.state import State

T = TypeVar("T")


@dataclass
class Held(Generic[T]):
    """The held version, and the reorder buffer of the versions after it (items of type ``T``)."""

    record: VersionRecord | None = None
    state: State | None = None  # our own arrays: patched in place
    changes: list[Move] = field(default_factory=list)  # applied in place, until the live model takes them
    reorder: ReorderBuffer[T] = field(default_factory=lambda: ReorderBuffer(next_version=0))

    def __post_init__(self) -> None:
        self.reorder.reset(self.record.version + 1 if self.record is not None else 0)

    @property
    def version(self) -> int:
        return self.record.version if self.record is not None else -1

    def moved(self, base: int, target: int, changes: Changes) -> None:
        """Keep what an in-place apply changed, for the live model (``take_changes``): one step
        from the version the live model last took, consecutive applies composed into it."""
        if self.changes and self.changes[-1][1] == base:
            first, _, before = self.changes[-1]
            self.changes = [(first, target, before.then(changes))]
        else:
            self.changes = [(base, target, changes)]

    def adopt(self, record: VersionRecord, state: State) -> None:
        """Hold ``record`` with ``state`` loaded whole (the live model reloads)."""
        self.state, self.record = state, record
        self.changes = []
        self.reorder.reset(record.version + 1)

    def take_changes(self) -> list[Move]:
        """The (from, to, changes) steps applied since the last call."""
        out, self.changes = self.changes, []
        return out
