"""Which round decisions a trainer accepts: the designated coordinator's, on our base, one per round.

``RoundAgreement`` (``trainer/agreement.py``) takes every pushed or pulled decision through its
``DecisionIntake.offer`` (a class of its own: it shares only the agreement's ``RoundTable``,
``trainer/rounds.py``, and meets peers through ``RoundPeers``). A decision is checked (caps, schema, run id, signer = the key
the coordinator's peer id encodes, a trainer-set member not convicted, signature, every
contributor a member, no payload we refused as out of bound, the spot-check verdicts and
convictions it names, ``loco/verdicts.py``), then:

1. **Witnessed.** The first verified decision of each (round, signer) is remembered; a second,
   different one signed by the same key is equivocation evidence (``loco/equivocation.py``,
   ``chain/evidence.py``): the key is convicted, refused from then on by this node and by every
   node the evidence reaches, and a decision of it we accepted for the open round is dropped
   (the next coordinator decides).
2. **Designated.** Round ``r``'s coordinators take turns in ``coordinator_order``: the members
   sorted by BLAKE3(run id, ``r``, peer id), a rendezvous order every trainer computes alike
   from public ids (it changes every round, so no member coordinates more than its share of
   rounds, and a view missing some member only differs where that member would have been
   first). The first in the order may decide at once; the one at position ``p`` only from its
   turn on: ``deadline_s`` after the round opened here plus ``decision_wait_s`` for each live
   member before it, less ``decision_wait_s / 2`` for skew between trainers. A decision that
   comes before its turn, or before its round opened here, is parked (a few per round, for the
   rounds of the window) and looked at again at every step: nobody, designated or not, can have
   a decision accepted for a round ahead of time.
3. **On our base.** A decision whose base is not this round's base here is refused (reason
   ``other_base``; a trainer on another state re-syncs when its peers have closed the round),
   so a decision cannot freeze training by naming a base nobody holds.
4. **Naming every commitment** (commit-reveal, ``trainer/commits.py``). Every contributor is
   named among the decision's commitments, and its payload digest is the one its commitment
   names (held here, or fetched: step 6). Before our commit phase closed, a decision is early
   unless it names a commitment of every live member. It must name every commitment held here
   that arrived in our commit phase at least ``decision_wait_s / 2`` ago (skew), and list as a
   contributor every committed trainer whose payload we held as long; else it is refused
   (``omits_commitment``), both signed statements (the decision, the commitment left out) are
   kept under ``loco/<round>/omitted/``, and the next coordinator in turn decides (a peer that applied the
   refused decision does not make us re-sync onto it). Likewise one naming a verdict we can
   refute by what we held as long (``refuted``: no answer of a target whose answer we held, a
   check nobody drew), and one
   leaving out a failed verdict with evidence of a round at least two before, held and re-checked
   here before our round opened (``omits_verdict``, kept like an omission; ``SpotRounds.owed``).
5. **A round closed without us.** A decision we pull once most live members have closed the
   round, nobody having pushed it to us, was made while its coordinator did not count us live
   (we joined, re-synced or were slow): it is taken without the turn and early rules and without
   our own commitment (a coordinator dropping us while honest members hold our commitment
   relayed is refused by them, and the round is then not closed by most). A round closed
   elsewhere is never decided again here.
6. **Naming only commitments we can check** (a member; an open trainer follows the members). A
   commitment it names that is not held here is fetched by its digest and checked like a pushed
   one (``trainer/commit_fetch.py``); a good one is held as never in time (it makes no later
   decision "omit" it), so the payload check and the spot draw see it. One that fails is refused
   (``bad_commitment``) and kept like an omission; the next coordinator decides. A forged one (no
   valid commitment of that trainer for this round), or a contributor's payload its commitment is
   not to, is a strike on the coordinator: the digest binds the bytes, and an honest coordinator
   checks every commitment as we do. One on other terms (a coordinator with spot checks off holds
   it honestly, as ``spot_terms`` is no strike) or the trainer's second commitment (evidence
   against the trainer) is none. One nobody serves parks the decision: not accepted (its payload
   would enter with no check drawable on it), not refused (a partition), and holding nothing back:
   once most live members closed the round with it, a member still unable to fetch it re-syncs,
   like one that cannot get a decided payload.

Every decision names the epoch of the chain its round extends (``loco/decision.py``); one of
another epoch than ours is refused before anything else looks at it (an earlier run's, or a
chain we left). Our own decisions are kept in ``<data_dir>/decided/<epoch>/<round>`` (the last
``OWN_KEEP`` rounds of our current epoch; other epochs' folders are deleted) and signed again
never: a trainer that restarts within a round it decided re-sends that decision (or re-syncs if
it is on another state now) instead of signing a second one and being convicted.

The first decision that passes all of these is accepted (at most one per round; later different
ones from other coordinators are counted as ``decision_conflicts`` and ignored) and relayed once.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal

import blake3
import msgpack

from pulse_node.chain.evidence import encode_evidence
from pulse_node.chain.identity import key_id_of
from pulse_node.chain.serving import LOCO_DIR, loco_decision_path
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status_model import count
from pulse_node.errors import IntegrityError, PulseError
from pulse_node.fsutil import write_atomic
from pulse_node.loco.bound import PayloadBoundError
from pulse_node.loco.commitlist import CheckVerdict
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.decision import (
    MAX_DECISION_BYTES,
    MAX_DECISION_VERDICTS,
    RoundDecision,
    decode_decision,
    encode_decision,
    verify_decision,
)
from pulse_node.loco.ledger import Ledger
from pulse_node.loco.roundrules import entering
from pulse_node.loco.verdicts import failing, named_verdicts, verdict_problems
from pulse_node.peers.outcomes import Reported
from pulse_node.trainer.commit_fetch import CommitFetch
from pulse_node.trainer.commits import CommitIntake
from pulse_node.trainer.round_peers import RoundPeers
from pulse_node.trainer.rounds import OpenRound, RoundTable
from pulse_node.vocab import DecisionRefusal

_ORDER_DOMAIN = b"pulse/coordinator-order/1\0"
PARK_PER_ROUND = 8  # decisions parked per coming round, at most
OWN_KEEP = 8  # rounds whose own decision a trainer keeps on disk
_KEPT = (DecisionRefusal.OMITS_COMMITMENT, DecisionRefusal.OMITS_VERDICT,  # refusals kept as evidence
         DecisionRefusal.BAD_COMMITMENT)
WITNESSED_BASES = 4  # bases per (round, signer) whose first decision is remembered, at most


def coordinator_order(run_id: str, round: int, ids: Iterable[str]) -> list[str]:
    """Round ``round``'s coordinators in turn: rendezvous order of the members' peer ids."""
    prefix = _ORDER_DOMAIN + run_id.encode() + b"\0" + round.to_bytes(8, "big")
    return sorted(set(ids), key=lambda pid: (blake3.blake3(prefix + pid.encode()).digest(), pid.encode()))


def turn_at(order: list[str], who: str, live: Mapping[str, object], *, me: str, deadline: float,
            wait: float) -> float:
    """When ``who`` may decide (monotonic time), by the live members before it in ``order``."""
    pos = order.index(who)
    if pos == 0:
        return float("-inf")
    before = [i for i, pid in enumerate(order[:pos]) if pid == me or pid in live]
    return deadline + (before[-1] + 1) * wait if before else deadline


class DecisionIntake:
    """``RoundAgreement``'s decision side (see the module docstring): it reads and writes the
    agreement's ``RoundTable`` and meets peers through ``RoundPeers``, nothing else of it."""

    def __init__(self, ctx: RoleContext[TrainerConfig], *, peers: RoundPeers, table: RoundTable,
                 commits: CommitIntake, payload_at: Callable[[int, str], tuple[bytes, float] | None],
                 ledger: Callable[[], Ledger], refutes: Callable[[CheckVerdict, float], bool],
                 owed: Callable[[int, float], Mapping[tuple[int, str, str], bytes]],
                 culprit: Callable[[CheckVerdict], str | None] = lambda v: "") -> None:
        """``payload_at(r, trainer)``: the digest of ``trainer``'s round-``r`` payload held here and
        when it arrived (monotonic), or None. ``ledger``: the trust ledger of our outer state.
        ``refutes(verdict, before)``: whether we can show a verdict is a lie, by what came before
        ``before`` (``SpotRounds.refutes``);
        ``owed(r, since)``: the verdicts a decision of round ``r`` must name (``SpotRounds.owed``);
        ``culprit(verdict)``: whom our re-check of its evidence convicts ("": nobody, None: not
        re-checked here yet; ``SpotRounds.culprit``)."""
        self.ctx, self.peers, self.table, self.refutes, self.owed = ctx, peers, table, refutes, owed
        self.culprit = culprit
        self.commits, self.payload_at, self.ledger = commits, payload_at, ledger
        self.cfg: LocoConfig = ctx.cfg.loco
        self.me = peers.me
        self.root = Path(ctx.store.root)
        #: round -> coordinator -> (d, data, elsewhere, sender)
        self.parked: dict[int, dict[str, tuple[RoundDecision, bytes, bool, str]]] = {}
        self.unfetched: dict[int, set[str]] = {}  # round -> coordinators parked until a commitment it names is here
        self.fetch = CommitFetch(ctx, peers=peers, commits=commits)
        #: (round, signer) -> base -> its first verified decision on that base (a few bases at most)
        self.witnessed: dict[tuple[int, str], dict[bytes, bytes]] = {}

    def offer(self, sender: str, data: bytes, *, closed_elsewhere: bool = False) -> None:
        """Check a decision; accept (and relay) it if it passes (module docstring). ``PulseError`` if bad.
        ``closed_elsewhere``: we pulled it from a round most live members had closed."""
        if self.peers.dropped("decision", sender):
            return
        if not self.peers.is_member(sender):
            self.peers.refuse(sender, DecisionRefusal.NOT_MEMBER, "not a trainer-set member", lied=True)
            raise IntegrityError(f"decision pushed by {sender[:12]}, not a trusted trainer-set member")
        try:
            d = decode_decision(data)
            self._verify(d)
            self._witness(d, data, sender=sender)
        except PayloadBoundError as exc:
            self.peers.refuse(sender, DecisionRefusal.OUT_OF_BOUND, str(exc), lied=False)
            raise
        except PulseError as exc:
            self.peers.refuse(sender, DecisionRefusal.BAD_DECISION, str(exc), lied=False)
            raise
        if self.table.in_window(d.round):
            self._consider(d, data, sender=sender, elsewhere=closed_elsewhere)

    def _verify(self, d: RoundDecision) -> None:
        if d.run_id != self.ctx.cfg.run_id:
            raise IntegrityError(f"round {d.round} decision is for run {d.run_id!r}")
        if d.epoch != self.table.epoch():
            raise IntegrityError(f"round {d.round} decision is of epoch {d.epoch.hex()[:8]}, ours is "
                                 f"{self.table.epoch().hex()[:8]} (an earlier run's or another chain's)")
        if not self.peers.is_member(d.coordinator):
            raise IntegrityError(f"round {d.round} decision of {d.coordinator[:12]}: not a trusted trainer-set member")
        verify_decision(d, signer_key=self.peers.key_of(d.coordinator))
        if not all(map(self.peers.may_contribute, d.trainer_ids)):
            raise IntegrityError(f"round {d.round} decision names a contributor outside the trainer set")
        refused = set(self.table.refused.get(d.round, {}).values())
        if any(digest in refused for _, digest in d.contributors):
            raise PayloadBoundError(f"round {d.round} decision names a payload beyond the value bound")
        if (problem := verdict_problems(d, key_of=self.peers.key_of, is_member=self.peers.is_member)) is not None:
            raise IntegrityError(problem)
        if set(d.open) != {t for t in d.trainer_ids if not self.peers.is_member(t)}:
            raise IntegrityError(f"round {d.round} decision calls other contributors open trainers than we do")
        if d.committed and not set(d.trainer_ids) <= self.entering(d):
            raise IntegrityError(f"round {d.round} decision names a contributor the ledger does not let in")
        named = d.commitments
        for tid, digest in d.contributors:
            held = self.commits.of(d.round, tid)
            if held is not None and named[tid] == held.digest and held.commit.payload != digest:
                raise IntegrityError(f"round {d.round} decision names a payload of {tid[:12]} it did not commit to")

    def _witness(self, d: RoundDecision, data: bytes, *, sender: str) -> None:
        """Remember the first decision of (round, signer) on each base; convict the signer on a
        different second one on the same base (one on another base is no conflict: a re-sync)."""
        if not -4 <= d.round - self.table.current_round() < 4:  # bounded: recent and coming rounds only
            return
        bases = self.witnessed.setdefault((d.round, d.signer), {})
        if d.base not in bases and len(bases) >= WITNESSED_BASES:
            return
        first = bases.setdefault(d.base, data)
        if first == data or decode_decision(first).contributors == d.contributors:
            return
        self.ctx.book.judge(sender, Reported("two decisions", evidence=encode_evidence("decision", first, data)))
        if not self.ctx.book.convicted(d.signer):  # both were verified: only a full evidence book says no
            raise IntegrityError(f"{key_id_of(d.signer)} signed two decisions for round {d.round}; not convicted")
        with self.ctx.status.trainer() as c:
            count(c.decisions_refused, DecisionRefusal.EQUIVOCATION)
        accepted = self.table.decisions.get(d.round)
        if accepted is not None and accepted.signer == d.signer:
            self.table.drop_decision(accepted)  # not applied yet: the next coordinator in turn decides
        raise IntegrityError(f"{key_id_of(d.signer)} signed two decisions for round {d.round}: convicted")

    def _consider(self, d: RoundDecision, data: bytes, *, sender: str, elsewhere: bool) -> None:
        """Accept ``d`` if its round is open here, it is its coordinator's turn and on our base;
        park it if it is early."""
        why = self._standing(d, elsewhere=elsewhere, sender=sender)
        if isinstance(why, DecisionRefusal):
            if why not in _KEPT:  # (counted and kept by ``_refuse_omission``)
                self.peers.refuse(sender, why, f"round {d.round} decision of {d.coordinator[:12]}", lied=False)
            return
        if why is not None:  # early, its round is not open here yet, or a commitment it names not here yet: parked
            held = self.parked.setdefault(d.round, {})
            if d.coordinator in held or len(held) < PARK_PER_ROUND:
                held[d.coordinator] = (d, data, elsewhere, sender)
            return
        if self.accept(d, data):
            self.parked.pop(d.round, None)
            self._relay(d, data, sender=sender)

    def _relay(self, d: RoundDecision, data: bytes, *, sender: str = "") -> None:
        """Relay an accepted decision once to the live members; an open trainer relays nothing
        (members refuse a decision pushed by a non-member, and they hold it already)."""
        if self.peers.i_am_member():
            relay_to = [p for pid, p in self.peers.live().items() if pid not in (sender, d.coordinator)]
            self.peers.push(relay_to, data, kind="loco_decision", job=f"loco_decision:{d.round}:relay")

    def _standing(self, d: RoundDecision, *, elsewhere: bool,
                  sender: str) -> DecisionRefusal | Literal["early", "not_open", "unfetched"] | None:
        """None if ``d`` may be accepted now, else why not (``_rules``; then, for a member,
        ``unfetched`` or ``bad_commitment``: ``_named_held``)."""
        why: DecisionRefusal | Literal["early", "not_open", "unfetched"] | None = self._rules(d, elsewhere=elsewhere)
        if why is None and self.peers.i_am_member():
            why = self._named_held(d, sender=sender)
        waiting = self.unfetched.setdefault(d.round, set())
        (waiting.add if why == "unfetched" else waiting.discard)(d.coordinator)
        return why

    def holds_back(self, r: int) -> bool:
        """Whether a decision of round ``r`` is parked here for a reason a peer applying it does not
        remove (early, its convictions not re-checked here yet): that peer does not make us re-sync.
        One parked only until a commitment it names is fetched is none: once most live members
        closed the round with it and we still cannot fetch it, we re-sync (module docstring)."""
        return bool(set(self.parked.get(r, {})) - self.unfetched.get(r, set()))

    def _rules(self, d: RoundDecision, *, elsewhere: bool) -> DecisionRefusal | Literal["early", "not_open"] | None:
        """None if ``d`` passes the rules of steps 2 to 5 (module docstring), else why not
        (``not_open``, ``early``, ``other_base``, ``not_designated``, an omission, ``refuted``)."""
        o = self.table.open
        if o is None or o.round != d.round:
            return "not_open"
        if d.base != o.base:
            return DecisionRefusal.OTHER_BASE
        live = self.peers.live()
        mine = {self.me} if self.peers.i_am_member() else set()  # an open trainer may have committed late
        if not elsewhere and time.monotonic() < o.commit_deadline and not {*mine, *live} <= set(d.commitments):
            return "early"
        # an open trainer follows the members' decisions: it cannot have a next coordinator decide
        if self.peers.i_am_member() and (omission := self._omission(d, o, elsewhere=elsewhere)) is not None:
            self._refuse_omission(d, omission)
            return DecisionRefusal.OMITS_COMMITMENT
        if self.peers.i_am_member() and (left := self._verdict_left_out(d, o)) is not None:
            self._refuse_omission(d, left, reason=DecisionRefusal.OMITS_VERDICT)
            return DecisionRefusal.OMITS_VERDICT
        judged = self._convictions(d, elsewhere=elsewhere) if self.peers.i_am_member() else None
        if self.peers.i_am_member() and (self._refuted(d) or judged == "refuted"):
            self.table.omitted.setdefault(d.round, set()).add(d.coordinator)  # a peer applying it: no re-sync
            return DecisionRefusal.REFUTED
        if judged == "early":
            return "early"
        order = coordinator_order(self.ctx.cfg.run_id, d.round,
                                  [pid for pid in {*o.order, *live} if self.peers.is_member(pid)
                                   and (pid != self.me or self.peers.i_am_member())])
        if d.coordinator not in order and not (elsewhere and self.peers.is_member(d.coordinator)):
            return DecisionRefusal.NOT_DESIGNATED
        if elsewhere:  # a round most live members closed without pushing us its decision: no turn, no early
            return None
        due = turn_at(order, d.coordinator, live, me=self.me, deadline=o.t0 + self.cfg.deadline_s,
                      wait=self.cfg.decision_wait_s)
        return None if time.monotonic() >= due - self.cfg.decision_wait_s / 2 else "early"

    def entering(self, d: RoundDecision) -> set[str]:
        """The keys among ``d``'s commitments whose payloads may count (``loco/roundrules.entering``;
        never the target of a failed verdict ``d`` names); ``d``'s verdicts were checked."""
        ledger = self.ledger()
        return entering(d.commitments, is_member=self.peers.is_member, ledger=ledger,
                        failed=failing(named_verdicts(d), ledger, convicted=d.convicted))

    def _named_held(self, d: RoundDecision, *, sender: str) -> DecisionRefusal | Literal["unfetched"] | None:
        """Hold every commitment ``d`` names that we lack (step 6, ``trainer/commit_fetch.py``): None
        once all are, ``unfetched`` if one cannot be had yet, ``bad_commitment`` if one fails our
        checks (refused and kept; a strike if forged, module docstring)."""
        got = self.fetch.obtain(d, sender=sender)
        if got is None or got == "unfetched":
            return got
        tid, data, fault = got
        self._refuse_omission(d, (tid, data), reason=DecisionRefusal.BAD_COMMITMENT, lied=fault.kind == "forged",
                              why=f"round {d.round} decision names a commitment of {tid[:12]} that fails our "
                                  f"checks ({fault.kind}): {fault.message}")
        return DecisionRefusal.BAD_COMMITMENT

    def _omission(self, d: RoundDecision, o: OpenRound, *, elsewhere: bool) -> tuple[str, bytes] | None:
        """(trainer, what was left out) for a commitment (or revealed payload) held here in time
        that ``d`` leaves out, else None (module docstring, step 4)."""
        named, contributors, entered = d.commitments, dict(d.contributors), self.entering(d)
        skew = self.cfg.decision_wait_s / 2
        cutoff = min(o.commit_close, time.monotonic() - skew)
        for tid, held in sorted(self.commits.round(d.round).items()):
            if held.at > cutoff or (tid == self.me and elsewhere) or self.ctx.book.convicted(self.peers.key_of(tid)):
                continue
            if not self.peers.is_member(tid) and held.at > o.commit_close - skew:
                continue  # an open trainer's, at the end of the commit phase: the coordinator's may have closed first
            if tid not in named:
                return tid, held.data
            have = self.payload_at(d.round, tid)
            if (tid not in contributors and tid in entered and named[tid] == held.digest and have is not None
                    and have[0] == held.commit.payload and have[1] <= time.monotonic() - self.cfg.decision_wait_s / 2):
                return tid, held.data
        return None

    def _refuted(self, d: RoundDecision) -> bool:
        """``d`` names a verdict we can refute by what we held ``decision_wait_s / 2`` before: no
        answer of a target whose answer we held, or a check nobody drew (``refutes``)."""
        cutoff = time.monotonic() - self.cfg.decision_wait_s / 2
        return any(self.refutes(v, cutoff) for v in named_verdicts(d))

    def _convictions(self, d: RoundDecision, *, elsewhere: bool) -> Literal["early", "refuted"] | None:
        """Whether ``d`` convicts whom our own re-checks of the evidence it names convict (``culprit``):
        "refuted" if it convicts a key, or spares a culprit, against them; "early" if it convicts by
        evidence not re-checked here yet (parked until it is; taken from a round closed elsewhere);
        None if they agree, or we cannot tell (our re-check was inconclusive)."""
        named = [(v, self.culprit(v)) for v in named_verdicts(d) if v.evidence]
        ledger, early = self.ledger(), False
        for key in d.convicted:
            backing = [who for v, who in named if key in (v.target, v.verifier)]
            if key in backing or "" in backing:
                continue
            if None not in backing:
                return "refuted"
            early = True
        if any(who and who not in d.convicted and not ledger.convicted(who) for _, who in named):
            return "refuted"
        return "early" if early and not elsewhere else None

    def _verdict_left_out(self, d: RoundDecision, o: OpenRound) -> tuple[str, bytes] | None:
        """(target, verdict) for a failed verdict with evidence ``d`` must name and leaves out
        (``owed``: held and re-checked here before our round opened, a round old at least)."""
        if len(d.verdicts) >= MAX_DECISION_VERDICTS:
            return None
        named = {v.key for v in named_verdicts(d)}
        return next(((k[1], data) for k, data in sorted(self.owed(d.round, o.t0).items()) if k not in named), None)

    def _refuse_omission(self, d: RoundDecision, omission: tuple[str, bytes], *,
                         reason: DecisionRefusal = DecisionRefusal.OMITS_COMMITMENT, why: str = "",
                         lied: bool = False) -> None:
        """Count the refusal once per coordinator and round and keep both signed statements (the
        decision, and the commitment or verdict it leaves out, or the commitment it names that
        fails our checks: ``why``, a strike on the coordinator if ``lied``)."""
        seen = self.table.omitted.setdefault(d.round, set())
        if d.coordinator in seen:
            return
        seen.add(d.coordinator)
        tid, commitment = omission
        self.peers.refuse(d.coordinator, reason, why or f"round {d.round} decision leaves out what {tid[:12]} "
                          "committed, or a verdict on it, held here in time", lied=lied)
        path = Path(self.ctx.store.root) / LOCO_DIR / str(d.round) / "omitted" / f"{d.coordinator[:32]}.msgpack"
        try:
            write_atomic(path, msgpack.packb([encode_decision(d), commitment], use_bin_type=True), durable=False)
        except OSError as exc:
            self.ctx.log.warning("cannot keep the evidence of an omission: %s", exc)

    def replay_parked(self, r: int) -> None:
        """Look again at the parked decisions of round ``r`` (their turn may have come)."""
        for coordinator, (d, data, elsewhere, sender) in sorted(self.parked.get(r, {}).items(),
                                                                 key=lambda kv: kv[0].encode()):
            if r in self.table.decisions:
                return
            why = self._standing(d, elsewhere=elsewhere, sender=sender)
            if why in _KEPT:
                self.parked.get(r, {}).pop(coordinator, None)
                continue
            if why is None and self.accept(d, data):
                self.parked.pop(r, None)
                self._relay(d, data)
                return

    def accept(self, d: RoundDecision, data: bytes) -> bool:
        """Take ``d`` if it is the first decision of its round (at most one per round)."""
        have = self.table.decisions.get(d.round)
        if have is not None:
            if (have.base, have.contributors) != (d.base, d.contributors):
                with self.ctx.status.trainer() as c:
                    c.decision_conflicts += 1
                self.ctx.log.warning("round %d: ignoring a second, different decision from %s",
                                     d.round, d.coordinator[:12])
            return False
        self.table.decisions[d.round] = d
        write_atomic(loco_decision_path(self.root, d.round), data, durable=False)  # served by the wire worker
        return True

    def _own_path(self, r: int) -> Path:
        return Path(self.ctx.cfg.data_dir) / "decided" / self.table.epoch().hex() / str(r)

    def signed_before(self, r: int) -> tuple[RoundDecision, bytes] | None:
        """The decision of round ``r`` we signed earlier (before a restart, too), if any."""
        try:
            data = self._own_path(r).read_bytes()[:MAX_DECISION_BYTES + 1]
            d = decode_decision(data)
            verify_decision(d, signer_key=self.ctx.identity.public_key_hex)
        except (OSError, PulseError):
            return None
        mine = d.round == r and d.run_id == self.ctx.cfg.run_id and d.epoch == self.table.epoch()
        return (d, data) if mine else None

    def keep_own(self, r: int, data: bytes) -> None:
        """Keep our decision of round ``r`` (durably: it must outlive a crash) and forget old ones
        (and every other epoch's)."""
        folder = self._own_path(r).parent
        try:
            write_atomic(self._own_path(r), data)
            for path in folder.iterdir():
                if path.name.isdigit() and int(path.name) < r - OWN_KEEP:
                    path.unlink(missing_ok=True)
            for other in folder.parent.iterdir():
                if other != folder:
                    shutil.rmtree(other) if other.is_dir() else other.unlink()
        except OSError as exc:
            self.ctx.log.warning("cannot keep our decision of round %d: %s", r, exc)

    def prune(self, r: int) -> None:
        for table in (self.parked, self.unfetched):
            for old in [k for k in table if k < r]:
                del table[old]
        self.fetch.prune(r)
        for slot in [s for s in self.witnessed if s[0] < r - 4]:
            del self.witnessed[slot]
