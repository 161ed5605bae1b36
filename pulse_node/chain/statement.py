"""One envelope for every signed statement: declared fields, size cap, domain, sign, decode, verify.

A statement type (a version record, a round decision, an admission, an inner-step commitment, a
spot accusation, and the unsigned containers that carry signed ones: equivocation evidence, spot
evidence, openings) is a frozen dataclass whose fields, in order, are its wire fields, each
declared once with its type and bounds (``Annotated``: ``Hex64``, ``U63``, ``Digest32``, ...;
nested dataclasses and tuples travel as arrays). ``Statement(cls, magic=..., format=...,
max_bytes=...)`` is that type's codec, the only way its bytes become a struct and back::

    wire    = msgpack [magic, format, *fields]
    signed  = DOMAIN + msgpack [magic, format, *covered]   (covered: all fields but the signatures)

- ``decode`` treats its input as hostile: bytes of at most ``max_bytes`` before anything is parsed,
  msgpack limits on every string, binary and array (``max_str``, ``max_bin``, ``max_array``), no
  maps or extensions, the magic, the format, the field count, then every field's type and bounds
  exactly (strict: an int is no bool, a float no int, nothing is coerced), then the type's own
  rules across fields (``rules``). Every failure is a ``WireError``, and nothing else escapes.
- ``seal`` signs a statement we made (``signer`` and ``signature`` fields): the same checks (a
  ``ValueError``: our own bug), the cap, then an Ed25519 signature over ``signed``.
- ``verify`` checks the signer is the key expected and the signature holds (``IntegrityError``);
  ``signature_of`` / ``signed_by`` do the same for a statement several keys sign (admissions).

The domain tag keeps a statement's signature from ever being valid for anything else this
node's key signs (DHT records, another statement type: its magic is in the signed bytes).
A new statement type declares its fields and rules and nothing else.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields, is_dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Annotated, Generic, TypeVar, cast

import msgpack
import pydantic
from pydantic import BeforeValidator, Field, StringConstraints

from pulse_node.chain.identity import Identity, verify_signature
from pulse_node.errors import IntegrityError, WireError
from pulse_node.vocab import RUN_ID_PATTERN

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    S = TypeVar("S", bound=DataclassInstance)
else:
    S = TypeVar("S")

#: what every statement signature covers first: no other signature of a node key starts so
DOMAIN = b"pulse/statement/sign/1\0"
MAX_U63 = 2**63 - 1
SIGNATURE_LEN = 64


def _only_float(value: object) -> object:
    if type(value) is not float:
        raise ValueError("must be a float")
    return value


#: an Ed25519 public key (or a SHA-256 digest) as 64 lowercase hex characters
Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
U63 = Annotated[int, Field(ge=0, le=MAX_U63)]
#: a finite, non-negative float (exactly a float on the wire)
Finite = Annotated[float, BeforeValidator(_only_float), Field(ge=0.0, allow_inf_nan=False)]
Signature = Annotated[bytes, Field(min_length=SIGNATURE_LEN, max_length=SIGNATURE_LEN)]
Digest32 = Annotated[bytes, Field(min_length=32, max_length=32)]

Rules = Callable[[S], Iterable[str]]


class Statement(Generic[S]):
    """The codec of one statement type ``cls`` (see the module docstring)."""

    def __init__(self, cls: type[S], *, magic: str, format: int, max_bytes: int, max_str: int = 1024,
                 max_bin: int = 1024, max_array: int = 64, signatures: tuple[str, ...] = ("signature",),
                 rules: Rules[S] | None = None) -> None:
        self.cls, self.magic, self.format, self.max_bytes = cls, magic, format, max_bytes
        self.what = magic.rsplit("/", 1)[-1].replace("-", " ")
        self.names = tuple(f.name for f in fields(cls))
        assert set(signatures) <= set(self.names), f"{cls.__name__} has no fields {signatures}"
        self.signatures = signatures
        self.max_str, self.max_bin, self.max_array = max_str, max_bin, max_array
        self._adapter: pydantic.TypeAdapter[tuple[object, ...]] = pydantic.TypeAdapter(
            cast("type[tuple[object, ...]]", _wire_type(cls)), config=pydantic.ConfigDict(strict=True))
        self._build = _builder(cls)
        self._rules = rules

    # ---- bytes ------------------------------------------------------------------------------
    def encode(self, s: S) -> bytes:
        """The statement's wire bytes."""
        return msgpack.packb([self.magic, self.format, *self._values(s)], use_bin_type=True)

    def signing_bytes(self, s: S) -> bytes:
        """The exact bytes a signature of ``s`` covers: every field but the signatures, domain-tagged."""
        covered = [v for name, v in zip(self.names, self._values(s)) if name not in self.signatures]
        return DOMAIN + msgpack.packb([self.magic, self.format, *covered], use_bin_type=True)

    def _values(self, s: S) -> tuple[object, ...]:
        return tuple(_wire(getattr(s, name)) for name in self.names)

    def decode(self, data: object, *, max_bytes: int | None = None) -> S:
        """Hostile bytes (at most ``max_bytes``, never more than the type's cap) -> the statement;
        ``WireError`` if anything is undeclared. No signature is checked here."""
        cap = self.max_bytes if max_bytes is None else min(max_bytes, self.max_bytes)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise WireError(f"a {self.what} must be bytes")
        if len(data) > cap:
            raise WireError(f"{self.what} is {len(data)} bytes, limit {cap}")
        items = self._unpack(bytes(data))
        s = self._typed(items, error=WireError)
        self._ruled(s, error=WireError)
        return s

    def _unpack(self, data: bytes) -> tuple[object, ...]:
        try:
            items: object = msgpack.unpackb(data, raw=False, use_list=False, max_map_len=0, max_ext_len=0,
                                          max_str_len=self.max_str, max_bin_len=self.max_bin,
                                          max_array_len=self.max_array)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise WireError(f"{self.what} is not valid msgpack ({type(exc).__name__})") from None
        if not isinstance(items, tuple) or len(items) < 2 or items[0] != self.magic:
            raise WireError(f"not a {self.what}")
        if type(items[1]) is not int or items[1] != self.format:
            raise WireError(f"{self.what} format {str(items[1])[:16]!r} is not supported (want {self.format})")
        if len(items) != 2 + len(self.names):
            raise WireError(f"{self.what} has {len(items) - 2} fields, expected {len(self.names)}")
        return items[2:]

    # ---- checks -----------------------------------------------------------------------------
    def problems(self, s: S) -> Iterator[str]:
        """What is wrong with ``s`` (field types and bounds, then the type's rules); nothing if valid."""
        try:
            self._adapter.validate_python(self._values(s))
        except pydantic.ValidationError as exc:
            yield self._explain(exc)
            return
        if self._rules is not None:
            yield from self._rules(s)

    def check(self, s: S, *, error: type[Exception] = ValueError) -> None:
        """``error`` naming the first problem of ``s``, if it has one."""
        problem = next(self.problems(s), None)
        if problem is not None:
            raise error(f"invalid {self.what}: {problem}")

    def _typed(self, items: tuple[object, ...], *, error: type[Exception]) -> S:
        try:
            valid = self._adapter.validate_python(items)
        except pydantic.ValidationError as exc:
            raise error(f"invalid {self.what}: {self._explain(exc)}") from None
        return cast(S, self._build(valid))

    def _ruled(self, s: S, *, error: type[Exception]) -> None:
        problem = next(iter(self._rules(s)), None) if self._rules is not None else None
        if problem is not None:
            raise error(f"invalid {self.what}: {problem}")

    def _explain(self, exc: pydantic.ValidationError) -> str:
        first = exc.errors()[0]
        loc = list(first["loc"])
        if loc and isinstance(loc[0], int) and loc[0] < len(self.names):
            loc[0] = self.names[loc[0]]
        where = ".".join(str(x) for x in loc) or "fields"
        return f"{where}: {first['msg']}"

    # ---- signatures -------------------------------------------------------------------------
    def signature_of(self, identity: Identity, s: S) -> bytes:
        """``identity``'s signature of ``s`` (for statements several keys sign)."""
        return identity.sign(self.signing_bytes(s))

    def signed_by(self, s: S, key: str, signature: bytes) -> bool:
        """Whether ``signature`` is ``key``'s valid signature of ``s``."""
        return verify_signature(key, self.signing_bytes(s), signature)

    def seal(self, identity: Identity, s: S) -> S:
        """``s`` signed by ``identity`` (its ``signer`` set to the identity's key); ``ValueError`` if
        ``s`` breaks a declared bound or rule, or is larger than the cap."""
        unsigned = replace(s, signer=identity.public_key_hex, signature=b"")
        self.check(replace(unsigned, signature=bytes(SIGNATURE_LEN)))
        size = len(self.encode(unsigned)) + SIGNATURE_LEN + 2
        if size > self.max_bytes:
            raise ValueError(f"{self.what} is {size} bytes, limit {self.max_bytes}")
        return replace(unsigned, signature=self.signature_of(identity, unsigned))

    def verify(self, s: S, *, signer_key: str, tag: str = "") -> None:
        """``IntegrityError`` unless ``s`` is signed by ``signer_key`` (public key hex), validly."""
        signer, signature = getattr(s, "signer", ""), getattr(s, "signature", b"")
        tag = tag or f"{self.what} from {signer[:12]}"
        if signer != signer_key.lower():
            raise IntegrityError(f"{tag}: not signed by the expected key")
        if not self.signed_by(s, signer, signature):
            raise IntegrityError(f"{tag}: bad signature")


