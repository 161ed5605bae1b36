"""Flags shared by the commands that load a role config (``--config``, ``--set``, ``--print-config``)."""

from __future__ import annotations

import argparse


def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set grpo.lr=3e-6 (repeatable)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as TOML and exit")


def flag_overrides(pairs: dict[str, object]) -> list[str]:
    """Turn set CLI flags into ``key=value`` overrides (flags win over the file)."""
    import json

    out = []
    for key, value in pairs.items():
        if value is None or value == []:
            continue
        out.append(f"{key}={json.dumps(value) if not isinstance(value, bool) else str(value).lower()}")
    return out
