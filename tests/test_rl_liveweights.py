"""Live weights moved sparsely: after any sequence of forward applies (in place), undos, jumps
to other versions' states and failed applies, the state's hash and the live parameters are
bit-identical to a fresh load of the version they claim to hold."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from codec_strategies import mutate, realistic_bits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_node.codec.header import pack_header, unpack_header
from pulse_node.codec.inplace import Changes, apply_patch_inplace
from pulse_node.codec.patch import make_patch
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import IntegrityError
from pulse_node.rl import liveweights
from pulse_node.rl.liveweights import LiveWeights
from pulse_node.torchbits import bits_to_tensor

#: (state dtype, live parameter dtype, shape)
LAYOUT = {"a": ("BF16", torch.float32, (24, 17)), "b": ("BF16", torch.bfloat16, (40,)),
          "c": ("F32", torch.float32, (9, 5)), "d": ("BF16", torch.float32, ())}
VERSIONS = 7
OPS = st.lists(st.one_of(st.just(("fwd", 0)), st.just(("back", 0)), st.just(("bad", 0)),
                         st.tuples(st.just("goto"), st.integers(0, VERSIONS - 1))), min_size=1, max_size=14)


def _chain(seed: int, densities: tuple[float, ...] = (0.0, 0.02, 0.2, 1.0)) -> list[State]:
    rng = np.random.default_rng(seed)
    first = {}
    for name, (dtype, _, shape) in LAYOUT.items():
        first[name] = TensorBits(dtype, shape, realistic_bits(dtype, int(np.prod(shape, dtype=np.int64)), rng))
    chain = [first]
    for _ in range(VERSIONS - 1):
        density = float(rng.choice(densities))
        chain.append({k: TensorBits(t.dtype, t.shape, mutate(t.dtype, t.bits, density, rng))
                      for k, t in chain[-1].items()})
    return chain


def _params() -> dict[str, torch.Tensor]:
    return {name: torch.zeros(shape, dtype=dt) for name, (_, dt, shape) in LAYOUT.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_holds(live: LiveWeights, state: State) -> None:
    for name, p in live.params.items():
        fresh = bits_to_tensor(state[name]).to(p.dtype)
        assert torch.equal(_bits(p), _bits(fresh)), name


def _forged(base: State, new: State) -> bytes:
    """A patch that decodes cleanly from ``base`` but not to the result it names (``new``)."""
    other = {k: t.copy() for k, t in new.items()}
    other["a"].bits[3] ^= 1
    patch = make_patch(base, other)
    header, start = unpack_header(memoryview(patch))
    return pack_header(dataclasses.replace(header, result_state_hash=state_hash(new))) + patch[start:]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), OPS)
def test_any_sequence_of_moves_equals_a_fresh_load(seed: int, ops: list[tuple[str, int]]) -> None:
    chain = _chain(seed)
    hashes = [state_hash(s) for s in chain]
    patches = [b""] + [make_patch(chain[v - 1], chain[v]) for v in range(1, VERSIONS)]
    state = {k: t.copy() for k, t in chain[0].items()}  # the in-place state, allocated once
    undo: list[Changes] = []
    at = 0
    live = LiveWeights(_params(), keep=4)
    live.load(state, 0)
    held = 0
    for op, arg in ops:
        if op == "fwd" and at + 1 < VERSIONS:
            changes = apply_patch_inplace(state, patches[at + 1], base_hash=hashes[at])
            undo.append(changes)
            at += 1
            live.set(state, at, changes=[(at - 1, at, changes)])
            held = at
        elif op == "back" and undo:
            undo.pop().undo(state)
            at -= 1
            live.set(state, at)
            held = at
        elif op == "bad" and at + 1 < VERSIONS:
            try:
                apply_patch_inplace(state, _forged(chain[at], chain[at + 1]), base_hash=hashes[at])
                raise AssertionError("a forged result was accepted")
            except IntegrityError:
                pass
            live.set(state, at)
            held = at
        elif op == "goto":
            live.set(chain[arg], arg)  # another holder's immutable state of that version
            held = arg
        assert state_hash(state) == hashes[at]
        assert all(np.array_equal(state[k].bits, chain[at][k].bits) for k in state)
        _assert_holds(live, chain[live.version])
        assert live.version == held


@pytest.mark.parametrize("numpy_on_cpu", [True, False])  # False: the torch path CUDA parameters take
def test_verifier_switches_back_four_versions_by_undo_not_reload(numpy_on_cpu: bool, monkeypatch) -> None:
    monkeypatch.setattr(liveweights, "NUMPY_ON_CPU", numpy_on_cpu)
    chain = _chain(7, densities=(0.02, 0.1))
    live = LiveWeights(_params(), keep=4)
    live.load(chain[0], 0)
    for v in range(1, 5):
        assert live.set(chain[v], v) == "diffed"  # first visit: one compare, no reload
    assert live.set(chain[0], 0) == "moved" and live.counts["loads"] == 1
    _assert_holds(live, chain[0])
    assert live.set(chain[4], 4) == "moved"
    _assert_holds(live, chain[4])
    other = {k: t.copy() for k, t in chain[2].items()}  # the same number, another object (a re-sync)
    assert live.set(other, 2) == "diffed"
    _assert_holds(live, other)


def test_advance_refuses_steps_that_do_not_start_at_the_held_version() -> None:
    chain = _chain(3, densities=(0.02, 0.1))
    state = {k: t.copy() for k, t in chain[0].items()}
    live = LiveWeights(_params(), keep=0)
    live.load(state, 0)
    one = apply_patch_inplace(state, make_patch(chain[0], chain[1]))
    two = apply_patch_inplace(state, make_patch(chain[1], chain[2]))
    assert live.set(state, 2, changes=[(1, 2, two)]) == "diffed"  # a gap: compared, not trusted
    _assert_holds(live, chain[2])
    live.load(chain[0], 0)
    assert live.set(state, 2, changes=[(0, 1, one), (1, 2, two)]) == "advanced"
    _assert_holds(live, chain[2])
    assert not live.steps  # keep=0: nothing kept beside the live model


def test_the_diff_kernel_finds_exactly_the_differing_bits() -> None:
    from pulse_node.codec import kernels as K

    rng = np.random.default_rng(5)
    want = rng.integers(0, 1 << 16, 5000).astype(np.uint16)
    have = want.astype(np.uint32) << 16 | rng.integers(0, 1 << 16, 5000).astype(np.uint32)  # low bits: noise
    flip = rng.random(5000) < 0.05
    have[flip] ^= 1 << 20
    out = np.empty(5001, np.int64)
    n = K.differ(have, want, 16, 100, out)
    assert np.array_equal(out[:n], np.flatnonzero(flip) + 100)
    assert K.differ(want, want, 0, 0, out) == 0


def test_dense_steps_are_loaded_not_kept() -> None:
    """A state where most entries differ (a first Adam step) is loaded whole and keeps no step:
    the undo logs stay bounded by ``MAX_STEP_FRACTION`` of the model."""
    chain = _chain(11)
    rng = np.random.default_rng(0)
    dense = {k: TensorBits(t.dtype, t.shape, mutate(t.dtype, t.bits, 1.0, rng)) for k, t in chain[0].items()}
    live = LiveWeights(_params(), keep=4)
    live.load(chain[0], 0)
    assert live.set(dense, 1) == "loaded" and live.counts["loads"] == 2 and not live.steps
    _assert_holds(live, dense)
