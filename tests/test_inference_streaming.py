"""inference/streaming.py: the next version applied while the wire worker writes its patch file,
into the state and the live model; forged bytes, a stalled file and a refused version leave both
at the previous version; the syncer keeps the version and the live model follows without a reload."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
import torch
from codec_strategies import copy_state, mixed_pair, states_equal
from test_chain_catchup_producer import STATES
from test_chain_synth import TRAINER
from test_inference_inplace import _live
from test_node_sync_bounds import EVE, _syncer, served  # noqa: F401  (fixture)

from pulse_node.chain.store import VersionStore
from pulse_node.codec.patch import ParsedPatch, make_patch
from pulse_node.codec.pipelined import Expected
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import IntegrityError, PeerUnavailable
from pulse_node.fsutil import atomic_writer
from pulse_node.inference.streaming import Pipeline
from pulse_node.net.wire.protocol import FetchRequest, PatchRequest
from pulse_node.net.wire.serving import store_resolver
from pulse_node.testing.adversaries import announce
from pulse_node.testing.memory import MemoryHub


def _writer(data: bytes, *, chunk: int = 997, hold: threading.Event | None = None, stop_at: int | None = None):
    """A fetch as the wire worker does it: a temp file beside ``dest`` written piece by piece,
    renamed when complete; with ``hold``, it stops at ``stop_at`` until ``hold`` is set, then fails."""
    def fetch(dest: Path) -> None:
        with atomic_writer(dest, durable=False) as fh:
            for pos in range(0, len(data), chunk):
                if stop_at is not None and pos >= stop_at and hold is not None:
                    fh.flush()
                    hold.wait(30)
                    raise PeerUnavailable("peer went away")
                fh.write(data[pos:pos + chunk])
                fh.flush()
    return fetch


def _holds(live, state) -> bool:
    """The live parameters hold ``state``'s bits exactly (NaN payloads included)."""
    def bits(p: torch.Tensor, dtype: str) -> torch.Tensor:
        raw = p.view(torch.int32)
        return ((raw >> 16) & 0xFFFF) if dtype == "BF16" else raw
    return all(torch.equal(bits(p, state[n].dtype), torch.from_numpy(state[n].bits.astype("int64")).to(torch.int32)
                           .view(p.shape)) for n, p in live.params.items())


def _setup(seed: int):
    base, new = mixed_pair(seed, tensors=5)
    patch = make_patch(base, new)
    state = copy_state(base)
    live = _live(state)
    live.set(state, 3)
    return base, new, patch, state, live


def _expect(base, new, patch) -> Expected:
    return Expected(state_hash(base), state_hash(new), hashlib.sha256(patch).hexdigest())


def test_a_version_lands_in_state_and_live_model_while_the_file_grows(tmp_path) -> None:
    base, new, patch, state, live = _setup(0)
    pipe = Pipeline(live)
    got, streamed = pipe.fetch_apply(_writer(patch), tmp_path / "p", state=state, base=3, target=4,
                                     expected=_expect(base, new, patch), size=len(patch), timeout=30)
    assert isinstance(got, ParsedPatch) and got.data == patch and streamed is not None and streamed.live_written
    assert states_equal(state, new) and _holds(live, new) and live.version == 3  # written, not yet kept
    streamed.commit()
    assert live.version == 4 and live.set(state, 4) == "kept"
    streamed.rollback()  # settled: nothing moves any more
    assert states_equal(state, new) and _holds(live, new)


