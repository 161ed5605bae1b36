"""Ed25519 node identity: a persistent signing key per node, and signature checks.

The key file holds the 32-byte raw Ed25519 private key as PKCS#8 PEM (readable by
``openssl pkey``), mode 0600. It is created atomically: a fully written temp file is
hard-linked into place, so two processes racing on ``load_or_create`` end up with the
same key and a crash never leaves a half-written key behind. The libp2p host reuses the
same key (``private_bytes()``), so a node's peer id and its record signer are one key:
``peer_id_of_key`` and ``key_of_peer_id`` convert between the two (an Ed25519 libp2p peer id is
an identity multihash of the protobuf-encoded public key, so it *is* the key).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import stat
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pulse_node.errors import ConfigError, WireError
from pulse_node.fsutil import atomic_writer

log = logging.getLogger(__name__)

PUBLIC_KEY_HEX_LEN = 64
SIGNATURE_LEN = 64
_MAX_KEY_FILE = 4096
#: identity multihash header, then protobuf PublicKey{Type: Ed25519, Data: <32 bytes>} header
_PEER_ID_HEAD = b"\x00\x24" + b"\x08\x01\x12\x20"


class Identity:
    """An Ed25519 signing key with its public key and a short fingerprint for logs."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        raw_pub = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key_hex: str = raw_pub.hex()
        self.key_id: str = key_id_of(self.public_key_hex)

    def __repr__(self) -> str:
        return f"Identity(key_id={self.key_id})"

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> Identity:
        if len(raw) != 32:
            raise ConfigError(f"an Ed25519 private key is 32 bytes, got {len(raw)}")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    @classmethod
    def load(cls, path: Path) -> Identity:
        """Read a key file; ``ConfigError`` naming the file if it is missing or corrupt."""
        path = Path(path)
        try:
            if path.stat().st_size > _MAX_KEY_FILE:
                raise ConfigError(f"{path}: identity key file is too large to be a key")
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"{path}: identity key file not found") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read identity key ({exc.strerror})") from None
        _warn_if_readable_by_others(path)
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{path}: not a valid PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path}: key is {type(key).__name__}, expected Ed25519")
        return cls(key)

    @classmethod
    def load_or_create(cls, path: Path) -> Identity:
        """Load the key at ``path``, creating it (0600, atomically) if it does not exist."""
        path = Path(path)
        if path.exists():
            return cls.load(path)
        ident = cls.generate()
        if _create_exclusive(path, ident.private_pem()):
            log.info("created node identity %s at %s", ident.key_id, path)
            return ident
        return cls.load(path)  # another process created it first: use theirs

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def private_bytes(self) -> bytes:
        """The raw 32-byte private key (the libp2p host builds its key pair from it)."""
        return self._key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
            serialization.NoEncryption())

    def private_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())


def key_id_of(public_key_hex: str) -> str:
    """Short fingerprint of a public key for log lines (not for trust decisions)."""
    return hashlib.sha256(public_key_hex.encode("ascii")).hexdigest()[:12]


def peer_id_of_key(public_key_hex: str) -> str:
    """The libp2p peer id (base58, ``12D3KooW...``) of an Ed25519 public key (hex)."""
    raw = bytes.fromhex(public_key_hex)
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
    return base58.b58encode(_PEER_ID_HEAD + raw).decode("ascii")


@functools.lru_cache(maxsize=16384)
def key_of_peer_id(peer_id: str) -> str:
    """The Ed25519 public key (hex) a libp2p peer id encodes; ``WireError`` for any other id.
    Cached: every record read checks it, and a flood of records repeats the same ids."""
    try:
        raw = base58.b58decode(peer_id)
    except ValueError:
        raise WireError(f"peer id {peer_id[:64]!r} is not base58") from None
    if len(raw) != len(_PEER_ID_HEAD) + 32 or not raw.startswith(_PEER_ID_HEAD):
        raise WireError(f"peer id {peer_id[:64]!r} is not an Ed25519 identity peer id")
    return raw[len(_PEER_ID_HEAD):].hex()


def verify_signature(public_key_hex: str, data: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``data`` by that key."""
    if len(public_key_hex) != PUBLIC_KEY_HEX_LEN or len(signature) != SIGNATURE_LEN:
        return False
    try:
        pub = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))
        pub.verify(signature, data)
    except (ValueError, InvalidSignature):
        return False
    return True


def _create_exclusive(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` (0600) only if it does not exist. False if it already did."""
    try:
        with atomic_writer(path, mode=0o600, exclusive=True) as fh:
            fh.write(data)
    except FileExistsError:
        return False
    return True


def _warn_if_readable_by_others(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s: identity key is accessible by group/others (mode %o); chmod 600 it",
                    path, stat.S_IMODE(mode))
