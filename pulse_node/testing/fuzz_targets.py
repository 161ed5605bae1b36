"""Every decoder of a peer's bytes, as a fuzz target: the public call a node makes on those bytes,
and real samples of them to start from (``testing/fuzz_samples.py``).

A target's ``decode(data)`` may return anything or raise a ``PulseError`` (a typed refusal);
any other exception is a crash. ``bench/fuzz.py`` runs every target coverage-guided (atheris),
``tests/test_fuzz.py`` runs each briefly with ``mutations`` and replays every input a run found
crashing (``tests/fuzz_regressions/<target>/``). A new decoder is one ``register`` line.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from pulse_node.errors import PulseError
from pulse_node.testing import fuzz_samples as S


@dataclass(frozen=True)
class Target:
    name: str
    decode: Callable[[bytes], Any]
    seeds: Callable[[], list[bytes]]


TARGETS: dict[str, Target] = {}


def register(name: str, decode: Callable[[bytes], Any], seeds: Callable[[], list[bytes]]) -> None:
    TARGETS[name] = Target(name, decode, seeds)


# ---- the decode calls a node makes on a peer's bytes ----------------------------------------------
def _record(data: bytes) -> Any:
    from pulse_node.chain.record import decode_record, verify_record

    rec = decode_record(data)
    verify_record(rec, run_id=S.RUN, trusted_signers={S.TRAINER.public_key_hex})
    return rec.manifest()


def _patch(data: bytes) -> Any:
    from pulse_node.codec.patch import apply_patch

    return apply_patch(S.context().base, data, verify=True)


def _patch_inplace(data: bytes) -> Any:
    from pulse_node.codec.inplace import apply_patch_inplace

    c = S.context()
    return apply_patch_inplace(S.copy_state(c.base), data, verify=True, base_hash=c.base_hash)


def _patch_streamed(data: bytes) -> Any:
    from pulse_node.codec.limits import check_patch_size
    from pulse_node.codec.pipelined import Expected, GrowingBuffer, apply_streaming

    c = S.context()
    check_patch_size(len(data), c.base)
    buf = GrowingBuffer(len(data), stall_s=1.0)
    buf.append(data)
    return apply_streaming(S.copy_state(c.base), buf, Expected(c.base_hash, c.new_hash, S.digest(data)), workers=1)


def _patch_header(data: bytes) -> Any:
    from pulse_node.codec.patch import parse_patch

    return parse_patch(data)


def _payload(data: bytes) -> Any:
    from pulse_node.loco.payload import decode_payload

    return decode_payload(data, shapes=S.shapes(), max_bytes=1 << 20, base=S.context().fp32)


def _decision(data: bytes) -> Any:
    from pulse_node.loco.decision import decode_decision, verify_decision

    d = decode_decision(data)
    verify_decision(d, signer_key=S.MEMBER.public_key_hex)
    return d


def _admission(data: bytes) -> Any:
    from pulse_node.chain.admission import Admission
    from pulse_node.peers.trainerset import TrainerSet

    adm = Admission.decode(data)
    TrainerSet(run_id=S.RUN, keys=[S.TRAINER.public_key_hex, S.MEMBER.public_key_hex], quorum=1).check(adm)
    return adm


def _evidence(data: bytes) -> Any:
    from pulse_node.errors import IntegrityError
    from pulse_node.peers.book import PeerBook
    from pulse_node.peers.outcomes import Lied, Reported
    from pulse_node.peers.trainerset import TrainerSet

    book = PeerBook(TrainerSet(run_id=S.RUN, keys=[S.TRAINER.public_key_hex, S.MEMBER.public_key_hex]))
    judged = book.judge("fuzzer", Reported("fuzzed evidence", evidence=data))  # checked as every node does
    if isinstance(judged, Lied):
        raise IntegrityError(judged.why)
    return book.convictions()


def _commitment(data: bytes) -> Any:
    from pulse_node.loco.commit import decode_commitment, verify_commitment

    c = decode_commitment(data)
    verify_commitment(c, signer_key=S.TRAINER.public_key_hex)
    return c


def _opening(data: bytes) -> Any:
    from pulse_node.loco.opening import decode_opening

    return decode_opening(data, max_bytes=1 << 20)


def _spot_evidence(data: bytes) -> Any:
    from pulse_node.loco.spot_evidence import decode_evidence, verify_accusation

    ev = decode_evidence(data)
    verify_accusation(ev.accusation, signer_key=S.MEMBER.public_key_hex)
    return ev


def _statement(data: bytes) -> Any:
    """The envelope itself: any statement type's decode on any statement's bytes (the first byte
    picks the type), then its signature checks as a receiver makes them."""
    codecs = S.statement_codecs()
    codec = codecs[data[0] % len(codecs)] if data else codecs[0]
    s = codec.decode(data[1:])
    if codec.signatures == ("signature",):
        codec.verify(s, signer_key=s.signer)
    return s


def _rollouts(data: bytes) -> Any:
    from pulse_node.rl.rollout import decode_rollouts

    return decode_rollouts(data)


def _status(data: bytes) -> Any:
    from pulse_node.daemon.status_model import parse_status

    return parse_status(data)


def _dht_entry(data: bytes) -> Any:
    """One entry of a DHT answer (subkey, value, expiration), as every DHT node checks it, then
    read as the worker reads it."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    from pulse_node.chain.peer import PeerRecord
    from pulse_node.net.dht.records import dht_key, validate_tree
    from pulse_node.net.dht.validator import PulseRecordValidator

    try:
        subkey, value, exp = msgpack.unpackb(data, raw=False)
    except Exception:
        return None
    if not (isinstance(subkey, bytes) and isinstance(value, bytes) and isinstance(exp, (int, float))):
        return None  # hivemind hands the validator bytes, bytes and a float, nothing else
    record = DHTRecord(DHTID.generate(source=dht_key(S.RUN, "peers")).to_bytes(), subkey, value, float(exp))
    validator = PulseRecordValidator(S.RUN, S.MEMBER)
    if validator.validate(record):
        return validate_tree(PeerRecord, msgpack.unpackb(validator.strip_value(record), raw=False))
    return None


