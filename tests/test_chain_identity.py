"""Node identity: persistence, file mode, atomic create, signatures."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from pulse_node.chain.identity import Identity, verify_signature
from pulse_node.errors import ConfigError


def test_sign_and_verify_round_trip() -> None:
    ident = Identity.generate()
    sig = ident.sign(b"hello")
    assert verify_signature(ident.public_key_hex, b"hello", sig)
    assert not verify_signature(ident.public_key_hex, b"hellO", sig)
    assert not verify_signature(Identity.generate().public_key_hex, b"hello", sig)
    assert not verify_signature(ident.public_key_hex, b"hello", sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not verify_signature("zz" * 32, b"hello", sig)
    assert not verify_signature(ident.public_key_hex, b"hello", b"short")


def test_load_or_create_persists_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "node.key"
    first = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = Identity.load_or_create(path)
    third = Identity.load(path)
    assert first.public_key_hex == second.public_key_hex == third.public_key_hex
    assert first.key_id == third.key_id and len(first.key_id) == 12
    assert verify_signature(first.public_key_hex, b"x", third.sign(b"x"))
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]  # no temp files left


def test_private_bytes_rebuild_the_same_key() -> None:
    ident = Identity.generate()
    raw = ident.private_bytes()
    assert len(raw) == 32
    assert Identity.from_private_bytes(raw).public_key_hex == ident.public_key_hex


def test_racing_creators_end_with_one_key(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(Identity.load_or_create(path).public_key_hex))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 8 and len(set(got)) == 1
    assert Identity.load(path).public_key_hex == got[0]


def test_load_missing_or_corrupt_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        Identity.load(tmp_path / "absent.key")
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="bad.key"):
        Identity.load(bad)
    good = tmp_path / "good.key"
    Identity.load_or_create(good)
    good.write_bytes(good.read_bytes()[:40])  # truncated
    with pytest.raises(ConfigError, match="good.key"):
        Identity.load(good)


def test_non_ed25519_key_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    path = tmp_path / "ec.key"
    path.write_bytes(pem)
    with pytest.raises(ConfigError, match="Ed25519"):
        Identity.load(path)
