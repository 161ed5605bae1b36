"""The inference node's apply path in place: versions land in the state it loaded once, the live
model follows them by the composed changes (no reload), and a patch that does not reproduce its
signed record leaves both the state and the live model at the previous version."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_chain_catchup_producer import STATES
from test_chain_synth import TRAINER, states_equal, verified
from test_node_sync_bounds import _syncer, served  # noqa: F401  (fixture)

from pulse_node.chain.record import make_record
from pulse_node.codec.header import pack_header, unpack_header
from pulse_node.codec.patch import make_patch
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import IntegrityError
from pulse_node.inference.syncer import Fetched
from pulse_node.net.wire.serving import store_resolver
from pulse_node.rl.liveweights import LiveWeights
from pulse_node.testing.adversaries import announce
from pulse_node.testing.memory import MemoryHub
from pulse_node.torchbits import bits_to_tensor


def _live(state) -> LiveWeights:
    return LiveWeights({n: torch.zeros(t.shape, dtype=torch.float32) for n, t in state.items()}, keep=0)


def _holds(live: LiveWeights, state) -> bool:
    return all(torch.equal(p, bits_to_tensor(state[n]).float()) for n, p in live.params.items())


def test_versions_land_in_place_and_the_live_model_follows_sparsely(served, tmp_path) -> None:  # noqa: F811
    hub = MemoryHub()
    announce(hub, TRAINER, store_resolver(served), role="trainer", version=18, lowest=1)
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    try:
        arrays = {n: t.bits for n, t in sync.state.items()}
        live = _live(sync.state)
        assert live.set(sync.state, 14) == "loaded"
        applied = sync.step(list(hub.records.values()))
        assert [r.version for r in applied] == [15, 16, 17, 18]
        assert all(sync.state[n].bits is a for n, a in arrays.items())  # no state allocated per version
        moves = sync.take_changes()
        assert [(a, b) for a, b, _ in moves] == [(14, 18)] and sync.take_changes() == []
        assert live.set(sync.state, 18, changes=moves) == "advanced" and _holds(live, STATES[18])
        assert states_equal(sync.state, STATES[18])
    finally:
        sync.close()


def test_a_bad_patch_leaves_state_and_live_model_at_the_previous_version(served, tmp_path) -> None:  # noqa: F811
    """A trainer-signed record whose patch names the right result but decodes to another state."""
    hub = MemoryHub()
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    try:
        live = _live(sync.state)
        live.set(sync.state, 14)
        before = state_hash(sync.state)
        other = {k: t.copy() for k, t in STATES[15].items()}
        name = next(iter(other))
        other[name].bits[0] ^= 1
        forged = make_patch(STATES[14], other)
        header, start = unpack_header(memoryview(forged))
        forged = pack_header(dataclasses.replace(header, result_state_hash=state_hash(STATES[15]))) + forged[start:]
        rec = make_record(TRAINER, run_id="run-s", version=15, parent=sync.record, state_hash=state_hash(STATES[15]),
                          patch=forged, anchor_version=sync.record.anchor_version, is_anchor=False,
                          codec="pulsesync/compact/1")
        with pytest.raises(IntegrityError):
            sync._apply(Fetched(verified(rec, forged)))
        assert state_hash(sync.state) == before and sync.record.version == 14 and sync.take_changes() == []
        assert not sync.store.has_patch(15)
        live.set(sync.state, 14, changes=sync.take_changes())
        assert _holds(live, STATES[14])
    finally:
        sync.close()
