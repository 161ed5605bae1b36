"""What the fuzzed decoders run against: one small swarm's worth of real artifacts, made by the
real encoders, and the decode calls a node makes on a peer's bytes (``testing/fuzz_targets.py``).

Everything is deterministic (fixed keys, seeded weights), so an input that crashed a decoder once
crashes it again in a regression test. The model is small (a few thousand entries in BF16 and
F32), which bounds what a decoder may allocate: its caps are derived from it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from pulse_node.chain.identity import Identity
from pulse_node.codec.state import State, TensorBits

RUN = "fuzz-run"
TRAINER = Identity.from_private_bytes(bytes(range(32)))
MEMBER = Identity.from_private_bytes(bytes(range(1, 33)))
NEWCOMER = Identity.from_private_bytes(bytes(range(2, 34)))


@dataclass(frozen=True)
class Context:
    base: State
    new: State
    base_hash: str
    new_hash: str
    records: tuple[Any, ...]  # genesis (an anchor with its manifest), version 1
    fp32: dict[str, np.ndarray]  # the round's FP32 weights (PULSELoCo base)


def _state(rng: np.random.Generator) -> State:
    def bf16(*shape: int) -> np.ndarray:
        vals = rng.normal(0, 0.05, size=shape).astype(np.float32)
        return (vals.view(np.uint32) >> 16).astype(np.uint16).reshape(-1)

    return {"blocks.0.attn.w": TensorBits("BF16", (48, 32), bf16(48, 32)),
            "blocks.0.bias": TensorBits("BF16", (32,), bf16(32)),
            "norm.scale": TensorBits("F32", (24,), rng.normal(1, 0.1, 24).astype(np.float32).view(np.uint32))}


def _changed(state: State, rng: np.random.Generator) -> State:
    out = {}
    for name, tb in state.items():
        bits = tb.bits.copy()
        hit = rng.random(bits.size) < 0.08
        step = rng.choice(np.array([1, 2, np.iinfo(bits.dtype).max], dtype=bits.dtype), size=int(hit.sum()))
        bits[hit] = bits[hit] + step  # +1, +2 or -1 ulp (wrapping)
        out[name] = TensorBits(tb.dtype, tb.shape, bits)
    return out


@functools.cache
def context() -> Context:
    from pulse_node.chain.anchor import anchor_manifest
    from pulse_node.chain.record import make_record
    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.statehash import state_hash

    rng = np.random.default_rng(34)
    base = _state(rng)
    new = _changed(base, rng)
    base_hash, new_hash = state_hash(base), state_hash(new)
    settings = json.dumps({"sampler": "inverse-cdf/blake3/2", "temperature": 1.0}, separators=(",", ":"))
    genesis = make_record(TRAINER, run_id=RUN, version=0, parent=None, state_hash=base_hash, patch=None,
                          anchor_version=0, is_anchor=True, codec="anchor/safetensors",
                          anchor_manifest=anchor_manifest(base), rollout_settings=settings, nonce=b"\x34" * 16)
    one = make_record(TRAINER, run_id=RUN, version=1, parent=genesis, state_hash=new_hash,
                      patch=make_patch(base, new, base_hash=base_hash, new_hash=new_hash), anchor_version=0,
                      is_anchor=False, codec="pulsesync/compact/1", rollout_settings=settings)
    fp32 = {n: (tb.bits.astype(np.uint32) << 16).view(np.float32) if tb.dtype == "BF16" else tb.bits.view(np.float32)
            for n, tb in base.items()}
    return Context(base, new, base_hash, new_hash, (genesis, one), {n: a.reshape(-1) for n, a in fp32.items()})


def epoch() -> bytes:
    """The run's epoch: its genesis chain hash (what decisions are scoped to)."""
    return bytes.fromhex(context().records[0].chain_hash)


def copy_state(state: State) -> State:
    return {n: TensorBits(t.dtype, t.shape, t.bits.copy()) for n, t in state.items()}


def shapes() -> dict[str, tuple[int, ...]]:
    return {n: t.shape for n, t in context().base.items()}


