"""Trainer keys and admissions, the statements: who may train is the peer book's (``peers/trainerset.py``).

**Admission** of a new trainer: ``quorum`` distinct members (``chain.admission_quorum``; default a
majority of the configured keys) each sign ``(run id, new key)`` (``pulse-node trainers admit``);
the new trainer names the collected file in ``chain.admission_file`` and carries it in its DHT
peer record; every node that reads the record verifies it against the members it already
trusts (``peers/trainerset.TrainerSet``).

``bound_key(peer)`` is the only way a peer's key is read: the key its peer id encodes (libp2p
Ed25519 ids embed it), never a key the peer merely announces; a peer announcing another key gets
none. (Ids that are not libp2p ids exist only on the in-memory test hub, where the hub, not the
peer, sets the id; there the announced key is used.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import msgpack

from pulse_node.chain.identity import Identity, key_id_of, key_of_peer_id
from pulse_node.chain.peer import PeerRecord
from pulse_node.errors import ConfigError, WireError

ADMISSION_MAGIC = "pulse/trainer-admission"
ADMISSION_FORMAT = 1
MAX_ADMISSION_BYTES = 4096
MAX_ENDORSEMENTS = 32
_SIGN_DOMAIN = b"pulse/trainer-admission/sign/1\0"
_KEY = re.compile(r"[0-9a-f]{64}")
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_key(key: object, *, what: str = "trainer key") -> str:
    """``key`` as 64 lowercase hex characters (an Ed25519 public key), else ``ValueError``."""
    if not isinstance(key, str) or not _KEY.fullmatch(key.strip().lower()):
        raise ValueError(f"{what} {str(key)[:80]!r} is not an Ed25519 public key (64 hex characters)")
    return key.strip().lower()


@dataclass(frozen=True)
class Admission:
    """``key`` joins the trainer set of run ``run_id``; ``endorsements`` = (member key, signature)."""

    run_id: str
    key: str
    endorsements: tuple[tuple[str, bytes], ...] = ()

    def signing_bytes(self) -> bytes:
        """What each endorsing member signs: the run and the new key, domain-tagged."""
        return _SIGN_DOMAIN + msgpack.packb([ADMISSION_MAGIC, ADMISSION_FORMAT, self.run_id, self.key],
                                            use_bin_type=True)

    def endorse(self, identity: Identity) -> Admission:
        """This admission with ``identity``'s endorsement added (replacing an earlier one of it)."""
        others = tuple(e for e in self.endorsements if e[0] != identity.public_key_hex)
        return replace(self, endorsements=(*others, (identity.public_key_hex, identity.sign(self.signing_bytes()))))

    def encode(self) -> bytes:
        return msgpack.packb([ADMISSION_MAGIC, ADMISSION_FORMAT, self.run_id, self.key,
                              [[k, s] for k, s in self.endorsements]], use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Admission:
        """Parse hostile bytes (size and shape caps); ``WireError`` if malformed. No signature check."""
        if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_ADMISSION_BYTES:
            raise WireError(f"an admission is bytes of at most {MAX_ADMISSION_BYTES}")
        try:
            items = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, max_str_len=128,
                                    max_bin_len=64, max_array_len=MAX_ENDORSEMENTS + 4, max_map_len=0)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise WireError(f"admission is not valid msgpack ({type(exc).__name__})") from None
        if not (isinstance(items, list) and len(items) == 5 and items[:2] == [ADMISSION_MAGIC, ADMISSION_FORMAT]):
            raise WireError("not a trainer admission of a supported format")
        run_id, key, ends = items[2:]
        if not (isinstance(run_id, str) and _RUN_ID.fullmatch(run_id) and isinstance(key, str)
                and _KEY.fullmatch(key) and isinstance(ends, list) and len(ends) <= MAX_ENDORSEMENTS):
            raise WireError("admission fields are malformed")
        out = []
        for e in ends:
            if not (isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and _KEY.fullmatch(e[0])
                    and isinstance(e[1], bytes) and len(e[1]) == 64):
                raise WireError("admission endorsement is malformed")
            out.append((e[0], e[1]))
        return cls(run_id, key, tuple(out))


def bound_key(peer: PeerRecord) -> str:
    """The Ed25519 key (hex) a peer speaks for: the one its peer id encodes ("" if it announces
    another). Non-libp2p ids (the in-memory test hub only): the key it announces."""
    announced = (peer.node_key or "").lower()
    try:
        key = key_of_peer_id(peer.peer_id)
    except WireError:
        return announced
    return key if announced in ("", key) else ""


def sender_key(sender: str, peers: Iterable[PeerRecord]) -> str:
    """The key of an authenticated sender (a push's peer id): encoded in its id, else (test hub)
    the key its discovery record announces."""
    try:
        return key_of_peer_id(sender)
    except WireError:
        return next((bound_key(p) for p in peers if p.peer_id == sender), "")


class TrainerSetSettings(Protocol):
    """What a node's ``[chain]`` config (``config.ChainConfig``) says about the trainer set."""

    @property
    def trusted_trainers(self) -> Sequence[str]: ...
    @property
    def trusted_trainers_path(self) -> Path | None: ...
    @property
    def admission_quorum(self) -> int: ...
    @property
    def admission_depth(self) -> int: ...


def read_key_file(path: Path) -> list[str]:
    """Keys from a file (one hex key per line, ``#`` comments) or a directory of ``*.pub`` files."""
    path = Path(path)
    files = sorted(path.glob("*.pub")) if path.is_dir() else [path]
    keys = []
    for f in files:
        try:
            text = f.read_text()[:1 << 20]
        except OSError as exc:
            raise ConfigError(f"{f}: cannot read trainer keys ({exc.strerror})") from None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                try:
                    keys.append(check_key(line))
                except ValueError as exc:
                    raise ConfigError(f"{f}:{n}: {exc}") from None
    return keys


def read_admission(path: Path, *, run_id: str, key: str) -> bytes:
    """This trainer's admission file, checked to be well formed and to name ``key`` in ``run_id``
    (its endorsements are checked by every node that reads it); ``ConfigError`` otherwise."""
    try:
        data = Path(path).read_bytes()[:MAX_ADMISSION_BYTES + 1]
        adm = Admission.decode(data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the admission file ({exc.strerror})") from None
    except WireError as exc:
        raise ConfigError(f"{path}: not a trainer admission ({exc})") from None
    if (adm.run_id, adm.key) != (run_id, key):
        raise ConfigError(f"{path}: admits key {key_id_of(adm.key)} to run {adm.run_id!r}; this node is "
                          f"{key_id_of(key)} in run {run_id!r}")
    return data
