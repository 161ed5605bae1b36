"""Per-round contributor agreement: every trainer averages exactly the same PULSELoCo payloads.

The trainer drives a round: ``open_round`` with its payload, then ``step`` until the round
closes, handing over what peers pushed meanwhile (``offer_payload``, ``offer_decision``) for up
to ``idle_s`` between steps. The agreement never waits on the network itself and never calls
back into the trainer. Round ``r``, on every trainer:

1. Push our payload to every live trainer. Like every push of the agreement it goes to all of
   them at once and in the background (``daemon/transport.push_to_all``): no round waits on a
   slow or vanished peer; a payload push is bounded by ``deadline_s``, a decision push by 5 s.
   Our payload and every valid one received are kept as ``loco/<r>/<digest>.payload`` under the
   store root for ``KEEP_ROUNDS`` rounds; peers fetch them (``loco_payload``). A received payload is decoded against our FP32 global weights
   (payloads are base-coded, ``loco/payload.py``) only if the base hash it names is ours, checked
   before any of it is decoded; one made on another base misses the round like a late one
   (counted as ``loco_base_mismatch``, logged once per round and trainer), and a trainer on the
   wrong state is repaired by re-sync (step 5, ``TrainerRole._check_agreement``). Payloads of a
   coming round are held undecoded until that round opens here.
2. The coordinator is the lowest id among the trainers we saw when pushing (``order``). It
   decides once it holds a payload from each of them still live (one whose payload named another
   base counts as heard from: it cannot contribute), or at ``loco.deadline_s``:
   it signs a ``RoundDecision`` naming the payloads it holds (trainer id + BLAKE3 digest),
   keeps it (``loco_decision``) and pushes it to every trainer. A trainer relays the first
   decision it accepts for a round, once.
3. The others wait for it. If none came ``loco.decision_wait_s`` after their own deadline, the
   next trainer in ``order`` decides, and so on; past the deadline a coordinator gone from
   discovery is skipped at once. A round closes within ``deadline_s + n * decision_wait_s``.
4. A trainer about to decide on the timeout path, or seeing a peer announce that it finished
   the round, first pulls an existing decision from the live trainers, and never decides a
   round a peer already closed (it re-syncs instead).
5. Everyone applies exactly the decided payloads, fetching those it lacks from the coordinator
   or any trainer (digest checked). A trainer that cannot get them within ``decision_wait_s``,
   or whose state is not the decision's base, gets ``payloads=None`` and must re-sync.

Decisions are checked (caps, schema, run id, signer = the announced key of the trainer the
decision names as coordinator, a configured trusted trainer key if any, signature); rejections
are counted (``decisions_rejected``). At most one decision is accepted per round; differing
later ones are counted (``decision_conflicts``) and ignored.

Remaining failure case: a decision that reaches only some trainers (its coordinator dies right
after pushing it, before anyone relays it) while another trainer has already timed out, found
no decision to pull and decided differently. The two groups then publish different states for
version ``r + 1``. Trainers push their head records to each other, and one that sees the
lowest-id trainer announcing that version hold another state re-syncs from it
(``TrainerRole._check_agreement``); that trainer also coordinates the next round, so any trainer
still on the other state re-syncs then at the latest, when the decision names a base it lacks.
"""

from __future__ import annotations

import enum
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pulse_node.chain.serving import LOCO_DIR, loco_decision_path, loco_payload_path
from pulse_node.errors import BaseMismatchError, IntegrityError, PulseError, WireError
from pulse_node.fsutil import write_atomic
from pulse_node.loco.decision import (MAX_DECISION_BYTES, RoundDecision, decode_decision, encode_decision,
                                      make_decision, payload_digest, verify_decision)
from pulse_node.loco.payload import LocoPayload, decode_payload, read_header
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.transport import PeerInfo, push_to_all

KEEP_ROUNDS = 4  # rounds whose payloads and decisions a trainer keeps on disk and serves
WINDOW = 4  # payloads and decisions are buffered for the current round and the next WINDOW - 1
_PULL_EVERY_S = 1.0
_PUSH_TIMEOUT_S = 5.0
_IDLE_DECIDING_S = 0.05  # how long the driver waits for inputs between steps, reaching a decision
_IDLE_GATHERING_S = 0.2  # ... and gathering the decided payloads (each step tries fetches)

#: the current round's base: (hash of the FP32 global weights + momentum, those FP32 weights by name)
BaseFn = Callable[[], tuple[bytes, Mapping[str, Any]]]


