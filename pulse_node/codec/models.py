"""Value models of one patch: the header's symbol counts as rANS models, built once.

A patch header carries one count table per ``(coding, dtype, label)``: byte planes
(``label`` = plane) for overwrite coding, exponent labels for delta coding. Encoder and
decoder build the same models from the same counts (``rans.quantize`` is deterministic).
Delta models of one dtype are stacked with a label -> row map, so one compiled loop picks
each element's model from its base exponent (``fused.decode_deltas_into``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from pulse_node.codec import rans
from pulse_node.codec import values as V
from pulse_node.codec.entropy import n_gap_bins
from pulse_node.codec.state import DTYPES
from pulse_node.errors import PatchError

Key = tuple[int, str, int]


def symbol_limit(coding: int, dtype: str) -> int:
    """Alphabet size of a value model: bytes for planes, gap bins of the dtype's width for deltas."""
    return 256 if coding == V.PLANES else n_gap_bins(1 << (8 * DTYPES[dtype].itemsize))


def delta_counts(sym: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(labels present, counts)``: row ``i`` of ``counts`` holds the symbol counts of label ``i``."""
    nb = int(sym.max()) + 1
    grid = np.bincount(labels.astype(np.int64) * nb + sym, minlength=256 * nb).reshape(256, nb)
    present = np.flatnonzero(grid.any(axis=1))
    return present, grid[present]


class PatchModels:
    """Models of one patch by key, built on first use (thread-safe)."""

    def __init__(self, counts: Mapping[Key, object]) -> None:
        self.counts = counts
        self._models: dict[Key, rans.Model] = {}
        self._stacks: dict[str, tuple[np.ndarray, rans.ModelStack]] = {}  # delta: (label_row, stack)
        self._planes: dict[str, rans.ModelStack] = {}
        self._lock = threading.Lock()

    def model(self, key: Key, name: str) -> rans.Model:
        with self._lock:
            return self._model(key, name)

    def _model(self, key: Key, name: str) -> rans.Model:
        if key not in self._models:
            counts = self.counts.get(key)
            if counts is None:
                raise PatchError(f"tensor {name!r}: patch lacks value table {key}")
            table = np.asarray(counts, dtype=np.float64)
            if table.size > symbol_limit(key[0], key[1]):
                raise PatchError(f"tensor {name!r}: value table {key} has {table.size} symbols "
                                 f"(limit {symbol_limit(key[0], key[1])})")
            self._models[key] = rans.model(table, leaky=False)
        return self._models[key]

    def plane_stack(self, dtype: str, name: str) -> rans.ModelStack:
        """The byte-plane models of ``dtype``, row ``j`` = plane ``j`` (least significant first)."""
        with self._lock:
            if dtype not in self._planes:
                self._planes[dtype] = rans.stack([self._model((V.PLANES, dtype, j), name)
                                                  for j in range(DTYPES[dtype].itemsize)])
            return self._planes[dtype]

    def delta_stack(self, dtype: str, name: str) -> tuple[np.ndarray, rans.ModelStack]:
        """``(label_row, stack)``: row of each exponent label's model (-1: none) and the models."""
        with self._lock:
            if dtype not in self._stacks:
                labels = sorted(k[2] for k in self.counts if k[0] == V.DELTA and k[1] == dtype)
                row = np.full(256, -1, np.int64)
                row[labels] = np.arange(len(labels))
                self._stacks[dtype] = row, rans.stack([self._model((V.DELTA, dtype, k), name) for k in labels])
            return self._stacks[dtype]
