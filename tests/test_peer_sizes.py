"""Every allocation whose size a peer names, and the bound checked before it (issue 34).

``SIZES`` enumerates them: what is allocated, where, what bounds it (our model's dense size or a
constant), and a probe that declares a size far past the bound (2^40 and more) and must end in a
typed refusal (a ``PulseError``) with at most ``PEAK`` bytes allocated on the way (tracemalloc:
the bound was checked before the allocation). A check that lives inline in a network handler is
probed there by the test named in ``covered_by``. A new decoder or download that allocates from a
peer's number gets a row here.
"""

from __future__ import annotations

import dataclasses
import os
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from codec_strategies import mixed_pair
from test_chain_synth import TRAINER
from test_node_sync_bounds import _syncer, served  # noqa: F401  (fixture)

from pulse_node.chain.record import encode_record, make_record, signing_bytes
from pulse_node.codec.limits import DENSE_FACTOR, HEADER_SLACK, check_patch_size, patch_cap
from pulse_node.codec.patch import make_patch
from pulse_node.codec.pipelined import MAX_RESERVE, Expected, GrowingBuffer
from pulse_node.codec.state import TensorBits, state_nbytes
from pulse_node.errors import PatchError, PulseError
from pulse_node.inference.streaming import Pipeline
from pulse_node.net.wire.protocol import FetchRequest, kind_of
from pulse_node.testing.adversaries import announce
from pulse_node.testing.memory import MemoryHub

HUGE = 1 << 50
PEAK = 64 << 20
TESTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Size:
    what: str  # the allocation
    where: str  # the function that makes it
    bound: str  # what bounds it, checked first
    probe: Callable[[Path], None] | None = None  # declares a size past the bound: must raise PulseError
    covered_by: str = ""  # "file::test" probing an inline check of a network handler


def _small():
    base, new = mixed_pair(1, tensors=3)
    return base, new


def _streamed(tmp: Path) -> None:
    base, _new = _small()
    called = []
    Pipeline().fetch_apply(called.append, tmp / "p", state=base, base=0, target=1,
                           expected=Expected("a" * 64, "b" * 64, "c" * 64), size=HUGE, timeout=5)
    assert not called


def _reserve(tmp: Path) -> None:
    GrowingBuffer(HUGE)


def _patch_size(tmp: Path) -> None:
    check_patch_size(HUGE, _small()[0])


def _anchor(tmp: Path) -> None:
    from pulse_node.chain.anchor import AnchorManifest
    from pulse_node.inference.anchor_load import load_anchor
    from pulse_node.peers.book import PeerBook
    from pulse_node.peers.trainerset import TrainerSet
    from pulse_node.testing.member_attackers import record_at

    chunk = HUGE // 128
    manifest = AnchorManifest(b"\0" * 32, HUGE, chunk, b"\0" * 32 * 128).encode()
    rec = record_at(TRAINER, "run-s", 5, anchor_manifest=manifest)

    class NoFetch:
        def fetch(self, *a, **kw):
            raise AssertionError("fetched an anchor past the bound")

        fetch_anchor = fetch

    book = PeerBook(TrainerSet(run_id="run-s", keys=[TRAINER.public_key_hex]))
    load_anchor(NoFetch(), book, rec, None, [], tmp, timeout=5.0)  # type: ignore[arg-type]


def _anchor_layout(tmp: Path) -> None:
    from pulse_node.chain.anchor import AnchorManifest, anchor_manifest, split_header
    from pulse_node.codec.state import to_safetensors_bytes
    from pulse_node.inference.anchor_load import check_layout_size

    state = _small()[0]
    real = AnchorManifest.decode(anchor_manifest(state))
    data = to_safetensors_bytes(state)
    n, _ = split_header(data)
    check_layout_size(data[:8 + n], dataclasses.replace(real, data_bytes=HUGE))


def _anchor_header(tmp: Path) -> None:
    from pulse_node.chain.anchor import header_length

    header_length((HUGE).to_bytes(8, "little"))


def _patch_header(tmp: Path) -> None:
    from pulse_node.codec.header import MAGIC, unpack_header

    unpack_header(MAGIC + bytes([3]) + (0xFFFFFFFF).to_bytes(4, "little") + b"\0" * 64)