class _Wait(enum.Enum):
    WAIT = "wait"  # a step can go no further until new inputs arrive


_WAIT = _Wait.WAIT


@dataclass
class OpenRound:
    """The round being agreed on, as far as ``RoundAgreement.step`` got."""

    round: int
    base: bytes
    order: list[str]  # trainers seen when pushing, by id: who decides, and in which turn
    t0: float  # when the round opened here (monotonic)
    pulled_at: float = float("-inf")
    decision: RoundDecision | None = None
    gather_until: float = 0.0
    payloads: list[LocoPayload] = field(default_factory=list)  # decided payloads obtained so far


@dataclass
class RoundResult:
    """How a round closes: exactly the decided payloads, or ``payloads=None`` (re-sync needed)."""

    payloads: list[LocoPayload] | None
    decision: RoundDecision | None = None
    mine_included: bool = False


class RoundAgreement:
    """One trainer's side of the contributor agreement (inputs, decisions, payload files)."""

    def __init__(self, ctx: RoleContext, *, shapes: Mapping[str, tuple[int, ...]],
                 current_round: Callable[[], int], base: BaseFn | None = None) -> None:
        """``base``: our current round's base (``BaseFn``); without it only base-free payloads
        decode and payloads are not checked against a base hash."""
        self.ctx = ctx
        self.cfg = ctx.cfg.loco  # type: ignore[attr-defined]
        self.shapes = dict(shapes)
        self.current_round = current_round
        self._open: OpenRound | None = None
        self.me = ctx.transport.peer_id
        self.root = Path(ctx.store.root)
        self.base = base
        self.inbox: dict[int, dict[str, tuple[bytes, LocoPayload]]] = {}
        self.pending: dict[int, dict[str, bytes]] = {}  # coming rounds: sender -> payload bytes, undecoded
        self.mismatched: dict[int, set[str]] = {}  # round -> trainers whose payload named another base
        self.decisions: dict[int, RoundDecision] = {}
        self.keys: dict[str, str] = {}  # trainer peer id -> node key it announced
        self.trusted = {k.lower() for k in ctx.cfg.chain.trusted_trainers}
        shutil.rmtree(self.root / LOCO_DIR, ignore_errors=True)  # an earlier run's rounds mean nothing now

    # ---- inputs (the trainer hands over every pushed payload and decision) -----------------
    def offer_payload(self, sender: str, data: bytes) -> None:
        """Keep a pushed payload of the current round, hold one of a coming round until it opens.

        ``PulseError`` if it is malformed; one made on another base is not an error (``_admit``).
        """
        self._flush_pending()
        h = read_header(data, max_bytes=self.cfg.max_payload_bytes, max_tensors=len(self.shapes))
        if h.trainer_id != sender:
            raise WireError(f"payload claims trainer {h.trainer_id[:12]} but came from {sender[:12]}")
        if not self._in_window(h.round):
            return
        if h.round > self.current_round():  # its base is the state we do not hold yet
            self.pending.setdefault(h.round, {})[sender] = data
            return
        self._admit(sender, h.round, data)

    def _admit(self, sender: str, r: int, data: bytes) -> None:
        """Decode and keep a payload of the current round if it was made on our base.

        The base hash is compared before anything is decoded with our weights; a payload made on
        another base misses the round (``_base_mismatch``). ``PulseError`` if it is malformed.
        """
        base_hash, params = self.base() if self.base is not None else (None, None)
        try:
            p = decode_payload(data, shapes=self.shapes, max_bytes=self.cfg.max_payload_bytes,
                               base=params, expect_base=base_hash)
        except BaseMismatchError as exc:
            self._base_mismatch(r, sender, exc)
            return
        self._keep_payload(p, data)

    def _flush_pending(self) -> None:
        """Admit held payloads of the round that is now current; drop those of past rounds."""
        r = self.current_round()
        for k in sorted(k for k in self.pending if k <= r):
            held = self.pending.pop(k)
            for sender, data in held.items() if k == r else ():
                try:
                    self._admit(sender, k, data)
                except PulseError as exc:
                    self.ctx.status.add("rejected")
                    self.ctx.status.error(f"bad loco from {sender[:12]}: {exc}")

    def _base_mismatch(self, r: int, trainer: str, exc: BaseMismatchError) -> None:
        """Count (and log) once per round and trainer a payload made on another global state."""
        seen = self.mismatched.setdefault(r, set())
        if trainer in seen:
            return
        seen.add(trainer)
        self.ctx.status.add("loco_base_mismatch")
        self.ctx.log.warning("round %d: %s; not decoded, %s misses this round (a trainer on another "
                             "state re-syncs)", r, exc, trainer[:12])

    def offer_decision(self, sender: str, data: bytes) -> None:
        """Check a decision; accept (and relay) the first of its round. ``PulseError`` if bad."""
        try:
            d = decode_decision(data)
            self._verify(d)
        except PulseError:
            self.ctx.status.add("decisions_rejected")
            raise
        if self._in_window(d.round) and self._accept(d, data):
            relay_to = [p for pid, p in self._live().items() if pid not in (sender, d.coordinator)]
            self._push(relay_to, data, kind="loco_decision")

    def _verify(self, d: RoundDecision) -> None:
        if d.run_id != self.ctx.cfg.run_id:
            raise IntegrityError(f"round {d.round} decision is for run {d.run_id!r}")
        key = self.ctx.identity.public_key_hex if d.coordinator == self.me else self._key_of(d.coordinator)
        if not key:
            raise IntegrityError(f"round {d.round} decision names {d.coordinator[:12]}, not a known trainer")
        if self.trusted and key.lower() not in self.trusted:
            raise IntegrityError(f"round {d.round} decision of {d.coordinator[:12]}: not a trusted trainer key")
        verify_decision(d, signer_key=key)

    def _accept(self, d: RoundDecision, data: bytes) -> bool:
        """Take ``d`` if it is the first decision of its round (at most one per round)."""
        have = self.decisions.get(d.round)
        if have is not None:
            if (have.base, have.contributors) != (d.base, d.contributors):
                self.ctx.status.add("decision_conflicts")
                self.ctx.log.warning("round %d: ignoring a second, different decision from %s",
                                     d.round, d.coordinator[:12])
            return False
        self.decisions[d.round] = d
        write_atomic(loco_decision_path(self.root, d.round), data, durable=False)  # served by the wire worker
        return True

    def _keep_payload(self, p: LocoPayload, data: bytes) -> None:
        digest = payload_digest(data)
        self.inbox.setdefault(p.round, {})[p.trainer_id] = (digest, p)
        write_atomic(loco_payload_path(self.root, p.round, digest.hex()), data, durable=False)

    def _in_window(self, r: int) -> bool:
        return 0 <= r - self.current_round() < WINDOW

    # ---- one round ---------------------------------------------------------------------
    def open_round(self, mine: LocoPayload, data: bytes) -> None:
        """Open round ``mine.round``: keep our payload and push it; ``step`` then advances it."""
        r = mine.round
        self._prune(r)
        self._flush_pending()
        self._keep_payload(mine, data)
        live = self._live()
        self._push(list(live.values()), data, kind="loco", timeout=self.cfg.deadline_s)
        self.ctx.status.add("loco_bytes_out", len(data) * len(live))
        order = sorted([self.me, *live], key=str.encode)
        self._open = OpenRound(r, mine.base_hash, order, t0=time.monotonic())

    def step(self) -> RoundResult | None:
        """Advance the open round as far as the inputs at hand allow, without waiting.

        Returns how the round closed, or None while it waits for inputs: the caller hands over
        what arrived (``offer_payload``, ``offer_decision``) for up to ``idle_s``, then steps again.
        """
        o = self._open
        if o is None:
            raise RuntimeError("step() without an open round")
        if o.decision is None:
            d = self._reach_decision(o)
            if d is _WAIT:
                return None
            if d is None:  # stopping, or a peer closed the round and we cannot get its decision
                return self._close(RoundResult(None))
            o.decision, o.gather_until = d, time.monotonic() + self.cfg.decision_wait_s
            if d.base != o.base:
                self.ctx.status.error(f"round {d.round}: {d.coordinator[:12]} decided on another state than ours")
                return self._close(RoundResult(None, d))
        result = self._gather(o, o.decision)
        return None if result is None else self._close(result)

    @property
    def idle_s(self) -> float:
        """How long the caller may wait for inputs before the next ``step``."""
        return _IDLE_GATHERING_S if self._open is not None and self._open.decision else _IDLE_DECIDING_S

    def _close(self, result: RoundResult) -> RoundResult:
        self._open = None
        return result

    def _reach_decision(self, o: OpenRound) -> RoundDecision | None | _Wait:
        """The round's decision: pushed to us, pulled, or made by us when it is our turn."""
        while not self.ctx.stop.is_set():
            if o.round in self.decisions:
                return self.decisions[o.round]
            now, live = time.monotonic(), self._live()
            if self._my_turn(o.round, o.order, live, o.t0, now):
                return self._decide(o.round, o.base, live, pull=not self._all_in(o.round, o.order, live))
            if now - o.pulled_at > _PULL_EVERY_S and self._closed_elsewhere(o.round, live):
                o.pulled_at = now
                if self._pull(o.round, live) is None:
                    return None  # a peer closed the round and we cannot get its decision: re-sync
                continue
            return _WAIT
        return None

    def _my_turn(self, r: int, order: list[str], live: Mapping[str, PeerInfo], t0: float, now: float) -> bool:
        """Whether we decide round ``r`` now (module docstring, steps 2 and 3)."""
        deadline = t0 + self.cfg.deadline_s
        if order[0] == self.me:
            return now >= deadline or self._all_in(r, order, live)
        if now < deadline:
            return False
        due = deadline + self.cfg.decision_wait_s
        for peer_id in order:
            if peer_id == self.me:
                return True
            if peer_id in live and now < due:
                return False
            due += self.cfg.decision_wait_s
        return True

    def _all_in(self, r: int, order: list[str], live: Mapping[str, PeerInfo]) -> bool:
        held, other_base = self.inbox.get(r, {}), self.mismatched.get(r, set())
        return all(pid in held or pid in other_base for pid in order if pid == self.me or pid in live)

    @staticmethod
    def _closed_elsewhere(r: int, live: Mapping[str, PeerInfo]) -> bool:
        return any(p.version > r for p in live.values())  # it published version r + 1

    def _decide(self, r: int, base: bytes, live: Mapping[str, PeerInfo], *, pull: bool) -> RoundDecision | None:
        """Sign and push the decision of round ``r``: the payloads we hold that were made on ``base``."""
        if pull:
            if self._pull(r, live) is not None:
                return self.decisions[r]
            if self._closed_elsewhere(r, live):
                return None
        held = {tid: digest for tid, (digest, p) in self.inbox.get(r, {}).items() if p.base_hash == base}
        d = make_decision(self.ctx.identity, run_id=self.ctx.cfg.run_id, round=r, base=base,
                          coordinator=self.me, contributors=held)
        data = encode_decision(d)
        self._accept(d, data)
        self._push(list(live.values()), data, kind="loco_decision")
        self.ctx.status.add("decisions_made")
        self.ctx.log.info("round %d: decided %d contributors", r, len(held))
        return d

    def _pull(self, r: int, live: Mapping[str, PeerInfo]) -> RoundDecision | None:
        """Fetch an existing decision of round ``r`` from the live trainers (the first valid one)."""
        timeout = min(self.ctx.cfg.net.fetch_timeout_s, self.cfg.decision_wait_s)
        for peer in sorted(live.values(), key=lambda p: p.peer_id.encode()):
            data = self._fetch(peer, "loco_decision", {"round": r}, cap=MAX_DECISION_BYTES, timeout=timeout)
            if data is None:
                continue
            try:
                self.offer_decision(peer.peer_id, data)
            except PulseError as exc:
                self.ctx.status.add("rejected")
                self.ctx.status.error(f"bad decision from {peer.peer_id[:12]}: {exc}")
            if r in self.decisions:
                self.ctx.status.add("decisions_pulled")
                return self.decisions[r]
        return None

    # ---- the decided payloads ------------------------------------------------------------
    def _gather(self, o: OpenRound, d: RoundDecision) -> RoundResult | None:
        """Exactly the decided payloads, fetched where missing (None: still waiting for some);
        ``payloads=None`` if they cannot be had by ``o.gather_until``."""
        while len(o.payloads) < len(d.contributors):
            tid, digest = d.contributors[len(o.payloads)]
            p = self._obtain(d, tid, digest, o.gather_until)
            if p is _WAIT:
                return None
            if p is None:
                self.ctx.status.error(f"round {d.round}: decided payload of {tid[:12]} unavailable")
                return RoundResult(None, d)
            o.payloads.append(p)
        return RoundResult(o.payloads, d, mine_included=self.me in d.trainer_ids)

    def _obtain(self, d: RoundDecision, tid: str, digest: bytes, until: float) -> LocoPayload | None | _Wait:
        """A decided payload: held, or fetched from a live trainer (the coordinator first)."""
        have = self.inbox.get(d.round, {}).get(tid)
        if have is not None and have[0] == digest:
            return have[1]
        if self.ctx.stop.is_set() or time.monotonic() >= until:
            return None
        live = self._live()
        for peer in sorted(live.values(), key=lambda p: (p.peer_id != d.coordinator, p.peer_id.encode())):
            p = self._fetch_payload(peer, d.round, tid, digest, until)
            if p is not None:
                return p
        return _WAIT

    def _fetch_payload(self, peer: PeerInfo, r: int, tid: str, digest: bytes, until: float) -> LocoPayload | None:
        timeout = max(0.5, min(self.ctx.cfg.net.fetch_timeout_s, until - time.monotonic()))
        data = self._fetch(peer, "loco_payload", {"round": r, "digest": digest.hex()},
                           cap=self.cfg.max_payload_bytes, timeout=timeout)
        if data is None:
            return None
        base_hash, params = self.base() if self.base is not None else (None, None)
        try:
            if payload_digest(data) != digest:
                raise IntegrityError(f"payload from {peer.peer_id[:12]} does not match the decided digest")
            h = read_header(data, max_bytes=self.cfg.max_payload_bytes, max_tensors=len(self.shapes))
            if (h.trainer_id, h.round) != (tid, r):
                raise WireError(f"payload from {peer.peer_id[:12]} is not the decided one")
            p = decode_payload(data, shapes=self.shapes, max_bytes=self.cfg.max_payload_bytes,
                               base=params, expect_base=base_hash)
        except BaseMismatchError as exc:  # decided on our base, yet made on another: never decoded
            self._base_mismatch(r, tid, exc)
            return None
        except PulseError as exc:
            self.ctx.status.add("rejected")
            self.ctx.status.error(f"round {r}: {exc}")
            return None
        self._keep_payload(p, data)
        self.ctx.status.add("loco_fetched")
        return p

    # ---- plumbing ------------------------------------------------------------------------
    def _live(self) -> dict[str, PeerInfo]:
        """Live trainers but us, remembering the node key each announced."""
        live = {p.peer_id: p for p in self.ctx.peers("trainer")}
        self.keys.update({pid: p.node_key for pid, p in live.items() if p.node_key})
        return live

    def _key_of(self, peer_id: str) -> str:
        if peer_id not in self.keys:
            self._live()
        return self.keys.get(peer_id, "")

    def _push(self, peers: list[PeerInfo], data: bytes, *, kind: str, timeout: float = _PUSH_TIMEOUT_S) -> None:
        """Push to every peer at once, in the background: the round never waits on a slow or
        vanished peer (each push is still bounded by ``timeout``; failures are logged per peer)."""
        if not peers:
            return

        def failed(peer: PeerInfo, exc: PulseError) -> None:
            self.ctx.status.error(f"{kind} push to {peer.peer_id[:12]} failed: {exc}")

        threading.Thread(target=push_to_all, args=(self.ctx.transport, peers, kind, data),
                         kwargs={"timeout": timeout, "on_error": failed}, name=f"push-{kind}", daemon=True).start()

    def _fetch(self, peer: PeerInfo, kind: str, params: dict, *, cap: int, timeout: float) -> bytes | None:
        """Bytes of a small fetch from ``peer`` (at most ``cap``), or None on any failure."""
        dest = self.root / LOCO_DIR / f".fetch-{kind}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.ctx.transport.fetch(peer, kind, params, dest, timeout=timeout)
            if dest.stat().st_size > cap:
                raise WireError(f"{kind} from {peer.peer_id[:12]} exceeds {cap} bytes")
            return dest.read_bytes()
        except (PulseError, OSError) as exc:
            self.ctx.log.debug("%s %s from %s: %s", kind, params, peer.peer_id[:12], exc)
            return None
        finally:
            dest.unlink(missing_ok=True)

    def _prune(self, r: int) -> None:
        """Forget rounds before ``r``; keep the files of the last ``KEEP_ROUNDS`` rounds."""
        for table in (self.inbox, self.decisions, self.pending, self.mismatched):
            for old in [k for k in table if k < r]:
                del table[old]
        folder = self.root / LOCO_DIR
        for path in folder.iterdir() if folder.is_dir() else []:
            if path.name.isdigit() and int(path.name) < r - KEEP_ROUNDS:
                shutil.rmtree(path, ignore_errors=True)

