"""The live model's weights, moved between versions by scattering only the changed entries.

A rollout worker (sampler or verifier) holds one network whose parameters are the BF16 bits of
one version, FP32 upcasts where the parameter is FP32 (exact). Reloading every parameter per
version (``torchbits.load_state``) is dense work: at 1 B parameters 4 GB written per version,
and on a trainer verifying batches of several versions, per switch. ``LiveWeights`` knows which
version its parameters hold and moves them:

- forward by ``Changes`` (``codec/inplace.py``: what an in-place apply changed), written as
  upcasts of the new bits;
- between versions it has been at, along the steps it keeps (the last ``keep``): forward with
  a step's new bits, backward with its old bits (the undo log), never decoding or reloading;
- to a state it has no step to, by one compare of the live bits against that state (no
  allocation of a model-sized buffer), which is kept as a step too; a full load only when the
  parameters cannot be compared bitwise (a dtype the live model does not hold exactly).

Steps are edges between version numbers; a version whose state is a different object than the
one a step was made for (another fork, a re-sync) loses its steps, so a path always leads to
the bits of the state the caller names.

A move that fails midway is undone (the old bits written back); one that cannot be undone, or a
load or compare that fails, leaves the parameters at no known version (``forget``), so the next
``set`` loads the state whole: they never pass for a version whose bits they do not hold.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from pulse_node.codec import kernels as K
from pulse_node.codec.failpoints import NEVER, Failpoints
from pulse_node.codec.fused import LiveWords, write_live
from pulse_node.codec.inplace import Changes, Move, TensorChange
from pulse_node.codec.state import State, TensorBits
from pulse_node.torchbits import load_state

#: elements compared per chunk when diffing the live bits against a state (bounds temporaries)
CHUNK = 1 << 22
#: a step changing more than this fraction of all entries is not kept (8 B per changed entry)
MAX_STEP_FRACTION = 0.25
#: CPU parameters are written through numpy views (False: the torch path CUDA takes, for tests)
NUMPY_ON_CPU = True
#: threads scattering into CPU parameters
SCATTER_THREADS = min(4, os.cpu_count() or 1)
_SIGNED = {2: torch.int16, 4: torch.int32}



def _exact(param: torch.Tensor, tb: TensorBits) -> bool:
    """Whether ``param`` holds ``tb``'s dtype exactly and can be read back as its bits."""
    if not param.is_contiguous() or tuple(param.shape) != tb.shape:
        return False
    return (tb.dtype, param.dtype) in {("BF16", torch.float32), ("BF16", torch.bfloat16), ("F32", torch.float32),
                                       ("F16", torch.float16)}


def _to_param(bits: np.ndarray, dtype: str, param: torch.Tensor) -> torch.Tensor:
    """The values of ``bits`` (dtype ``dtype``) as ``param``'s dtype, on its device."""
    raw = torch.from_numpy(np.ascontiguousarray(bits).view(np.dtype(f"<i{bits.itemsize}"))).to(param.device)
    if dtype == "BF16" and param.dtype == torch.float32:
        return (raw.to(torch.int32) << 16).view(torch.float32)  # the exact upcast
    return raw.view(param.dtype)


def _live_bits(chunk: torch.Tensor, dtype: str) -> torch.Tensor:
    """The stored bits (signed view) of a chunk of live values, in the state's dtype."""
    if dtype == "BF16" and chunk.dtype == torch.float32:
        return (chunk.view(torch.int32) >> 16).to(torch.int16)
    return chunk.view(_SIGNED[chunk.element_size()])


def _cpu_bits(param: torch.Tensor) -> np.ndarray:
    """The flat unsigned-integer numpy view of a CPU parameter's storage (writes go to it)."""
    return param.detach().view(-1).view(_SIGNED[param.element_size()]).numpy().view(
        np.dtype(f"<u{param.element_size()}"))


def _numpy_writable(param: torch.Tensor) -> bool:
    """Whether ``param`` is written in place through numpy (a CPU parameter)."""
    return param.device.type == "cpu" and NUMPY_ON_CPU


