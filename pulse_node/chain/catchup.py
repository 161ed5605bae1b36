"""Catch-up patches: one patch from version a to version b for a peer that fell behind.

Entries that change in several steps are sent once, with their final value, so a catch-up
patch is much smaller than the sum of the patches a+1..b (see bench/RESULTS.md, version chain section).
A catch-up patch needs no signature of its own: the codec header names the base and result
state hashes, and the receiver checks them against the signed records of a and b
(``check_catchup``), then ``apply_patch(..., verify=True)`` checks the state it produced.
Every peer that holds both states can therefore serve catch-ups; ``catchup_producer`` makes
them on demand from a node's store.
"""

from __future__ import annotations

from pulse_node.chain.patchinfo import patch_hashes
from pulse_node.chain.record import VersionRecord
from pulse_node.codec.header import Mode
from pulse_node.codec.patch import ParsedPatch, apply_patch, make_patch, parse_patch
from pulse_node.codec.state import State
from pulse_node.errors import IntegrityError


def make_catchup(state_a: State, state_b: State, *, from_version: int, to_version: int,
                 mode: Mode = "compact", hashes: tuple[str, str] | None = None) -> bytes:
    """A single codec patch turning ``state_a`` (version a) into ``state_b`` (version b).

    ``hashes``: the two states' known (verified) state hashes, so they are not computed again.
    """
    if not 0 <= from_version < to_version:
        raise ValueError(f"catch-up must go forward, got v{from_version} -> v{to_version}")
    base_hash, new_hash = hashes or (None, None)
    return make_patch(state_a, state_b, mode=mode, base_hash=base_hash, new_hash=new_hash)


def check_catchup(patch: bytes | ParsedPatch, *, from_record: VersionRecord, to_record: VersionRecord) -> None:
    """``IntegrityError`` unless the patch goes from ``from_record``'s state to ``to_record``'s.

    Both records must already be verified (signature, chain); this only binds the patch to them.
    """
    if from_record.run_id != to_record.run_id or from_record.version >= to_record.version:
        raise IntegrityError(f"catch-up {from_record.short()} -> {to_record.short()} is not a "
                             "forward step within one run")
    base_hash, result_hash = patch_hashes(patch)
    if base_hash != from_record.state_hash:
        raise IntegrityError(f"catch-up patch is not based on {from_record.short()}")
    if result_hash != to_record.state_hash:
        raise IntegrityError(f"catch-up patch does not produce {to_record.short()}")


def apply_catchup(state_a: State, patch: bytes, *, from_record: VersionRecord,
                  to_record: VersionRecord) -> State:
    """Check the catch-up patch against both records, apply it, verify the result."""
    parsed = parse_patch(patch)
    check_catchup(parsed, from_record=from_record, to_record=to_record)
    return apply_patch(state_a, parsed, verify=True)
