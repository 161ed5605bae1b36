"""The spool directory: push bodies too large for the local RPC cross it as files, not bytes.

A trainer's DHT worker owns one directory (``<data_dir>/spool``, mode 0700) and empties it
when it starts and when it stops. Outbound, the node writes a payload to a file there and hands
the worker its path (``push_file`` RPC), removing the file once the call returns; inbound, the
worker writes a received body to a file there while reading it from the stream and hands the
node its path (``events`` RPC); the node reads and deletes it. A path crossing the RPC is
checked on the side that opens it: a regular file directly in the spool directory (symlinks
resolved), named like the spool's own files, of exactly the announced size.

    spool = Spool(Path("data/spool")).prepare()       # the worker, at start
    path = spool.write_file(payload)                  # the node, outbound
    fd = spool.open_checked(str(path), len(payload))  # the worker, before streaming it
    data = spool.take(path_from_worker, size)         # the node, inbound (file deleted)
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import stat
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pulse_node.errors import WireError

#: bodies above this many bytes go through the spool; smaller ones stay on the bytes RPC
THRESHOLD = 1 << 20
#: largest push carried through a spool (= LocoConfig.max_payload_bytes's default)
DEFAULT_MAX_PUSH = 1 << 30
#: bytes of received files waiting for the node (a full spool answers ``busy``)
DEFAULT_DISK_BYTES = 4 << 30
_NAME = re.compile(r"^(in|out)-[0-9a-f]{24}\.push$")


@dataclass(frozen=True)
class Spool:
    """One spool directory (resolved once here) and its limits."""

    directory: Path
    max_push: int = DEFAULT_MAX_PUSH  # cap of one push carried through the spool
    disk_bytes: int = DEFAULT_DISK_BYTES  # received files waiting for the node, at most

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory).resolve())

    def prepare(self) -> Spool:
        """Create the directory (mode 0700) or tighten an existing one; remove files of an earlier run."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self.clear()
        return self

    def clear(self) -> int:
        """Remove every spool file (not subdirectories); returns how many were removed."""
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                try:
                    os.unlink(entry.path)
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    def files(self) -> list[str]:
        """Names of the files now in the spool (tests, diagnostics)."""
        try:
            return sorted(e.name for e in os.scandir(self.directory) if not e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []

    def create(self, prefix: str) -> tuple[int, Path]:
        """A new, uniquely named, empty file (``in`` or ``out``) open for writing; ``OSError`` on failure."""
        path = self.directory / f"{prefix}-{secrets.token_hex(12)}.push"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(path, flags, 0o600), path

    def write_file(self, data: bytes) -> Path:
        """Write an outbound body to a new spool file; nothing is left behind on failure."""
        fd, path = self.create("out")
        try:
            write_all(fd, data)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return path

    def check(self, path: object) -> Path:
        """``path`` resolved, if it names a spool file directly in this directory; ``WireError`` otherwise."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise WireError(f"spool path must be a non-empty string, got {type(path).__name__}")
        real = Path(path).resolve()
        if real.parent != self.directory or not _NAME.match(real.name):
            raise WireError(f"{path} is not a file of the spool {self.directory}")
        return real

    def open_checked(self, path: object, size: object) -> int:
        """A read-only descriptor on spool file ``path`` if it is a regular file of ``size`` bytes."""
        real = self.check(path)
        size = checked_size(size)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise WireError(f"spool file {real.name}: {exc.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            os.close(fd)
            raise WireError(f"spool file {real.name}: {st.st_size} bytes, expected {size}")
        return fd

    def take(self, path: object, size: object) -> bytes:
        """Read and delete a received spool file (checked like ``open_checked``; deleted even if bad)."""
        real = self.check(path)
        try:
            fd = self.open_checked(path, size)
            with open(fd, "rb", buffering=0) as fh:
                data = read_exact(fh, checked_size(size))
                if fh.read(1):
                    raise WireError(f"spool file {real.name} grew while it was read")
            return data
        finally:
            real.unlink(missing_ok=True)


def checked_size(size: object) -> int:
    """``size`` if it is a non-negative int (a spool file's size from the other process); ``WireError``."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise WireError(f"spool file size must be a non-negative int, got {size!r}")
    return size


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fh: BinaryIO, size: int) -> bytes:
    """``size`` bytes of an unbuffered file, one allocation in the usual case; ``WireError`` if short."""
    parts, got = [], 0
    while got < size:
        chunk = fh.read(size - got)
        if not chunk:
            raise WireError(f"spool file ended after {got} of {size} bytes")
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class AsyncFile:
    """An open spool file whose blocking writes and reads run on ``executor`` (off the event loop).

    A cancelled await (a deadline) leaves the thread running, and closing the descriptor under it
    could make it write into whatever file or socket reuses the number next: ``close`` therefore
    closes only once the last operation has finished."""

    def __init__(self, fd: int, executor: Executor) -> None:
        self.fd = fd
        self._executor = executor
        self._last: Future[None] | Future[bytes] | None = None

    async def write(self, data: bytes) -> None:
        self._last = self._executor.submit(write_all, self.fd, data)
        await asyncio.wrap_future(self._last)

    async def pread(self, n: int, offset: int) -> bytes:
        read = self._executor.submit(os.pread, self.fd, n, offset)
        self._last = read
        return await asyncio.wrap_future(read)

    def close(self) -> None:
        last, self._last = self._last, None
        if last is not None and not last.done():
            fd = self.fd
            last.add_done_callback(lambda _f: os.close(fd))
        else:
            os.close(self.fd)