def _cpu_words(param: torch.Tensor, itemsize: int) -> LiveWords:
    """A CPU parameter's words and the shift that puts stored bits of ``itemsize`` bytes in them."""
    dst = _cpu_bits(param)
    return dst, 16 if dst.itemsize == 4 and itemsize == 2 else 0  # the BF16 -> FP32 upcast


def _scatter(param: torch.Tensor, idx: np.ndarray, bits: np.ndarray, dtype: str) -> None:
    """``param[idx] = bits`` (as values of ``dtype``, upcast where the parameter is wider)."""
    if not idx.size:
        return
    if _numpy_writable(param):  # in place: no int64 copy of the positions
        write_live(_cpu_words(param, bits.itemsize), idx, bits)
        return
    where = torch.from_numpy(idx.astype(np.int64, copy=False)).to(param.device)
    param.view(-1).index_copy_(0, where, _to_param(bits, dtype, param))


def _scatter_all(jobs: list[tuple[torch.Tensor, np.ndarray, np.ndarray, str]]) -> None:
    """Scatter into several parameters; CPU ones on a few threads (numpy releases the GIL, and one
    thread does not saturate memory with these scattered writes: 1.4x measured on 2 cores)."""
    cpu = [j for j in jobs if j[0].device.type == "cpu"]
    for job in jobs:
        if job[0].device.type != "cpu":
            _scatter(*job)
    if len(cpu) < 2 or SCATTER_THREADS < 2:
        for job in cpu:
            _scatter(*job)
        return
    with ThreadPoolExecutor(max_workers=SCATTER_THREADS) as pool:
        list(pool.map(lambda job: _scatter(*job), cpu))


class _Step:
    """An edge ``a -> b`` between versions: the changes and which state objects they were made for."""

    def __init__(self, a: int, b: int, changes: Changes, dtypes: Mapping[str, str]) -> None:
        self.a, self.b, self.changes, self.dtypes = a, b, changes, dict(dtypes)

    def other(self, v: int) -> int:
        return self.b if v == self.a else self.a


