"""Trainers exchange base-coded PULSELoCo payloads and refuse ones made on another base.

A payload coded against the round's FP32 global weights (``loco.base_coding``) is decoded by a
receiver only if the base hash it names is the receiver's own, checked before anything is
decoded; one made on another base misses the round like a late payload and is counted
(``loco_base_mismatch``). Base-free payloads (an older peer) still decode.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
from helpers import all_at_version, assert_trainers_identical, commit_to, read_status, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.chain.store import VersionStore
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus
from pulse_node.errors import BaseMismatchError
from pulse_node.loco import payload as payload_mod
from pulse_node.loco.payload import (
    POS_CODER_BASE,
    VAL_CODER,
    VAL_CODER_BASE,
    LocoPayload,
    decode_payload,
    encode_payload,
    read_header,
)
from pulse_node.testing.inprocess import InProcessSwarm
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.decisions import coordinator_order

SHAPES = {"w": (256,), "z.bias": (8,)}
CAP = 1 << 20
OTHER_BASE = b"\x5a" * 32
#: deadline long enough that no payload is late on a loaded 2-core machine (rounds close when all are in)
LOCO = {"inner_steps": 2, "deadline_s": 20.0, "decision_wait_s": 2.0}


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) * 0.02).astype(np.float32) for n, s in SHAPES.items()}


def _payload(trainer: str, rnd: int, base_hash: bytes, weights: dict[str, np.ndarray], seed: int = 0) -> LocoPayload:
    """Entries that cross the BF16 boundary of ``weights`` (what the gate sends)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, w in weights.items():
        idx = np.flatnonzero(rng.random(w.size) < 0.2).astype(np.int64)
        steps = rng.integers(1 << 15, 1 << 17, idx.size) * rng.choice([-1, 1], idx.size)
        tensors[name] = (idx, (steps * np.spacing(np.abs(w[idx])).astype(np.float64)).astype(np.float32))
    return LocoPayload(round=rnd, trainer_id=trainer, base_hash=base_hash, tensors=tensors,
                       numel={n: w.size for n, w in weights.items()})


def _same(p: LocoPayload, q: LocoPayload) -> bool:
    return (p.round, p.trainer_id, p.base_hash) == (q.round, q.trainer_id, q.base_hash) and all(
        np.array_equal(p.tensors[n][0], q.tensors[n][0])
        and np.array_equal(p.tensors[n][1].view(np.uint32), q.tensors[n][1].view(np.uint32)) for n in p.tensors)