# ---- seeds: real samples of each kind ------------------------------------------------------------
def patch_seeds(*, mode: str = "compact", position_context: bool = False) -> list[bytes]:
    """Patches from the base: to the new state (what a record signs), to another state, to itself."""
    from pulse_node.codec.patch import make_patch

    c = context()
    other = _changed(c.new, np.random.default_rng(7))
    return [make_patch(c.base, target, mode=mode, position_context=position_context)  # type: ignore[arg-type]
            for target in (c.new, other, c.base)]


def signed_patch_seeds() -> list[bytes]:
    """Patches to the signed result in every coding (what a streamed apply expects)."""
    from pulse_node.codec.patch import make_patch

    c = context()
    return [make_patch(c.base, c.new, mode=m, position_context=p)  # type: ignore[arg-type]
            for m, p in (("compact", False), ("compact", True), ("overwrite", False))]


def record_seeds() -> list[bytes]:
    from pulse_node.chain.record import encode_record

    return [encode_record(r) for r in context().records]


def payload_seeds() -> list[bytes]:
    from pulse_node.loco.payload import LocoPayload, encode_payload

    c, rng = context(), np.random.default_rng(11)
    tensors = {}
    for name, w in c.fp32.items():
        pos = np.sort(rng.choice(w.size, size=max(1, w.size // 10), replace=False)).astype(np.int64)
        tensors[name] = (pos, (w[pos] * 1e-3).astype(np.float32))
    p = LocoPayload(round=3, trainer_id="12D3KooWtrainer", base_hash=b"\x01" * 32, tensors=tensors,
                    numel={n: w.size for n, w in c.fp32.items()})
    return [encode_payload(p), encode_payload(p, base=c.fp32),
            encode_payload(LocoPayload(round=0, trainer_id="t", base_hash=b""))]


def decision_seeds() -> list[bytes]:
    from pulse_node.loco.decision import encode_decision, make_decision
    from pulse_node.net.dht.validator import peer_id_of

    me = peer_id_of(MEMBER)
    return [encode_decision(make_decision(MEMBER, run_id=RUN, round=r, base=bytes([r]) * 32, epoch=epoch(), coordinator=me,
                                          contributors={me: bytes([r + 1]) * 32, peer_id_of(TRAINER): b"\x07" * 32}))
            for r in (1, 2)]


def admission_seeds() -> list[bytes]:
    from pulse_node.chain.admission import Admission

    adm = Admission(RUN, NEWCOMER.public_key_hex)
    return [adm.endorse(TRAINER).encode(), adm.endorse(TRAINER).endorse(MEMBER).encode(), adm.encode()]


def evidence_seeds() -> list[bytes]:
    from pulse_node.chain.evidence import Evidence
    from pulse_node.chain.record import encode_record, make_record

    genesis, one = context().records
    other = make_record(TRAINER, run_id=RUN, version=1, parent=genesis, state_hash="cd" * 32, patch=b"another patch",
                        anchor_version=0, is_anchor=False, codec="pulsesync/compact/1")
    return [Evidence("head", TRAINER.public_key_hex, 1, encode_record(one), encode_record(other)).encode(),
            Evidence("decision", MEMBER.public_key_hex, 1, decision_seeds()[0], _decision_variant()).encode()]


def _decision_variant() -> bytes:
    from pulse_node.loco.decision import encode_decision, make_decision
    from pulse_node.net.dht.validator import peer_id_of

    me = peer_id_of(MEMBER)
    return encode_decision(make_decision(MEMBER, run_id=RUN, round=1, base=b"\x09" * 32, epoch=epoch(), coordinator=me,
                                         contributors={me: b"\x02" * 32}))


def commitment_seeds() -> list[bytes]:
    from pulse_node.loco.commit import COMMITMENTS
    from pulse_node.net.dht.validator import peer_id_of

    return [COMMITMENTS.encode(_commitment(peer_id_of(TRAINER), stepped)) for stepped in (True, False)]


def _commitment(trainer: str, stepped: bool = True) -> Any:
    from pulse_node.loco.commit import STATE_GLOBAL, BatchRef, InnerCommitment, StepCommit, sign_commitment

    d = bytes(range(32))
    step = StepCommit((BatchRef(trainer, 4, 1, d),), d, d if stepped else b"", 0.5)
    return sign_commitment(TRAINER, InnerCommitment(
        run_id=RUN, round=4, trainer=trainer, signer="", base=d, payload=d, settings=d, params=1000, leaf=256,
        adam_step=30, state=STATE_GLOBAL, state_root=d, steps=(step, step)))


def opening_seeds() -> list[bytes]:
    from pulse_node.loco.opening import RoundOpening, encode_opening

    proven = (b"\x01" * 64, (b"\x02" * 32, b"\x03" * 32))
    return [encode_opening(RoundOpening(4, "t", (1, 3), (proven, proven), ((proven, proven),))),
            encode_opening(RoundOpening(5, "t", (0,), (proven,)))]


def spot_evidence_seeds() -> list[bytes]:
    import blake3

    from pulse_node.loco.commit import encode_commitment
    from pulse_node.loco.spot_evidence import Accusation, encode_evidence, make_evidence, sign_accusation
    from pulse_node.net.dht.validator import peer_id_of

    target, exhibit = peer_id_of(TRAINER), b"exhibit bytes"
    a = sign_accusation(MEMBER, Accusation(
        run_id=RUN, round=4, target=target, accuser=peer_id_of(MEMBER), signer="", step=1, leaves=(2, 7),
        reason="gradient", keep=1.0, commitment=encode_commitment(_commitment(target)), next_commitment=b"",
        exhibits=(("opening", blake3.blake3(exhibit).digest()), ("patch", blake3.blake3(b"p").digest()))))
    return [encode_evidence(make_evidence(a, {"opening": exhibit})), encode_evidence(make_evidence(a, {}))]


def statement_codecs() -> list[Any]:
    """Every statement type's codec (``chain/statement.py``), in a fixed order."""
    from pulse_node.chain.admission import ADMISSIONS
    from pulse_node.chain.evidence import CONFLICTS
    from pulse_node.chain.record import RECORDS
    from pulse_node.loco.commit import COMMITMENTS
    from pulse_node.loco.decision import DECISIONS
    from pulse_node.loco.opening import OPENINGS
    from pulse_node.loco.spot_evidence import ACCUSATIONS, CARRIED

    return [RECORDS, DECISIONS, ADMISSIONS, CONFLICTS, COMMITMENTS, ACCUSATIONS, CARRIED, OPENINGS]


def statement_seeds() -> list[bytes]:
    """Each statement's samples behind the byte that picks its own codec (and a few behind another's)."""
    from pulse_node.loco.spot_evidence import ACCUSATIONS, decode_evidence

    accusation = ACCUSATIONS.encode(decode_evidence(spot_evidence_seeds()[0]).accusation)
    groups = [record_seeds(), decision_seeds(), admission_seeds(), evidence_seeds(), commitment_seeds(),
              [accusation], spot_evidence_seeds(), opening_seeds()]
    own = [bytes([i]) + data for i, group in enumerate(groups) for data in group]
    return own + [bytes([(i + 1) % len(groups)]) + group[0] for i, group in enumerate(groups)]


def rollout_seeds() -> list[bytes]:
    from pulse_node.rl.rollout import Rollout, encode_rollouts

    rollouts = [Rollout(prompt_ids=[1, 2, 3, i], completion_ids=[5, 6, 7], logprobs=[-0.1, -0.5, -2.0],
                        reward=float(i % 2), version=4, problem_id=f"p{i}", group_id="g0", finished=bool(i % 2),
                        batch=0, sample=i) for i in range(4)]
    return [encode_rollouts(rollouts), encode_rollouts(rollouts[:1])]


def status_seeds() -> list[bytes]:
    from pulse_node.daemon.status_model import new_report

    report = new_report(role="inference", peer_id="12D3KooWfuzz", run_id=RUN)
    return [report.model_dump_json(by_alias=True).encode(),
            new_report(role="trainer", peer_id="12D3KooWt", run_id=RUN).model_dump_json(by_alias=True).encode()]


def dht_entry(ident: Identity, *, expires: float | None = None) -> bytes:
    """A peer record as one DHT entry (subkey, signed value, expiration), msgpack'd for the fuzzer."""
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    from pulse_node.chain.peer import PeerRecord
    from pulse_node.net.dht.records import dht_key
    from pulse_node.net.dht.validator import PulseRecordValidator, peer_id_of

    pid, exp = peer_id_of(ident), expires or (time.time() + 3600)
    body = PeerRecord(role="trainer", peer_id=pid, session="ab" * 16, updated_at=time.time(), version=3,
                      wire_maddrs=[f"/ip4/127.0.0.1/tcp/4001/p2p/{pid}"], node_key=ident.public_key_hex)
    raw = DHTRecord(DHTID.generate(source=dht_key(RUN, "peers")).to_bytes(), DHTProtocol.serializer.dumps(pid),
                    DHTProtocol.serializer.dumps(body.model_dump()), exp)
    signed = PulseRecordValidator(RUN, ident).sign_value(raw)
    return msgpack.packb([raw.subkey, signed, exp], use_bin_type=True)


def dht_seeds() -> list[bytes]:
    return [dht_entry(TRAINER), dht_entry(NEWCOMER)]


def peer_body_seeds() -> list[bytes]:
    from pulse_node.net.dht.validator import open_envelope

    return [open_envelope(msgpack.unpackb(s)[1])[0] for s in dht_seeds()]


def request_classes() -> list[Any]:
    """Every local RPC request type (both workers'), in a fixed order."""
    import pulse_node.net.dht.rpc
    import pulse_node.net.wire.rpc  # noqa: F401
    from pulse_node.net.local.rpc_api import Request

    found: set[Any] = set()
    todo: list[Any] = [Request]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if getattr(cls, "rpc_method", None) and not cls.__pydantic_generic_metadata__["parameters"]:
            found.add(cls)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


def rpc_request_seeds() -> list[bytes]:
    from pulse_node.net.local.ipc import encode_frame
    from pulse_node.net.wire import protocol as wp

    classes = [c.__name__ for c in request_classes()]
    params = [("Fetch", {"peer": "/ip4/127.0.0.1/tcp/1/p2p/x", "kind": "record",
                         "request": wp.RecordRequest(version=3).body(), "dest": "/tmp/x", "timeout": 5.0}),
              ("SetMembers", {"peer_ids": ["a", "b"]}), ("Ping", {})]
    return [bytes([classes.index(name) % 256]) + encode_frame({"id": 7, "method": name.lower(), "params": p})[4:]
            for name, p in params if name in classes]


def rpc_reply_seeds() -> list[bytes]:
    from pulse_node.net.local.ipc import encode_frame

    classes = [c.__name__ for c in request_classes()]
    replies = [("Fetch", {"id": 1, "ok": True, "result": {"bytes": 10, "seconds": 0.5, "peer": "p", "total": 10}}),
               ("Ping", {"id": 2, "ok": True, "result": ["ping", "stop"]}),
               ("Fetch", {"id": 3, "ok": False, "error": "NotFound", "message": "no such version"})]
    return [bytes([classes.index(name) % 256]) + encode_frame(r)[4:] for name, r in replies]


def wire_seeds() -> list[bytes]:
    from pulse_node.net.wire import protocol as wp

    kinds = sorted(wp.BODY_CAPS)
    reqs = [wp.RecordRequest(version=3), wp.PatchRequest(version=2), wp.AnchorRequest(version=0, offset=0, length=64)]
    out = [bytes([kinds.index(wp.kind_of(r))]) + r.body() for r in reqs]
    out.append(bytes([len(kinds)]) + wp.Response(v=wp.WIRE_VERSION, status="ok", size=10, total=10, message="").body())
    out.append(bytes([len(kinds) + 1]) + wp.PushRequest(v=wp.WIRE_VERSION, kind="head", size=100).body())
    return out


def anchor_seeds() -> list[bytes]:
    from pulse_node.chain.anchor import split_header
    from pulse_node.chain.layout import state_metadata
    from pulse_node.codec.state import to_safetensors_bytes

    c = context()
    data = to_safetensors_bytes(c.base, metadata=state_metadata(c.records[0]))
    n, _ = split_header(data)
    return [data[:8 + n]]


def safetensors_seeds() -> list[bytes]:
    from pulse_node.codec.state import to_safetensors_bytes

    return [to_safetensors_bytes(context().base)]


def manifest_seeds() -> list[bytes]:
    return [context().records[0].anchor_manifest]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
