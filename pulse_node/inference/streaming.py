"""The next version applied while its patch arrives: the file followed, the live model written early.

The wire worker (another process) writes a fetched patch into a temp file beside ``dest``
(``fsutil.atomic_writer``: ``.<dest name>.<pid>.<random>.tmp``) and renames it when complete.
``Pipeline.fetch_apply`` runs the fetch on a thread, follows that file's growth (the open file
stays readable across the rename) into a ``codec.pipelined.GrowingBuffer`` of the signed size,
and runs ``codec.pipelined.apply_streaming`` on it: each tensor's section is decoded into the
state in place as soon as it is complete, written into the live model (``LiveSink``, only when
the live model holds this very state's base version) and hashed in order. The result is a
``Streamed``: kept by ``commit`` once the syncer stores the version, undone by ``rollback``
(state and live model) otherwise.

What a peer's bytes can do: nothing beyond the undo. A failure before the whole file is in
(a corrupt section, a header naming another result) is not yet blamed on the peer: the transfer
is followed to its end and the file's digest compared with the signed one. A different digest
is the peer's (``IntegrityError``, struck by the syncer); a matching one means the signed patch
itself does not apply, which the syncer's normal path reports (the bytes are returned without a
``Streamed``). A file that stops growing fails after ``stall_s`` (``PeerUnavailable``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.chain.record import VersionRecord
from pulse_node.chain.store import VersionStore
from pulse_node.chain.verified import VerifiedVersion, apply_version, seal_streamed
from pulse_node.codec.failpoints import NEVER, Failpoints
from pulse_node.codec.fused import LiveWords
from pulse_node.codec.inplace import Changes, TensorChange
from pulse_node.codec.limits import check_patch_size
from pulse_node.codec.patch import ParsedPatch
from pulse_node.codec.pipelined import Expected, GrowingBuffer, apply_streaming, undo_sink
from pulse_node.codec.state import State, TensorBits
from pulse_node.errors import IntegrityError, PatchError, PeerUnavailable, PulseError
from pulse_node.fsutil import temp_paths_of

if TYPE_CHECKING:  # torch: imported by the role, not by the syncer
    from pulse_node.rl.liveweights import LiveWeights

log = logging.getLogger("pulse.sync")

#: seconds between looks at a file that has not grown
POLL_S = 0.002
#: bytes read from the followed file at once
READ_BYTES = 4 << 20


def stream_next(held: VersionRecord | None, rec: VersionRecord) -> bool:
    """Whether ``rec`` (verified) is the version right after the one held, on our chain: the only
    one whose patch may be applied while it arrives."""
    return held is not None and rec.version == held.version + 1 and rec.parent_chain_hash == held.chain_hash


class LiveSink:
    """The live model as a ``codec.pipelined.TensorSink``: each tensor written as soon as it is decoded."""

    def __init__(self, live: LiveWeights) -> None:
        self.live = live

    def write(self, name: str, change: TensorChange, dtype: str) -> None:
        self.live.write(name, change, dtype)

    def undo(self, name: str, change: TensorChange, dtype: str) -> None:
        self.live.write(name, change, dtype, forward=False)

    def words(self, name: str, tb: TensorBits) -> LiveWords | None:
        return self.live.words(name, tb)

    def lost(self) -> None:
        self.live.forget()


@dataclass
class Streamed:
    """A version applied while it arrived (state and maybe live model), until committed or undone."""

    state: State
    base: int
    target: int
    changes: Changes
    live: LiveWeights | None
    settled: bool = field(default=False)
    last_byte_at: float | None = None  # monotonic time the follower read the patch's last byte

    @property
    def live_written(self) -> bool:
        return self.live is not None

    def commit(self) -> None:
        """The version is kept: the live model now holds ``target`` (nothing more is written).
        Never raises: the version is stored by then; a live model that cannot note the step is
        forgotten (reloaded from the state by its next ``set``)."""
        if self.settled:
            return
        self.settled = True
        if self.live is not None:
            try:
                self.live.advance(self.state, [(self.base, self.target, self.changes)], written=True)
            except Exception:
                log.exception("the live model could not take version %d; it reloads", self.target)
                self.live.forget()

    def rollback(self) -> None:
        """Back to ``base`` in the state and the live model (no-op once settled)."""
        if self.settled:
            return
        self.settled = True
        self.changes.undo(self.state)
        if self.live is not None:
            undo_sink(LiveSink(self.live), [(name, c, self.state[name].dtype)
                                            for name, c in self.changes.tensors.items()])


def apply_next(got: VerifiedVersion, streamed: Streamed | None, *, state: State, base: VersionRecord,
               store: VersionStore, failpoints: Failpoints = NEVER) -> Changes:
    """Make ``got`` (the version after ``base``, whose verified state ``state`` holds) the node's
    version, all or nothing: applied in place (or, ``streamed``, already applied while it
    arrived), sealed, its patch (and an anchor's state) stored, then the live model's step kept.
    Any failure before the live model's step puts the state and the live model back at ``base``
    and raises; the store may then hold the version too (verified, idempotent: it is stored
    again when applied again). Returns what changed."""
    changes: Changes | None = streamed.changes if streamed is not None else None
    try:
        if streamed is not None:
            applied = seal_streamed(got, state, base=base)
        else:
            changes, applied = apply_version(state, got, base=base, failpoints=failpoints)
        failpoints.reached("sealed")
        store.put_patch(applied)
        if got.record.is_anchor:
            store.put_anchor(applied)
    except BaseException:
        if streamed is not None:
            streamed.rollback()
        elif changes is not None:
            changes.undo(state)
        raise
    if streamed is not None:
        streamed.commit()
    assert changes is not None
    return changes


class _Fetch:
    """The blocking fetch on its own thread, and a follower copying the growing file into ``buf``."""

    def __init__(self, fetch: Callable[[Path], None], dest: Path, buf: GrowingBuffer) -> None:
        self.dest, self.buf = dest, buf
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self.stop = threading.Event()
        self._fetch = fetch
        self.threads = [threading.Thread(target=self._run_fetch, name="stream-fetch", daemon=True),
                        threading.Thread(target=self._follow, name="stream-follow", daemon=True)]
        for t in self.threads:
            t.start()

    def _run_fetch(self) -> None:
        try:
            self._fetch(self.dest)
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished.set()
            if self.stop.is_set():  # abandoned (stalled): its file is nobody's
                self.dest.unlink(missing_ok=True)

    def _open(self) -> int | None:
        for path in [self.dest, *temp_paths_of(self.dest)]:
            try:
                return os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
        return None

    def _follow(self) -> None:
        fd: int | None = None
        try:
            while not self.stop.is_set() and self.buf.have < self.buf.size:
                done = self.finished.is_set()  # read before looking: a finished fetch wrote everything
                if done and self.error is not None:
                    self.buf.fail(self.error)
                    return
                fd = fd if fd is not None else self._open()
                if fd is not None and self.buf.read_from(fd, READ_BYTES):
                    continue
                if done:
                    self.buf.fail(PatchError(f"patch ended at {self.buf.have} of {self.buf.size} signed bytes"))
                    return
                time.sleep(POLL_S)
        except BaseException as exc:
            self.buf.fail(exc)
        finally:
            if fd is not None:
                os.close(fd)

    def join(self, timeout: float) -> None:
        """Wait for the fetch to end; its error, if any, is raised."""
        if not self.finished.wait(timeout):
            raise PeerUnavailable(f"{self.dest.name}: fetch did not end in {timeout:.1f}s")
        if self.error is not None:
            raise self.error


@dataclass
class StreamCounts:
    """What the pipeline did: versions applied while they arrived, of them with the live model
    written as they came, and streams handed back to the whole-patch path."""

    streamed: int = 0
    live_written: int = 0
    fallback: int = 0


class Pipeline:
    """Fetches the next version's patch and applies it while it arrives (see the module doc)."""

    def __init__(self, live: LiveWeights | None = None, *, stall_s: float = 10.0, workers: int = 2,
                 trace: list[tuple[str, str, float]] | None = None, failpoints: Failpoints = NEVER) -> None:
        self.live, self.stall_s, self.workers, self.trace = live, stall_s, workers, trace
        self.failpoints = failpoints  # tests: a failure injected after a step (``codec/failpoints.py``)
        self.counters = StreamCounts()

    @staticmethod
    def expect(held: VersionRecord, rec: VersionRecord) -> Expected:
        """What ``rec``'s patch must be: from the state we hold to its signed result, its signed digest."""
        return Expected(base_hash=held.state_hash, result_hash=rec.state_hash, digest=rec.patch_digest)

    def fetch_apply(self, fetch: Callable[[Path], None], dest: Path, *, state: State, base: int, target: int, expected: Expected, size: int, timeout: float) -> tuple[bytes | ParsedPatch, Streamed | None]:
        """Fetch (``fetch(dest)`` blocks until ``dest`` holds the file) and apply into ``state``
        (version ``base``, hashing to ``expected.base_hash``) as the bytes come. Returns the patch and the
        ``Streamed`` apply, or the patch and None when the signed patch itself does not apply
        here (the caller's normal path then reports why); raises when the bytes are not the
        signed ones (``IntegrityError``), do not all come or the fetch fails even after the last
        byte (``PeerUnavailable``; the state and live model are then back at ``base``), or when
        the signed ``size`` is past what a patch of this model can be (``PatchError``, before
        anything is allocated)."""
        check_patch_size(size, state)
        buf = GrowingBuffer(size, stall_s=self.stall_s, deadline_s=timeout + self.stall_s)
        live = self.live if self.live is not None and self.live.holds(base, state) else None
        job = _Fetch(fetch, dest, buf)
        try:
            sink = LiveSink(live) if live is not None else None
            changes, header, start = apply_streaming(state, buf, expected, sink=sink, workers=self.workers,
                                                     trace=self.trace, failpoints=self.failpoints)
        except PeerUnavailable:
            job.stop.set()
            raise
        except PulseError as exc:
            return self._after_refusal(job, buf, expected, timeout, exc)
        except BaseException:
            job.stop.set()
            raise
        streamed = Streamed(state, base, target, changes, live, last_byte_at=buf.completed_at)
        try:  # applied: kept only if the fetch itself ends well too
            job.join(timeout + self.stall_s)
            self.failpoints.reached("reported")
            patch = ParsedPatch(buf.bytes(), header, start)  # the header parsed once, while it came
        except BaseException:
            streamed.rollback()
            raise
        self.counters.streamed += 1
        self.counters.live_written += live is not None
        return patch, streamed

    def _after_refusal(self, job: _Fetch, buf: GrowingBuffer, expected: Expected, timeout: float,
                       exc: PulseError) -> tuple[bytes, None]:
        """Refused before or after the last byte (state and live model already restored): the
        peer's fault only if its bytes are not the signed ones, so the transfer is finished."""
        job.join(timeout + self.stall_s)
        if buf.digest() != expected.digest:
            raise IntegrityError("patch does not match its signed digest") from None
        self.counters.fallback += 1
        log.info("signed patch refused while streaming (%s); left to the normal apply", exc)
        return buf.bytes(), None
