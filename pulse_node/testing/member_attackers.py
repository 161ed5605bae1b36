"""A trainer-set member gone bad (issue 21, items 6 and 7): what it signs, and the attacks.

A member holds an admitted key, so its signatures verify everywhere; each builder below makes
one thing it could sign to get more than one member's share (``tests/test_node_members_swarm.py``
pushes them into an in-process swarm; ``bench/adversary.py`` runs ``MEMBER_ATTACKS`` as real
attacker processes through ``run_member_attack``, its key being one the bench admitted):

- ``presigned_decisions``: decisions for the coming rounds, signed before they exist;
- ``equivocating_decisions``: two different decisions for one round;
- ``conflicting_heads``: two records for one version on one parent (two histories);
- ``far_head``: a record of version 10**12 - 1 (past every version the swarm will make);
- ``swapped_anchor``: its own record for a real anchor, with other chunk digests;
- ``oversize_push``: a p2pd push declaring 1 GiB, over a trainer's model-derived cap;
- ``oversize_patch``: the next version's record declaring a 2^50-byte patch (issue 34: the streaming
  buffer was allocated at that size, and every inference node exited).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulse_node.net.wire import protocol as wp

if TYPE_CHECKING:
    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import VersionRecord
    from pulse_node.testing.attackers import Attack, Hostile, Report

FAR_VERSION = 10**12 - 1
#: the patch size ``oversize_patch`` signs: far past any model's dense size
HUGE_PATCH = 1 << 50


def record_at(identity: Identity, run_id: str, version: int, *, salt: str = "ab", anchor_manifest: bytes = b"",
              parent: VersionRecord | None = None) -> VersionRecord:
    """A well-formed record of ``version`` signed by ``identity``; ``salt`` picks its state hash;
    on ``parent`` (a record of ``version - 1``), else on a fresh chain of its own."""
    from pulse_node.chain.record import make_record
    from pulse_node.testing.faults import ForgedChain

    if parent is None:
        parent = dataclasses.replace(ForgedChain(run_id, identity).record(1), version=version - 1)
    return make_record(identity, run_id=run_id, version=version, parent=parent, state_hash=(salt * 64)[:64],
                       patch=b"member-" + salt.encode(), anchor_version=version if anchor_manifest else 0,
                       is_anchor=bool(anchor_manifest), codec="pulsesync/compact/1", anchor_manifest=anchor_manifest)


def _decision(identity: Any, me: str, run_id: str, rnd: int, base: bytes, digest: bytes,  # noqa: PLR0917
              epoch: bytes) -> bytes:
    from pulse_node.loco.decision import encode_decision, make_decision

    return encode_decision(make_decision(identity, run_id=run_id, round=rnd, base=base, epoch=epoch, coordinator=me,
                                         contributors={me: digest}))


def presigned_decisions(identity: Any, me: str, run_id: str, rnd: int, *, base: bytes | None = None,
                        epoch: bytes | None = None) -> list[bytes]:
    """Decisions naming only ``me`` for rounds ``rnd`` .. ``rnd + 3``, on ``base`` in ``epoch`` (random if None)."""
    epoch = epoch or os.urandom(32)
    return [_decision(identity, me, run_id, r, base or os.urandom(32), os.urandom(32), epoch) for r in range(rnd, rnd + 4)]


def equivocating_decisions(identity: Any, me: str, run_id: str, rnd: int, *, base: bytes | None = None,
                           epoch: bytes | None = None) -> list[bytes]:
    """Two decisions of round ``rnd`` naming different payloads of ``me`` (in ``epoch``, random if None)."""
    base, epoch = base or os.urandom(32), epoch or os.urandom(32)
    return [_decision(identity, me, run_id, rnd, base, os.urandom(32), epoch) for _ in range(2)]


def swarm_epoch(h: Hostile) -> bytes | None:
    """The epoch of a trainer's head record (anyone may fetch it): what a decision must name."""
    from pulse_node.chain.record import decode_record
    from pulse_node.errors import PulseError

    for rec in h.others("trainer"):
        data = h.fetch(rec, wp.RecordRequest(version=None), max_bytes=1 << 16, timeout=5.0)
        try:
            return bytes.fromhex(decode_record(data).epoch) if data else None
        except PulseError:
            continue
    return None


def conflicting_heads(identity: Identity, run_id: str, version: int) -> list[bytes]:
    """Two records of ``version`` on one parent with different states, both signed by ``identity``
    (equivocation on one chain: evidence)."""
    from pulse_node.chain.record import encode_record
    from pulse_node.testing.faults import ForgedChain

    parent = record_at(identity, run_id, version - 1) if version > 1 else ForgedChain(run_id, identity).record(0)
    return [encode_record(record_at(identity, run_id, version, salt=s, parent=parent)) for s in ("a1", "b2")]


