"""Apply a patch while its bytes still arrive: decode, scatter and hash tensor by tensor.

``apply_patch_inplace`` starts once the whole patch is in and its signed digest checked, so at
1 B parameters every decode, live-model scatter and the result hash happen after the last byte
(bench/RESULTS.md, "Versions in place"). The payload is laid out per tensor in sorted name order,
which is also the order of the state hash, so ``apply_streaming`` takes the patch from a
``Source`` that grows (``wait(n)``: the first ``n`` bytes, blocking) and, as soon as a tensor's
section is complete, decodes it into the state's own arrays (a few threads), hands the change to
a ``TensorSink`` (the live model, written optimistically) and feeds the state hash in order
(``StateHasher``: equal to ``statehash.state_hash``), untouched tensors included.

Trust. The bytes are decoded before the whole patch is authenticated. That is safe because the
decoder is bounded by what is signed or ours, never by a peer's number: the total size is the
signed ``patch_bytes`` (the source never holds more), checked first against our dense size
(``codec/limits.py``); the header must name exactly our tensors, dtypes and shapes, our base
hash and the signed result hash, and its ranges must tile the signed size; a tensor's positions are capped by its declared count (<= its numel, from our shape) and
every write lands at a decoded position < numel, with the old bits taken first (the undo log).
Any error is raised as ``PatchError`` (catch-up patches from any peer already go through the
same decoder unauthenticated). Only when the source's digest equals the signed one AND the
state hash of the result equals the signed result is the version kept; otherwise every tensor
written so far is restored in the state and in the sink, and the error is raised.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import blake3
import numpy as np

from pulse_node.codec.failpoints import NEVER, Failpoints
from pulse_node.codec.fused import LiveWords
from pulse_node.codec.header import MAGIC, MAX_HEADER_BYTES, PatchHeader, TensorEntry, unpack_header
from pulse_node.codec.inplace import Changes, TensorChange, _owned, _patch_tensor
from pulse_node.codec.models import PatchModels
from pulse_node.codec.patch import _check_base
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import _DOMAIN, _tensor_prefix
from pulse_node.errors import BaseMismatchError, IntegrityError, PatchError, PeerUnavailable

#: the most a ``GrowingBuffer`` reserves, whatever its caller allows (a 1 TB model's patch)
MAX_RESERVE = 1 << 41
#: threads decoding sections that are complete (bounded so a node sharing the machine is not starved)
WORKERS = min(2, os.cpu_count() or 1)
_PREFIX = struct.Struct("<7sBI")


class _Hash(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


class Source(Protocol):
    """A patch file that grows to ``size`` bytes (the signed size)."""

    size: int

    def wait(self, n: int) -> memoryview:
        """A view of (at least) the first ``n`` bytes, blocking until they are in; raises when the
        bytes stop coming (stall, deadline, failed fetch)."""
        ...

    def digest(self) -> str:
        """The digest of all ``size`` bytes (the one signed records name), after ``wait(size)``."""
        ...


class TensorSink(Protocol):
    """Takes each tensor's change as soon as it is decoded (the live model), and can take it back."""

    def write(self, name: str, change: TensorChange, dtype: str) -> None: ...

    def undo(self, name: str, change: TensorChange, dtype: str) -> None: ...

    def words(self, name: str, tb: TensorBits) -> LiveWords | None:
        """Words the decoder may write ``tb``'s new bits into itself, in its own pass (then
        ``write`` is not called for that tensor; ``undo`` still is); None: ``write`` after."""
        ...

    def lost(self) -> None:
        """An ``undo`` failed: what the sink holds is neither the base nor the result any more."""
        ...


class StateHasher:
    """``state_hash`` fed tensor by tensor, in sorted name order (the canonical encoding)."""

    def __init__(self, n_tensors: int) -> None:
        self._h = blake3.blake3(_DOMAIN, max_threads=blake3.blake3.AUTO)
        self._h.update(struct.pack("<Q", n_tensors))
        self._last: str | None = None

    def add(self, name: str, tb: TensorBits) -> None:
        if self._last is not None and name <= self._last:
            raise ValueError(f"tensors must be hashed in sorted order ({name!r} after {self._last!r})")
        self._last = name
        self._h.update(_tensor_prefix(name, tb))
        bits = np.ascontiguousarray(tb.bits, dtype=tb.bits.dtype.newbyteorder("<"))
        self._h.update(bits.view(np.uint8).data if bits.size else b"")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


@dataclass(frozen=True)
class Expected:
    """What the patch must be and do, from the signed record and our own state."""

    base_hash: str  # the state we hold
    result_hash: str  # signed
    digest: str  # signed digest of the whole patch file


