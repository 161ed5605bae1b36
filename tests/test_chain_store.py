"""Version store: verified writes, crash recovery, retention, bit-identical rebuilds."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_chain_synth import CODEC, TRAINER, adam_like_chain, build_chain, states_equal, verified

from pulse_node.chain.identity import Identity
from pulse_node.chain.layout import read_safetensors_header, store_path
from pulse_node.chain.record import make_record
from pulse_node.chain.store import VersionStore
from pulse_node.codec.patch import make_patch
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import GapError, IntegrityError, StoreError

TRUSTED = {TRAINER.public_key_hex}
STATES = adam_like_chain(11, 30)
CHAIN = build_chain(STATES, anchor_every=10)


def fill(store: VersionStore, upto: int, chain=CHAIN, states=STATES) -> None:
    for v in range(upto + 1):
        record, patch = chain[v]
        if record.is_anchor:
            store.put_anchor(verified(record, state=states[v]))
        if patch is not None:
            store.put_patch(verified(record, patch))


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "LOCK"}


def test_fill_and_rebuild_every_version_bit_identical(tmp_path: Path) -> None:
    with VersionStore(tmp_path, trusted_signers=TRUSTED) as store:
        fill(store, 25)
        assert store.head().version == 25
        assert store.anchors() == [0, 10, 20]
        assert store.versions() == list(range(26))
        for v in range(26):
            assert states_equal(store.load_state(v), STATES[v])
        assert store.patch_bytes(7) == CHAIN[7][1]
        fill(store, 25)  # idempotent
        assert not list(tmp_path.rglob("*.tmp"))
    with VersionStore(tmp_path, trusted_signers=TRUSTED) as again:
        assert again.head() == CHAIN[25][0]
        assert states_equal(again.load_state(25), STATES[25])


def test_anchor_file_is_plain_safetensors_with_record_metadata(tmp_path: Path) -> None:
    with VersionStore(tmp_path) as store:
        fill(store, 10)
        header = read_safetensors_header(store.path_of("anchor", 10))
    meta = header["__metadata__"]
    assert meta["format"] == "pt" and meta["pulse.version"] == "10"
    assert meta["pulse.state_hash"] == CHAIN[10][0].state_hash
    assert header["model.embed.weight"]["dtype"] == "BF16"


def test_patches_out_of_order_link_up_later(tmp_path: Path) -> None:
    with VersionStore(tmp_path, trusted_signers=TRUSTED) as store:
        store.put_anchor(verified(CHAIN[0][0], state=STATES[0]))
        for v in (5, 3, 4, 1):
            store.put_patch(verified(*CHAIN[v]))
        assert store.head().version == 1
        with pytest.raises(GapError):
            store.load_state(4)
        store.put_patch(verified(*CHAIN[2]))
        assert store.head().version == 5
        assert states_equal(store.load_state(5), STATES[5])


def test_bad_input_raises_and_leaves_store_unchanged(tmp_path: Path) -> None:
    store = VersionStore(tmp_path, trusted_signers=TRUSTED)
    fill(store, 4)
    before = snapshot(tmp_path)
    rec5, patch5 = CHAIN[5]
    forger = Identity.generate()
    fork = build_chain(STATES[:4] + [STATES[6], STATES[7]], anchor_every=10)
    bad_inputs = [
        lambda: store.put_patch(verified(rec5, patch5[:-1] + bytes([patch5[-1] ^ 1]))),  # digest
        lambda: store.put_patch(verified(rec5, CHAIN[6][1])),  # another version's patch
        lambda: store.put_patch(verified(build_chain(STATES[:6], anchor_every=10, ident=forger)[5][0],
                                         patch5)),  # untrusted signer
        lambda: store.put_patch(verified(dataclasses.replace(rec5, state_hash=CHAIN[6][0].state_hash),
                                         patch5)),  # tampered record
        lambda: store.put_patch(verified(*fork[4])),  # conflicts with stored v4 (fork)
        lambda: store.put_patch(verified(*build_chain(STATES[:6], anchor_every=10, run_id="x")[5])),
        lambda: store.put_anchor(verified(CHAIN[10][0], state=STATES[9])),  # state does not match record
    ]
    for attempt in bad_inputs:
        with pytest.raises(IntegrityError):
            attempt()
        assert snapshot(tmp_path) == before
    with pytest.raises(StoreError):
        store.put_anchor(verified(CHAIN[5][0], state=STATES[5]))  # not an anchor version
    assert store.head().version == 4
    store.close()


def test_patch_whose_base_is_not_the_parent_is_refused(tmp_path: Path) -> None:
    # a correctly signed record whose patch was made against a different base
    states = STATES[:3]
    wrong_patch = make_patch(STATES[0], STATES[2], mode="compact")
    rec2 = make_record(TRAINER, run_id="run-s", version=2, parent=CHAIN[1][0],
                       state_hash=state_hash(STATES[2]), patch=wrong_patch, anchor_version=0,
                       is_anchor=False, codec=CODEC)
    with VersionStore(tmp_path, trusted_signers=TRUSTED) as store:
        fill(store, 1, states=states)
        before = snapshot(tmp_path)
        with pytest.raises(IntegrityError, match="base"):
            store.put_patch(verified(rec2, wrong_patch))
        assert snapshot(tmp_path) == before


def test_single_writer_and_readonly_reader(tmp_path: Path) -> None:
    with VersionStore(tmp_path) as store:
        fill(store, 3)
        with pytest.raises(StoreError, match="another process"):
            VersionStore(tmp_path)
        reader = VersionStore(tmp_path, readonly=True)
        assert reader.head().version == 3
        assert reader.path_of("patch", 2) == store_path(tmp_path, "patch", 2)
        assert reader.path_of("patch", 2).read_bytes() == CHAIN[2][1]
        with pytest.raises(StoreError):
            reader.put_patch(verified(*CHAIN[4]))
    with pytest.raises(StoreError, match="does not exist"):
        VersionStore(tmp_path / "nope", readonly=True)


# ---------------------------------------------------------------------------- crash recovery
def crashed_store(tmp_path: Path, upto: int) -> Path:
    with VersionStore(tmp_path) as store:
        fill(store, upto)
    return tmp_path


def test_recovery_removes_temp_files_and_orphans(tmp_path: Path) -> None:
    root = crashed_store(tmp_path, 14)
    (root / "patches" / ".15.patch.999.tmp").write_bytes(CHAIN[15][1][:10])
    (root / "anchors" / ".20.safetensors.999.tmp").write_bytes(b"partial")
    (root / "records" / ".15.rec.999.tmp").write_bytes(b"")
    store_path(root, "patch", 15).write_bytes(CHAIN[15][1])  # patch written, record not yet
    with VersionStore(root) as store:
        assert store.head().version == 14
        assert not list(root.rglob("*.tmp")) and not store_path(root, "patch", 15).exists()
        assert states_equal(store.load_state(14), STATES[14])


def test_truncated_record_restarts_at_previous_version(tmp_path: Path) -> None:
    root = crashed_store(tmp_path, 14)
    path = store_path(root, "record", 14)
    path.write_bytes(path.read_bytes()[:50])
    with VersionStore(root) as store:
        assert store.head().version == 13
        assert not path.exists() and not store_path(root, "patch", 14).exists()
        assert states_equal(store.load_state(13), STATES[13])
        store.put_patch(verified(*CHAIN[14]))  # the version can simply be received again
        assert store.head().version == 14


def test_truncated_patch_and_anchor_fall_back_to_verified_chain(tmp_path: Path) -> None:
    root = crashed_store(tmp_path, 14)
    anchor = store_path(root, "anchor", 10)
    anchor.write_bytes(anchor.read_bytes()[:-100])
    with VersionStore(root) as store:  # anchor 10 dropped, chain from 0 still complete
        assert store.anchors() == [0] and store.head().version == 14
        assert states_equal(store.load_state(14), STATES[14])
    patch = store_path(root, "patch", 6)
    patch.write_bytes(patch.read_bytes()[:-1])
    with VersionStore(root) as store:
        assert store.head().version == 5
        with pytest.raises(GapError):
            store.load_state(7)


def test_bit_flip_in_anchor_is_caught_on_load_and_routed_around(tmp_path: Path) -> None:
    root = crashed_store(tmp_path, 12)
    anchor = store_path(root, "anchor", 10)
    data = bytearray(anchor.read_bytes())
    data[-3] ^= 0x40  # same size: passes the cheap open-time check
    anchor.write_bytes(bytes(data))
    with VersionStore(root) as store:
        assert store.anchors() == [0, 10]
        assert states_equal(store.load_state(12), STATES[12])  # via anchor 0
        assert store.anchors() == [0] and not anchor.exists()
        with pytest.raises(IntegrityError):
            store.put_anchor(verified(CHAIN[10][0], state=STATES[11]))  # wrong state for the record
        store.put_anchor(verified(CHAIN[10][0], state=STATES[10]))
        assert store.anchors() == [0, 10]


def test_load_head_falls_back_below_a_file_that_fails_verification(tmp_path: Path) -> None:
    root = crashed_store(tmp_path, 12)
    anchor = store_path(root, "anchor", 10)
    data = bytearray(anchor.read_bytes())
    data[-3] ^= 0x40  # passes the open-time check, fails the state hash on load
    anchor.write_bytes(bytes(data))
    store_path(root, "patch", 5).unlink()  # and anchor 0 cannot reach past v4
    with VersionStore(root) as store:
        assert store.head().version == 12
        record, state = store.load_head()  # a node starts from v4 instead of failing to start
        assert record.version == 4 and states_equal(state, STATES[4])
    with VersionStore(tmp_path / "empty") as store:
        assert store.load_head() is None


_WRITER = """
import sys
sys.path.insert(0, {tests!r})
from test_chain_synth import adam_like_chain, build_chain, verified
from pulse_node.chain.store import VersionStore
STATES = adam_like_chain(11, 30)
CHAIN = build_chain(STATES, anchor_every=10)
store = VersionStore({root!r})
for v in range(len(CHAIN)):
    record, patch = CHAIN[v]
    if record.is_anchor:
        store.put_anchor(verified(record, state=STATES[v]))
    if patch is not None:
        store.put_patch(verified(record, patch))
    if v % 4 == 3:
        store.put_current(verified(record, state=STATES[v]))