def _peer_body(data: bytes) -> Any:
    from pulse_node.net.dht.records import decode_dht_record

    return decode_dht_record("peers", data)


def _rpc_request(data: bytes) -> Any:
    from pulse_node.net.local.ipc import decode_body

    classes = S.request_classes()
    cls = classes[data[0] % len(classes)] if data else classes[0]
    msg = decode_body(data[1:])
    return cls.model_validate(msg.get("params"))


def _rpc_reply(data: bytes) -> Any:
    from pulse_node.net.local.ipc import decode_body, raised_error

    classes = S.request_classes()
    cls = classes[data[0] % len(classes)] if data else classes[0]
    reply = decode_body(data[1:])
    if not reply.get("ok"):
        return raised_error(reply)
    return cls.model_construct().rpc_reply(reply.get("result"))


def _wire(data: bytes) -> Any:
    from pulse_node.net.dht.push import PushHeader
    from pulse_node.net.wire import protocol as wp

    kinds = sorted(wp.BODY_CAPS)
    which, body = (data[0], data[1:]) if data else (0, b"")
    if which < len(kinds):
        return wp.decode_fetch(kinds[which], body)
    structs: list[Any] = [wp.Response, wp.PushRequest, PushHeader]
    return structs[(which - len(kinds)) % 3].decode(body)


def _anchor_header(data: bytes) -> Any:
    from pulse_node.chain.anchor import AnchorManifest, check_header
    from pulse_node.chain.layout import state_metadata
    from pulse_node.inference.anchor_load import check_layout_size

    genesis = S.context().records[0]
    manifest = AnchorManifest.decode(genesis.anchor_manifest)
    n = check_header(data, manifest=manifest, metadata=state_metadata(genesis))
    check_layout_size(data[:n], manifest)
    return n


def _manifest(data: bytes) -> Any:
    from pulse_node.chain.anchor import AnchorManifest

    return AnchorManifest.decode(data)


