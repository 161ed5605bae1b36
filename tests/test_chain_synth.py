"""Synthetic BF16 states and Adam-like update sequences for the chain tests and bench.

``adam_like_chain`` makes small pretrained-like BF16 states (normal(0, 0.02) weights) and a
sequence of steps that each move ~1% of entries by +-1 ulp, preferring entries that changed
before (temporal locality, as measured on real RL runs); an entry keeps drifting in one
direction (momentum), so repeated changes accumulate rather than cancel. The tests below
check the generator itself does what the other tests assume.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pulse_node.chain.identity import Identity
from pulse_node.chain.record import VersionRecord, make_record
from pulse_node.codec.state import State, TensorBits

if TYPE_CHECKING:
    from pulse_node.chain.verified import VerifiedVersion

CODEC = "pulsesync/compact/1"
#: a fixed trainer key, so subprocesses sign with the same key as the test process
TRAINER = Identity.from_private_bytes(hashlib.sha256(b"test trainer").digest())

SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed.weight": (64, 32),
    "model.layers.0.mlp.weight": (48, 40),
    "model.layers.0.norm.weight": (40,),
}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns (round to nearest even), flat uint16."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).ravel().astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def random_state(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]] = SHAPES) -> State:
    return {name: TensorBits("BF16", shape, to_bf16_bits(rng.normal(0, 0.02, size=shape)))
            for name, shape in shapes.items()}


@dataclass
class StepMemory:
    """What persists across steps: entries changed so far, and each entry's drift direction."""

    hot: dict[str, np.ndarray] = field(default_factory=dict)
    direction: dict[str, np.ndarray] = field(default_factory=dict)


def adam_like_step(rng: np.random.Generator, state: State, memory: StepMemory, *,
                   density: float = 0.01, locality: float = 0.75, flip: float = 0.1) -> State:
    """One step: ~density of entries move 1 ulp, a ``locality`` share from entries that moved
    before. Like Adam's momentum, an entry keeps drifting one way (sign flips with ``flip``)."""
    out: State = {}
    for name, t in state.items():
        n = max(1, round(density * t.numel))
        prev = memory.hot.get(name, np.empty(0, dtype=np.int64))
        if name not in memory.direction:
            memory.direction[name] = rng.choice(np.array([-1, 1], dtype=np.int32), t.numel)
        n_hot = min(len(prev), round(locality * n))
        idx = np.concatenate([rng.choice(prev, n_hot, replace=False) if n_hot else prev[:0],
                              rng.integers(0, t.numel, n - n_hot)])
        idx = np.unique(idx)
        bits = t.bits.copy()
        step = memory.direction[name][idx] * np.where(rng.random(idx.size) < flip, -1, 1)
        step[(bits[idx] & 0x7FFF) == 0] = 1  # never step a zero into the sign bit
        bits[idx] = (bits[idx].astype(np.int32) + step).astype(np.uint16)
        memory.hot[name] = np.union1d(prev, idx)
        out[name] = TensorBits(t.dtype, t.shape, bits)
    return out


def adam_like_chain(seed: int, steps: int, *, density: float = 0.01, locality: float = 0.75,
                    shapes: dict[str, tuple[int, ...]] = SHAPES) -> list[State]:
    """States of versions 0..steps (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    states = [random_state(rng, shapes)]
    memory = StepMemory()
    for _ in range(steps):
        states.append(adam_like_step(rng, states[-1], memory, density=density, locality=locality))
    return states


def states_equal(a: State, b: State) -> bool:
    """Bitwise equality of two states (names, dtypes, shapes, bits)."""
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape
        and np.array_equal(a[n].bits, b[n].bits) for n in a)


def build_chain(states: list[State], *, anchor_every: int, ident: Identity = TRAINER,
                run_id: str = "run-s") -> list[tuple[VersionRecord, bytes | None]]:
    """Signed (record, patch) for every version; anchors every ``anchor_every`` versions. The
    genesis nonce is fixed, so every process building it gets the same chain (same epoch)."""
    from pulse_node.chain.anchor import anchor_manifest
    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.statehash import state_hash

    out: list[tuple[VersionRecord, bytes | None]] = []
    parent = None
    for v, state in enumerate(states):
        patch = None if v == 0 else make_patch(states[v - 1], state, mode="compact")
        anchor = v - v % anchor_every
        parent = make_record(ident, run_id=run_id, version=v, parent=parent,
                             state_hash=state_hash(state), patch=patch, anchor_version=anchor,
                             is_anchor=anchor == v, codec=CODEC,
                             anchor_manifest=anchor_manifest(state) if anchor == v else b"", nonce=bytes(16))
        out.append((parent, patch))
    return out


def verified(record: VersionRecord, patch: bytes | None = None, *, state: State | None = None) -> VerifiedVersion:
    """The gate's checks of one version without a trust policy (any run and signer: the store
    checks its own signers and links), for tests that fill a store."""
    from pulse_node.chain.verified import verify_version  # here: bench/verify_once.py imports this module

    return verify_version(record, run_id=None, trusted_signers=None, patch=patch, state=state)


def changed(a: State, b: State) -> dict[str, np.ndarray]:
    return {n: np.flatnonzero(a[n].bits != b[n].bits) for n in a}


def test_steps_change_about_one_percent_by_one_ulp() -> None:
    states = adam_like_chain(1, 5)
    total = sum(t.numel for t in states[0].values())
    for a, b in itertools.pairwise(states):
        n = sum(len(i) for i in changed(a, b).values())
        assert 0.005 * total <= n <= 0.015 * total
        for name, idx in changed(a, b).items():
            diff = a[name].bits[idx].astype(np.int32) - b[name].bits[idx].astype(np.int32)
            assert set(np.abs(diff).tolist()) <= {1}


def test_steps_have_temporal_locality() -> None:
    states = adam_like_chain(2, 12)
    seen: dict[str, set[int]] = {n: set() for n in states[0]}
    repeat = fresh = 0
    for k, (a, b) in enumerate(itertools.pairwise(states)):
        for name, idx in changed(a, b).items():
            if k >= 6:
                hits = sum(int(i) in seen[name] for i in idx)
                repeat, fresh = repeat + hits, fresh + len(idx) - hits
            seen[name].update(int(i) for i in idx)
    assert repeat / (repeat + fresh) > 0.6


def test_chain_is_deterministic_per_seed() -> None:
    assert states_equal(adam_like_chain(3, 3)[-1], adam_like_chain(3, 3)[-1])
    assert not states_equal(adam_like_chain(3, 3)[-1], adam_like_chain(4, 3)[-1])