# ---- the declared fields as positional wire types, and back ---------------------------------------
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(kind: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type, in order (None for any other type): looked up once
    per type, not on every value of every statement signed, encoded or checked."""
    try:
        return _FIELD_NAMES[kind]
    except KeyError:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind)) if is_dataclass(kind) else None
        return names


def _wire(value: object) -> object:
    """A statement (nested dataclasses, tuples) as the plain tuples it travels as."""
    names = _field_names(type(value))  # (a class itself is an instance of its metaclass: no fields)
    if names is not None:
        return tuple(_wire(getattr(value, name)) for name in names)
    if isinstance(value, (tuple, list)):
        return tuple(_wire(v) for v in value)
    return value


def _hints(cls: type) -> list[object]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return [hints[f.name] for f in fields(cls)]


def _repeated(args: tuple[object, ...]) -> bool:
    return len(args) == 2 and args[1] is Ellipsis


def _wire_type(tp: object) -> object:
    """The positional type ``tp`` travels as: a dataclass as a fixed tuple of its fields' types."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return Annotated.__class_getitem__((_wire_type(args[0]), *tp.__metadata__))  # type: ignore[attr-defined]
    if isinstance(tp, type) and is_dataclass(tp):
        return tuple.__class_getitem__(tuple(_wire_type(h) for h in _hints(tp)))
    if origin is tuple and _repeated(args):
        return tuple.__class_getitem__((_wire_type(args[0]), ...))
    if origin is tuple:
        return tuple.__class_getitem__(tuple(_wire_type(a) for a in args))
    return tp


Build = Callable[[object], object]


def _builder(tp: object) -> Build:
    """Turns validated wire tuples of ``tp`` back into its dataclasses (made once per type)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _builder(args[0])
    if isinstance(tp, type) and is_dataclass(tp):
        return partial(_build_dataclass, tp, [_builder(h) for h in _hints(tp)])
    if origin is tuple and _repeated(args):
        return partial(_build_repeated, _builder(args[0]))
    if origin is tuple:
        return partial(_build_fixed, [_builder(a) for a in args])
    return _same


def _build_dataclass(cls: Callable[..., object], parts: list[Build], value: object) -> object:
    return cls(*(b(x) for b, x in zip(parts, _items(value))))


def _build_repeated(item: Build, value: object) -> object:
    return tuple(item(x) for x in _items(value))


def _build_fixed(parts: list[Build], value: object) -> object:
    return tuple(b(x) for b, x in zip(parts, _items(value)))


def _items(value: object) -> tuple[object, ...]:
    assert isinstance(value, tuple)  # validated against the wire type first
    return value


def _same(value: object) -> object:
    return value
