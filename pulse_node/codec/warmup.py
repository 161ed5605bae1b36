"""Ready the codec's compiled kernels: drop stale on-disk compilations, then compile (or load) all.

numba caches compiled kernels under ``codec/__pycache__`` and reuses an entry while the source
file of the kernel itself is unchanged; it does not notice edits to helpers inlined from another
module (``rans``, ``fused``, ``entropy`` inline each other and ``kernels``). ``clear_stale_cache``
keeps a digest of all kernel modules' sources beside the cache and drops every cached kernel of
those modules when it differs (an edited checkout, an upgrade in place). It must run before the
first kernel of a process is loaded, so each entry point calls it first: ``pulse-node``
(``cli.main``), the test session (``tests/conftest.py``), the codec benchmarks, and
``warm_up``, which a node runs at start so its first patch is not slowed by compilation.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from pulse_node.codec import kernels as K
from pulse_node.codec.header import Mode
from pulse_node.codec.patch import apply_patch, make_patch
from pulse_node.codec.state import TensorBits
from pulse_node.fsutil import write_atomic

#: modules whose compiled kernels inline each other
KERNEL_MODULES = ("kernels", "rans", "fused", "entropy")
_STAMP = "kernels.sources"


def clear_stale_cache(package: Path | None = None) -> bool:
    """Drop the cached kernels if any kernel module's source changed; True if it did.

    ``package``: the folder of the kernel modules (default: this package's).
    """
    if not K.AVAILABLE:
        return False
    here = package or Path(K.__file__).parent
    cache = here / "__pycache__"
    try:
        digest = hashlib.sha256(b"".join((here / f"{m}.py").read_bytes() for m in KERNEL_MODULES)).hexdigest()
        stamp = cache / _STAMP
        if stamp.is_file() and stamp.read_text() == digest:
            return False
        for m in KERNEL_MODULES:
            for f in [*cache.glob(f"{m}.*.nbi"), *cache.glob(f"{m}.*.nbc")]:
                f.unlink(missing_ok=True)
        write_atomic(stamp, digest.encode(), durable=False)
    except OSError:  # read-only install: numba then caches elsewhere (keyed by the installed files)
        return False
    return True


def warm_up() -> None:
    """Clear a stale cache, then compile (or load) every kernel for every element width."""
    if not K.AVAILABLE:
        return
    clear_stale_cache()
    _warm_kernels()
    _warm_codec_round_trips()


def _warm_kernels() -> None:
    i64 = np.arange(4, dtype=np.int64)
    buf = np.zeros(8, np.uint8)
    K.read_fields(buf, 0, 64, i64, np.empty(4, np.int64))
    K.write_fields(i64, i64, np.zeros(8, np.uint8))
    K.bin_values(i64, np.empty(4, np.int32), np.empty(4, np.int64), np.empty(4, np.int64))
    K.label_order(np.zeros(4, np.uint8), np.empty(4, np.int64), np.zeros(256, np.int64))
    for at in (np.int64, np.uint32):  # positions decode into 4-byte indices below 2**32 elements
        K.background_positions(i64.astype(at), i64, np.empty(4, at))
    K.locate(i64, i64, np.empty(4, bool), np.empty(4, np.int64))
    for dt in (np.uint8, np.uint16, np.uint32):
        bits = np.arange(4, dtype=dt)
        K.delta_zig(bits, bits + dt(1), K.FLOAT, 8 * bits.itemsize, np.empty(4, np.int64))
        K.count_below(bits, 1, 127)
        K.members_below(bits, 1, 127, 2, np.empty(5, np.int64), np.empty(5, np.uint8))
    for have, want in ((np.uint32, np.uint16), (np.uint16, np.uint16), (np.uint32, np.uint32)):
        K.differ(np.arange(4, dtype=have), np.arange(4, dtype=want), 0, 0, np.empty(5, np.int64))
        for at in (np.uint32, np.int64):  # live-model writes: positions as changes keep them
            K.scatter_shifted(np.zeros(4, have), np.arange(4, dtype=at), np.arange(4, dtype=want), 0)


def _warm_codec_round_trips() -> None:
    """A tiny patch per element width and mode through the whole codec (rANS and fused kernels)."""
    rng = np.random.default_rng(0)
    for dtype, np_dtype in (("BF16", np.uint16), ("F32", np.uint32), ("I8", np.uint8), ("I64", np.uint64)):
        old = rng.integers(0, 1 << 7, 4096).astype(np_dtype)
        new = old.copy()
        new[::7] += np_dtype(1)
        base, moved = {"w": TensorBits(dtype, (4096,), old)}, {"w": TensorBits(dtype, (4096,), new)}
        runs: tuple[tuple[Mode, bool], ...] = (("compact", False), ("compact", True), ("overwrite", False))
        for mode, context in runs:
            apply_patch(base, make_patch(base, moved, mode=mode, position_context=context))
