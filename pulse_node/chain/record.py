"""Signed version records: the hash-chained, signed description of one model version.

A ``VersionRecord`` says: in run ``run_id``, version ``version`` has model state hash
``state_hash``; it follows the version whose chain hash is ``parent_chain_hash`` via the
patch whose SHA-256 is ``patch_digest``. ``chain_hash`` commits to (parent chain hash,
version, patch digest, state hash), so one trusted record pins the whole history behind it.
Version 0 (genesis) is always an anchor, has no patch, and its parent chain hash is
``genesis_parent_hash(run_id, genesis_nonce)``: the run id and 16 random bytes its publisher
chose, so two geneses of one run and one state (a second ``pulse-node swarm`` in the same
directory, a trainer that lost its store) start two different chains. That chain of records is
an **epoch**; its identity is the genesis record's chain hash, which every record carries as
``epoch`` (a genesis names its own chain hash, every later record its parent's epoch). Round
decisions and every file a node keeps per round or version are scoped to the epoch
(``loco/decision.py``, ``trainer/decisions.py``): nothing signed in one epoch is taken in another.

The record of an anchor version also carries the anchor file's manifest (``anchor_manifest``:
layout digest, data size, a BLAKE3 digest per chunk; ``chain/anchor.py``), so an anchor download
is bounded by signed numbers and each chunk is checked as it arrives; ``patch_bytes`` bounds a
patch download the same way.

The signature (Ed25519, by ``signer``) covers every other field, so no field can be altered
without detection. Receivers check, in order: decode (size and type caps), run id (a record of
another run is refused even if well signed), signer trusted, signature, chain hash, link to the
parent record, then the patch digest (``check_patch``), and finally the codec checks the base
and result state hashes when the patch is applied.

``rollout_settings`` is the canonical JSON of the settings rollouts of this version must be
made with (``rl/settings.py``; "" when none are declared): signed like every field, so a
producer cannot pick its own temperature or task and trainers agree on what they check.

Wire format (``RECORD_FORMAT`` 4): the signed-statement envelope (``chain/statement.py``), the
fields in ``VersionRecord``'s order, each declared there with its bounds; the signature covers
every other field.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Annotated

import msgpack
from pydantic import Field, StringConstraints

from pulse_node.chain.anchor import MAX_MANIFEST_BYTES, AnchorManifest
from pulse_node.chain.identity import Identity, key_id_of
from pulse_node.chain.statement import U63, Finite, Hex64, RunId, Signature, Statement
from pulse_node.errors import IntegrityError, WireError

RECORD_MAGIC = "pulse/version-record"
RECORD_FORMAT = 4
MAX_RECORD_BYTES = 8192
_CHAIN_DOMAIN = "pulse/chain/1"
_GENESIS_DOMAIN = "pulse/genesis/2"
NONCE_LEN = 16

StateHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,128}$")]
PatchDigest = Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{64})?$")]  # "" for version 0
Codec = Annotated[str, StringConstraints(pattern=r"^[a-z0-9._/+-]{1,64}$")]
Settings = Annotated[str, StringConstraints(pattern=r"^[\x20-\x7e]{0,1024}$")]


@dataclass(frozen=True)
class VersionRecord:
    """One signed, hash-chained model version. Field order is the wire order."""

    run_id: RunId
    version: U63
    parent_chain_hash: Hex64
    chain_hash: Hex64
    epoch: Hex64  # chain hash of this chain's genesis (a genesis: its own)
    genesis_nonce: Annotated[bytes, Field(max_length=NONCE_LEN)]  # NONCE_LEN random bytes in a genesis, else b""
    state_hash: StateHash
    patch_digest: PatchDigest
    patch_bytes: U63
    anchor_version: U63
    is_anchor: bool
    anchor_manifest: Annotated[bytes, Field(max_length=MAX_MANIFEST_BYTES)]  # b"" unless is_anchor (chain/anchor.py)
    codec: Codec
    created_at: Finite
    rollout_settings: Settings
    signer: Hex64
    signature: Signature

    def short(self) -> str:
        """``v12@3fa9c1e0`` style tag for log lines."""
        return f"v{self.version}@{self.chain_hash[:8]}"

    def manifest(self) -> AnchorManifest | None:
        """The signed manifest of this anchor's file (None: not an anchor, or made without one)."""
        return AnchorManifest.decode(self.anchor_manifest) if self.anchor_manifest else None