def _patch_counts(tmp: Path) -> None:
    """A header declaring more changes than our tensor holds: refused before positions are decoded."""
    import msgpack

    from pulse_node.codec.header import MAGIC, PatchHeader, TensorEntry, pack_header
    from pulse_node.codec.inplace import apply_patch_inplace

    state = {"w": TensorBits("BF16", (4,), np.zeros(4, np.uint16))}
    blob = msgpack.packb([b"", b"", b""], use_bin_type=True)
    header = PatchHeader(3, "compact", "blake3", "a" * 64, "b" * 64, "c" * 64, len(blob),
                         (TensorEntry("w", "BF16", (1 << 40,), 1 << 40, 0, len(blob), 0, 1),), ())
    assert MAGIC
    apply_patch_inplace(state, pack_header(header) + blob, verify=False)


def _wire_frame(tmp: Path) -> None:
    from pulse_node.net.wire import protocol as wp

    wp.frame_length(b"\xff\xff\xff\xff", wp.REQUEST_CAP)


def _push_request(tmp: Path) -> None:
    from pulse_node.net.wire import protocol as wp

    wp.PushRequest.decode(wp.PushRequest(v=wp.WIRE_VERSION, kind="rollouts", size=1).encode()
                          .replace(b"\x01", b"\xcf" + HUGE.to_bytes(8, "big"), 1))


def _rpc_frame(tmp: Path) -> None:
    from pulse_node.net.local.ipc import frame_length

    frame_length(b"\xff\xff\xff\xff")


def _record(tmp: Path) -> None:
    from pulse_node.chain.record import MAX_RECORD_BYTES, decode_record

    decode_record(b"\x90" * (MAX_RECORD_BYTES + 1))


def _dht_value(tmp: Path) -> None:
    from pulse_node.net.dht.records import MAX_PEER_RECORD_BYTES
    from pulse_node.net.dht.validator import open_envelope

    open_envelope(b"\0" * (MAX_PEER_RECORD_BYTES + 129))


def _payload(tmp: Path) -> None:
    from pulse_node.loco.payload import decode_payload

    decode_payload(b"\0" * 1025, shapes={"w": (4,)}, max_bytes=1024)


def _zstd(tmp: Path) -> None:
    import zstandard

    from pulse_node.loco.bounded_zstd import bounded_decompress

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (1 << 20))
    bounded_decompress(bomb, limit=1024, what="values")


def _rollouts(tmp: Path) -> None:
    from pulse_node.rl.rollout import decode_rollouts

    decode_rollouts(b"\0" * 1025, max_bytes=1024)


def _spool(tmp: Path) -> None:
    from pulse_node.net.local.spool import checked_size

    checked_size(-HUGE)


def _decision(tmp: Path) -> None:
    from pulse_node.loco.decision import MAX_DECISION_BYTES, decode_decision

    decode_decision(b"\0" * (MAX_DECISION_BYTES + 1))


def _admission(tmp: Path) -> None:
    from pulse_node.chain.admission import MAX_ADMISSION_BYTES, Admission

    Admission.decode(b"\0" * (MAX_ADMISSION_BYTES + 1))


def _evidence(tmp: Path) -> None:
    from pulse_node.chain.evidence import MAX_EVIDENCE_BYTES, decode_evidence

    decode_evidence(b"\0" * (MAX_EVIDENCE_BYTES + 1))


def _huge_view(n: int) -> memoryview:
    """``n`` bytes that are never allocated (one byte seen n times)."""
    return memoryview(np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=(n,), strides=(0,)))


def _commitment(tmp: Path) -> None:
    from pulse_node.loco.commit import decode_commitment

    decode_commitment(_huge_view(HUGE))


def _opening(tmp: Path) -> None:
    from pulse_node.loco.opening import decode_opening

    decode_opening(_huge_view(HUGE), max_bytes=1 << 20)


def _spot_evidence(tmp: Path) -> None:
    from pulse_node.loco.spot_evidence import decode_evidence as decode_spot

    decode_spot(_huge_view(HUGE))