def far_head(identity: Any, run_id: str) -> bytes:
    from pulse_node.chain.record import encode_record

    return encode_record(record_at(identity, run_id, FAR_VERSION, salt="f0"))


def swapped_anchor(identity: Any, real: Any) -> Any:
    """``real`` (an anchor's record) with every chunk digest changed, signed by ``identity``."""
    from pulse_node.chain.anchor import AnchorManifest
    from pulse_node.chain.record import signing_bytes

    m = AnchorManifest.decode(real.anchor_manifest)
    swapped = dataclasses.replace(m, chunks=bytes(b ^ 1 for b in m.chunks)).encode()
    unsigned = dataclasses.replace(real, anchor_manifest=swapped, signer=identity.public_key_hex)
    return dataclasses.replace(unsigned, signature=identity.sign(signing_bytes(unsigned)))


def oversize_patch(identity: Any, head: Any) -> Any:
    """The version after ``head`` (a real record), signed by ``identity``, declaring a patch of
    ``HUGE_PATCH`` bytes."""
    from pulse_node.chain.record import make_record, signing_bytes

    rec = make_record(identity, run_id=head.run_id, version=head.version + 1, parent=head,
                      state_hash=os.urandom(32).hex(), patch=b"member-patch", anchor_version=head.anchor_version,
                      is_anchor=False, codec="pulsesync/compact/1", rollout_settings=head.rollout_settings)
    rec = dataclasses.replace(rec, patch_bytes=HUGE_PATCH)
    return dataclasses.replace(rec, signature=identity.sign(signing_bytes(rec)))


# ---- real attacker processes (bench/adversary.py) ------------------------------------------------
def _every(deadline: float, every: float, step: Callable[[], None]) -> None:
    from pulse_node.errors import PulseError

    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            step()
        except PulseError:
            pass
        time.sleep(max(0.0, every - (time.monotonic() - t0)))


def _round(h: Hostile) -> int:
    return max((r.version for r in h.others("trainer") if r.version is not None), default=0)


def _decisions_attack(h: Hostile, deadline: float, make: Callable[..., list[bytes]], tried: str) -> Report:
    h.announce("inference", None)  # a member key, not a live trainer: never waited for

    def step() -> None:
        for data in make(h.identity, h.peer_id, h.run_id, _round(h), epoch=swarm_epoch(h)):
            for rec in h.others("trainer"):
                h.push(rec, "loco_decision", data)

    _every(deadline, 1.0, step)
    return {"tried": tried}


def presigned(h: Hostile, deadline: float) -> Report:
    return _decisions_attack(h, deadline, presigned_decisions,
                             "member key: decisions for this and the next 3 rounds, signed ahead, on random bases")


def equivocate(h: Hostile, deadline: float) -> Report:
    return _decisions_attack(h, deadline, equivocating_decisions,
                             "member key: two different decisions for one round to every trainer")


def heads(h: Hostile, deadline: float) -> Report:
    h.announce("inference", None)

    def step() -> None:
        for data in conflicting_heads(h.identity, h.run_id, _round(h)):
            for rec in h.others():
                h.push(rec, "head", data)

    _every(deadline, 1.0, step)
    return {"tried": "member key: two signed heads with different states for the current version, to every node"}


def far(h: Hostile, deadline: float) -> Report:
    from pulse_node.chain.layout import store_path
    from pulse_node.fsutil import write_atomic

    data = far_head(h.identity, h.run_id)
    write_atomic(store_path(h.root / "store", "record", FAR_VERSION), data)
    h.announce("inference", FAR_VERSION)  # not a live trainer: a member that never contributes would
    # hold every round up to its deadline, which is not what this attack measures

    def step() -> None:
        for rec in h.others():
            h.push(rec, "head", data)

    _every(deadline, 1.0, step)
    return {"tried": f"member key: announces, serves and pushes a signed head of version {FAR_VERSION}"}


def anchor_swap(h: Hostile, deadline: float) -> Report:
    """Serve its own record for the newest real anchor (other chunk digests) and announce holding it."""
    from pulse_node.chain.layout import store_path
    from pulse_node.chain.peer import Serves
    from pulse_node.chain.record import decode_record, encode_record
    from pulse_node.fsutil import write_atomic

    done: set[int] = set()

    def step() -> None:
        for rec in h.others():
            for a in sorted(set(rec.serves.anchors) - done, reverse=True)[:1]:
                raw = h.fetch(rec, wp.RecordRequest(version=a), max_bytes=1 << 16, timeout=5.0)
                if not raw:
                    continue
                real = decode_record(raw)
                if real.is_anchor and real.anchor_manifest:
                    write_atomic(store_path(h.root / "store", "record", a), encode_record(swapped_anchor(h.identity, real)))
                    done.add(a)
        if done:
            h.announce("inference", max(done), serves=Serves(lowest=min(done), highest=max(done), anchors=sorted(done)))

    _every(deadline, 2.0, step)
    return {"tried": "member key: serves its own signed record for real anchors (other chunk digests)",
            "anchors": sorted(done)}