print("done", flush=True)
"""


@pytest.mark.parametrize("kill_after", [4, 17])
@pytest.mark.slow
def test_kill_9_while_writing_restarts_at_a_verified_version(tmp_path: Path,
                                                             kill_after: int) -> None:
    root = tmp_path / "store"
    code = _WRITER.format(tests=str(Path(__file__).parent), root=str(root))
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    records = root / "records"
    try:
        wait_for(lambda: proc.poll() is not None or (records.is_dir() and len(list(records.glob("*.rec"))) > kill_after),
                 timeout=60, interval=0.002, what=f"the writer past version {kill_after}")
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stderr.close()
    with VersionStore(root, trusted_signers=TRUSTED) as store:
        head = store.head()
        assert head is not None and head.version >= kill_after
        assert head.chain_hash == CHAIN[head.version][0].chain_hash
        assert states_equal(store.load_state(head.version), STATES[head.version])
        assert not list(root.rglob("*.tmp"))


# ---------------------------------------------------------------------------- retention
CHAIN_4 = build_chain(STATES, anchor_every=4)


@pytest.fixture(scope="module")
def full_stores(tmp_path_factory) -> dict[int, Path]:
    """Stores holding versions 0..30 (anchors every 4 / every 10), written once."""
    roots = {}
    for every, chain in ((4, CHAIN_4), (10, CHAIN)):
        roots[every] = tmp_path_factory.mktemp(f"full{every}")
        with VersionStore(roots[every]) as store:
            fill(store, 30, chain=chain)
    return roots


def copy_up_to(template: Path, dest: Path, upto: int) -> Path:
    """A copy of a full store holding versions 0..upto only (plain copies: no fsync cost)."""
    shutil.copytree(template, dest)
    for kind in ("record", "patch", "anchor"):
        for v in range(upto + 1, 31):
            store_path(dest, kind, v).unlink(missing_ok=True)
    return dest


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(upto=st.integers(3, 30), keep_versions=st.integers(1, 15), keep_anchors=st.integers(0, 3),
       anchor_every=st.sampled_from([4, 10]))
def test_retention_keeps_every_needed_link(full_stores, tmp_path_factory, upto: int,
                                           keep_versions: int, keep_anchors: int,
                                           anchor_every: int) -> None:
    root = copy_up_to(full_stores[anchor_every], tmp_path_factory.mktemp("ret") / "s", upto)
    with VersionStore(root, trusted_signers=TRUSTED) as store:
        assert store.head().version == upto
        anchors_before = store.anchors()
        removed = store.retain(keep_versions, keep_anchors)
        low = max(0, upto - keep_versions + 1)
        base = low - low % anchor_every
        assert store.head().version == upto
        # replaying to the head verifies every kept version's state hash on the way
        assert states_equal(store.load_state(upto), STATES[upto])
        assert states_equal(store.load_state(low), STATES[low])
        expect_anchors = set(anchors_before[len(anchors_before) - keep_anchors:]
                             if keep_anchors else []) | {a for a in anchors_before if a >= base}
        assert set(store.anchors()) == expect_anchors
        # nothing older than the kept chain's anchor survives, except kept anchors
        assert all(v >= base or v in expect_anchors for v in store.versions())
        assert all(not store.has_patch(v) for v in range(base + 1))
        assert all(not p.exists() for p in removed)
    with VersionStore(root, trusted_signers=TRUSTED) as again:  # and it survives reopening
        assert again.head().version == upto
        assert states_equal(again.load_state(low), STATES[low])


def test_retention_with_pending_versions_above_head(tmp_path: Path) -> None:
    with VersionStore(tmp_path) as store:
        fill(store, 22)
        store.put_patch(verified(*CHAIN[25]))  # waiting on a gap (23, 24)
        store.retain(2, 0)
        assert store.head().version == 22
        assert store.anchors() == [20] and store.has_patch(25)
        assert store.versions() == [20, 21, 22, 25]
        store.put_patch(verified(*CHAIN[23]))
        store.put_patch(verified(*CHAIN[24]))
        assert store.head().version == 25
        assert states_equal(store.load_state(25), STATES[25])


def test_current_state_is_a_fast_restart_point(tmp_path: Path) -> None:
    with VersionStore(tmp_path) as store:
        fill(store, 17)
        store.put_current(verified(CHAIN[15][0], state=STATES[15]))
        store.put_current(verified(CHAIN[17][0], state=STATES[17]))
        assert store.current_version() == 17
        assert sorted(p.name for p in (tmp_path / "current").iterdir()) == ["17.safetensors"]
        with pytest.raises(IntegrityError):
            store.put_current(verified(CHAIN[16][0], state=STATES[15]))
    os.unlink(store_path(tmp_path, "patch", 12))  # the anchor chain is now broken at 12
    with VersionStore(tmp_path) as store:
        assert store.head().version == 17  # still reachable from current
        assert states_equal(store.load_state(17), STATES[17])
        with pytest.raises(GapError):
            store.load_state(16)


def test_join_by_catchup_stores_a_non_anchor_version_as_current(tmp_path: Path) -> None:
    with VersionStore(tmp_path, trusted_signers=TRUSTED) as store:
        store.put_anchor(verified(CHAIN[10][0], state=STATES[10]))
        store.put_current(verified(CHAIN[17][0], state=STATES[17]))  # reached via a catch-up patch 10 -> 17
        assert store.head().version == 17 and store.versions() == [10, 17]
        store.put_patch(verified(*CHAIN[18]))
        assert store.head().version == 18
        assert states_equal(store.load_state(18), STATES[18])
        with pytest.raises(IntegrityError):  # a record that does not match the stored child
            store.put_current(verified(build_chain(STATES[:18], anchor_every=10, run_id="x")[17][0],
                                       state=STATES[17]))


def test_retention_when_only_current_reaches_the_head(tmp_path: Path) -> None:
    with VersionStore(tmp_path) as store:
        fill(store, 17)
        store.put_current(verified(CHAIN[17][0], state=STATES[17]))
    os.unlink(store_path(tmp_path, "patch", 12))
    with VersionStore(tmp_path) as store:
        store.retain(3, 1)
        assert store.head().version == 17 and store.anchors() == [10]
        assert states_equal(store.load_state(17), STATES[17])
        assert store.versions() == [10, 17]  # 15, 16 could not be rebuilt: nothing to keep
        assert states_equal(store.load_state(10), STATES[10])