SIZES = [
    Size("the streamed patch buffer", "inference/streaming.py:Pipeline.fetch_apply", "codec/limits.py:patch_cap "
         "(2x our state's dense size + 1 MiB)", _streamed),
    Size("GrowingBuffer's reservation", "codec/pipelined.py:GrowingBuffer", "MAX_RESERVE (2 TiB); pages only "
         "as bytes arrive", _reserve),
    Size("a patch download (whole)", "inference/syncer.py:_version_from", "codec/limits.py:check_patch_size "
         "before the fetch", _patch_size),
    Size("a catch-up patch download", "inference/recovery.py:_caught_up_from", "catchup_cap = patch_cap",
         covered_by="test_node_sync_bounds.py::test_every_download_is_capped_by_its_signed_size_and_the_liar_struck"),
    Size("a download's body (any kind)", "net/wire/transfer.py:fetch_to_file", "the caller's max_bytes and "
         "protocol.BODY_CAPS, before the body is read",
         covered_by="test_net_wire.py::test_a_body_larger_than_the_signed_size_is_refused_before_reading"),
    Size("an anchor's data region", "inference/anchor_load.py:load_anchor", "the dense size of our state, else "
         "free disk and memory", _anchor),
    Size("an anchor's data region (layout)", "inference/anchor_load.py:check_layout_size", "the checked header's "
         "layout", _anchor_layout),
    Size("an anchor's header", "chain/anchor.py:header_length", "MAX_HEADER_BYTES (16 MiB)", _anchor_header),
    Size("a patch header", "codec/header.py:unpack_header", "MAX_HEADER_BYTES (64 MiB) and the signed size",
         _patch_header),
    Size("a tensor's decoded positions and undo log", "codec/inplace.py:_patch_tensor", "the declared count, "
         "<= numel of our own tensor (_check_base first)", _patch_counts),
    Size("a wire request or response frame", "net/wire/protocol.py:frame_length", "REQUEST_CAP / RESPONSE_CAP",
         _wire_frame),
    Size("a wire push body", "net/wire/protocol.py:PushRequest", "PUSH_CAPS (48 MiB)", _push_request),
    Size("a p2pd push body", "net/dht/push.py:_receive", "the plane's cap (the model's payload bound)",
         covered_by="test_net_dht_push.py::test_oversized_or_malformed_requests_are_refused_before_any_body"),
    Size("a spool file", "net/local/spool.py:Spool.take", "the announced size, under the spool's cap",
         _spool),
    Size("a spooled push read back", "net/dht/client.py:_take_spooled", "Spool.max_push",
         covered_by="test_net_dht_spool.py::test_an_oversized_declared_size_is_refused_before_anything_is_written"),
    Size("a local RPC frame", "net/local/ipc.py:frame_length", "MAX_FRAME (64 MiB)", _rpc_frame),
    Size("a version record", "chain/record.py:decode_record", "MAX_RECORD_BYTES (8 KiB)", _record),
    Size("a DHT record value", "net/dht/validator.py:open_envelope", "MAX_PEER_RECORD_BYTES", _dht_value),
    Size("a PULSELoCo payload", "loco/payload.py:decode_payload", "loco/bound.max_payload_bytes of our shapes",
         _payload),
    Size("a payload's decompressed values", "loco/bounded_zstd.py:bounded_decompress", "4 B x the count our "
         "shapes allow", _zstd),
    Size("a rollout batch", "rl/rollout.py:decode_rollouts", "max_bytes (64 MiB) and per-field caps", _rollouts),
    Size("a round decision", "loco/decision.py:decode_decision", "MAX_DECISION_BYTES", _decision),
    Size("an admission", "chain/admission.py:Admission.decode", "MAX_ADMISSION_BYTES", _admission),
    Size("an evidence push", "chain/evidence.py:decode_evidence", "MAX_EVIDENCE_BYTES", _evidence),
    Size("an inner-step commitment", "loco/commit.py:decode_commitment", "MAX_COMMIT_BYTES (256 KiB)", _commitment),
    Size("an inner-step opening", "loco/opening.py:decode_opening", "the caller's max_bytes (opening_cap of the "
         "commitment), at most MAX_OPENING_BYTES", _opening),
    Size("spot-check evidence", "loco/spot_evidence.py:decode_evidence", "MAX_EVIDENCE_BYTES (96 MiB)",
         _spot_evidence),
    Size("a trainer state download", "trainer/role.py:_fetch_trainer_state", "trainer_state_cap (8 B/param + "
         "header), as the fetch's max_bytes",
         covered_by="test_net_wire.py::test_a_body_larger_than_the_signed_size_is_refused_before_reading"),
    Size("a peer's status page", "ops/sources.py:http_get", "MAX_STATUS_BYTES (4 MiB)",
         covered_by="test_ops_status_fetch.py::test_redirects_are_not_followed_and_bodies_are_capped"),
]