def _safetensors(data: bytes) -> Any:
    from pulse_node.codec.state import from_safetensors_bytes

    return from_safetensors_bytes(data)


register("version_record", _record, S.record_seeds)
register("patch_compact", _patch, S.patch_seeds)
register("patch_overwrite", _patch, lambda: S.patch_seeds(mode="overwrite"))
register("patch_context", _patch, lambda: S.patch_seeds(position_context=True))
register("patch_inplace", _patch_inplace, lambda: S.patch_seeds() + S.patch_seeds(mode="overwrite"))
register("patch_streamed", _patch_streamed, S.signed_patch_seeds)
register("patch_header", _patch_header, S.patch_seeds)
register("loco_payload", _payload, S.payload_seeds)
register("round_decision", _decision, S.decision_seeds)
register("admission", _admission, S.admission_seeds)
register("evidence", _evidence, S.evidence_seeds)
register("inner_commitment", _commitment, S.commitment_seeds)
register("inner_opening", _opening, S.opening_seeds)
register("spot_evidence", _spot_evidence, S.spot_evidence_seeds)
register("statement", _statement, S.statement_seeds)
register("rollout_batch", _rollouts, S.rollout_seeds)
register("status_record", _status, S.status_seeds)
register("dht_entry", _dht_entry, S.dht_seeds)
register("dht_peer_record", _peer_body, S.peer_body_seeds)
register("rpc_request", _rpc_request, S.rpc_request_seeds)
register("rpc_reply", _rpc_reply, S.rpc_reply_seeds)
register("wire_frame", _wire, S.wire_seeds)
register("anchor_header", _anchor_header, S.anchor_seeds)
register("anchor_manifest", _manifest, S.manifest_seeds)
register("anchor_state", _safetensors, S.safetensors_seeds)


# ---- running inputs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    kind: str  # "decoded", "refused" (a PulseError) or "crash"
    detail: str = ""  # a crash's traceback

    @property
    def signature(self) -> str:
        """Where a crash came from (its type, our innermost frame and the innermost frame of all),
        to tell crashes apart: inputs failing the same way at the same place are one crash."""
        if not self.detail:
            return ""
        frames = [ln.strip() for ln in self.detail.splitlines() if ln.strip().startswith("File ")]
        ours = [f for f in frames if "pulse_node" in f]
        kind = self.detail.strip().splitlines()[-1].split(":")[0]
        return f"{kind} @ {ours[-1] if ours else ''} @ {frames[-1] if frames else ''}"


def run_one(target: Target, data: bytes) -> Outcome:
    try:
        target.decode(data)
    except PulseError:
        return Outcome("refused")
    except Exception:
        return Outcome("crash", traceback.format_exc())
    return Outcome("decoded")


_INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\xff\xff\xff\xff", b"\x00\x00\x00\x80", b"\xcf" + b"\xff" * 8,
                b"\xdd\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff", b"\x91", b"\xc0"]


def mutations(seeds: list[bytes], *, count: int, rng: random.Random) -> Iterator[bytes]:
    """``count`` inputs made from ``seeds`` by the usual blind mutations (bit flips, cuts,
    inserts, copies, splices, interesting values): the fast lane's fuzzing, without coverage."""
    for _ in range(count):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            _mutate(data, seeds, rng)
        yield bytes(data)


def _mutate(data: bytearray, seeds: list[bytes], rng: random.Random) -> None:
    op = rng.randrange(6)
    at = rng.randrange(len(data) + 1)
    if op == 0 and data:
        data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
    elif op == 1:
        del data[at:at + rng.randint(1, 64)]
    elif op == 2:
        data[at:at] = rng.randbytes(rng.randint(1, 16))
    elif op == 3:
        value = rng.choice(_INTERESTING)
        data[at:at + len(value)] = value
    elif op == 4 and data:
        lo = rng.randrange(len(data))
        data[at:at] = data[lo:lo + rng.randint(1, 128)]
    else:
        other = rng.choice(seeds)
        cut = rng.randrange(len(other) + 1)
        data[at:] = other[cut:]