def oversize(h: Hostile, deadline: float) -> Report:
    """Declare 1 GiB loco pushes on the p2pd plane to every trainer (refused before any body)."""
    from pulse_node.net.dht.push import PushHeader

    h.announce("inference", None)
    answers: dict[str, int] = {}
    raw = PushHeader(v=wp.WIRE_VERSION, kind="loco", size=1 << 30).encode() + b"\0" * 4096

    def step() -> None:
        for rec in h.others("trainer"):
            try:
                reply = h.dht.probe(rec.peer_id, raw, maddrs=tuple(rec.dht_maddrs or ()), timeout=5.0)
                key = wp.Response.decode(reply[4:4 + wp.frame_length(reply[:4], wp.RESPONSE_CAP)]).status
            except Exception as exc:
                key = type(exc).__name__
            answers[key] = answers.get(key, 0) + 1

    _every(deadline, 1.0, step)
    return {"tried": "member key: p2pd pushes declaring 1 GiB of payload to every trainer", "answers": answers}


def patch_size(h: Hostile, deadline: float) -> Report:
    """As soon as a trainer pushes it a head (a member is pushed every head), sign the next
    version's record with a 2^50-byte patch, serve it, announce it and push it to every node."""
    from pulse_node.chain.layout import store_path
    from pulse_node.chain.peer import Serves
    from pulse_node.chain.record import decode_record, encode_record
    from pulse_node.errors import PulseError
    from pulse_node.fsutil import write_atomic

    signed: list[int] = []
    h.announce("inference", None)

    def sign_after(head: Any) -> None:
        data = encode_record(oversize_patch(h.identity, head))
        v = head.version + 1
        write_atomic(store_path(h.root / "store", "record", v), data)
        write_atomic(store_path(h.root / "store", "patch", v), os.urandom(1 << 16))
        signed.append(v)
        for rec in h.others():
            h.push(rec, "head", data)
        h.announce("inference", v, serves=Serves(lowest=v, highest=v))

    def step() -> None:
        for ev in h.wire.events(wait_s=0.5):
            try:
                head = decode_record(ev.data) if ev.kind == "head" else None
            except PulseError:
                continue
            if head is not None and head.signer != h.identity.public_key_hex and head.version + 1 > max(signed, default=-1):
                sign_after(head)

    _every(deadline, 0.0, step)
    return {"tried": f"member key: signs, serves, announces and pushes the record of each next version (on the "
                     f"head a trainer pushed it) declaring a {HUGE_PATCH}-byte patch", "versions_signed": len(signed)}


MEMBER_ATTACKS: dict[str, Attack] = {
    "member_presigned": presigned, "member_equivocate": equivocate, "member_heads": heads,
    "member_far_version": far, "member_anchor_swap": anchor_swap, "member_oversize": oversize,
    "member_patch_size": patch_size,
}


def member_keys(root: Path, names: list[str]) -> dict[str, Path]:
    """One admitted key per member attack in ``names`` (a convicted key stays refused for the
    rest of a run, so each attack brings its own): name -> identity file under ``root/members``."""
    from pulse_node.chain.identity import Identity
    from pulse_node.fsutil import write_atomic
    from pulse_node.net.dht.validator import peer_id_of

    out = {}
    for name in names:
        if name in MEMBER_ATTACKS:
            out[name] = root / "members" / name / "identity.key"
            if name == "member_patch_size" and not out[name].exists():
                # the last of 256 keys by peer id: it sorts after the inference nodes' ids, never takes
                # their rank, so the first of them fetches a fresh version from it (syncer.providers)
                ident = max((Identity.generate() for _ in range(256)), key=peer_id_of)
                out[name].parent.mkdir(parents=True, exist_ok=True)
                write_atomic(out[name], ident.private_pem(), mode=0o600)
            Identity.load_or_create(out[name])
    return out


def run_member_attack(name: str, root: Path, *, identity: Path, run_id: str, bootstrap: list[str], seconds: float,
                      host: str = "127.0.0.1", on_start: Callable[[], None] | None = None) -> Report:
    """Run member attack ``name`` for ``seconds`` under the admitted key file ``identity``;
    ``on_start`` is called once the attacker's workers are up (the bench's window starts then)."""
    from pulse_node.testing.attackers import Hostile

    (root / "key-0").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(identity, root / "key-0" / "identity.key")
    h = Hostile(root / "key-0", run_id, bootstrap, host)
    try:
        if on_start is not None:
            on_start()
        res = MEMBER_ATTACKS[name](h, time.monotonic() + seconds)
        return {**res, "keys": 1, "peer_ids": [h.peer_id], "sent": dict(h.tally), "succeeded": False}
    finally:
        h.close()