def read_header(source: Source, expected: Expected) -> tuple[PatchHeader, int]:
    """The header, once its bytes are in; refused unless it fits the signed size and names the
    signed result and our base."""
    if source.size < _PREFIX.size:
        raise PatchError("not a patch: the signed size is too short")
    magic, _, hlen = _PREFIX.unpack_from(source.wait(_PREFIX.size), 0)
    if magic != MAGIC or hlen > MAX_HEADER_BYTES or _PREFIX.size + hlen > source.size:
        raise PatchError("not a patch, or its header runs past the signed size")
    header, start = unpack_header(source.wait(_PREFIX.size + hlen)[:_PREFIX.size + hlen])
    if start + header.payload_len != source.size:
        raise PatchError(f"patch header declares {start + header.payload_len} bytes, the record signs {source.size}")
    if header.base_state_hash != expected.base_hash:
        raise BaseMismatchError("patch names another base than the state held")
    if header.result_state_hash != expected.result_hash:
        raise IntegrityError("patch names another result than its signed record")
    return header, start


class _Run:
    """One streaming apply: decode jobs in flight, the hasher thread, and what to undo."""

    def __init__(self, state: State, header: PatchHeader, sink: TensorSink | None, workers: int,
                 trace: list[tuple[str, str, float]] | None, failpoints: Failpoints) -> None:
        self.state, self.header, self.sink, self.trace = state, header, sink, trace
        self.failpoints = failpoints
        self.models = PatchModels({(t.coding, t.dtype, t.label): t.counts for t in header.tables})
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="pipelined")
        # the sink's writes beside the hash of the same tensor (both only read the decoded bits)
        self.sink_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipelined-sink")
        self.sink_jobs: list[Future[None]] = []
        self.done: dict[str, TensorChange] = {}
        self.sunk: list[str] = []
        self.lock = threading.Lock()
        self.order: queue.Queue[tuple[TensorEntry, Future[TensorChange | None]] | None] = queue.Queue()
        self.hasher = StateHasher(len(header.tensors))
        self.hash_error: BaseException | None = None
        self.stop = threading.Event()
        self.hash_thread = threading.Thread(target=self._hash_in_order, name="pipelined-hash", daemon=True)
        self.hash_thread.start()

    def decode(self, entry: TensorEntry, payload: memoryview) -> TensorChange:
        tb = self.state[entry.name]
        direct = self.sink.words(entry.name, tb) if self.sink is not None else None
        change = _patch_tensor(entry, tb, payload, self.models, live=direct)  # a failure undoes both
        with self.lock:
            self.done[entry.name] = change
            if self.sink is not None:
                self.sunk.append(entry.name)  # before a write: a failing write is undone too
                if direct is None:
                    self.sink_jobs.append(self.sink_pool.submit(self._write, entry.name, change, tb.dtype))
            if self.trace is not None:
                self.trace.append(("decoded", entry.name, time.monotonic()))
        self.failpoints.reached("decoded")
        if direct is not None:
            self.failpoints.reached("written")  # the decode kernel wrote the live words itself
        return change

    def _write(self, name: str, change: TensorChange, dtype: str) -> None:
        assert self.sink is not None
        self.sink.write(name, change, dtype)
        self.failpoints.reached("written")

    def submit(self, entry: TensorEntry, payload: memoryview) -> None:
        fut: Future[TensorChange | None]
        if entry.changed:
            fut = self.pool.submit(self.decode, entry, payload)
        else:
            fut = Future()
            fut.set_result(None)
        self.order.put((entry, fut))

    def _hash_in_order(self) -> None:
        while not self.stop.is_set():
            item = self.order.get()
            if item is None:
                return
            entry, fut = item
            try:
                fut.result()
                self.hasher.add(entry.name, self.state[entry.name])
                if self.trace is not None:
                    self.trace.append(("hashed", entry.name, time.monotonic()))
            except BaseException as exc:  # the decode's error, kept for the caller
                self.hash_error = exc
                return

    def finish(self) -> str:
        """Wait for every decode and the hash; the result hash (raises a decode's error)."""
        self.order.put(None)
        self.hash_thread.join()
        self.pool.shutdown(wait=True)
        self.sink_pool.shutdown(wait=True)
        if self.hash_error is not None:
            raise self.hash_error
        for job in self.sink_jobs:
            job.result()  # a failed write raises here (and is undone by ``abort``)
        return self.hasher.hexdigest()

    def abort(self) -> None:
        """Stop, wait for the decodes in flight (none may write after the undo), restore all."""
        self.stop.set()
        self.order.put(None)
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.hash_thread.join()
        self.sink_pool.shutdown(wait=True)
        changes = self.changes()
        changes.undo(self.state)
        if self.sink is not None:
            undo_sink(self.sink, [(name, c, self.state[name].dtype) for name in self.sunk
                                  if (c := self.done.get(name)) is not None])

    def changes(self) -> Changes:
        return Changes(self.header.base_state_hash, self.header.result_state_hash, dict(self.done))


def undo_sink(sink: TensorSink, written: list[tuple[str, TensorChange, str]]) -> None:
    """Write each change's old bits back into ``sink``; one that cannot be undone makes the
    sink ``lost`` (its holder reloads it) and the others are still undone."""
    failed = False
    for name, change, dtype in written:
        try:
            sink.undo(name, change, dtype)
        except Exception:
            failed = True
    if failed:
        sink.lost()