def _rules(r: VersionRecord) -> Iterator[str]:
    """What every record obeys across its fields (independent of signature and parent)."""
    if r.version == 0 and (r.patch_digest or r.patch_bytes or not r.is_anchor):
        yield "version 0 must be an anchor without a patch"
    if r.version == 0 and (len(r.genesis_nonce) != NONCE_LEN or r.epoch != r.chain_hash):
        yield f"version 0 must carry a {NONCE_LEN}-byte genesis nonce and name its own chain hash as epoch"
    if r.version > 0 and r.genesis_nonce:
        yield "only version 0 carries a genesis nonce"
    if r.version > 0 and not r.patch_digest:
        yield "patch_digest must be 64 lowercase hex characters"
    if not r.anchor_version <= r.version or r.is_anchor != (r.anchor_version == r.version):
        yield "anchor_version must be <= version, and equal to it exactly when is_anchor"
    if r.anchor_manifest and not r.is_anchor:
        yield "anchor_manifest must be empty unless the version is an anchor"
    if r.anchor_manifest:
        try:
            AnchorManifest.decode(r.anchor_manifest)
        except WireError as exc:
            yield str(exc)


RECORDS = Statement(VersionRecord, magic=RECORD_MAGIC, format=RECORD_FORMAT, max_bytes=MAX_RECORD_BYTES,
                    max_bin=MAX_MANIFEST_BYTES, max_array=32, rules=_rules)


def digest_of(data: bytes) -> str:
    """The patch digest used in records: SHA-256, lowercase hex."""
    return hashlib.sha256(data).hexdigest()


def genesis_parent_hash(run_id: str, nonce: bytes) -> str:
    """The parent chain hash of a version 0 of ``run_id`` whose publisher chose ``nonce``."""
    packed = msgpack.packb([_GENESIS_DOMAIN, run_id, bytes(nonce)], use_bin_type=True)
    return hashlib.sha256(packed).hexdigest()


def chain_hash(*, parent_chain_hash: str, version: int, patch_digest: str, state_hash: str) -> str:
    """Hash committing to a version's parent, number, patch and resulting state."""
    packed = msgpack.packb([_CHAIN_DOMAIN, parent_chain_hash, version, patch_digest, state_hash],
                           use_bin_type=True)
    return hashlib.sha256(packed).hexdigest()


def signing_bytes(r: VersionRecord) -> bytes:
    """The exact bytes the signer signs: every field but the signature, domain-tagged."""
    return RECORDS.signing_bytes(r)


def make_record(identity: Identity, *, run_id: str, version: int, parent: VersionRecord | None,
                state_hash: str, patch: bytes | None, anchor_version: int, is_anchor: bool,
                codec: str, anchor_manifest: bytes = b"", rollout_settings: str = "",
                nonce: bytes | None = None) -> VersionRecord:
    """Build and sign the record of ``version`` (``patch`` turns ``parent``'s state into it;
    ``anchor_manifest``: ``chain.anchor.anchor_manifest`` of an anchor's state; ``rollout_settings``:
    ``rl.settings`` canonical JSON). A genesis starts a new epoch: ``nonce`` (default: fresh
    random bytes) is only for tests that need two equal geneses."""
    if (version == 0) != (parent is None):
        raise ValueError("version 0 has no parent; every later version needs its parent record")
    if (version == 0) != (patch is None):
        raise ValueError("version 0 has no patch; every later version needs the patch from its parent")
    if parent is not None and parent.version != version - 1:
        raise ValueError(f"parent is v{parent.version}, expected v{version - 1}")
    genesis_nonce = (os.urandom(NONCE_LEN) if nonce is None else bytes(nonce)) if parent is None else b""
    parent_hash = genesis_parent_hash(run_id, genesis_nonce) if parent is None else parent.chain_hash
    digest = "" if patch is None else digest_of(patch)
    own_hash = chain_hash(parent_chain_hash=parent_hash, version=version, patch_digest=digest, state_hash=state_hash)
    unsigned = VersionRecord(
        run_id=run_id, version=version, parent_chain_hash=parent_hash, chain_hash=own_hash,
        epoch=own_hash if parent is None else parent.epoch, genesis_nonce=genesis_nonce,
        state_hash=state_hash, patch_digest=digest, patch_bytes=0 if patch is None else len(patch),
        anchor_version=anchor_version, is_anchor=is_anchor, anchor_manifest=anchor_manifest, codec=codec,
        created_at=float(time.time()), rollout_settings=rollout_settings,
        signer=identity.public_key_hex, signature=b"")
    return RECORDS.seal(identity, unsigned)


