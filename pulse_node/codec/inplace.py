"""Apply a patch in place: a scatter of the changed entries into a state allocated once.

``apply_patch`` (``patch.py``) builds a fresh array for every changed tensor, which at 1 B
parameters is a new ~2 GB state per version whose first touch costs page faults (0.45-2.35 s
measured, bench/RESULTS.md "About 1B parameters"). ``apply_patch_inplace`` decodes each changed
tensor straight into the state's own arrays and returns the ``Changes`` it made: per tensor the
changed positions, the old bits (the undo log) and the new bits (the redo log). Only the changed
entries are allocated (about 8 bytes each: uint32 position, old and new 16-bit values).

A failure leaves the previous version intact: a tensor that fails to decode is restored from
its undo log, and so is every tensor already patched; a result whose state hash differs from
the header's is rolled back the same way before ``IntegrityError`` is raised.

The state's arrays are mutated: the caller must own them (no other ``State`` may share them,
which ``apply_patch``'s outputs do with their base). ``Changes.undo``/``redo`` move the state
back to the base and forward again without decoding; the live model (``rl/liveweights.py``)
takes the same ``Changes`` as FP32 upcasts of the new bits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pulse_node.codec import values as V
from pulse_node.codec.failpoints import NEVER, Failpoints
from pulse_node.codec.fused import LiveWords, write_live
from pulse_node.codec.header import PatchHeader, TensorEntry
from pulse_node.codec.models import PatchModels
from pulse_node.codec.patch import (
    ParsedPatch,
    _check_base,
    _decode_deltas,
    _decode_planes,
    _decode_positions,
    _map,
    _payload,
    _split_stream,
    parse_patch,
)
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import BaseMismatchError, IntegrityError, PatchError


@dataclass(frozen=True)
class TensorChange:
    """The entries of one tensor a patch changed: sorted flat positions, old and new bits."""

    idx: np.ndarray
    old: np.ndarray
    new: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.idx.nbytes + self.old.nbytes + self.new.nbytes)


@dataclass(frozen=True)
class Changes:
    """What one patch did to a state: ``base_hash`` -> ``result_hash``, entry by entry."""

    base_hash: str
    result_hash: str
    tensors: dict[str, TensorChange]

    @property
    def changed(self) -> int:
        return sum(int(c.idx.size) for c in self.tensors.values())

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.tensors.values())

    def then(self, later: Changes) -> Changes:
        """One ``Changes`` for this step followed by ``later`` (whose base is this result): the
        union of positions, old bits from the first step that touched each, new bits from the last."""
        tensors = dict(self.tensors)
        for name, b in later.tensors.items():
            a = tensors.get(name)
            if a is None:
                tensors[name] = b
                continue
            idx = np.union1d(a.idx, b.idx)
            pa, pb = np.searchsorted(idx, a.idx), np.searchsorted(idx, b.idx)
            old, new = np.empty(idx.size, a.old.dtype), np.empty(idx.size, a.new.dtype)
            old[pb], new[pa] = b.old, a.new
            old[pa], new[pb] = a.old, b.new  # the first step's old bits, the last step's new bits win
            tensors[name] = TensorChange(idx, old, new)
        return Changes(self.base_hash, later.result_hash, tensors)

    def undo(self, state: Mapping[str, TensorBits]) -> None:
        """Write the old bits back: the state returns to ``base_hash``."""
        for name, c in self.tensors.items():
            state[name].bits[c.idx] = c.old

    def redo(self, state: Mapping[str, TensorBits]) -> None:
        """Write the new bits: the state moves (again) to ``result_hash``."""
        for name, c in self.tensors.items():
            state[name].bits[c.idx] = c.new


#: one step of a state: (from version, to version, what changed)
Move = tuple[int, int, Changes]


def _patch_tensor(entry: TensorEntry, tb: TensorBits, payload: memoryview, models: PatchModels,
                  live: LiveWords | None = None) -> TensorChange:
    """Decode one tensor's changes into ``tb.bits`` (and into ``live``, a parameter's words
    holding the same bits, when given); on failure both are as they were."""
    pos_blob, words, raw = _split_stream(payload[entry.offset:entry.offset + entry.length], entry.name)
    idx = _decode_positions(entry, tb.bits, pos_blob)  # the base's context, before any write; 4 B each
    if entry.value_coding != V.PLANES:  # the kernel keeps the old and new bits as it writes (and undoes)
        old, new = np.empty(idx.size, tb.bits.dtype), np.empty(idx.size, tb.bits.dtype)
        _decode_deltas(entry, idx, words, raw, models, tb.bits, old=old, new=new, live=live)
        return TensorChange(idx, old, new)
    old = tb.bits[idx]
    try:
        _decode_planes(entry, idx, words, models, tb.bits)
    except BaseException:
        tb.bits[idx] = old
        raise
    change = TensorChange(idx, old, tb.bits[idx])
    if live is not None:
        write_live(live, change.idx, change.new)
    return change


def _owned(state: Mapping[str, TensorBits], header: PatchHeader) -> None:
    for e in header.tensors:
        if e.changed and not state[e.name].bits.flags.writeable:
            raise PatchError(f"tensor {e.name!r} is read-only: an in-place apply needs arrays it may write")


def apply_patch_inplace(state: State, patch: bytes | ParsedPatch, *, verify: bool = True,
                        base_hash: str | None = None, failpoints: Failpoints = NEVER) -> Changes:
    """Turn ``state`` into the patch's result in place and return what changed.

    ``verify`` checks the base hash (``base_hash`` if given, else hashed), the payload digest
    and the result hash; with ``verify=False`` a given ``base_hash`` is still compared with the
    header's. Any failure raises (``BaseMismatchError``, ``PatchError``, ``IntegrityError``)
    with ``state`` exactly as it was. ``patch``: the bytes, or a ``ParsedPatch`` whose header is
    used as parsed (not parsed again). ``failpoints`` (tests): told once every tensor is decoded
    and once the result is hashed and compared.
    """
    parsed = parse_patch(patch)
    header, start = parsed.header, parsed.start
    _check_base(header, state)
    _owned(state, header)
    if verify or base_hash is not None:
        actual = base_hash or state_hash(state)
        if actual != header.base_state_hash:
            raise BaseMismatchError(f"base state hash {actual[:16]}... does not match the patch's base "
                                    f"{header.base_state_hash[:16]}...")
    payload = _payload(parsed.data, header, start, verify)
    models = PatchModels({(t.coding, t.dtype, t.label): t.counts for t in header.tables})
    entries = [e for e in header.tensors if e.changed]

    def one(entry: TensorEntry) -> TensorChange | BaseException:
        try:
            return _patch_tensor(entry, state[entry.name], payload, models)
        except Exception as exc:  # every outcome is collected, so the successes can be undone
            return exc

    results = _map(one, entries, elements=sum(int(state[e.name].bits.size) for e in entries))
    changes = Changes(header.base_state_hash, header.result_state_hash,
                      {e.name: r for e, r in zip(entries, results) if isinstance(r, TensorChange)})
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    try:
        if failed is not None:
            raise failed
        failpoints.reached("decoded")
        if verify and state_hash(state) != header.result_state_hash:
            raise IntegrityError("patched state hash does not match the patch's result hash")
        failpoints.reached("hashed")
    except BaseException:
        changes.undo(state)
        raise
    return changes
