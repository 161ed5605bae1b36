"""Per-round contributor agreement: every trainer averages exactly the same PULSELoCo payloads.

The trainer drives a round: ``open_round`` with its payload, then ``step`` until the round
closes, handing over what peers pushed meanwhile (``offer_payload``, ``offer_decision``) for up
to ``idle_s`` between steps. The agreement never waits on the network itself and never calls
back into the trainer. Round ``r``, on every trainer:

1. Push our payload to every live trainer. Like every push of the agreement it goes to all of
   them at once and in the background (``daemon/transport.push_to_all``): no round waits on a
   slow or vanished peer; a payload push is bounded by ``deadline_s``, a decision push by 5 s.
   Our payload and every valid one received are kept as ``loco/<r>/<digest>.payload`` under the
   store root for ``KEEP_ROUNDS`` rounds; peers fetch them (``loco_payload``). A received payload
   is decoded (base-coded, ``loco/payload.py``) only if the base hash it names is ours; one made
   on another base misses the round like a late one (``loco_base_mismatch``; the trainer on the
   wrong state re-syncs). Payloads of a coming round are held undecoded until it opens here.
2. The coordinator is the first of the trainers we saw when pushing in the round's rendezvous
   order (``order``, ``trainer/decisions.coordinator_order``: it changes every round). It
   decides once it holds a payload from each of them still live (one whose payload named another
   base counts as heard from: it cannot contribute) and the open trainers' short windows are over
   (``trainer/pace.py``), or at ``loco.deadline_s``:
   it signs a ``RoundDecision`` naming the payloads it holds (trainer id + BLAKE3 digest),
   keeps it (``loco_decision``) and pushes it to every trainer. A trainer accepts a decision
   only from a coordinator whose turn it is, on its own base (``trainer/decisions.py``), and
   relays the first it accepts for a round, once.
3. The others wait for it. If none came ``loco.decision_wait_s`` after their own deadline, the
   next trainer in ``order`` decides, and so on; past the deadline a coordinator gone from
   discovery is skipped at once. A round closes within ``deadline_s + n * decision_wait_s``.
4. A trainer about to decide on the timeout path, or seeing a peer announce that it finished
   the round, first pulls an existing decision from the live trainers, and never decides a
   round a peer already closed (it re-syncs instead).
5. Everyone applies exactly the decided payloads, fetching those it lacks from the coordinator
   or any trainer (digest checked). A trainer that cannot get them within ``decision_wait_s``,
   or whose state is not the decision's base, gets ``payloads=None`` and must re-sync.

Only trainer-set members take part (``trainer/round_peers.py``, asking the peer book): payloads
and decisions pushed by any other peer are refused and judged its lie, and only members are pushed to, waited for, asked
for decisions and fetched from. Payloads are capped by the model's size before anything is
parsed (``loco/bound.max_payload_bytes``), and every entry is checked against the payload value
bound (``loco/bound.py``) on our base weights before the payload is kept, signed into a decision
or applied; a refused payload counts as heard from (its sender cannot contribute this round).
Payloads of coming rounds are parked only for the next ``PARK_ROUNDS`` rounds, one per member
and round. Which decisions are accepted (designated coordinator, our base, one per round,
equivocation evidence): ``trainer/decisions.py``; refusals are counted by reason
(``decisions_refused``, ``loco_refused``).

Remaining failure case (a decision that reaches only some trainers while another timed out and
decided differently) and its repair: docs/ARCHITECTURE.md, "Trainers agreeing on one state".
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.serving import LOCO_DIR, loco_payload_path
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.errors import BaseMismatchError, IntegrityError, PulseError, WireError
from pulse_node.fsutil import write_atomic
from pulse_node.loco.bound import PayloadBound, PayloadBoundError
from pulse_node.loco.commitlist import VERDICTS, CheckVerdict
from pulse_node.loco.decision import MAX_DECISION_BYTES, RoundDecision, encode_decision, make_decision, payload_digest
from pulse_node.loco.ledger import Ledger
from pulse_node.loco.payload import LocoPayload, read_header
from pulse_node.loco.roundcommit import decode_commit
from pulse_node.loco.roundrules import entering
from pulse_node.loco.verdicts import failing
from pulse_node.net.wire.protocol import LocoDecisionRequest, LocoPayloadRequest
from pulse_node.trainer.commits import CommitIntake, HeldCommit
from pulse_node.trainer.decisions import DecisionIntake, coordinator_order
from pulse_node.trainer.pace import commit_phase_over, payloads_in
from pulse_node.trainer.payload_intake import BaseFn, PayloadIntake
from pulse_node.trainer.round_peers import RoundPeers
from pulse_node.trainer.rounds import WAIT, OpenRound, RoundTable, Wait
from pulse_node.vocab import DecisionRefusal

KEEP_ROUNDS = 4  # rounds whose payloads and decisions a trainer keeps on disk and serves
_PULL_EVERY_S = 1.0
_IDLE_DECIDING_S = 0.05  # how long the driver waits for inputs between steps, reaching a decision
_IDLE_GATHERING_S = 0.2  # ... and gathering the decided payloads (each step tries fetches)


@dataclass
class RoundResult:
    """How a round closes: exactly the decided payloads, or ``payloads=None`` (re-sync needed)."""

    payloads: list[LocoPayload] | None
    decision: RoundDecision | None = None
    mine_included: bool = False


class RoundAgreement:
    """One trainer's side of the contributor agreement (inputs, decisions, payload files)."""

    def __init__(self, ctx: RoleContext[TrainerConfig], *, shapes: Mapping[str, tuple[int, ...]],
                 current_round: Callable[[], int], epoch: Callable[[], bytes], base: BaseFn | None = None,
                 bound: PayloadBound | None = None, ledger: Callable[[], Ledger] | None = None,
                 verdicts: Callable[[int], tuple[list[bytes], list[str]]] | None = None,
                 refutes: Callable[[CheckVerdict, float], bool] | None = None,
                 owed: Callable[[int, float], Mapping[tuple[int, str, str], bytes]] | None = None,
                 culprit: Callable[[CheckVerdict], str | None] | None = None,
                 inner_settings: Callable[[], bytes | None] | None = None) -> None:
        """``epoch``: the epoch of the chain we extend (``chain/record.py``; decisions of another are refused).
        ``base``: our current round's base (``BaseFn``); without it only base-free payloads decode and payloads are
        not checked against a base hash nor the value bound. ``bound``: the payload value bound (default: the one
        ``ctx.cfg`` implies). Who takes part is the node's peer book's (``ctx.book``); ``ledger``: the trust ledger
        of our outer state (default: an empty one, every open trainer a newcomer); ``verdicts(r)``: the spot-check
        verdicts (encoded) and convicted keys a decision of round ``r`` we sign names (``trainer/spot_round.py``;
        default: none); ``refutes(verdict, before)``: whether we can show a verdict a decision names is a lie
        (``SpotRounds.refutes``; default: never); ``owed``: the verdicts a decision must name (``SpotRounds.owed``;
        default: none); ``culprit``: whom our re-check of a verdict's evidence convicts (``SpotRounds.culprit``;
        default: nobody); ``inner_settings()``: the settings inner commitments must name (``SpotRounds.settings``;
        default: any)."""
        self.ctx = ctx
        self.cfg = ctx.cfg.loco
        self.shapes = dict(shapes)
        self.table = RoundTable(current_round, epoch)
        self.me = ctx.transport.peer_id
        self.root = Path(ctx.store.root)
        self.base = base
        self.verdicts = verdicts or (lambda r: ([], []))
        self.peers = RoundPeers(ctx)
        self.commits = CommitIntake(ctx, peers=self.peers, table=self.table, base_of=self._base_of, ledger=ledger or Ledger,
                                    shapes=self.shapes, settings=inner_settings)
        self.bound = bound if bound is not None else PayloadBound.of_trainer(ctx.cfg)
        self.payloads = PayloadIntake(ctx, peers=self.peers, table=self.table, commits=self.commits, shapes=self.shapes,
                                      base=base, bound=self.bound)
        self.inbox, self.pending, self.cap = self.payloads.inbox, self.payloads.pending, self.payloads.cap  # (shared)
        self._cap_pushes()
        self.intake = DecisionIntake(ctx, peers=self.peers, table=self.table, commits=self.commits,
                                     payload_at=self.payloads.payload_at, ledger=ledger or Ledger,
                                     refutes=refutes or (lambda v, before: False), owed=owed or (lambda r, since: {}),
                                     culprit=culprit or (lambda v: ""))
        shutil.rmtree(self.root / LOCO_DIR, ignore_errors=True)  # an earlier run's rounds mean nothing now

    # ---- the table shared with the decision intake (``trainer/rounds.py``) -------------------
    @property
    def decisions(self) -> dict[int, RoundDecision]:
        return self.table.decisions

    @property
    def refused(self) -> dict[int, dict[str, bytes]]:
        return self.table.refused

    @property
    def _open(self) -> OpenRound | None:
        return self.table.open

    def current_round(self) -> int:
        return self.table.current_round()

    # ---- inputs (the trainer hands over every pushed payload and decision) -----------------
    def offer_decision(self, sender: str, data: bytes, *, closed_elsewhere: bool = False) -> None:
        """A pushed or pulled decision, to the decision intake (``trainer/decisions.py``);
        ``PulseError`` if it is refused. ``closed_elsewhere``: pulled from a round most live
        members had closed."""
        self.intake.offer(sender, data, closed_elsewhere=closed_elsewhere)

    def offer_commit(self, sender: str, data: bytes) -> None:
        """A pushed round commitment (``trainer/commits.py``); a payload that waited for it is
        admitted now. ``PulseError`` if it is refused."""
        for trainer in [*self.commits.flush(), self.commits.offer(sender, data)]:
            if trainer is not None:
                self._admit_unbacked(trainer)

    def _admit_unbacked(self, trainer: str) -> None:
        self.payloads.admit_unbacked(trainer)

    def _base_of(self, r: int) -> bytes | None:
        """The base hash round ``r`` starts from here (None: not known yet)."""
        o = self._open
        if o is not None and o.round == r:
            return o.base
        if r == self.current_round() and self.base is not None:
            return self.base()[0]
        return None

    def offer_payload(self, sender: str, data: bytes) -> None:
        """A pushed payload, to the payload intake (``trainer/payload_intake.py``); ``PulseError``
        if it is refused."""
        self.payloads.offer(sender, data)

    def _flush_pending(self) -> None:
        self.payloads.flush_pending()

    # ---- one round ---------------------------------------------------------------------
    def open_round(self, mine: LocoPayload, data: bytes, *, spot: bytes = b"") -> None:
        """Open round ``mine.round``: keep our payload, push our commitment to it (``spot``: our
        encoded inner-step commitment); ``step`` then reveals the payload once the commit phase
        closes, and advances the round."""
        r = mine.round
        self._prune(r)
        self.payloads.keep(mine, data, serve=False)  # nobody may fetch it before we reveal it
        if self.base is not None:
            self.payloads.ratio(self.bound.ratio(mine.tensors, self.base()[1]))
        live = self._live()
        order = coordinator_order(self.ctx.cfg.run_id, r, [*([self.me] if self.peers.i_am_member() else []), *live])
        self.table.open = OpenRound(r, mine.base_hash, order, t0=time.monotonic(), commit_s=self.cfg.deadline_s / 2,
                                    mine=data)
        commitment = self.commits.make_own(r, base=mine.base_hash, payload=payload_digest(data), spot=spot)
        if decode_commit(commitment).payload != payload_digest(data):  # committed to another before a restart
            self.ctx.log.warning("round %d: committed to another payload before; this one sits the round out", r)
            self.table.open.mine = b""
        to = [*live.values(), *self.peers.open_peers(self.commits.round(r))]
        self.peers.push(to, commitment, kind="loco_commit", job=f"loco_commit:{r}")
        for trainer in self.commits.flush():
            self._admit_unbacked(trainer)
        self._flush_pending()
        self.intake.replay_parked(r)

    def _reveal(self, o: OpenRound) -> bool:
        """Reveal our payload once the commit phase closed here (``trainer/pace.py``: every live
        member's commitment held and the open trainers' window over, or ``commit_s`` passed).
        Whether it is revealed."""
        if o.revealed:
            return True
        live, held, ledger = self._live(), self.commits.round(o.round), self.intake.ledger()
        open_live = [t for t in self.peers.live_open(o.round) if not ledger.convicted(t)]  # out for good: not waited for
        if not commit_phase_over(o, now=time.monotonic(), members=live, open_live=open_live,
                                 held=held, wait_s=self.cfg.open_wait_s):
            return False
        o.revealed = True
        if not o.mine:  # committed to another payload before a restart: nothing to reveal
            return True
        digest, data = payload_digest(o.mine), o.mine
        self.payloads.arrived.setdefault(o.round, {})[self.me] = time.monotonic()  # no one held it before
        write_atomic(loco_payload_path(self.root, o.round, digest.hex()), data, durable=False)
        self.peers.push(list(live.values()), data, kind="loco", timeout=self.cfg.deadline_s, job=f"loco:{o.round}")
        with self.ctx.status.trainer() as counters:
            counters.loco_bytes_out += len(data) * len(live)
        return True

    def step(self) -> RoundResult | None:
        """Advance the open round as far as the inputs at hand allow, without waiting.

        Returns how the round closed, or None while it waits for inputs: the caller hands over
        what arrived (``offer_payload``, ``offer_decision``) for up to ``idle_s``, then steps again.
        """
        o = self._open
        if o is None:
            raise RuntimeError("step() without an open round")
        if o.decision is None:
            if not self._reveal(o) and o.round not in self.decisions and not self.ctx.stop.is_set() \
                    and not self._behind(o):
                return None
            d = self._reach_decision(o)
            if d is WAIT:
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
    def idle_s(self) -> float:  # how long the caller may wait for inputs before the next ``step``
        return _IDLE_GATHERING_S if self._open is not None and self._open.decision else _IDLE_DECIDING_S

    def _close(self, result: RoundResult) -> RoundResult:
        self.table.open = None
        return result

    def _reach_decision(self, o: OpenRound) -> RoundDecision | Wait | None:
        """The round's decision: pushed to us, pulled, or made by us when it is our turn."""
        while not self.ctx.stop.is_set():
            self.intake.replay_parked(o.round)
            if o.round in self.decisions:
                return self.decisions[o.round]
            now, live = time.monotonic(), self._live()
            if self._my_turn(o.round, o.order, live, o.t0, now):
                return self._decide(o, live, pull=not self._all_in(o.round, o.order, live))
            if now - o.pulled_at > _PULL_EVERY_S and self._closed_elsewhere(o.round, live):
                o.pulled_at = now
                if self._pull(o.round, live) is None:
                    if self._held_back(o.round):
                        return WAIT  # a peer applied a decision we refused or parked: its turn, or the next coordinator's
                    return None  # a peer closed the round and we cannot get its decision: re-sync
                continue
            return WAIT
        return None

    def _my_turn(self, r: int, order: list[str], live: Mapping[str, PeerRecord], t0: float, now: float) -> bool:
        """Whether we decide round ``r`` now (module docstring, steps 2 and 3)."""
        deadline = t0 + self.cfg.deadline_s
        if self.me not in order:  # an open trainer never decides
            return False
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

    def _all_in(self, r: int, order: list[str], live: Mapping[str, PeerRecord]) -> bool:
        """Every live member's payload is here (or cannot count), and every open trainer's that
        entered the round with a commitment in our commit phase, or its reveal window is over
        (``trainer/pace.py``)."""
        heard = {*self.inbox.get(r, {}), *self.payloads.mismatched.get(r, set()), *self.refused.get(r, {})}
        o = self._open
        committed = {t: h for t, h in self.commits.round(r).items() if o is None or h.at <= o.commit_close}
        entered = entering(committed, is_member=self.peers.is_member, ledger=self.intake.ledger())
        members = all(pid in heard for pid in order if pid == self.me or pid in live)
        return payloads_in(o, now=time.monotonic(), members_in=members, held=heard, wait_s=self.cfg.open_wait_s,
                           open_entered=[t for t in entered if not self.peers.is_member(t)])

    def _behind(self, o: OpenRound) -> bool:
        """An open trainer whose round most members closed already: it pulls the decision at once
        rather than waiting out a commit phase nobody else is in any more."""
        return not self.peers.i_am_member() and self.closed_elsewhere(o.round)

    def closed_elsewhere(self, r: int) -> bool:
        """Most live members closed round ``r`` already (``_closed_elsewhere``)."""
        return self._closed_elsewhere(r, self._live())

    def _closed_elsewhere(self, r: int, live: Mapping[str, PeerRecord]) -> bool:
        """Most live members announce a version past round ``r`` (they published ``r + 1``; one
        member alone may be a coordinator that applied a decision we refused); a claim more than
        ``max_version_step`` ahead is no member's honest progress and is ignored."""
        step = self.ctx.book.gate.max_version_step
        return 2 * sum(1 for p in live.values() if r < p.head <= r + step) > len(live)

    def _decide(self, o: OpenRound, live: Mapping[str, PeerRecord], *, pull: bool) -> RoundDecision | None:
        """Sign and push the decision of round ``o.round``: every commitment we hold that arrived
        in the commit phase, and the payloads we hold that match them and were made on our base."""
        r, base = o.round, o.base
        self._reveal(o)
        if pull or self._closed_elsewhere(r, live):  # never a second decision of a round decided elsewhere
            if self._pull(r, live) is not None:
                return self.decisions[r]
            if self._closed_elsewhere(r, live) and not self._held_back(r):
                return None
        earlier = self.intake.signed_before(r)  # never two decisions of one round, even across a restart
        if earlier is not None:
            d, data = earlier
            if d.base != base:
                return None  # we decided it on another state before: re-sync
        else:
            committed = {tid: h for tid, h in self.commits.round(r).items() if h.at <= o.commit_close}
            self._fetch_missing(r, committed, live)
            verdicts, convicted = self.verdicts(r)  # a key failing a check they name enters no payload now
            ledger = self.intake.ledger()
            entered = entering(committed, is_member=self.peers.is_member, ledger=ledger,
                               failed=failing(map(VERDICTS.decode, verdicts), ledger, convicted=convicted))
            held = {tid: digest for tid, (digest, p) in self.inbox.get(r, {}).items() if p.base_hash == base
                    and tid in entered and committed[tid].commit.payload == digest and self.peers.may_contribute(tid)}
            if not held:  # not even ours (we sit the round out after a restart): no decision to make
                return None
            d = make_decision(self.ctx.identity, run_id=self.ctx.cfg.run_id, round=r, base=base, epoch=self.table.epoch(),
                              coordinator=self.me, contributors=held,
                              committed={tid: h.digest for tid, h in committed.items()},
                              open=[tid for tid in held if not self.peers.is_member(tid)],
                              verdicts=verdicts, convicted=convicted)
            data = encode_decision(d)
            self.intake.keep_own(r, data)
        self.intake.accept(d, data)
        # the open trainers that committed learn it at once too: pulled late, they would lag a round behind
        to = [*live.values(), *self.peers.open_peers(self.commits.round(r))]
        self.peers.push(to, data, kind="loco_decision", job=f"loco_decision:{r}")
        with self.ctx.status.trainer() as counters:
            counters.decisions_made += 1
        self.ctx.log.info("round %d: decided %d contributors", r, len(d.contributors))
        return d

    def _held_back(self, r: int) -> bool:
        """Whether we refused a decision of round ``r`` for an omission, or hold one back
        (``DecisionIntake.holds_back``): a peer that applied it does not make us re-sync onto it."""
        return r in self.table.omitted or self.intake.holds_back(r)

    def _fetch_missing(self, r: int, committed: Mapping[str, HeldCommit], live: Mapping[str, PeerRecord]) -> None:
        """Fetch each committed payload that did not reach us (a lost push, or one revealed to some
        trainers only): from the trainer itself, else from a live member that holds it (payloads
        are served by digest). A decision may leave out only what nobody could get, so a trainer
        revealing to some members only cannot have them refuse the coordinator's decision."""
        until = time.monotonic() + self.cfg.decision_wait_s / 2
        opened = {p.peer_id: p for p in self.peers.open_peers(committed)}
        for tid, h in sorted(committed.items()):
            if tid in self.inbox.get(r, {}) or tid in self.refused.get(r, {}):
                continue
            own = live.get(tid) or opened.get(tid)
            holders = [p for pid, p in sorted(live.items()) if pid != tid]
            for peer in [own, *holders] if own is not None else holders:
                if time.monotonic() >= until or self._fetch_payload(peer, r, tid, h.commit.payload, until) is not None:
                    break

    def _pull(self, r: int, live: Mapping[str, PeerRecord]) -> RoundDecision | None:
        """Fetch an existing decision of round ``r`` from the live trainers (the first valid one)."""
        timeout = min(self.ctx.cfg.net.fetch_timeout_s, self.cfg.decision_wait_s)
        elsewhere = self._closed_elsewhere(r, live)
        for peer in sorted(live.values(), key=lambda p: p.peer_id.encode()):
            data = self.peers.fetch(peer, LocoDecisionRequest(round=r), cap=MAX_DECISION_BYTES, timeout=timeout)
            if data is None:
                continue
            try:
                self.offer_decision(peer.peer_id, data, closed_elsewhere=elsewhere)
            except PulseError as exc:
                with self.ctx.status.node() as counters:
                    counters.rejected += 1
                self.ctx.status.error(f"bad decision from {peer.peer_id[:12]}: {exc}")
            if r in self.decisions:
                with self.ctx.status.trainer() as counters:
                    counters.decisions_pulled += 1
                return self.decisions[r]
        return None

    # ---- the decided payloads ------------------------------------------------------------
    def _gather(self, o: OpenRound, d: RoundDecision) -> RoundResult | None:
        """Exactly the decided payloads, fetched where missing (None: still waiting for some);
        ``payloads=None`` if they cannot be had by ``o.gather_until``."""
        while len(o.payloads) < len(d.contributors):
            tid, digest = d.contributors[len(o.payloads)]
            p = self._obtain(d, tid, digest, o.gather_until)
            if p is WAIT:
                return None
            if p is None:
                self.ctx.status.error(f"round {d.round}: decided payload of {tid[:12]} unavailable")
                return RoundResult(None, d)
            o.payloads.append(p)
        return RoundResult(o.payloads, d, mine_included=self.me in d.trainer_ids)

    def _obtain(self, d: RoundDecision, tid: str, digest: bytes, until: float) -> LocoPayload | Wait | None:
        """A decided payload: held, or fetched from a live member (the coordinator first); None
        if it cannot be had in time or is beyond the value bound (the round then re-syncs)."""
        have = self.inbox.get(d.round, {}).get(tid)
        if have is not None and have[0] == digest:
            return have[1]
        if self.ctx.stop.is_set() or time.monotonic() >= until or digest in self.refused.get(d.round, {}).values():
            return None
        live = self._live()
        for peer in sorted(live.values(), key=lambda p: (p.peer_id != d.coordinator, p.peer_id.encode())):
            p = self._fetch_payload(peer, d.round, tid, digest, until)
            if p is not None:
                return p
        return WAIT

    def _fetch_payload(self, peer: PeerRecord, r: int, tid: str, digest: bytes, until: float) -> LocoPayload | None:
        timeout = max(0.5, min(self.ctx.cfg.net.fetch_timeout_s, until - time.monotonic()))
        data = self.peers.fetch(peer, LocoPayloadRequest(round=r, digest=digest.hex()), cap=self.cap, timeout=timeout)
        if data is None:
            return None
        try:
            if payload_digest(data) != digest:
                raise IntegrityError(f"payload from {peer.peer_id[:12]} does not match the decided digest")
            h = read_header(data, max_bytes=self.cap, max_tensors=len(self.shapes))
            if (h.trainer_id, h.round) != (tid, r):
                raise WireError(f"payload from {peer.peer_id[:12]} is not the decided one")
            p = self.payloads.decode(data)
        except BaseMismatchError as exc:  # decided on our base, yet made on another: never decoded
            self.payloads.base_mismatch(r, tid, exc)
            return None
        except PayloadBoundError as exc:  # a decision naming it is refused: never applied
            self.refused.setdefault(r, {})[tid] = digest
            coordinator = self.decisions[r].coordinator if r in self.decisions else peer.peer_id
            self.peers.refuse(coordinator, DecisionRefusal.OUT_OF_BOUND, str(exc), lied=True)
            return None
        except PulseError as exc:
            with self.ctx.status.node() as counters:
                counters.rejected += 1
            self.ctx.status.error(f"round {r}: {exc}")
            return None
        self.payloads.keep(p, data)
        with self.ctx.status.trainer() as counters:
            counters.loco_fetched += 1
        return p

    # ---- plumbing ------------------------------------------------------------------------
    def _cap_pushes(self) -> None:
        """Tell the push planes our payload cap: a larger push is refused before it is read."""
        try:
            self.ctx.transport.cap_pushes("loco", self.cap)
        except PulseError as exc:
            self.ctx.log.warning("cannot lower the push plane's payload cap: %s", exc)

    def _live(self) -> dict[str, PeerRecord]:
        """Live trainer-set members but us (``RoundPeers.live``)."""
        return self.peers.live()

    def _prune(self, r: int) -> None:
        """Forget rounds before ``r``; keep the files of the last ``KEEP_ROUNDS`` rounds."""
        self.commits.prune(r)
        self.payloads.prune(r)
        self.table.prune(r)
        self.intake.prune(r)
        folder = self.root / LOCO_DIR
        for path in folder.iterdir() if folder.is_dir() else []:
            if path.name.isdigit() and int(path.name) < r - KEEP_ROUNDS:
                shutil.rmtree(path, ignore_errors=True)

