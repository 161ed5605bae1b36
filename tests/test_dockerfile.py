"""The Dockerfile's own Python one-liners name modules and functions that exist.

A rename inside the package (``codec.kernels.warm_up`` moved to ``codec.warmup``) once broke the
image build at its last step, seen only on a machine with a Docker engine; this catches it here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[1] / "Dockerfile"
FROM_IMPORT = re.compile(r"from (pulse_node[\w.]*) import ([\w, ]+)")


def _imports() -> list[tuple[str, str]]:
    found = []
    for module, names in FROM_IMPORT.findall(DOCKERFILE.read_text()):
        found += [(module, n.strip()) for n in names.split(",")]
    return found


def test_dockerfile_imports_exist():
    imports = _imports()
    assert imports, "the Dockerfile warms the codec up; its import line was not found"
    for module, name in imports:
        assert hasattr(importlib.import_module(module), name), f"Dockerfile: {module} has no {name}"


def test_a_renamed_function_is_caught():
    stale = "RUN python -c \"from pulse_node.codec.kernels import warm_up; warm_up()\""
    module, name = FROM_IMPORT.search(stale).groups()
    assert not hasattr(importlib.import_module(module), name)
