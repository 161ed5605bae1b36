"""codec/pipelined.py: a patch applied while it arrives equals the whole apply bit for bit, and
hostile sections, a wrong digest or result, or bytes that stop coming leave the state as it was."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
from codec_strategies import copy_state, mixed_pair, state_pairs, states_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_node.codec.header import unpack_header
from pulse_node.codec.inplace import TensorChange, apply_patch_inplace
from pulse_node.codec.patch import make_patch
from pulse_node.codec.pipelined import Expected, GrowingBuffer, StateHasher, apply_streaming
from pulse_node.codec.state import State, TensorBits
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import BaseMismatchError, IntegrityError, PatchError, PeerUnavailable, PulseError

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class DictSink:
    """A stand-in live model: arrays written tensor by tensor (and back); ``direct``: the decoder
    writes them itself, in its own pass (``words``), as it does a CPU live model's parameters."""

    def __init__(self, state: State, *, direct: bool = False) -> None:
        self.arrays = {k: t.bits.copy() for k, t in state.items()}
        self.writes = 0
        self.direct = direct

    def write(self, name: str, change: TensorChange, dtype: str) -> None:
        self.arrays[name][change.idx] = change.new
        self.writes += 1

    def undo(self, name: str, change: TensorChange, dtype: str) -> None:
        self.arrays[name][change.idx] = change.old

    def words(self, name: str, tb: TensorBits) -> tuple[np.ndarray, int] | None:
        if not self.direct:
            return None
        self.writes += 1
        return self.arrays[name], 0

    def lost(self) -> None:
        self.arrays.clear()  # its holder reloads it

    def holds(self, state: State) -> bool:
        return all(np.array_equal(self.arrays[k], t.bits) for k, t in state.items())


def _feed(data: bytes, chunks: list[int], *, stop_at: int | None = None, stall_s: float = 5.0) -> GrowingBuffer:
    """A buffer filled by a thread in ``chunks``-sized pieces (cycled), stopping at ``stop_at``."""
    buf = GrowingBuffer(len(data), stall_s=stall_s)
    end = len(data) if stop_at is None else stop_at

    def produce() -> None:
        pos, i = 0, 0
        while pos < end:
            n = min(max(1, chunks[i % len(chunks)]), end - pos)
            buf.append(data[pos:pos + n])
            pos, i = pos + n, i + 1

    threading.Thread(target=produce, daemon=True).start()
    return buf


def _expected(base: State, new: State, patch: bytes) -> Expected:
    return Expected(state_hash(base), state_hash(new), hashlib.sha256(patch).hexdigest())


@FAST
@given(state_pairs())
def test_the_state_hash_fed_tensor_by_tensor_is_the_state_hash(pair) -> None:
    base, _ = pair
    h = StateHasher(len(base))
    for name in sorted(base):
        h.add(name, base[name])
    assert h.hexdigest() == state_hash(base)


@FAST
@given(state_pairs(), st.lists(st.integers(1, 700), min_size=1, max_size=5), st.sampled_from([1, 2, 3]),
       st.sampled_from(["compact", "overwrite"]), st.booleans())
def test_streamed_apply_equals_the_whole_apply_bit_for_bit(pair, chunks, workers, mode, direct) -> None:
    base, new = pair
    patch = make_patch(base, new, mode=mode)
    whole = copy_state(base)
    ref = apply_patch_inplace(whole, patch)
    state, sink = copy_state(base), DictSink(base, direct=direct)
    arrays = {k: t.bits for k, t in state.items()}
    changes, _, _ = apply_streaming(state, _feed(patch, chunks), _expected(base, new, patch), sink=sink, workers=workers)
    assert states_equal(state, whole) and states_equal(state, new) and sink.holds(new)
    assert all(state[k].bits is arrays[k] for k in state)  # in place
    assert set(changes.tensors) == set(ref.tensors) and all(
        np.array_equal(changes.tensors[k].idx, ref.tensors[k].idx)
        and np.array_equal(changes.tensors[k].old, ref.tensors[k].old)
        and np.array_equal(changes.tensors[k].new, ref.tensors[k].new) for k in ref.tensors)
    changes.undo(state)
    assert states_equal(state, base)


def _sections(patch: bytes) -> list[tuple[int, int]]:
    header, start = unpack_header(memoryview(patch))
    return [(start + e.offset, e.length) for e in header.tensors if e.changed]


@FAST
@given(st.integers(0, 2**32 - 1), st.sampled_from(["flip", "garbage", "zeros", "swap"]), st.booleans())
def test_hostile_sections_leave_state_and_sink_at_the_base(seed, how, direct) -> None:
    """Bytes a peer changed in any section: refused (a decode error, or the digest), state and sink
    exactly the base; nothing but a PulseError comes out."""
    rng = np.random.default_rng(seed)
    base, new = mixed_pair(seed % 7, tensors=5)
    patch = make_patch(base, new)
    forged = bytearray(patch)
    sections = _sections(patch)
    at, length = sections[int(rng.integers(len(sections)))]
    if how == "flip":
        forged[at + int(rng.integers(length))] ^= 1 << int(rng.integers(8))
    elif how == "garbage":
        forged[at:at + length] = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
    elif how == "zeros":
        forged[at:at + length] = bytes(length)
    else:  # two sections' bytes exchanged where they fit
        (a, la), (b, lb) = sections[0], sections[-1]
        n = min(la, lb)
        forged[a:a + n], forged[b:b + n] = patch[b:b + n], patch[a:a + n]
    if bytes(forged) == patch:
        return
    state, sink = copy_state(base), DictSink(base, direct=direct)
    with pytest.raises(PulseError):
        apply_streaming(state, _feed(bytes(forged), [97, 4096]), _expected(base, new, patch), sink=sink)
    assert states_equal(state, base) and sink.holds(base)


