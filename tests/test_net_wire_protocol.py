"""Wire structs of the libp2p data plane: exact fields, types, bounds, versions (no network)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from pulse_node.errors import UnsupportedVersion, WireError
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.serving import resolve

V = wp.WIRE_VERSION


def _body(frame: bytes) -> bytes:
    n = wp.frame_length(frame[:4], 1 << 20)
    assert len(frame) == 4 + n
    return frame[4:]


def test_every_request_round_trips() -> None:
    reqs = [wp.RecordRequest(v=V, version=None), wp.RecordRequest(v=V, version=3),
            wp.PatchRequest(v=V, version=7), wp.AnchorRequest(v=V, version=2, offset=5, length=9),
            wp.CatchupRequest(v=V, base=3, target=9), wp.PushRequest(v=V, kind="loco", size=12),
            wp.LocoPayloadRequest(v=V, round=4, digest="ab" * 32), wp.LocoDecisionRequest(v=V, round=4)]
    for req in reqs:
        assert type(req).decode(_body(req.encode())) == req


def test_response_round_trips_and_error_response_truncates() -> None:
    r = wp.Response(v=V, status="ok", size=10, total=20, message="")
    assert wp.Response.decode(_body(r.encode())) == r
    err = wp.error_response("bad_request", "x" * 2000)
    assert err.status == "bad_request" and len(err.message) == 512


@pytest.mark.parametrize("msg, match", [
    ({"v": V}, "fields"),
    ({"v": V, "version": 7, "extra": 1}, "fields"),
    ({"v": V, "version": -1}, "integer"),
    ({"v": V, "version": "7"}, "integer"),
    ({"v": V, "version": 1 << 63}, "integer"),
    ({"v": V, "version": True}, "integer"),
    ({"v": 3, "version": 7}, "unsupported wire version"),
    ({"version": 7}, "unsupported wire version"),
    ([1, 7], "malformed|not a map"),
    ("text", "not a map"),
])
def test_patch_request_rejects_undeclared_input(msg: object, match: str) -> None:
    with pytest.raises(WireError, match=match):
        wp.PatchRequest.decode(msgpack.packb(msg))


def test_unsupported_version_is_its_own_type() -> None:
    with pytest.raises(UnsupportedVersion):
        wp.PatchRequest.decode(msgpack.packb({"v": 9, "version": 1}))


def test_garbage_and_oversized_frames_are_rejected() -> None:
    with pytest.raises(WireError, match="malformed"):
        wp.PatchRequest.decode(b"\xc1\xc1\xc1")
    with pytest.raises(WireError, match="exceeds"):
        wp.PatchRequest.decode(b"\x00" * (wp.REQUEST_CAP + 1))
    with pytest.raises(WireError, match="exceeds"):
        wp.frame_length(b"\xff\xff\xff\xff", wp.REQUEST_CAP)


def test_anchor_chunk_length_is_capped() -> None:
    with pytest.raises(WireError):
        wp.AnchorRequest(v=V, version=1, offset=0, length=wp.BODY_CAPS["anchor"] + 1)


def test_protocol_ids_and_caps_speak_the_one_vocabulary() -> None:
    from pulse_node.vocab import FETCH_KINDS, PUSH_KINDS

    assert set(wp.BODY_CAPS) == set(FETCH_KINDS) and set(wp.PUSH_CAPS) == set(PUSH_KINDS)
    assert wp.PROTOCOLS["trainer_state"] == "/pulse/trainer_state/2.0.0" and wp.PROTOCOLS["push"] == "/pulse/push/2.0.0"


def test_fetch_requests_are_typed_from_the_start_and_checked_again_when_decoded() -> None:
    req = wp.CatchupRequest(base=1, target=4)  # the wire version is filled in
    assert req == wp.CatchupRequest(v=V, base=1, target=4) and wp.kind_of(req) == "catchup"
    assert wp.params_of(req) == {"base": 1, "target": 4}
    assert wp.decode_fetch("catchup", req.body()) == req
    assert wp.decode_fetch("loco_decision", wp.LocoDecisionRequest(round=2).body()).round == 2
    commit = wp.LocoCommitRequest(round=2, digest="ab" * 32)
    assert wp.kind_of(commit) == "loco_commit" and wp.decode_fetch("loco_commit", commit.body()) == commit
    assert resolve(Path("/s"), commit) == Path("/s/loco/2") / f"{'ab' * 32}.commit"
    assert resolve(Path("/s"), wp.LocoCommitRequest(round=2, digest="../" + "ab" * 30 + "c")) is None
    with pytest.raises(WireError):
        wp.LocoPayloadRequest(round=2, digest="ab" * 33)  # out of its declared bound: never built
    with pytest.raises(WireError, match="not a fetch request"):
        wp.kind_of(wp.PushRequest(v=V, kind="loco", size=1))
    with pytest.raises(WireError, match="unknown fetch kind"):
        wp.decode_fetch("push", wp.PushRequest(v=V, kind="loco", size=1).body())
    with pytest.raises(WireError):  # a body of another kind's fields
        wp.decode_fetch("catchup", wp.PatchRequest(version=3).body())


def test_parse_digest() -> None:
    h = "ab" * 32
    assert wp.parse_digest(f"sha256:{h.upper()}") == h
    assert wp.parse_digest(h) == h and wp.parse_digest(None) is None
    for bad in ("sha256:xyz", "ab" * 31, "blake3:" + h):
        with pytest.raises(WireError):
            wp.parse_digest(bad)