@pytest.mark.parametrize("size", SIZES, ids=[s.what for s in SIZES])
def test_each_peer_named_size_is_bounded_before_it_is_allocated(size: Size, tmp_path: Path) -> None:
    if size.probe is None:
        file, name = size.covered_by.split("::")
        text = (TESTS / file).read_text()
        assert f"def {name}(" in text, f"{size.what}: {size.covered_by} does not exist"
        return
    with pytest.raises(PulseError):
        size.probe(tmp_path)  # once first: what it imports is not counted
    tracemalloc.start()
    try:
        with pytest.raises(PulseError):
            size.probe(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK, f"{size.what}: {peak} bytes allocated before the refusal"


def test_a_fully_changed_state_fits_the_patch_cap() -> None:
    """The bound's factor: every entry changed to random bits, in both modes and every float dtype
    of a state (the worst case: an honest fully changed state codes to ~1.04x dense)."""
    rng = np.random.default_rng(7)
    def rand(n: int, np_dtype: type) -> np.ndarray:
        return rng.integers(0, np.iinfo(np_dtype).max, n, dtype=np_dtype, endpoint=True)

    for dtype, np_dtype in (("BF16", np.uint16), ("F16", np.uint16), ("F32", np.uint32)):
        base = {f"t{i}": TensorBits(dtype, (n,), rand(n, np_dtype)) for i, n in enumerate((1, 7, 4096, 100_000))}
        new = {k: TensorBits(dtype, t.shape, rand(t.numel, np_dtype)) for k, t in base.items()}
        for mode in ("compact", "overwrite"):
            size = len(make_patch(base, new, mode=mode))
            assert size <= 1.15 * state_nbytes(base) + (64 << 10) < patch_cap(base), (dtype, mode, size)
    assert patch_cap(base) == DENSE_FACTOR * state_nbytes(base) + HEADER_SLACK


def _oversized_record(parent, size: int):
    rec = make_record(TRAINER, run_id="run-s", version=parent.version + 1, parent=parent,
                      state_hash="ab" * 32, patch=b"x", anchor_version=parent.anchor_version,
                      is_anchor=False, codec="pulsesync/compact/1")
    rec = dataclasses.replace(rec, patch_bytes=size)
    return dataclasses.replace(rec, signature=TRAINER.sign(signing_bytes(rec)))


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_a_member_signed_patch_size_past_the_model_is_refused_before_any_fetch(served, tmp_path, streamed) -> None:  # noqa: F811
    """Issue 34 item 1: a trainer-signed record declaring 2^50 patch bytes for the next version.
    Before, the streaming buffer was allocated at that size (``MemoryError``, the node exited);
    now the record is refused against our model's dense size and no patch is asked for."""
    from test_inference_inplace import _live

    hub = MemoryHub()
    sync = _syncer(tmp_path, hub, at=14, catchup_min_gap=0)
    asked: list[str] = []
    rec_file = tmp_path / "huge.rec"
    rec_file.write_bytes(encode_record(_oversized_record(sync.record, HUGE)))
    blob = tmp_path / "blob"
    blob.write_bytes(os.urandom(4096))

    def serve(request: FetchRequest) -> Path | None:
        kind = kind_of(request)
        asked.append(kind)
        return rec_file if kind == "record" and getattr(request, "version", None) == 15 else blob if kind == "patch" else None

    peer = announce(hub, TRAINER, serve, role="trainer", version=15, lowest=15)
    try:
        if streamed:
            live = _live(sync.state)
            live.set(sync.state, 14)
            sync.pipeline = Pipeline(live)
        assert sync.step([peer]) == []
        assert sync.record.version == 14 and "record" in asked and "patch" not in asked, asked
        assert sync.counters.fetch_errors >= 1
    finally:
        sync.close()


def test_the_cap_refuses_past_it_and_takes_up_to_it() -> None:
    state = _small()[0]
    cap = patch_cap(state)
    check_patch_size(cap, state)
    with pytest.raises(PatchError, match="at most"):
        check_patch_size(cap + 1, state)
    assert cap <= MAX_RESERVE
