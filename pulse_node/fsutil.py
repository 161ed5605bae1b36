"""Atomic file writes: readers (threads, the wire worker, other nodes) see the old file or the whole new one.

Every file the node shares through its directories is written the same way: into a temp file
``.<name>.<pid>.<random>.tmp`` beside the target (``chain/layout.is_temp`` knows the pattern;
store recovery removes leftovers), then renamed over it. ``durable=True`` also fsyncs the file before the rename
and the directory after it, so a crash leaves the old file or the new one, never a torn one;
files that are cheap to lose (round files, resume maps, test copies) skip the fsyncs.
Torch-free, no imports from the rest of the package.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: write buffer of the temp file (large bodies are streamed through it)
_BUFFER = 1 << 20


def temp_path(path: Path) -> Path:
    """A unique temp file name beside ``path`` (unique across processes and threads)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def temp_paths_of(path: Path) -> list[Path]:
    """The temp files ``temp_path`` made for ``path`` that exist now (a writer still at work)."""
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def fsync_dir(path: Path) -> None:
    """Make a rename or link inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: Path, path: Path, *, durable: bool = True) -> None:
    """Move a complete ``tmp`` over ``path`` (fsynced first and the directory after if ``durable``)."""
    if durable:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


@contextmanager
def atomic_writer(path: Path, *, durable: bool = True, mode: int = 0o666,
                  exclusive: bool = False) -> Iterator[BinaryIO]:
    """A binary file whose contents replace ``path`` when the block ends without an exception.

    On an exception the temp file is removed and ``path`` is left as it was. ``mode``: the
    new file's permission bits (before the umask). ``exclusive``: never replace an existing
    ``path`` (hard link, atomic against a racing writer); ``FileExistsError`` if it exists.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb", buffering=_BUFFER) as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        if exclusive:
            _link_exclusive(tmp, path)
        else:
            os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _link_exclusive(tmp: Path, path: Path) -> None:
    try:
        os.link(tmp, path)  # atomic, and fails if path exists: no clobbering a racer
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: rename (the last racer wins)
        if path.exists():
            raise FileExistsError(path) from None
        os.replace(tmp, path)


def write_atomic(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring)."""
    with atomic_writer(path, durable=durable, mode=mode) as fh:
        fh.write(data)
