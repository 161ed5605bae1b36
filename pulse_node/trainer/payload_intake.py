"""The payload side of a round: pushed PULSELoCo payloads checked, matched to commitments, kept.

``RoundAgreement`` (``trainer/agreement.py``) hands every pushed payload and round commitment to
its ``PayloadIntake``. A payload is refused unless its sender may contribute (a trainer-set
member), it fits the model's cap (``loco/bound.max_payload_bytes``), its header names its sender
and a round of the window; one of a coming round is parked undecoded (``PARK_ROUNDS``, one per
member and round) until its base is ours. It is decoded only if the base hash it names is ours
(else it misses the round, ``loco_base_mismatch``), every entry is checked against the payload
value bound, and it is kept only if it is the payload its sender committed to
(``trainer/commits.py``): one whose commitment has not arrived waits for it, one that does not
match is refused (``uncommitted``) and counts as heard from. An open trainer's payload is decoded
and held only once its commitment is (at most ``MAX_OPEN`` a round, ``trainer/commits.py``), never
parked for a coming round: a decided one is fetched. So fresh keys pushing payloads hold nothing
here. Kept payloads are written under ``<store>/loco/<round>/`` (served by digest) with the time
they arrived.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from pulse_node.chain.serving import loco_payload_path
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.errors import BaseMismatchError, IntegrityError, PulseError, WireError
from pulse_node.fsutil import write_atomic
from pulse_node.loco.bound import PayloadBound, PayloadBoundError, max_payload_bytes
from pulse_node.loco.decision import payload_digest
from pulse_node.loco.payload import LocoPayload, decode_payload, read_header
from pulse_node.trainer.commits import CommitIntake
from pulse_node.trainer.round_peers import RoundPeers
from pulse_node.trainer.rounds import RoundTable
from pulse_node.vocab import LocoRefusal

PARK_ROUNDS = 2  # payloads of coming rounds are parked for the next PARK_ROUNDS rounds only
#: the current round's base: (hash of the FP32 global weights + momentum, those FP32 weights by name)
BaseFn = Callable[[], tuple[bytes, Mapping[str, object]]]


class PayloadIntake:
    """One trainer's payloads of the current and coming rounds (module docstring)."""

    def __init__(self, ctx: RoleContext[TrainerConfig], *, peers: RoundPeers, table: RoundTable, commits: CommitIntake,
                 shapes: Mapping[str, tuple[int, ...]], base: BaseFn | None, bound: PayloadBound) -> None:
        self.ctx, self.peers, self.table, self.commits = ctx, peers, table, commits
        self.shapes, self.base, self.bound = dict(shapes), base, bound
        self.root = Path(ctx.store.root)
        self.cap = max_payload_bytes(self.shapes, cap=ctx.cfg.loco.max_payload_bytes)
        self.inbox: dict[int, dict[str, tuple[bytes, LocoPayload]]] = {}
        self.pending: dict[int, dict[str, bytes]] = {}  # coming rounds: sender -> payload bytes, undecoded
        self.mismatched: dict[int, set[str]] = {}  # round -> trainers whose payload named another base
        self.unbacked: dict[int, dict[str, bytes]] = {}  # round -> sender -> a payload whose commitment is not here yet
        self.arrived: dict[int, dict[str, float]] = {}  # round -> trainer -> when its payload was kept (monotonic)
        self.ratio_max = 0.0

    @property
    def refused(self) -> dict[int, dict[str, bytes]]:
        return self.table.refused

    def current_round(self) -> int:
        return self.table.current_round()

    def admit_unbacked(self, trainer: str) -> None:
        r = self.current_round()
        data = self.unbacked.get(r, {}).pop(trainer, None)
        if data is None:
            return
        try:
            self._admit(trainer, r, data)
        except PulseError as exc:
            self.ctx.status.error(f"bad loco from {trainer[:12]}: {exc}")

    def payload_at(self, r: int, trainer: str) -> tuple[bytes, float] | None:
        """The digest of ``trainer``'s payload of round ``r`` held here and when it was kept."""
        have, at = self.inbox.get(r, {}).get(trainer), self.arrived.get(r, {}).get(trainer)
        return None if have is None or at is None else (have[0], at)

    def offer(self, sender: str, data: bytes) -> None:
        """Keep a pushed payload of the current round, hold one of a coming round until it opens.

        ``PulseError`` if it is refused (not a member, too large, malformed, out of bound); one
        made on another base is not an error (``_admit``).
        """
        self.flush_pending()
        if self.peers.dropped("loco", sender):
            return
        if not self.peers.may_contribute(sender):
            self._refuse(sender, LocoRefusal.NOT_MEMBER, IntegrityError(f"{sender[:12]} is not a trusted trainer-set member"))
        if len(data) > self.cap:
            self._refuse(sender, LocoRefusal.TOO_LARGE, WireError(f"payload of {len(data)} bytes exceeds this model's cap {self.cap}"))
        try:
            h = read_header(data, max_bytes=self.cap, max_tensors=len(self.shapes))
        except WireError as exc:
            self._refuse(sender, LocoRefusal.MALFORMED, exc)
        if h.trainer_id != sender:
            self._refuse(sender, LocoRefusal.MALFORMED, WireError(f"payload claims trainer {h.trainer_id[:12]} but came from {sender[:12]}"))
        r, now = h.round, self.current_round()
        if not 0 <= r - now <= PARK_ROUNDS:
            if r > now:
                self.peers.refuse(sender, LocoRefusal.TOO_FAR_AHEAD, f"round {r} while at {now}", lied=False)
            return
        if self.peers.banned(sender):  # heard from: it cannot contribute this round
            self.refused.setdefault(r, {}).setdefault(sender, b"")
            self.peers.refuse(sender, LocoRefusal.BANNED, "sender is banned", lied=False)
            return
        if r > now:  # its base is the state we do not hold yet: parked, one per member and round
            if self.peers.is_member(sender):  # an open trainer's is not (fetched if decided)
                self.pending.setdefault(r, {})[sender] = data
            return
        self._admit(sender, r, data)

    def _refuse(self, sender: str, reason: LocoRefusal, exc: PulseError) -> NoReturn:
        """Count and strike a refused payload, then raise ``exc``."""
        self.peers.refuse(sender, reason, str(exc), lied=True)
        raise exc

    def _admit(self, sender: str, r: int, data: bytes) -> None:
        """Decode and keep a payload of the current round if it was made on our base.

        The base hash is compared before anything is decoded with our weights; a payload made on
        another base misses the round (``_base_mismatch``). ``PulseError`` if it is malformed.
        """
        have = self.inbox.get(r, {}).get(sender)
        if have is not None:  # one payload per member and round: the first
            if have[0] != payload_digest(data):
                self.peers.refuse(sender, LocoRefusal.DUPLICATE, f"a second payload for round {r}", lied=False)
            return
        if not self.peers.is_member(sender) and (self.commits.of(r, sender) is None or not self._committed(sender, r, data)):
            return  # an open trainer's, without the commitment it matches held: not decoded, not held
        try:
            p = self.decode(data)
        except BaseMismatchError as exc:
            self.base_mismatch(r, sender, exc)
            return
        except PayloadBoundError as exc:
            self.refused.setdefault(r, {})[sender] = payload_digest(data)
            self._refuse(sender, LocoRefusal.OUT_OF_BOUND, exc)
        except PulseError as exc:
            self._refuse(sender, LocoRefusal.MALFORMED, exc)
        if self._committed(sender, r, data):
            self.keep(p, data)

    def _committed(self, sender: str, r: int, data: bytes) -> bool:
        """Whether ``data`` is the payload ``sender`` committed to for round ``r``; one whose
        commitment has not arrived waits for it (one per sender and round); one that does not
        match it is refused (its sender lied) and counts as heard from."""
        held = self.commits.of(r, sender)
        if held is None:
            self.unbacked.setdefault(r, {})[sender] = data
            return False
        digest = payload_digest(data)
        if held.commit.payload != digest:
            self.refused.setdefault(r, {})[sender] = digest
            self._refuse(sender, LocoRefusal.UNCOMMITTED, IntegrityError(
                f"round {r} payload of {sender[:12]} is not the one it committed to"))
        return True

    def decode(self, data: bytes) -> LocoPayload:
        """Decode against our base and check the value bound (``PayloadBoundError``)."""
        base_hash, params = self.base() if self.base is not None else (None, None)
        p = decode_payload(data, shapes=self.shapes, max_bytes=self.cap, base=params, expect_base=base_hash)
        if params is not None:
            self.ratio(self.bound.check(p.tensors, params, who=f"round {p.round} payload of {p.trainer_id[:12]}"))
        return p

    def ratio(self, ratio: float) -> None:
        """Report the largest value / bound ratio seen (how close honest payloads come to it)."""
        if ratio > self.ratio_max:
            self.ratio_max = ratio
            with self.ctx.status.trainer() as counters:
                counters.loco_bound_ratio_max = ratio

    def flush_pending(self) -> None:
        """Admit held payloads of the round that is now current; drop those of past rounds."""
        r = self.current_round()
        for k in sorted(k for k in self.pending if k <= r):
            held = self.pending.pop(k)
            for sender, data in held.items() if k == r else ():
                try:
                    self._admit(sender, k, data)
                except PulseError as exc:
                    with self.ctx.status.node() as counters:
                        counters.rejected += 1
                    self.ctx.status.error(f"bad loco from {sender[:12]}: {exc}")

    def base_mismatch(self, r: int, trainer: str, exc: BaseMismatchError) -> None:
        """Count (and log) once per round and trainer a payload made on another global state."""
        seen = self.mismatched.setdefault(r, set())
        if trainer in seen:
            return
        seen.add(trainer)
        with self.ctx.status.trainer() as counters:
            counters.loco_base_mismatch += 1
        self.ctx.log.warning("round %d: %s; not decoded, %s misses this round (a trainer on another "
                             "state re-syncs)", r, exc, trainer[:12])

    def keep(self, p: LocoPayload, data: bytes, *, serve: bool = True) -> None:
        """Keep a payload (``serve``: and its file, which peers fetch by digest)."""
        digest = payload_digest(data)
        self.inbox.setdefault(p.round, {})[p.trainer_id] = (digest, p)
        self.arrived.setdefault(p.round, {}).setdefault(p.trainer_id, time.monotonic())
        if serve:
            write_atomic(loco_payload_path(self.root, p.round, digest.hex()), data, durable=False)

    def prune(self, r: int) -> None:
        """Forget rounds before ``r``."""
        for table in (self.inbox, self.pending, self.mismatched, self.unbacked, self.arrived):
            for old in [k for k in table if k < r]:
                del table[old]
