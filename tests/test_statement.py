"""The signed-statement envelope (``chain/statement.py``): every signed statement goes through it,
its checks are strict and come before any parse, and a signature binds one statement type."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Annotated

import msgpack
import pytest
from pydantic import Field

from pulse_node.chain.identity import Identity
from pulse_node.chain.statement import DOMAIN, U63, Finite, Hex64, Signature, Statement
from pulse_node.errors import IntegrityError, WireError

PKG = Path(__file__).resolve().parents[1] / "pulse_node"
KEY = Identity.generate()


@dataclasses.dataclass(frozen=True)
class Part:
    name: Annotated[str, Field(min_length=1, max_length=8)]
    count: U63


@dataclasses.dataclass(frozen=True)
class Note:
    round: U63
    weight: Finite
    parts: Annotated[tuple[Part, ...], Field(max_length=4)]
    signer: Hex64
    signature: Signature = b""


def _no_repeats(n: Note) -> list[str]:
    names = [p.name for p in n.parts]
    return ["parts must not repeat"] if len(set(names)) != len(names) else []


NOTES = Statement(Note, magic="pulse/test-note", format=1, max_bytes=512, max_array=8, rules=_no_repeats)
OTHER = Statement(Note, magic="pulse/test-other", format=1, max_bytes=512, max_array=8)


def note(**over: object) -> Note:
    return NOTES.seal(KEY, dataclasses.replace(Note(3, 0.5, (Part("a", 1), Part("b", 2)), ""), **over))


def raw(n: Note) -> list:
    return msgpack.unpackb(NOTES.encode(n), raw=False)


def test_a_statement_round_trips_with_its_nested_types_and_verifies() -> None:
    n = note()
    back = NOTES.decode(NOTES.encode(n))
    assert back == n and isinstance(back.parts[0], Part)
    NOTES.verify(back, signer_key=KEY.public_key_hex)
    assert NOTES.signing_bytes(n) == DOMAIN + msgpack.packb(["pulse/test-note", 1, *raw(n)[2:-1]])
    for change in ({"round": 4}, {"weight": 0.25}, {"parts": n.parts[:1]}):
        with pytest.raises(IntegrityError, match="bad signature"):
            NOTES.verify(dataclasses.replace(n, **change), signer_key=KEY.public_key_hex)
    with pytest.raises(IntegrityError, match="expected key"):
        NOTES.verify(n, signer_key=Identity.generate().public_key_hex)


def test_the_wire_form_is_every_field_in_order_nested_statements_as_arrays() -> None:
    n = note()
    assert raw(n) == ["pulse/test-note", 1, 3, 0.5, [["a", 1], ["b", 2]], n.signer, n.signature]
    assert raw(dataclasses.replace(n, parts=())) == ["pulse/test-note", 1, 3, 0.5, [], n.signer, n.signature]


def test_a_signature_binds_one_statement_type() -> None:
    n = note()
    assert not OTHER.signed_by(n, n.signer, n.signature)  # the same fields under another magic
    with pytest.raises(WireError, match="not a test other"):
        OTHER.decode(NOTES.encode(n))


@pytest.mark.parametrize(("mutate", "why"), [
    (lambda r: [*r[:1], 2, *r[2:]], "format '2' is not supported"),
    (lambda r: r[:-1], "has 4 fields, expected 5"),
    (lambda r: [*r[:2], True, *r[3:]], "round: Input should be a valid integer"),
    (lambda r: [*r[:2], -1, *r[3:]], "round: Input should be greater than or equal to 0"),
    (lambda r: [*r[:3], 1, *r[4:]], "weight: Value error, must be a float"),
    (lambda r: [*r[:3], float("inf"), *r[4:]], "weight"),
    (lambda r: [*r[:4], [["a", 1], ["", 2]], *r[5:]], r"parts\.1\.0: String should have at least 1 character"),
    (lambda r: [*r[:4], [["a", 1], ["a", 2]], *r[5:]], "parts must not repeat"),
    (lambda r: [*r[:4], [["a", 1]] * 5, *r[5:]], "parts: Tuple should have at most 4 items"),
    (lambda r: [*r[:5], r[5].upper(), *r[6:]], "signer: String should match pattern"),
    (lambda r: [*r[:6], r[6][:63]], "signature"),
])
def test_every_field_is_checked_exactly_and_named(mutate, why: str) -> None:
    with pytest.raises(WireError, match=why):
        NOTES.decode(msgpack.packb(mutate(raw(note())), use_bin_type=True))


def test_the_cap_and_the_msgpack_limits_come_before_any_parse() -> None:
    for data in (b"", b"\xc1", "text", None, b"x" * 513, msgpack.packb({"a": 1}), b"\xdd\xff\xff\xff\xff"):
        with pytest.raises(WireError):
            NOTES.decode(data)
    with pytest.raises(WireError, match="limit 100"):
        NOTES.decode(NOTES.encode(note()), max_bytes=100)


def test_sealing_refuses_what_a_receiver_would_refuse() -> None:
    with pytest.raises(ValueError, match="parts must not repeat"):
        note(parts=(Part("a", 1), Part("a", 1)))
    with pytest.raises(ValueError, match="round"):
        note(round=-1)


def _signing_calls(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("verify_signature", "sign") or (name == "verify" and "Ed25519" in ast.unparse(node.func)):
                out.append(f"{path.relative_to(PKG).as_posix()}:{node.lineno} {ast.unparse(node)[:60]}")
    return out


def test_every_signed_statement_goes_through_the_envelope() -> None:
    """Nothing outside the envelope signs or checks a signature of a node key (the DHT's record
    signatures included), but the identity itself."""
    allowed = {"chain/statement.py", "chain/identity.py"}
    found = [c for p in PKG.rglob("*.py") if "testing" not in p.parts
             and p.relative_to(PKG).as_posix() not in allowed for c in _signing_calls(p)]
    assert not found, "signatures made or checked outside chain/statement.py:\n" + "\n".join(found)