def apply_streaming(state: State, source: Source, expected: Expected, *, sink: TensorSink | None = None,
                    workers: int = WORKERS, trace: list[tuple[str, str, float]] | None = None,
                    failpoints: Failpoints = NEVER) -> tuple[Changes, PatchHeader, int]:
    """Turn ``state`` into the patch's result in place while ``source`` fills; returns the changes
    and the header it parsed (once), with where the payload starts.

    Every tensor's section is decoded as soon as it is complete and written into ``sink`` too;
    the result is kept only if the whole file's digest and the result's state hash equal
    ``expected``. Any failure (a bad header, a corrupt section, a stalled source, a digest or
    hash mismatch) leaves ``state`` and ``sink`` as they were and raises. ``trace`` (benches):
    gets ``(event, tensor, monotonic time)`` for each section complete, decoded and hashed.
    ``failpoints`` (tests): told when the bytes are all in, each tensor decoded and written, and
    the result hashed and compared.
    """
    header, start = read_header(source, expected)
    _check_base(header, state)
    _owned(state, header)
    run = _Run(state, header, sink, workers, trace, failpoints)
    try:
        for entry in header.tensors:
            if run.hash_error is not None:
                break
            end = start + entry.offset + entry.length
            view = source.wait(end) if entry.length else memoryview(b"")
            if trace is not None and entry.length:
                trace.append(("arrived", entry.name, time.monotonic()))
            run.submit(entry, view[start:end] if entry.length else view)
        result = run.finish()
        source.wait(source.size)
        failpoints.reached("received")
        if source.digest() != expected.digest:
            raise IntegrityError("patch does not match its signed digest")
        if result != expected.result_hash:
            raise IntegrityError("patched state hash does not match the signed result hash")
        failpoints.reached("hashed")
    except BaseException:
        run.abort()
        raise
    return run.changes(), header, start


class GrowingBuffer:
    """A ``Source`` filled by a producer (``append``): the patch's bytes as they arrive, at most
    the signed ``size``, hashed as they come (``digest_factory``: the record's digest, SHA-256).
    ``wait`` raises ``PeerUnavailable`` when nothing new came for ``stall_s`` or past
    ``deadline_s``, and the producer's error once it ``fail``-s.

    The size is reserved once as an anonymous mapping, whose pages take memory only as bytes are
    written into them: a peer that sends less costs what it sent. The caller bounds ``size`` by
    its own model first (``codec/limits.py``); past ``MAX_RESERVE`` it is refused here too."""

    def __init__(self, size: int, *, stall_s: float = 10.0, deadline_s: float = 600.0,
                 digest_factory: Callable[[], _Hash] = hashlib.sha256) -> None:
        if not 0 <= size <= MAX_RESERVE:
            raise PatchError(f"a patch of {size} bytes is past what a node reserves ({MAX_RESERVE})")
        self.size = size
        try:
            self._buf = mmap.mmap(-1, max(size, 1))
        except (OSError, ValueError, OverflowError) as exc:  # the machine cannot reserve it
            raise PatchError(f"cannot reserve {size} bytes for a patch ({exc})") from None
        self._view = memoryview(self._buf)[:size]
        self._have = 0
        self._hash = digest_factory()
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self.stall_s = stall_s
        self._deadline = time.monotonic() + deadline_s
        self.completed_at: float | None = None  # monotonic time the last byte came in

    @property
    def have(self) -> int:
        return self._have

    def append(self, data: bytes | memoryview) -> None:
        """The next bytes (refused past the signed size: the producer stops, the waiter fails)."""
        n = len(data)
        if self._have + n > self.size:
            self.fail(PatchError(f"patch is longer than the {self.size} bytes its record signs"))
            raise PatchError("patch overruns its signed size")
        self._view[self._have:self._have + n] = data
        self._grown(n)

    def read_from(self, fd: int, limit: int) -> int:
        """Read at most ``limit`` of the next bytes from ``fd`` straight into the buffer (never past
        the signed size, no intermediate copy); how many came (0: none yet, or the end)."""
        k = min(limit, self.size - self._have)
        n = os.readv(fd, [self._view[self._have:self._have + k]]) if k > 0 else 0
        if n:
            self._grown(n)
        return n

    def _grown(self, n: int) -> None:
        """The ``n`` bytes after ``have`` are in (one producer): hash them, then let waiters see them."""
        self._hash.update(self._view[self._have:self._have + n])
        with self._cond:
            self._have += n
            if self._have == self.size:
                self.completed_at = time.monotonic()
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def wait(self, n: int) -> memoryview:
        if n > self.size:
            raise PatchError(f"patch section ends at {n}, past the signed size {self.size}")
        with self._cond:
            last, since = self._have, time.monotonic()
            while self._have < n:
                if self._error is not None:
                    raise self._error
                now = time.monotonic()
                if self._have != last:
                    last, since = self._have, now
                if now - since >= self.stall_s or now >= self._deadline:
                    raise PeerUnavailable(f"patch stopped at {self._have} of {self.size} bytes")
                self._cond.wait(timeout=min(self.stall_s - (now - since), self._deadline - now, 0.5))
        return self._view

    def digest(self) -> str:
        self.wait(self.size)
        return self._hash.hexdigest()

    def bytes(self) -> bytes:
        """The whole patch (once complete), e.g. for the store."""
        return bytes(self.wait(self.size))