def test_forged_bytes_leave_state_and_live_model_and_blame_the_peer(tmp_path) -> None:
    base, new, patch, state, live = _setup(1)
    forged = bytearray(patch)
    forged[len(patch) // 2] ^= 0x10
    with pytest.raises(IntegrityError):
        Pipeline(live).fetch_apply(_writer(bytes(forged)), tmp_path / "p", state=state, base=3, target=4,
                                   expected=_expect(base, new, patch), size=len(patch), timeout=30)
    assert states_equal(state, base) and _holds(live, base) and live.version == 3


def test_a_signed_patch_that_does_not_apply_goes_back_to_the_normal_path(tmp_path) -> None:
    base, new, _, state, live = _setup(2)
    other = copy_state(new)
    other["w1"].bits[3] ^= 1
    bad = make_patch(base, other, new_hash=state_hash(new))  # signed as is, decodes to another state
    got, streamed = Pipeline(live).fetch_apply(_writer(bad), tmp_path / "p", state=state, base=3, target=4,
                                               expected=_expect(base, new, bad), size=len(bad), timeout=30)
    assert got == bad and streamed is None
    assert states_equal(state, base) and _holds(live, base)


def test_a_file_that_stops_growing_times_out_cleanly(tmp_path) -> None:
    base, new, patch, state, live = _setup(3)
    hold = threading.Event()
    try:
        with pytest.raises(PeerUnavailable):
            Pipeline(live, stall_s=0.3).fetch_apply(
                _writer(patch, hold=hold, stop_at=len(patch) * 3 // 4), tmp_path / "p", state=state, base=3,
                target=4, expected=_expect(base, new, patch), size=len(patch), timeout=30)
        assert states_equal(state, base) and _holds(live, base)
    finally:
        hold.set()


def test_a_live_model_at_another_version_is_not_written(tmp_path) -> None:
    base, new, patch, state, live = _setup(4)
    live.load({k: t.copy() for k, t in base.items()}, 3)  # same bits, another state object
    before = {n: p.clone() for n, p in live.params.items()}
    _, streamed = Pipeline(live).fetch_apply(_writer(patch), tmp_path / "p", state=state, base=3, target=4,
                                             expected=_expect(base, new, patch), size=len(patch), timeout=30)
    assert streamed is not None and not streamed.live_written and states_equal(state, new)
    assert all(torch.equal(before[n], p) for n, p in live.params.items())


def test_the_syncer_streams_the_next_version_and_the_live_model_follows(served, tmp_path) -> None:  # noqa: F811
    hub = MemoryHub()
    announce(hub, TRAINER, store_resolver(served), role="trainer", version=18, lowest=1)
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    try:
        live = _live(sync.state)
        assert live.set(sync.state, 14) == "loaded"
        sync.pipeline = Pipeline(live)
        applied = sync.step(list(hub.records.values()))
        assert [r.version for r in applied] == [15, 16, 17, 18]
        assert sync.pipeline.counters.streamed == 1 and sync.pipeline.counters.live_written == 1
        assert live.version == 15  # 15 written while it arrived; 16..18 by the usual composed step
        moves = sync.take_changes()
        assert [(a, b) for a, b, _ in moves] == [(15, 18)]
        assert live.set(sync.state, 18, changes=moves) == "advanced" and _holds(live, STATES[18])
        assert states_equal(sync.state, STATES[18]) and sync.store.has_patch(15)
        applied = sync.step(list(hub.records.values()))  # nothing new: nothing streamed
        assert applied == [] and sync.pipeline.counters.streamed == 1
    finally:
        sync.close()


def test_a_peer_serving_a_corrupt_patch_moves_nothing_and_is_struck(served, tmp_path) -> None:  # noqa: F811
    """The record is the trainer's (verified), the patch bytes are a peer's (one flipped byte
    mid-file): streamed, refused on the signed digest, state and live model back at 14, the peer
    struck; the next pass takes version 15 from the honest trainer."""
    hub = MemoryHub()
    honest = store_resolver(served)

    def corrupt_patches(request: FetchRequest) -> Path | None:
        path = honest(request)
        if not isinstance(request, PatchRequest) or path is None:
            return path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        out = tmp_path / f"lie-{request.version}"
        out.write_bytes(bytes(data))
        return out

    liar = announce(hub, EVE, corrupt_patches, role="inference", version=15, lowest=1)
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    try:
        live = _live(sync.state)
        live.set(sync.state, 14)
        sync.pipeline = Pipeline(live)
        assert sync.step([liar]) == []  # the head: a trainer-signed record pushed by the liar
        rec = VersionStore(served, readonly=True).record(15)
        assert rec is not None
        sync._verified(rec, holder=liar.peer_id)
        assert sync.step([liar]) == []
        assert states_equal(sync.state, STATES[14]) and _holds(live, STATES[14]) and live.version == 14
        assert sync.book.strikes.get(liar.peer_id, 0) >= 1 and not sync.store.has_patch(15)
        trainer = announce(hub, TRAINER, store_resolver(served), role="trainer", version=15, lowest=1)
        assert [r.version for r in sync.step([trainer])] == [15]
        assert sync.pipeline.counters.streamed == 1 and live.version == 15 and _holds(live, STATES[15])
    finally:
        sync.close()