class LiveWeights:
    """Parameters of one network holding one version; moved sparsely between versions."""

    def __init__(self, params: Mapping[str, torch.Tensor], *, keep: int = 4, failpoints: Failpoints = NEVER) -> None:
        self.params = dict(params)
        self.keep = keep
        self.failpoints = failpoints  # tests: a failure injected once a move is written
        self.version = -1
        self.steps: deque[_Step] = deque()
        self._who: dict[int, tuple[tuple[str, weakref.ref[TensorBits]], ...]] = {}  # version -> weak references to its state's tensors
        self.counts = {"loads": 0, "moves": 0, "diffs": 0}

    # ---- identity of the state a version number names ---------------------------------------
    def _tag(self, version: int, state: State) -> None:
        self._who[version] = tuple((name, weakref.ref(tb)) for name, tb in state.items())

    def _same(self, version: int, state: State) -> bool:
        refs = self._who.get(version)
        return refs is not None and len(refs) == len(state) and all(
            (tb := state.get(name)) is not None and r() is tb for name, r in refs)

    def _numel(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def _add(self, step: _Step) -> None:
        self.steps = deque(s for s in self.steps if step.b not in (s.a, s.b))
        if self.keep > 0 and step.changes.changed <= MAX_STEP_FRACTION * self._numel():
            self.steps.append(step)  # a dense step (a first Adam step, a long catch-up) is not kept
        while len(self.steps) > self.keep:
            self.steps.popleft()
        live = {v for s in self.steps for v in (s.a, s.b)} | {self.version, step.a, step.b}
        self._who = {v: r for v, r in self._who.items() if v in live}

    # ---- moves ---------------------------------------------------------------------------------
    def forget(self) -> None:
        """The parameters hold no known version (a write that failed and could not be undone):
        the next ``set`` loads its state whole."""
        self.version = -1
        self.steps.clear()
        self._who.clear()

    def load(self, state: State, version: int) -> None:
        """Full load (dense): every parameter from ``state``; forgets every step."""
        self.forget()  # until every parameter is written
        load_state(self.params, state)
        self.steps.clear()
        self._who.clear()
        self.version = int(version)
        self._tag(self.version, state)
        self.counts["loads"] += 1

    def path(self, version: int) -> list[tuple[_Step, bool]] | None:
        """Steps (and whether each is taken forward) from the held version to ``version``."""
        if version == self.version:
            return []
        seen: dict[int, list[tuple[_Step, bool]]] = {self.version: []}
        frontier = [self.version]
        while frontier:
            nxt = []
            for v in frontier:
                for s in self.steps:
                    if v in (s.a, s.b) and s.other(v) not in seen:
                        seen[s.other(v)] = seen[v] + [(s, v == s.a)]
                        nxt.append(s.other(v))
            frontier = nxt
        return seen.get(version)

    def _walk(self, path: Iterable[tuple[_Step, bool]]) -> None:
        """Along ``path``, all or nothing: a failure writes back what was written and raises."""
        start, begun = self.version, []
        try:
            with torch.no_grad():
                for step, forward in path:
                    begun.append((step, forward))
                    _scatter_all([(self.params[name], c.idx, c.new if forward else c.old, step.dtypes[name])
                                  for name, c in step.changes.tensors.items()])
                    self.version = step.b if forward else step.a
            self.failpoints.reached("written")
        except BaseException:
            self._unwalk(begun, start)
            raise
        self.counts["moves"] += 1

    def _unwalk(self, begun: list[tuple[_Step, bool]], start: int) -> None:
        """Back to ``start`` over the steps begun (a step cut midway: its untouched tensors hold
        the old bits already); ``forget`` if even that fails."""
        try:
            with torch.no_grad():
                for step, forward in reversed(begun):
                    _scatter_all([(self.params[name], c.idx, c.old if forward else c.new, step.dtypes[name])
                                  for name, c in step.changes.tensors.items()])
            self.version = start
        except Exception:
            self.forget()

    def advance(self, state: State, changes: Iterable[Move], *, written: bool = False) -> None:
        """Forward by ``(from, to, changes)`` steps, the first from the held version; ``state`` is
        their result (its tensors' dtypes name the bits). ``written``: the parameters already hold
        the new bits (``write`` did it, tensor by tensor): only the version and the steps move."""
        for a, b, ch in changes:
            if a != self.version:
                raise ValueError(f"a step from version {a} cannot move weights holding {self.version}")
            step = _Step(a, int(b), ch, {n: state[n].dtype for n in ch.tensors})
            if written:
                self.version = step.b
            else:
                self._walk([(step, True)])
            self._add(step)
        self._tag(self.version, state)

    def holds(self, version: int, state: State) -> bool:
        """Whether the parameters hold ``version`` of this very ``state`` object."""
        return version == self.version and self._same(version, state)

    def write(self, name: str, change: TensorChange, dtype: str, *, forward: bool = True) -> None:
        """Write one tensor's new bits (``forward``) or old bits into its parameter, the held
        version unchanged: a caller writing a step tensor by tensor (``inference/streaming.py``)
        ends with ``advance(..., written=True)`` or writes the old bits back."""
        with torch.no_grad():
            _scatter(self.params[name], change.idx, change.new if forward else change.old, dtype)

    def words(self, name: str, tb: TensorBits) -> LiveWords | None:
        """Where a decoder may write ``tb``'s bits into this parameter itself, as it decodes
        (a CPU parameter holding that dtype exactly); None: use ``write``."""
        param = self.params.get(name)
        if param is None or not _numpy_writable(param) or not _exact(param, tb):
            return None
        return _cpu_words(param, tb.bits.itemsize)

    def move_to(self, version: int, state: State | None = None) -> bool:
        """Move along kept steps to ``version`` (of ``state``, if named); False if no path."""
        if state is not None and not self._same(version, state):
            return False
        path = self.path(version)
        if path is None:
            return False
        self._walk(path)
        return True

    def set(self, state: State, version: int, *, changes: list[Move] | None = None) -> str:
        """Hold ``state`` as ``version``, the cheapest way; returns how ("kept", "moved", "advanced",
        "diffed", "loaded"). ``changes``: the steps from the held version to ``version`` if known."""
        version = int(version)
        if version == self.version and self._same(version, state):
            return "kept"
        if self.move_to(version, state):
            return "moved"
        if changes and self.version >= 0 and self._chains(changes, version):
            self.advance(state, changes)
            return "advanced"
        if self.version >= 0 and all(_exact(self.params[n], tb) for n, tb in state.items()) \
                and set(state) == set(self.params):
            return "diffed" if self.diff(state, version) else "loaded"
        self.load(state, version)
        return "loaded"

    def _chains(self, changes: list[Move], version: int) -> bool:
        """The steps lead from the held version to ``version``, one after the other."""
        ends = [self.version] + [b for _, b, _ in changes]
        return [a for a, _, _ in changes] == ends[:-1] and ends[-1] == version

    def diff(self, state: State, version: int) -> bool:
        """Compare the live bits with ``state`` and write only what differs; kept as a step. More
        than ``MAX_STEP_FRACTION`` of the entries differing: a whole load instead (bounded memory)."""
        tensors: dict[str, TensorChange] = {}
        budget = MAX_STEP_FRACTION * self._numel()
        held, self.version = self.version, -1  # no known version until every tensor is compared
        with torch.no_grad():
            for name, tb in state.items():
                c = self._diff_tensor(self.params[name], tb)
                if c.idx.size:
                    _scatter(self.params[name], c.idx, c.new, tb.dtype)
                    tensors[name] = c
                    budget -= c.idx.size
                if budget < 0:
                    self.load(state, version)
                    return False
        step = _Step(held, version, Changes("", "", tensors), {n: tb.dtype for n, tb in state.items()})
        self.version = version
        self._add(step)
        self._tag(version, state)
        self.counts["diffs"] += 1
        return True

    @staticmethod
    def _diff_tensor(param: torch.Tensor, tb: TensorBits) -> TensorChange:
        if param.device.type == "cpu" and NUMPY_ON_CPU:
            return _diff_cpu(_cpu_bits(param), tb)
        flat = param.view(-1)
        signed = tb.bits.view(np.dtype(f"<i{tb.bits.itemsize}"))
        parts_i, parts_old = [], []
        for lo in range(0, tb.numel, CHUNK):
            live = _live_bits(flat[lo:lo + CHUNK], tb.dtype)
            want = torch.from_numpy(signed[lo:lo + CHUNK]).to(param.device)
            hit = torch.nonzero(live != want).flatten()
            if hit.numel():
                parts_i.append((hit + lo).cpu().numpy())
                parts_old.append(live[hit].cpu().numpy())
        idx = np.concatenate(parts_i) if parts_i else np.zeros(0, np.int64)
        old = (np.concatenate(parts_old) if parts_old else np.zeros(0, signed.dtype)).view(tb.bits.dtype)
        return TensorChange(idx.astype(np.uint32 if tb.numel <= 1 << 32 else np.int64), old, tb.bits[idx])


def _diff_cpu(live: np.ndarray, tb: TensorBits) -> TensorChange:
    """Positions where the live bits (``live``: the parameter's unsigned view) differ from ``tb``."""
    shift = 16 if live.itemsize == 4 and tb.bits.itemsize == 2 else 0
    parts = []
    out = np.empty(min(CHUNK, tb.numel) + 1, np.int64)
    for lo in range(0, tb.numel, CHUNK):
        have, want = live[lo:lo + CHUNK], tb.bits[lo:lo + CHUNK]
        if K.AVAILABLE:  # one compiled pass: compare and compact
            parts.append(out[:K.differ(have, want, shift, lo, out)].copy())
        else:
            parts.append(np.flatnonzero((have >> shift) != want) + lo)
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    old = (live[idx] >> shift).astype(tb.bits.dtype)
    return TensorChange(idx.astype(np.uint32 if tb.numel <= 1 << 32 else np.int64), old, tb.bits[idx])
