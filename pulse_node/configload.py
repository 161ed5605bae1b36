"""Loading role configs: defaults < TOML file < CLI overrides, validated by pydantic.

Every role has one pydantic config class (see ``pulse_node/config.py``). A file is TOML;
overrides are ``dotted.key=value`` strings whose values are parsed as TOML literals
(``rl.lr=3e-6``, ``net.listen="0.0.0.0"``) and fall back to plain strings.
Nothing here runs at import time.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypeVar

import pydantic

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, before it joined the standard library
    import tomli as tomllib

from pulse_node.errors import ConfigError

C = TypeVar("C", bound=pydantic.BaseModel)
T = TypeVar("T")


class StrictModel(pydantic.BaseModel):
    """Base for config sections: unknown keys are errors, so a typo fails loudly."""

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=1`` -> (["a", "b"], 1)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not of the form key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def merge_override(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part} is not a section")
    node[path[-1]] = value


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None


def load_tree(path: str | Path | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw tree of an optional TOML file with ``overrides`` merged in (not yet validated)."""
    tree: dict[str, Any] = read_toml(path) if path else {}
    for item in overrides or []:
        keys, value = parse_override(item)
        merge_override(tree, keys, value)
    return tree


def validate_tree(schema: pydantic.TypeAdapter[T], tree: dict[str, Any], *, path: str | Path | None = None) -> T:
    """``tree`` validated as ``schema`` (a model, or a union of models told apart by ``role``);
    otherwise a ``ConfigError`` naming the first bad key."""
    try:
        return schema.validate_python(tree)
    except pydantic.ValidationError as exc:
        where = f"{path}: " if path else ""
        first = exc.errors()[0]
        loc = first["loc"]
        if len(loc) > 1 and loc[0] == tree.get("role"):
            loc = loc[1:]  # a union's variant tag (the role) leads the location
        key = ".".join(str(x) for x in loc)
        raise ConfigError(f"{where}{key}: {first['msg']} ({exc.error_count()} error(s))") from None


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None) -> C:
    """Build a validated config of ``cls`` from defaults, an optional TOML file and overrides."""
    return validate_tree(pydantic.TypeAdapter(cls), load_tree(path, overrides), path=path)


def dump_toml(config: pydantic.BaseModel) -> str:
    """The resolved config as TOML (what ``--print-config`` shows)."""
    import tomli_w

    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))
