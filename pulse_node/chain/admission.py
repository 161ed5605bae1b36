"""Trainer keys and admissions, the statements: who may train is the peer book's (``peers/trainerset.py``).

**Admission** of a new trainer: ``quorum`` distinct members (``chain.admission_quorum``; default a
majority of the configured keys) each sign ``(run id, new key)`` (``pulse-node trainers admit``);
the new trainer names the collected file in ``chain.admission_file`` and carries it in its DHT
peer record; every node that reads the record verifies it against the members it already
trusts (``peers/trainerset.TrainerSet``). Wire format (``ADMISSION_FORMAT`` 2): the
signed-statement envelope (``chain/statement.py``) of an ``Admission``; each endorsement signs
every field but the endorsements.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Protocol

from pydantic import Field

from pulse_node.chain.identity import Identity, key_id_of
from pulse_node.chain.statement import Hex64, RunId, Signature, Statement
from pulse_node.errors import ConfigError, WireError

ADMISSION_MAGIC = "pulse/trainer-admission"
ADMISSION_FORMAT = 2
MAX_ADMISSION_BYTES = 4096
MAX_ENDORSEMENTS = 32
_KEY = re.compile(r"[0-9a-f]{64}")


def check_key(key: object, *, what: str = "trainer key") -> str:
    """``key`` as 64 lowercase hex characters (an Ed25519 public key), else ``ValueError``."""
    if not isinstance(key, str) or not _KEY.fullmatch(key.strip().lower()):
        raise ValueError(f"{what} {str(key)[:80]!r} is not an Ed25519 public key (64 hex characters)")
    return key.strip().lower()


@dataclass(frozen=True)
class Admission:
    """``key`` joins the trainer set of run ``run_id``; ``endorsements`` = (member key, signature)."""

    run_id: RunId
    key: Hex64
    endorsements: Annotated[tuple[tuple[Hex64, Signature], ...], Field(max_length=MAX_ENDORSEMENTS)] = ()

    def endorse(self, identity: Identity) -> Admission:
        """This admission with ``identity``'s endorsement added (replacing an earlier one of it)."""
        others = tuple(e for e in self.endorsements if e[0] != identity.public_key_hex)
        return replace(self, endorsements=(*others, (identity.public_key_hex, ADMISSIONS.signature_of(identity, self))))

    def endorsed_by(self, key: str, signature: bytes) -> bool:
        """Whether ``signature`` is ``key``'s valid endorsement of this admission."""
        return ADMISSIONS.signed_by(self, key, signature)

    def encode(self) -> bytes:
        return ADMISSIONS.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Admission:
        """Parse hostile bytes (size and shape caps); ``WireError`` if malformed. No signature check."""
        return ADMISSIONS.decode(data)


#: every endorsement signs the run and the new key
ADMISSIONS = Statement(Admission, magic=ADMISSION_MAGIC, format=ADMISSION_FORMAT, max_bytes=MAX_ADMISSION_BYTES,
                       max_str=128, max_bin=64, max_array=MAX_ENDORSEMENTS + 4, signatures=("endorsements",))


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
