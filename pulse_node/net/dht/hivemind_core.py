"""hivemind's DHT and p2p halves without its machine-learning half, for the DHT worker's process.

``import hivemind.dht.node`` first runs ``hivemind/__init__.py``, which imports averaging, MoE and
optim, so torch, scipy and numpy: about 2 CPU-seconds before the worker can answer, in every
node's start (bench/RESULTS.md, "Suite time"). The worker uses only ``DHTNode``, ``DHTProtocol``,
``P2P`` and the utilities they import, none of which need torch. ``load_core`` registers the three
packages whose ``__init__`` pulls torch in (``hivemind``, ``hivemind.dht``, ``hivemind.utils``) as
bare packages over hivemind's own directories, so their submodules import as usual, and gives
``hivemind.utils`` the names its torch-free submodules define (what the DHT and p2p modules import
from it). Nothing of hivemind's code is copied or changed.

Only for a process that uses nothing else of hivemind (``python -m pulse_node.net.dht``); it does
nothing where hivemind is already imported, and if the installed hivemind does not fit (another
release), it undoes itself and the plain import runs instead.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import sys
import types

log = logging.getLogger("pulse.dht")

#: ``hivemind.utils`` submodules that import no torch; their public names make up the bare package
TORCH_FREE_UTILS = ("asyncio", "logging", "nested", "performance_ema", "serializer", "timed_storage")
#: what the worker imports of hivemind, loaded once here so a misfit shows now, not mid-run
WORKER_MODULES = ("hivemind.dht.node", "hivemind.dht.protocol", "hivemind.dht.validation", "hivemind.p2p",
                  "hivemind.utils.multiaddr")


def load_core() -> bool:
    """Import the worker's hivemind modules without torch; False (and nothing changed) if
    hivemind was imported already or does not fit."""
    if "hivemind" in sys.modules:
        return False
    spec = importlib.util.find_spec("hivemind")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = next(iter(spec.submodule_search_locations))
    before = set(sys.modules)
    try:
        _bare("hivemind", root)
        _bare("hivemind.dht", f"{root}/dht")
        utils = _bare("hivemind.utils", f"{root}/utils")
        for sub in TORCH_FREE_UTILS:
            module = importlib.import_module(f"hivemind.utils.{sub}")
            for name, value in vars(module).items():
                if not name.startswith("_"):
                    setattr(utils, name, value)
        for name in WORKER_MODULES:
            importlib.import_module(name)
    except Exception as exc:  # another hivemind release: fall back to the plain import
        for name in set(sys.modules) - before:
            del sys.modules[name]
        log.warning("hivemind's DHT could not be loaded without torch (%s); importing all of hivemind", exc)
        return False
    return True


def _bare(name: str, path: str) -> types.ModuleType:
    """A package module over ``path`` whose ``__init__`` never runs."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [path]
    module.__path__ = [path]
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module