@pytest.fixture
def body_decodes(monkeypatch) -> list[str]:
    """Names of the payload body decoders called (positions, values, the base weights' gather)."""
    calls: list[str] = []
    for name in ("_records", "_flat_base", "_decode_positions", "_decode_vals"):
        real = getattr(payload_mod, name)

        def spy(*args, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(*args, **kw)
        monkeypatch.setattr(payload_mod, name, spy)
    return calls


def test_header_and_base_check_come_before_any_decoding(body_decodes):
    w = _weights(1)
    p = _payload("trainer-a", 3, b"\x01" * 32, w)
    data = encode_payload(p, base=w)
    body_decodes.clear()  # the encoder gathers the base weights too
    h = read_header(data, max_bytes=CAP, max_tensors=len(SHAPES))
    assert (h.round, h.trainer_id, h.base_hash, h.val_coder) == (3, "trainer-a", b"\x01" * 32, VAL_CODER_BASE)
    assert h.needs_base and not body_decodes
    with pytest.raises(BaseMismatchError, match="another|not ours"):
        decode_payload(data, shapes=SHAPES, max_bytes=CAP, base=w, expect_base=OTHER_BASE)
    assert not body_decodes, "a payload naming another base was decoded"
    assert _same(p, decode_payload(data, shapes=SHAPES, max_bytes=CAP, base=w, expect_base=b"\x01" * 32))
    plain = encode_payload(p)  # an older peer: base-free, decodes with or without the weights
    assert not read_header(plain, max_bytes=CAP, max_tensors=len(SHAPES)).needs_base
    for base in (None, w):
        assert _same(p, decode_payload(plain, shapes=SHAPES, max_bytes=CAP, base=base, expect_base=b"\x01" * 32))


class _Round:
    """The base a test agreement sees: round number, base hash and FP32 weights, changeable."""

    def __init__(self, rnd: int, base_hash: bytes, weights: dict[str, np.ndarray]) -> None:
        self.round, self.hash, self.weights = rnd, base_hash, weights

    def base(self) -> tuple[bytes, dict[str, np.ndarray]]:
        return self.hash, self.weights


KEYS: dict[str, Identity] = {}  # the members' keys of the last ``_agreement``


def _agreement(tmp_path: Path, state: _Round, members=("trainer-a", "trainer-c", "trainer-x")) -> RoundAgreement:
    """trainer-b's agreement; ``members`` announce the trainer role (an open swarm: members)."""
    cfg = TrainerConfig.model_validate({"data_dir": str(tmp_path / "b")})
    store, hub = VersionStore(tmp_path / "b" / "store"), MemoryHub()
    for name in members:
        KEYS[name] = Identity.generate()
        hub.join(name, lambda request: None).publish(PeerStatus(role="trainer", node_key=KEYS[name].public_key_hex))
    ctx = RoleContext(cfg=cfg, identity=Identity.generate(), store=store,
                      transport=hub.join("trainer-b", lambda request: None),
                      status=NodeStatus(role="trainer", peer_id="trainer-b", run_id=cfg.run_id))
    return RoundAgreement(ctx, shapes=SHAPES, current_round=lambda: state.round, epoch=lambda: bytes(32),
                          base=state.base)


def test_payload_made_on_another_base_is_refused_before_decoding_and_counted(tmp_path, body_decodes):
    ours, theirs = _weights(1), _weights(2)
    state = _Round(3, b"\x01" * 32, ours)
    agreement = _agreement(tmp_path, state)
    good = _payload("trainer-a", 3, state.hash, ours, seed=1)
    older = _payload("trainer-c", 3, state.hash, ours, seed=2)
    for p, data in ((good, encode_payload(good, base=ours)), (older, encode_payload(older))):  # older: base-free
        agreement.offer_payload(p.trainer_id, data)  # waits for its commitment
        assert p.trainer_id not in agreement.inbox.get(3, {})
        commit_to(agreement, KEYS[p.trainer_id], p.trainer_id, data, round=3, base=state.hash)
    assert "_decode_vals" in body_decodes, "the good payloads were not decoded"
    stranger = encode_payload(_payload("trainer-x", 3, OTHER_BASE, theirs, seed=3), base=theirs)
    body_decodes.clear()
    agreement.offer_payload("trainer-x", stranger)  # not an error: no exception
    agreement.offer_payload("trainer-x", stranger)  # the same again: counted and logged once
    assert not body_decodes, "a payload made on another base was decoded"
    held = agreement.inbox[3]
    assert set(held) == {"trainer-a", "trainer-c"}
    assert _same(good, held["trainer-a"][1]) and _same(older, held["trainer-c"][1])
    status = agreement.ctx.status.snapshot()
    assert status.trainer.loco_base_mismatch == 1 and not status.counters.rejected and not status.counters.errors
    # it cannot contribute, so the coordinator does not wait for it
    assert agreement._all_in(3, ["trainer-a", "trainer-b", "trainer-x"], {"trainer-a": None, "trainer-x": None}) \
        is False  # our own (trainer-b) payload is not in yet
    agreement.inbox[3]["trainer-b"] = held["trainer-a"]
    assert agreement._all_in(3, ["trainer-a", "trainer-b", "trainer-x"], {"trainer-a": None, "trainer-x": None})
    agreement.ctx.store.close()


def test_coming_round_payloads_wait_undecoded_for_their_base(tmp_path, body_decodes):
    """A payload of round 4 arrives while we are in round 3: it is held as bytes and checked
    against our base only once round 4 opens (then its base is known)."""
    w3, w4 = _weights(1), _weights(4)
    state = _Round(3, b"\x03" * 32, w3)
    agreement = _agreement(tmp_path, state)
    early = _payload("trainer-a", 4, b"\x04" * 32, w4, seed=5)
    sent = {"trainer-a": encode_payload(early, base=w4),
            "trainer-x": encode_payload(_payload("trainer-x", 4, OTHER_BASE, w3), base=w3)}
    body_decodes.clear()
    for sender, data in sent.items():
        agreement.offer_payload(sender, data)
    assert not body_decodes and 4 not in agreement.inbox and set(agreement.pending[4]) == {"trainer-a", "trainer-x"}
    state.round, state.hash, state.weights = 4, b"\x04" * 32, w4  # round 3 closed: our state is round 4's base
    commit_to(agreement, KEYS["trainer-a"], "trainer-a", sent["trainer-a"], round=4, base=state.hash)
    agreement._flush_pending()
    assert set(agreement.inbox[4]) == {"trainer-a"} and _same(early, agreement.inbox[4]["trainer-a"][1])
    assert agreement.ctx.status.snapshot().trainer.loco_base_mismatch == 1 and not agreement.pending
    agreement.ctx.store.close()


# ---- networked trainers (in-process swarm over the memory hub) -------------------------------


class _PushTap:
    """Wraps a transport: records the ``loco`` payloads it pushes, optionally rewriting them."""

    def __init__(self, inner, rewrite=None) -> None:
        self.inner, self.rewrite, self.sent = inner, rewrite, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def push(self, peer, kind, data, *, timeout):
        if kind == "loco":
            if self.rewrite is not None:
                data = self.rewrite(data)
            self.sent.append(data)
        return self.inner.push(peer, kind, data, timeout=timeout)


def _renamed_base(data: bytes) -> bytes:
    """The same payload naming another base (as a trainer on another state would send it)."""
    msg = msgpack.unpackb(data, raw=False)
    msg["base"] = OTHER_BASE
    return msgpack.packb(msg, use_bin_type=True)


def _run_pair(node_cfg, rewrite_b=None, **b_extra) -> tuple[dict[str, Path], dict[str, _PushTap], list[str]]:
    taps: dict[str, _PushTap] = {}

    def wrap(name, transport):
        taps[name] = _PushTap(transport, rewrite_b if name == "trainer-b" else None)
        return taps[name]

    swarm = InProcessSwarm(wrap=wrap)
    try:
        dirs = {"trainer-a": swarm.start("trainer-a", node_cfg(TrainerConfig, "trainer-a", loco=LOCO)),
                "trainer-b": swarm.start("trainer-b", node_cfg(TrainerConfig, "trainer-b",
                                                               loco={**LOCO, **b_extra}))}
        wait_for(all_at_version(dirs.values(), 3), timeout=300, what="both trainers at version 3")
    finally:
        swarm.stop_all()
    return dirs, taps, swarm.errors


@pytest.mark.slow
def test_trainers_agree_bit_identically_on_base_coded_payloads(node_cfg):
    dirs, taps, errors = _run_pair(node_cfg)
    assert not errors, errors
    assert_trainers_identical(dirs, range(1, 4))
    for name, tap in taps.items():
        assert len(tap.sent) >= 3, f"{name} pushed too few payloads"
        for data in tap.sent:
            h = read_header(data, max_bytes=CAP, max_tensors=1 << 16)
            assert (h.val_coder, h.pos_coder) == (VAL_CODER_BASE, POS_CODER_BASE), (name, h)
    for name, d in dirs.items():
        st = read_status(d)
        assert st.contributors == 2, f"{name}: the last round did not average both payloads"
        assert not st.trainer.rounds_left_out and not st.trainer.loco_base_mismatch and not st.counters.rejected, st


@pytest.mark.slow
def test_base_free_peer_is_still_averaged(node_cfg):
    """trainer-b runs with ``loco.base_coding = false`` (like an older peer): both still average
    both payloads, bit-identically."""
    dirs, taps, errors = _run_pair(node_cfg, base_coding=False)
    assert not errors, errors
    assert_trainers_identical(dirs, range(1, 4))
    assert {read_header(d, max_bytes=CAP, max_tensors=1 << 16).val_coder for d in taps["trainer-b"].sent} == {VAL_CODER}
    assert {read_header(d, max_bytes=CAP, max_tensors=1 << 16).val_coder for d in taps["trainer-a"].sent} \
        == {VAL_CODER_BASE}
    for name, d in dirs.items():
        st = read_status(d)
        assert st.contributors == 2 and not st.trainer.loco_base_mismatch and not st.counters.rejected, (name, st)


@pytest.mark.slow
def test_payload_naming_another_base_misses_the_round_without_breaking_it(node_cfg):
    """Every payload trainer-b pushes names another base: trainer-a never decodes one, counts
    them, and closes each round it coordinates without waiting for the deadline, fetching the
    payload b committed to from b itself (commit-reveal: a decision leaves out only what nobody
    could get); in the rounds b coordinates, a fetches b's own payload by the decision's digest;
    both stay identical."""
    dirs, _taps, errors = _run_pair(node_cfg, rewrite_b=_renamed_base)
    assert not errors, errors
    assert_trainers_identical(dirs, range(1, 4))
    a, b = read_status(dirs["trainer-a"]), read_status(dirs["trainer-b"])
    assert a.trainer.loco_base_mismatch >= 3 and not a.counters.rejected, a
    led_by_a = [r for r in range(a.trainer.rounds)
                if coordinator_order(a.run_id, r, ["trainer-a", "trainer-b"])[0] == "trainer-a"]
    assert led_by_a, "the test needs a round trainer-a coordinates"
    assert not b.trainer.rounds_left_out and not b.trainer.forks, b
    assert a.trainer.loco_fetched >= a.trainer.rounds and a.contributors == 2, a.trainer
    at = {h.version: h.at for h in a.history}
    assert at[3] - at[1] < LOCO["deadline_s"], "trainer-a waited for the payload it had refused"
