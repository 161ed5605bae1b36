"""A version that passed every check, carried as a type: the only thing the store and the apply take.

A ``VerifiedVersion`` is a signed record whose run, signer, signature and chain hash were checked,
with what came with it: the patch from its parent (size and digest checked against the record, its
header parsed once and bound to the record's state hash: a ``codec.patch.ParsedPatch``) and/or a
full state hashed to the record's state hash. Each check runs once, where the version enters the
node, and the proof travels with the version instead of being redone downstream:

- ``VersionGate.admit`` (``chain/gate.py``), the trust gate of every record a peer sends: run,
  member signer, signature (once per record: a record equal to one it verified is not verified
  again), version step, equivocation, the patch digest (a mismatch strikes the sender), then
  ``seal_checked`` here (header, state hash);
- ``verify_version`` here: the same checks without a trust policy (tools, tests, benchmarks);
- ``sign_version`` here, the trainer's publisher: a record it signs itself, over the patch header
  it wrote and the state hash it computed (its fresh signature is verified once);
- ``apply_version`` / ``apply_catchup_version`` here: a state whose hash the codec just checked
  after an in-place apply comes back sealed with its version, so the store never hashes it again;
  ``seal_streamed`` the same for a patch applied while it arrived (its hash fed as it was applied).

Misuse is made hard: the constructor needs a key private to this module (``VerifiedVersion(...)``
anywhere else raises ``TypeError``), and the two functions that take the caller's word for part of
the proof (``seal_checked``: the record and digest were checked by the trust gate;
``sign_version``: the state hash is the publisher's own) may be called only by ``chain/gate.py``
and ``trainer/publisher.py`` (``tests/test_verify_once.py`` fails on any other caller in
``pulse_node/``). A ``VerifiedVersion`` is immutable; its ``state``, when present, is the caller's
arrays at sealing time (an in-place apply mutates them later), so it is handed on at once.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING

from pulse_node.chain.catchup import check_catchup
from pulse_node.chain.record import VersionRecord, check_patch, make_record, verify_record
from pulse_node.codec.failpoints import NEVER, Failpoints
from pulse_node.codec.header import PatchHeader
from pulse_node.codec.inplace import Changes, apply_patch_inplace
from pulse_node.codec.patch import ParsedPatch, parse_patch
from pulse_node.codec.state import State
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import GapError, IntegrityError

if TYPE_CHECKING:
    from collections.abc import Collection

    from pulse_node.chain.identity import Identity

_KEY = object()  # the constructor's key: only this module's functions hold it


@dataclass(frozen=True, eq=False)
class VerifiedVersion:
    """One version and the proof that it passed every check (module docstring)."""

    record: VersionRecord
    #: the patch from the parent version (digest checked, header parsed and bound to the record)
    patch: ParsedPatch | None = None
    #: a full state that hashes to ``record.state_hash`` (anchors, a catch-up's result, a publish)
    state: State | None = None
    key: InitVar[object] = None

    def __post_init__(self, key: object) -> None:
        if key is not _KEY:
            raise TypeError("a VerifiedVersion is made only by the trust gate (VersionGate.admit, "
                            "chain.verified.verify_version) or the trainer's publisher (sign_version)")

    @property
    def version(self) -> int:
        return self.record.version

    @property
    def header(self) -> PatchHeader | None:
        return None if self.patch is None else self.patch.header

    def short(self) -> str:
        return self.record.short()


def seal_checked(record: VersionRecord, *, patch: bytes | ParsedPatch | None = None,
                 state: State | None = None) -> VerifiedVersion:
    """Seal a record the caller verified (run, signer, signature, chain) with its patch, whose size
    and digest the caller checked against it too: the header is parsed here, once, and must name
    the record's state; a ``state`` is hashed here, once. Only ``chain/gate.py`` calls this.

    ``PatchError`` (malformed header), ``IntegrityError`` (header or state of another version).
    """
    parsed = None if patch is None else _bind(record, parse_patch(patch))
    if state is not None:
        _check_state(record, state)
    return VerifiedVersion(record, parsed, state, _KEY)


def verify_version(record: VersionRecord, *, run_id: str | None, trusted_signers: Collection[str] | None,
                   parent: VersionRecord | None = None, patch: bytes | ParsedPatch | None = None,
                   state: State | None = None) -> VerifiedVersion:
    """Every check of a version without a trust policy (``verify_record``'s arguments): the record,
    then the patch (size, digest, header) and the state (hash), each once."""
    verify_record(record, run_id=run_id, trusted_signers=trusted_signers, parent=parent)
    if patch is not None:
        check_patch(record, patch.data if isinstance(patch, ParsedPatch) else patch)
    return seal_checked(record, patch=patch, state=state)


def sign_version(identity: Identity, *, run_id: str, parent: VersionRecord | None, state: State,
                 state_hash: str, patch: ParsedPatch | None, anchor_version: int, is_anchor: bool, codec: str,
                 anchor_manifest: bytes = b"", rollout_settings: str = "") -> VerifiedVersion:
    """The trainer's own next version: ``make_record`` over the patch it made (``encode_patch``:
    its header is the one it wrote) and ``state_hash``, which must be ``codec.statehash.state_hash
    (state)`` as the publisher computed it. The new signature is verified once. Only
    ``trainer/publisher.py`` calls this."""
    version = 0 if parent is None else parent.version + 1
    record = make_record(identity, run_id=run_id, version=version, parent=parent, state_hash=state_hash,
                         patch=None if patch is None else patch.data, anchor_version=anchor_version,
                         is_anchor=is_anchor, codec=codec, anchor_manifest=anchor_manifest,
                         rollout_settings=rollout_settings)
    verify_record(record, run_id=run_id, trusted_signers=None, parent=parent)
    return VerifiedVersion(record, None if patch is None else _bind(record, patch), state, _KEY)


def apply_version(state: State, version: VerifiedVersion, *, base: VersionRecord,
                  failpoints: Failpoints = NEVER) -> tuple[Changes, VerifiedVersion]:
    """Apply ``version``'s patch in place to ``state``, the verified state of ``base`` (its parent).

    The header parsed at the gate is used as it is; the codec checks the base hash (against
    ``base``'s signed one, no hashing), the payload digest and, once, the result's state hash.
    Returns what changed and ``version`` sealed with ``state`` (now its state). A failure leaves
    ``state`` as it was (``IntegrityError``, ``PatchError``). ``failpoints``: tests only."""
    if version.patch is None:
        raise IntegrityError(f"{version.short()} carries no patch to apply")
    if version.record.parent_chain_hash != base.chain_hash:
        raise IntegrityError(f"version {version.version} does not extend our chain at {base.version}")
    changes = apply_patch_inplace(state, version.patch, verify=True, base_hash=base.state_hash, failpoints=failpoints)
    return changes, VerifiedVersion(version.record, version.patch, state, _KEY)


def seal_streamed(version: VerifiedVersion, state: State, *, base: VersionRecord) -> VerifiedVersion:
    """``version`` sealed with ``state``: its patch was applied to ``state`` (``base``'s verified
    state) while the bytes arrived (``codec/pipelined.py``), and that apply fed the result's state
    hash tensor by tensor and compared it with the signed one, so it is not hashed again here.
    Only ``inference/streaming.py:apply_next`` calls this, with the ``Streamed`` apply it commits."""
    if version.patch is None:
        raise IntegrityError(f"{version.short()} carries no patch to apply")
    if version.record.parent_chain_hash != base.chain_hash:
        raise IntegrityError(f"version {version.version} does not extend our chain at {base.version}")
    return VerifiedVersion(version.record, version.patch, state, _KEY)


def apply_catchup_version(state: State, patch: bytes, *, base: VersionRecord,
                  target: VerifiedVersion) -> tuple[Changes, VerifiedVersion]:
    """Apply a catch-up patch ``base -> target`` in place to ``state`` (``base``'s verified state).

    The header is parsed once: ``GapError`` if it starts from another state of ``base``'s version
    (another history, no lie), ``IntegrityError`` unless it names both signed state hashes
    (``check_catchup``); the codec then checks the payload digest and, once, the result's hash.
    Returns what changed and ``target`` sealed with ``state``; a failure leaves ``state`` intact."""
    parsed = parse_patch(patch)
    if parsed.header.base_state_hash != base.state_hash:
        raise GapError(f"catch-up starts from another state of version {base.version}")
    check_catchup(parsed, from_record=base, to_record=target.record)
    changes = apply_patch_inplace(state, parsed, verify=True, base_hash=base.state_hash)
    return changes, VerifiedVersion(target.record, None, state, _KEY)


def _bind(record: VersionRecord, patch: ParsedPatch) -> ParsedPatch:
    if patch.header.result_state_hash != record.state_hash:
        raise IntegrityError(f"patch for {record.short()} produces a different state than the record says")
    return patch


def _check_state(record: VersionRecord, state: State) -> None:
    got = state_hash(state)
    if got != record.state_hash:
        raise IntegrityError(f"state for {record.short()} hashes to {got[:16]}, record says {record.state_hash[:16]}")