def encode_record(r: VersionRecord) -> bytes:
    """The record's wire bytes (the statement envelope, see the module docstring)."""
    return RECORDS.encode(r)


def decode_record(data: bytes) -> VersionRecord:
    """Parse hostile bytes into a record. ``WireError`` if malformed; no signature check here."""
    return RECORDS.decode(data)


def verify_record(r: VersionRecord, *, run_id: str | None, trusted_signers: Collection[str] | None,
                  parent: VersionRecord | None = None) -> None:
    """Check run, signer, signature, chain hash and (if given) the parent link; ``IntegrityError``.

    ``run_id=None`` accepts any run (only where the run is checked otherwise, e.g. a store that
    re-reads its own files); ``trusted_signers=None`` accepts any signer whose signature is valid
    (the same); otherwise the signer's public key hex must be in the collection.
    """
    _check_record(r, run_id=run_id, trusted_signers=trusted_signers, parent=parent, signature=True)


def recheck_record(r: VersionRecord, *, run_id: str | None, trusted_signers: Collection[str] | None,
                   parent: VersionRecord | None = None) -> None:
    """``verify_record`` without the signature: only for a record EQUAL to one whose signature was
    verified (``VersionGate`` keeps them), whose run, signer and parent may be asked about anew."""
    _check_record(r, run_id=run_id, trusted_signers=trusted_signers, parent=parent, signature=False)


def _check_record(r: VersionRecord, *, run_id: str | None, trusted_signers: Collection[str] | None,
                  parent: VersionRecord | None, signature: bool) -> None:
    tag = f"record {r.short()} from {key_id_of(r.signer)}"
    problem = next(RECORDS.problems(r), None)
    if problem is not None:
        raise IntegrityError(f"{tag}: invalid version record: {problem}")
    if run_id is not None and r.run_id != run_id:
        raise IntegrityError(f"{tag}: record of run {r.run_id!r}, this is run {run_id!r}")
    if trusted_signers is not None and r.signer not in trusted_signers:
        raise IntegrityError(f"{tag}: signer is not a trusted trainer key")
    if signature and not RECORDS.signed_by(r, r.signer, r.signature):
        raise IntegrityError(f"{tag}: bad signature")
    want = chain_hash(parent_chain_hash=r.parent_chain_hash, version=r.version,
                      patch_digest=r.patch_digest, state_hash=r.state_hash)
    if want != r.chain_hash:
        raise IntegrityError(f"{tag}: chain hash does not match its fields")
    if r.version == 0 and r.parent_chain_hash != genesis_parent_hash(r.run_id, r.genesis_nonce):
        raise IntegrityError(f"{tag}: genesis parent hash does not match run {r.run_id!r}")
    if parent is not None:
        check_link(parent, r)


def check_link(parent: VersionRecord, child: VersionRecord) -> None:
    """``IntegrityError`` unless ``child`` directly follows ``parent`` in the same run."""
    tag = f"record {child.short()}"
    if parent.run_id != child.run_id:
        raise IntegrityError(f"{tag}: run {child.run_id!r} != parent's run {parent.run_id!r}")
    if parent.version != child.version - 1:
        raise IntegrityError(f"{tag}: parent is v{parent.version}, expected v{child.version - 1}")
    if child.parent_chain_hash != parent.chain_hash:
        raise IntegrityError(f"{tag}: parent chain hash does not match {parent.short()} (fork?)")
    if child.epoch != parent.epoch:
        raise IntegrityError(f"{tag}: epoch {child.epoch[:8]} != parent's {parent.epoch[:8]}")
    if not child.is_anchor and child.anchor_version != parent.anchor_version:
        raise IntegrityError(f"{tag}: anchor_version {child.anchor_version} != parent's "
                             f"{parent.anchor_version}")


def check_patch(r: VersionRecord, patch: bytes) -> None:
    """``IntegrityError`` unless ``patch`` is exactly the patch ``r`` names."""
    if r.version == 0:
        raise IntegrityError("version 0 has no patch")
    if len(patch) != r.patch_bytes:
        raise IntegrityError(f"patch for {r.short()} is {len(patch)} bytes, record says "
                             f"{r.patch_bytes}")
    if digest_of(patch) != r.patch_digest:
        raise IntegrityError(f"patch for {r.short()} does not match the record's digest")
