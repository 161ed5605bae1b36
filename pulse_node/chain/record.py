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

Wire format (``RECORD_FORMAT`` 3): a msgpack array
``[RECORD_MAGIC, RECORD_FORMAT, run_id, version, parent_chain_hash, chain_hash, epoch, genesis_nonce, state_hash,
patch_digest, patch_bytes, anchor_version, is_anchor, anchor_manifest, codec, created_at,
rollout_settings, signer, signature]``.
The signed message is the same array without the signature, prefixed by a domain tag.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, fields
from typing import Any

import msgpack

from pulse_node.chain.anchor import MAX_MANIFEST_BYTES, AnchorManifest
from pulse_node.chain.identity import Identity, key_id_of, verify_signature
from pulse_node.errors import IntegrityError, WireError
from pulse_node.vocab import RUN_ID_RULE, is_run_id

RECORD_MAGIC = "pulse/version-record"
RECORD_FORMAT = 3
MAX_RECORD_BYTES = 8192
_SIGN_DOMAIN = b"pulse/version-record/sign/1\0"
_CHAIN_DOMAIN = "pulse/chain/1"
_GENESIS_DOMAIN = "pulse/genesis/2"
NONCE_LEN = 16
_MAX_INT = 2**63 - 1

_HEX64 = re.compile(r"[0-9a-f]{64}")
_STATE_HASH = re.compile(r"[0-9a-f]{16,128}")
_CODEC = re.compile(r"[a-z0-9._/+-]{1,64}")
_SETTINGS = re.compile(r"[\x20-\x7e]{0,1024}")


@dataclass(frozen=True)
class VersionRecord:
    """One signed, hash-chained model version. Field order is the wire order."""

    run_id: str
    version: int
    parent_chain_hash: str
    chain_hash: str
    epoch: str  # chain hash of this chain's genesis (a genesis: its own)
    genesis_nonce: bytes  # NONCE_LEN random bytes in a genesis, b"" in every later record
    state_hash: str
    patch_digest: str
    patch_bytes: int
    anchor_version: int
    is_anchor: bool
    anchor_manifest: bytes  # b"" unless is_anchor (chain/anchor.py)
    codec: str
    created_at: float
    rollout_settings: str
    signer: str
    signature: bytes

    def short(self) -> str:
        """``v12@3fa9c1e0`` style tag for log lines."""
        return f"v{self.version}@{self.chain_hash[:8]}"

    def manifest(self) -> AnchorManifest | None:
        """The signed manifest of this anchor's file (None: not an anchor, or made without one)."""
        return AnchorManifest.decode(self.anchor_manifest) if self.anchor_manifest else None


_FIELDS = tuple(f.name for f in fields(VersionRecord))
_TYPES: dict[str, type] = {
    "run_id": str, "version": int, "parent_chain_hash": str, "chain_hash": str, "epoch": str,
    "genesis_nonce": bytes, "state_hash": str, "patch_digest": str, "patch_bytes": int, "anchor_version": int,
    "is_anchor": bool, "anchor_manifest": bytes, "codec": str, "created_at": float,
    "rollout_settings": str, "signer": str, "signature": bytes,
}


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


def _values(r: VersionRecord) -> list[Any]:
    return [getattr(r, name) for name in _FIELDS]


def signing_bytes(r: VersionRecord) -> bytes:
    """The exact bytes the signer signs: every field but the signature, domain-tagged."""
    body = [RECORD_MAGIC, RECORD_FORMAT, *_values(r)[:-1]]
    return _SIGN_DOMAIN + msgpack.packb(body, use_bin_type=True)


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
    _check_fields(unsigned, unsigned_ok=True, error=ValueError)
    return _replace_signature(unsigned, identity.sign(signing_bytes(unsigned)))


def _replace_signature(r: VersionRecord, signature: bytes) -> VersionRecord:
    values = dict(zip(_FIELDS, _values(r)))
    values["signature"] = signature
    return VersionRecord(**values)


def encode_record(r: VersionRecord) -> bytes:
    """The record's wire bytes (msgpack array, see the module docstring)."""
    return msgpack.packb([RECORD_MAGIC, RECORD_FORMAT, *_values(r)], use_bin_type=True)


