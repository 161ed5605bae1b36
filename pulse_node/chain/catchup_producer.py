"""Makes the catch-up patch ``base -> target`` a peer asks for, from this node's verified states.

Who and when: every node (trainer or inference) serves catch-ups on demand, from its own
store, in the serving path (the wire worker, or the in-memory transport in tests). A request
for a file already in ``<root>/catchup/`` is served as is; otherwise one background thread
rebuilds both states from the store (anchor or current + patches, each state hash checked
against its signed record, so a catch-up never launders bad weights), makes one codec patch
and caches it. Why on demand and not precomputed: a lagging peer's base is whatever version
it last held, so precomputing would have to guess bases; measured costs are in
bench/RESULTS.md ("Catch-up production").

Bounded everywhere: one catch-up is made at a time (a request for another pair while one is
being made gets ``BusyError`` at once), a request waits at most ``wait_s`` (then
``BusyError``: the file is still cached when done, ask again), requests this node cannot
serve (target not held, base not rebuildable, gap above ``max_gap``) fail at once with
``GapError`` before any heavy work, and the cache is pruned to ``CATCHUP_KEEP_FILES`` /
``CATCHUP_KEEP_BYTES`` after each write (and by ``VersionStore.retain``).

Torch-free, and the codec is imported on the first request, not with the module (the wire
worker's start); safe to use from a trio program through ``trio.to_thread.run_sync(request, ...)``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.chain.layout import CATCHUP_KEEP_BYTES, CATCHUP_KEEP_FILES, catchup_path, prune_catchups
from pulse_node.errors import BusyError, GapError, PulseError, StoreError
from pulse_node.fsutil import write_atomic

if TYPE_CHECKING:
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.header import Mode
    from pulse_node.codec.state import State

log = logging.getLogger("pulse.catchup")

CATCHUP_MAX_GAP = 256  # versions; beyond that an anchor is the better answer
CATCHUP_WAIT_S = 5.0  # below the data plane's 10 s stream idle timeout


@dataclass
class _Job:
    base: int
    target: int
    done: threading.Event = field(default_factory=threading.Event)
    error: PulseError | None = None


class CatchupProducer:
    """On-demand catch-up patches for one store root (read-only use of the store)."""

    def __init__(self, root: Path, *, max_gap: int = CATCHUP_MAX_GAP, wait_s: float = CATCHUP_WAIT_S,
                 mode: Mode = "compact") -> None:
        self.root, self.max_gap, self.wait_s, self.mode = Path(root), max_gap, wait_s, mode
        self._lock = threading.Lock()
        self._job: _Job | None = None
        self._store: VersionStore | None = None
        self._cached: tuple[int, str, State] | None = None  # (version, state hash, state) of the last target
        self.made = 0

    def request(self, base: int, target: int) -> Path:
        """The cached catch-up file ``base -> target``, made first if needed (blocks <= ``wait_s``)."""
        path = catchup_path(self.root, base, target)
        if path.exists():
            return path
        with self._lock:
            job = self._job
            if job is None or job.done.is_set():
                self._check(base, target)
                job = self._job = _Job(base, target)
                threading.Thread(target=self._run, args=(job,), name=f"catchup-{base}-{target}",
                                 daemon=True).start()
            elif (job.base, job.target) != (base, target):
                raise BusyError(f"making catch-up v{job.base} -> v{job.target}; ask again shortly")
        if not job.done.wait(self.wait_s):
            raise BusyError(f"still making catch-up v{base} -> v{target}; ask again shortly")
        if job.error is not None:
            raise job.error
        return path

    def making(self, base: int, target: int) -> bool:
        """Whether ``base -> target`` is cached or being made now (a request for it costs nothing new)."""
        job = self._job
        if job is not None and not job.done.is_set() and (job.base, job.target) == (base, target):
            return True
        return catchup_path(self.root, base, target).exists()

    def _check(self, base: int, target: int) -> None:
        """Fail fast (no state is loaded) unless this node can make ``base -> target``."""
        if target - base > self.max_gap:
            raise GapError(f"catch-up v{base} -> v{target} spans {target - base} versions, more than "
                           f"{self.max_gap}; fetch an anchor instead")
        store = self._open()
        if not store.can_load(target):
            raise GapError(f"this node does not hold v{target}")
        if not store.can_load(base):
            raise GapError(f"this node cannot rebuild base v{base} (not kept)")

    def _open(self) -> VersionStore:
        # the codec (numba) is imported on the first request, not at the wire worker's start
        from pulse_node.chain.store import VersionStore

        if self._store is None:
            self._store = VersionStore(self.root, readonly=True)
        else:
            self._store.refresh()
        return self._store

    def _run(self, job: _Job) -> None:
        t0 = time.perf_counter()
        try:
            patch = self._make(job.base, job.target)
            write_atomic(catchup_path(self.root, job.base, job.target), patch)
            prune_catchups(self.root, keep_files=CATCHUP_KEEP_FILES, keep_bytes=CATCHUP_KEEP_BYTES)
            self.made += 1
            log.info("made catch-up v%d -> v%d: %d bytes in %.2f s", job.base, job.target, len(patch),
                     time.perf_counter() - t0)
        except PulseError as exc:
            job.error = exc
        except Exception as exc:  # disk full, a store file vanishing under us: the requester falls back
            log.exception("making catch-up v%d -> v%d failed", job.base, job.target)
            job.error = StoreError(f"making catch-up v{job.base} -> v{job.target} failed: {type(exc).__name__}")
        finally:
            job.done.set()

    def _make(self, base: int, target: int) -> bytes:
        from pulse_node.chain.catchup import make_catchup

        store = self._store
        assert store is not None
        rec_a, rec_b = store.record(base), store.record(target)
        if rec_a is None or rec_b is None:
            raise GapError(f"records of v{base} / v{target} are gone")
        state_b = self._load(store, target, rec_b.state_hash)
        self._cached = (target, rec_b.state_hash, state_b)  # the next head is one patch away
        state_a = self._load(store, base, rec_a.state_hash)
        return make_catchup(state_a, state_b, from_version=base, to_version=target, mode=self.mode,
                            hashes=(rec_a.state_hash, rec_b.state_hash))

    def _load(self, store: VersionStore, version: int, digest: str) -> State:
        """The verified state of ``version``: from the cached one if it is on the way, else the store."""
        cached = self._cached
        if cached is not None:
            v, h, state = cached
            rec = store.record(v)
            if v == version and h == digest:
                return state
            if v < version and rec is not None and rec.state_hash == h and \
                    all(store.has_patch(u) for u in range(v + 1, version + 1)):
                return store.advance(state, v, version)
        return store.load_state(version)