@pytest.mark.parametrize("direct", [False, True])
def test_a_forged_patch_whose_digest_is_signed_but_result_differs_is_undone(direct: bool) -> None:
    base, new = mixed_pair(1, tensors=5)
    other = copy_state(new)
    other["w3"].bits[5] ^= 1
    forged = make_patch(base, other, new_hash=state_hash(new))  # names the signed result, decodes to another
    state, sink = copy_state(base), DictSink(base, direct=direct)
    expected = Expected(state_hash(base), state_hash(new), hashlib.sha256(forged).hexdigest())
    with pytest.raises(IntegrityError, match="result hash"):
        apply_streaming(state, _feed(forged, [333]), expected, sink=sink)
    assert states_equal(state, base) and sink.holds(base) and sink.writes > 0  # written, then undone


@pytest.mark.parametrize("direct", [False, True])
def test_a_wrong_final_digest_undoes_everything(direct: bool) -> None:
    base, new = mixed_pair(2, tensors=5)
    patch = make_patch(base, new)
    state, sink = copy_state(base), DictSink(base, direct=direct)
    wrong = Expected(state_hash(base), state_hash(new), "00" * 32)
    with pytest.raises(IntegrityError, match="signed digest"):
        apply_streaming(state, _feed(patch, [1000]), wrong, sink=sink)
    assert states_equal(state, base) and sink.holds(base) and sink.writes > 0


def test_header_checks_refuse_before_any_write() -> None:
    base, new = mixed_pair(3, tensors=5)
    patch = make_patch(base, new)
    state = copy_state(base)
    for expected, error in ((Expected("11" * 32, state_hash(new), "00" * 32), BaseMismatchError),
                            (Expected(state_hash(base), "22" * 32, "00" * 32), IntegrityError)):
        with pytest.raises(error):
            apply_streaming(state, _feed(patch, [50]), expected)
        assert states_equal(state, base)
    buf = GrowingBuffer(len(patch) + 5)  # the signed size is not what the header tiles
    buf.append(patch)
    with pytest.raises(PatchError, match="signs"):
        apply_streaming(state, buf, _expected(base, new, patch))
    with pytest.raises(PatchError):
        GrowingBuffer(len(patch) - 1).append(patch)  # never more than the signed size is held
    assert states_equal(state, base)


@pytest.mark.parametrize("direct", [False, True])
def test_a_patch_that_stops_growing_times_out_and_leaves_the_base(direct: bool) -> None:
    base, new = mixed_pair(4, tensors=5)
    patch = make_patch(base, new)
    at, length = _sections(patch)[-1]
    state, sink = copy_state(base), DictSink(base, direct=direct)
    buf = _feed(patch, [512], stop_at=at + length // 2, stall_s=0.3)
    with pytest.raises(PeerUnavailable, match="stopped"):
        apply_streaming(state, buf, _expected(base, new, patch), sink=sink)
    assert states_equal(state, base) and sink.holds(base) and sink.writes > 0
    failing = GrowingBuffer(len(patch), stall_s=5.0)
    failing.append(patch[:100])
    failing.fail(PeerUnavailable("connection reset"))
    with pytest.raises(PeerUnavailable, match="reset"):
        apply_streaming(state, failing, _expected(base, new, patch))
    assert states_equal(state, base)


def test_bytes_read_straight_into_the_buffer_stop_at_the_signed_size(tmp_path) -> None:
    """``read_from`` fills the buffer from a file without a copy, never past the signed size,
    and the digest covers exactly those bytes."""
    signed = bytes(range(256)) * 40
    path = tmp_path / "patch"
    path.write_bytes(signed + b"and more than the record signs")
    buf = GrowingBuffer(len(signed), stall_s=5.0)
    with open(path, "rb") as f:
        got = [buf.read_from(f.fileno(), 3000) for _ in range(6)]
    assert got == [3000, 3000, 3000, 1240, 0, 0] and buf.have == len(signed)
    assert bytes(buf.wait(len(signed))) == signed
    assert buf.digest() == hashlib.sha256(signed).hexdigest() and buf.completed_at is not None


def test_a_sink_that_cannot_be_undone_is_lost_and_the_rest_undone() -> None:
    """``undo_sink``: one tensor's undo failing leaves the sink ``lost`` (its holder reloads it);
    every other tensor is still written back."""
    from pulse_node.codec.pipelined import undo_sink

    class Flaky(DictSink):
        def undo(self, name: str, change: TensorChange, dtype: str) -> None:
            if name == "b":
                raise RuntimeError("device lost")
            super().undo(name, change, dtype)

    base = {n: TensorBits("BF16", (4,), np.arange(4, dtype=np.uint16)) for n in ("a", "b", "c")}
    sink = Flaky(base)
    change = TensorChange(np.array([1], np.uint32), np.array([1], np.uint16), np.array([9], np.uint16))
    for n in base:
        sink.write(n, change, "BF16")
    undone: list[str] = []
    sink.lost = lambda: undone.append("lost")  # type: ignore[method-assign]
    undo_sink(sink, [(n, change, "BF16") for n in base])
    assert undone == ["lost"] and sink.arrays["a"][1] == 1 and sink.arrays["c"][1] == 1