def decode_record(data: bytes) -> VersionRecord:
    """Parse hostile bytes into a record. ``WireError`` if malformed; no signature check here."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("record must be bytes")
    if len(data) > MAX_RECORD_BYTES:
        raise WireError(f"record is {len(data)} bytes, limit {MAX_RECORD_BYTES}")
    try:
        items = msgpack.unpackb(bytes(data), raw=False, use_list=True, strict_map_key=True,
                                max_str_len=1024, max_bin_len=MAX_MANIFEST_BYTES, max_array_len=32,
                                max_map_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"record is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(items, list) or len(items) < 2 or items[0] != RECORD_MAGIC:
        raise WireError("not a version record")
    if items[1] != RECORD_FORMAT:
        raise WireError(f"version record format {items[1]!r} is not supported (want {RECORD_FORMAT})")
    if len(items) != 2 + len(_FIELDS):
        raise WireError(f"version record has {len(items) - 2} fields, expected {len(_FIELDS)}")
    values = dict(zip(_FIELDS, items[2:]))
    for name, want in _TYPES.items():
        if type(values[name]) is not want:
            raise WireError(f"record field {name} must be {want.__name__}, "
                            f"got {type(values[name]).__name__}")
    r = VersionRecord(**values)
    _check_fields(r, unsigned_ok=False, error=WireError)
    return r


def _check_fields(r: VersionRecord, *, unsigned_ok: bool, error: type[Exception]) -> None:
    """Shape rules every record obeys (independent of signature and parent)."""
    problems = list(_field_problems(r, unsigned_ok=unsigned_ok))
    if problems:
        raise error(f"invalid version record v{r.version}: {problems[0]}")


def _field_problems(r: VersionRecord, *, unsigned_ok: bool) -> Iterator[str]:
    if not is_run_id(r.run_id):
        yield f"run_id must be {RUN_ID_RULE}"
    if not 0 <= r.version <= _MAX_INT or not 0 <= r.patch_bytes <= _MAX_INT:
        yield "version and patch_bytes must be non-negative 63-bit integers"
    for name in ("parent_chain_hash", "chain_hash", "epoch", "signer"):
        if not _HEX64.fullmatch(getattr(r, name)):
            yield f"{name} must be 64 lowercase hex characters"
    if not _STATE_HASH.fullmatch(r.state_hash):
        yield "state_hash must be 16-128 lowercase hex characters"
    if r.version == 0 and (r.patch_digest or r.patch_bytes or not r.is_anchor):
        yield "version 0 must be an anchor without a patch"
    if r.version == 0 and (len(r.genesis_nonce) != NONCE_LEN or r.epoch != r.chain_hash):
        yield f"version 0 must carry a {NONCE_LEN}-byte genesis nonce and name its own chain hash as epoch"
    if r.version > 0 and r.genesis_nonce:
        yield "only version 0 carries a genesis nonce"
    if r.version > 0 and not _HEX64.fullmatch(r.patch_digest):
        yield "patch_digest must be 64 lowercase hex characters"
    if not 0 <= r.anchor_version <= r.version or r.is_anchor != (r.anchor_version == r.version):
        yield "anchor_version must be <= version, and equal to it exactly when is_anchor"
    if r.anchor_manifest and not r.is_anchor:
        yield "anchor_manifest must be empty unless the version is an anchor"
    if r.anchor_manifest:
        try:
            AnchorManifest.decode(r.anchor_manifest)
        except WireError as exc:
            yield str(exc)
    if not _CODEC.fullmatch(r.codec):
        yield "codec must match [a-z0-9._/+-]{1,64}"
    if not math.isfinite(r.created_at) or r.created_at < 0:
        yield "created_at must be a finite non-negative timestamp"
    if not _SETTINGS.fullmatch(r.rollout_settings):
        yield "rollout_settings must be at most 1024 printable ASCII characters"
    if not (unsigned_ok and r.signature == b"") and len(r.signature) != 64:
        yield "signature must be 64 bytes"


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
    try:
        _check_fields(r, unsigned_ok=False, error=IntegrityError)
    except IntegrityError as exc:
        raise IntegrityError(f"{tag}: {exc}") from None
    if run_id is not None and r.run_id != run_id:
        raise IntegrityError(f"{tag}: record of run {r.run_id!r}, this is run {run_id!r}")
    if trusted_signers is not None and r.signer not in trusted_signers:
        raise IntegrityError(f"{tag}: signer is not a trusted trainer key")
    if signature and not verify_signature(r.signer, signing_bytes(r), r.signature):
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
