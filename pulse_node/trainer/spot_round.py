"""Spot checks in the real rounds: commit, draw, answer, check, verdict, evidence (trainer side).

On with ``chain.open_trainers`` (an open trainer earns weight only by checks passed) or ``loco.spot.keyed``
(``config.runs_spot_checks``), on a trainer with ``grpo.bf16_compute`` on one process or several (a
trainer that cannot record refuses to start; a commitment without an inner one is refused,
``trainer/commits.py``). Per round ``r``:

1. **Commit.** The engine records every inner step (``InnerStepLog``, ``begin`` after the local
   weights were reset); the round commitment carries the signed inner commitment (``commitment``).
2. **Draw.** Once the decision of ``r`` is applied (``decided``, before the outer step), every
   trainer computes the same draw (``loco/spotdraw.draw_round``) seeded by the decided payloads'
   bytes (``round_seed``: unknown to anyone before every payload was revealed): targets are the
   contributors with an inner commitment (and keys owing a check), each checked at
   ``loco.spot.rate``, newcomers, owing keys and unproven members (no check passed yet) always
   and by ``newcomer_verifiers``; verifiers are the decision's member contributors, never the target.
3. **Answer.** A drawn target publishes its answer (``trainer/spot_answers.py``: served by
   digest, its signed receipt relayed to every member like a commitment; every member fetches it).
4. **Check.** A verifier fetches the answer once its receipt came and runs ``SpotChecker.check``
   on its own model copy in the background (``trainer/spot_worker.py``) once the round's applied
   share is known; no answer served within ``loco.spot.answer_wait_s`` is ``unanswered`` (no
   evidence: the target owes a check). A verdict ``refutes`` shows a lie (``unanswered`` of a
   target whose answer a member holds, or of a check nobody drew) is refused there, a strike on
   its verifier. It signs a ``CheckVerdict`` (``loco/commitlist.py``)
   and pushes it to the live members; a failure on the target's data first pushes the evidence
   (``accuse``). Members relay both once.
5. **Re-check.** A member receiving evidence re-runs it (``recheck``) on the round's base it kept:
   confirmed, the target is struck (``Lied``); a false accusation strikes the accuser.
6. **Ledger.** A coordinator's decision names the verdicts it holds (``verdicts_for``) and, for
   each failure with evidence it re-checked, the key it convicts (target, or a false accuser);
   every trainer checks them (``loco/verdicts.py``), refuses one leaving out a verdict it must
   name (``owed``), and its ledger applies them alike (``loco/ledger.py``: failed = out of that
   round, then owing; convicted = out for good).

Not done: the link check (the next round's start opened against this round's end) is not asked
for; a verifier keeps the round's base (an FP32 and a BF16 copy of the weights) for
``keep_rounds`` rounds and a second copy of the model for its checks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import blake3
import torch

from pulse_node.chain.serving import loco_payload_path
from pulse_node.codec.state import State
from pulse_node.config import TrainerConfig, runs_spot_checks
from pulse_node.daemon.context import RoleContext
from pulse_node.errors import IntegrityError, PulseError, WireError
from pulse_node.loco.commit import InnerCommitment, decode_commitment, encode_commitment
from pulse_node.loco.commitlist import MAX_VERDICT_BYTES, VERDICTS, CheckVerdict, make_verdict
from pulse_node.loco.config import SpotConfig
from pulse_node.loco.decision import MAX_DECISION_VERDICTS, RoundDecision, payload_digest
from pulse_node.loco.ledger import VERDICT_WINDOW, Ledger
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.spot_answer import SpotAnswer, answer_cap
from pulse_node.loco.spot_evidence import SpotEvidence, decode_evidence, encode_evidence, verify_accusation
from pulse_node.loco.spotdraw import Shape, SpotDraw, draw_round, round_seed
from pulse_node.peers.outcomes import Lied
from pulse_node.torchbits import module_state
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.commits import MAX_OPEN
from pulse_node.trainer.engine import Engine
from pulse_node.trainer.recompute import RoundBase, SpotCase, SpotFailure
from pulse_node.trainer.spot_answers import BATCH_BYTES, Answers
from pulse_node.trainer.spot_evidence import Recheck, RecheckResult
from pulse_node.trainer.spot_record import InnerStepLog
from pulse_node.trainer.spot_replay import inner_settings
from pulse_node.trainer.spot_worker import Finished, SpotWorker

MAX_EVIDENCE = 64  # evidences held (re-checked or waiting)


@dataclass
class _Pending:
    """A check we verify: what the target committed and sent, the round as we hold it."""

    draw: SpotDraw
    commitment: InnerCommitment
    payload: LocoPayload
    data: bytes
    base: RoundBase
    states: dict[int, State]
    until: float = float("inf")
    keep: float | None = None  # the applied share, once the outer step ran
    queued: bool = False


class SpotRounds:
    """This trainer's part in the round's spot checks (module docstring)."""

    def __init__(self, ctx: RoleContext[TrainerConfig], *, engine: Engine, agreement: RoundAgreement,
                 ledger: Callable[[], Ledger], states: Callable[[], Mapping[int, State]]) -> None:
        cfg = ctx.cfg
        self.ctx, self.cfg, self.spot = ctx, cfg, cfg.loco.spot
        self.agreement, self.peers, self.me = agreement, agreement.peers, agreement.me
        self.ledger, self.states = ledger, states
        self.enabled = runs_spot_checks(cfg) and cfg.grpo.bf16_compute
        self.engine = engine
        self.log = InnerStepLog(engine.shapes, keep=self.spot.keep_rounds + 1) if self.enabled else None
        engine.inner_log = self.log
        self.worker: SpotWorker | None = None
        self.pending: dict[tuple[int, str, str], _Pending] = {}
        self.answers = Answers(ctx, peers=self.peers, current_round=agreement.current_round, epoch=agreement.table.epoch,
                               cap=self.answer_cap)
        self.params = sum(math.prod(s) for s in engine.shapes.values())  # the model's size: every commitment's
        self.published: set[int] = set()  # rounds we published our answer of
        #: round -> (keys its decision named a commitment of that is not held here: their draws are
        #: unknown here; the (target, verifier) pairs drawn)
        self.drawn: dict[int, tuple[set[str], set[tuple[str, str]]]] = {}
        self.caps: dict[tuple[int, str], int] = {}  # (round, drawn target) -> the most bytes its answer takes
        self.bases: dict[int, tuple[RoundBase, dict[int, State]]] = {}
        self.verdicts: dict[tuple[int, str, str], tuple[CheckVerdict, bytes]] = {}
        self.evidence: dict[bytes, SpotEvidence] = {}
        self.judged: dict[bytes, RecheckResult] = {}
        self.judged_at: dict[bytes, float] = {}  # when our re-check of an evidence finished
        self.arrived: dict[tuple[int, str, str], float] = {}  # when a verdict came (or we signed it)

    # ---- our own round ------------------------------------------------------------------
    def begin(self, *, round: int, base_hash: bytes) -> None:
        """Start recording round ``round`` (the local weights were just reset to its base)."""
        if self.log is not None:
            self.engine.begin_inner_log(round=round, base_hash=base_hash)

    def commitment(self, round: int, payload: bytes) -> bytes:
        """Our encoded inner commitment of ``round`` behind the payload bytes ``payload`` (empty:
        none, e.g. the round was not recorded from its start)."""
        if self.log is None or self.log.open_round != round:
            return b""
        c = self.log.commitment(self.ctx.identity, run_id=self.cfg.run_id, trainer=self.me,
                                payload=payload_digest(payload), settings=inner_settings(self.engine.learner, self.cfg.loco))
        return encode_commitment(c)

    def settings(self) -> bytes | None:
        """Our inner-step settings' digest, which every inner commitment we take must name
        (``trainer/commits.py``, where the swarm runs spot checks)."""
        return inner_settings(self.engine.learner, self.cfg.loco)

    # ---- the draw -----------------------------------------------------------------------
    def decided(self, d: RoundDecision, *, base: Mapping[str, torch.Tensor]) -> None:
        """Round ``d.round`` is decided and about to be applied: draw its checks, answer those on
        us, expect the answers of those we verify."""
        if not self.enabled:
            return
        seed = self._seed(d)
        if seed is None:
            return
        draws = self._draw(d, seed)
        self.drawn = {r: x for r, x in self.drawn.items() if d.round - r <= VERDICT_WINDOW}
        if draws and self.peers.i_am_member():  # members verify and re-check: they keep the round's base
            fp32 = {n: t.detach().clone() for n, t in base.items()}
            self.bases[d.round] = (RoundBase(d.round, module_state(fp32.items()), fp32), dict(self.states()))
            self.bases = {r: b for r, b in self.bases.items() if r > d.round - self.spot.keep_rounds}
        for draw in draws:
            if draw.target == self.me:
                self._answer(draw)
            elif draw.verifier == self.me:
                self._expect(d, draw)
        with self.ctx.status.trainer() as counters:
            counters.spot_drawn += len(draws)

    def _seed(self, d: RoundDecision) -> bytes | None:
        """``round_seed`` over the decided payloads' bytes (kept as files by the agreement)."""
        data = {}
        for tid, digest in d.contributors:
            try:
                data[tid] = loco_payload_path(self.agreement.root, d.round, digest.hex()).read_bytes()
            except OSError:
                self.ctx.status.error(f"round {d.round}: no file of the decided payload of {tid[:12]}; no checks drawn")
                return None
        return round_seed(d.round, data)

    def _draw(self, d: RoundDecision, seed: bytes) -> list[SpotDraw]:
        inners, unknown = {}, set()
        for tid, named in d.commitments.items():
            held = self.agreement.commits.of(d.round, tid)
            if held is None or held.digest != named:
                unknown.add(tid)
            if held is None or not held.commit.spot or held.digest != named:
                continue
            try:
                inners[tid] = decode_commitment(held.commit.spot)
            except WireError:
                continue
        shapes = {tid: Shape(len(c.steps), c.params, c.leaf) for tid, c in inners.items()}
        ledger = self.ledger()
        draws = round_draws(d, seed, shapes=shapes, ledger=ledger, is_member=self.peers.is_member, spot=self.spot)
        self.drawn[d.round] = (unknown, {(x.target, x.verifier) for x in draws})
        self.verdicts = {k: v for k, v in self.verdicts.items() if k[0] != d.round or not self.refutes(v[0])}  # held early
        self.arrived = {k: t for k, t in self.arrived.items() if k in self.verdicts}
        self.caps = {k: c for k, c in self.caps.items() if k[0] in self.drawn} | \
            {(d.round, x.target): self._cap(inners[x.target], step=x.step) for x in draws}
        return draws

    def _answer(self, draw: SpotDraw) -> None:
        """Publish our answer for ``draw`` (once per round: every draw on us opens one step alike)."""
        if self.log is None or draw.round in self.published:
            return
        r = draw.round
        try:
            patch = None if draw.step == 0 else self.log.weights_patch(r, draw.step)
            answer = SpotAnswer(r, self.me, draw.step, self.log.open(r, draw.leaves), self.log.batch_bytes(r, draw.step),
                                patch)
        except (KeyError, IndexError) as exc:
            self.ctx.status.error(f"round {r}: cannot answer the check of {draw.verifier[:12]}: {exc}")
            return
        self.published = {x for x in self.published if x > r - VERDICT_WINDOW} | {r}
        try:
            self.answers.publish(answer)
        except (OSError, PulseError) as exc:
            self.ctx.status.error(f"round {r}: cannot publish our spot answer: {exc}")

    def _expect(self, d: RoundDecision, draw: SpotDraw) -> None:
        """Hold what our check of ``draw`` needs besides the target's answer."""
        r, target = d.round, draw.target
        held, have = self.agreement.commits.of(r, target), self.agreement.inbox.get(r, {}).get(target)
        if held is None or have is None or r not in self.bases:
            return
        digest, payload = have
        try:
            data = loco_payload_path(self.agreement.root, r, digest.hex()).read_bytes()
            commitment = decode_commitment(held.commit.spot)
        except (OSError, PulseError):
            return
        base, states = self.bases[r]
        self.pending[draw.round, target, self.me] = _Pending(draw, commitment, payload, data, base, states)

    def applied(self, r: int, outer: OuterOptimizer) -> None:
        """Round ``r``'s outer step ran: the share of each target's payload it applied is known."""
        until = time.monotonic() + self.spot.answer_wait_s
        for p in self.pending.values():
            if p.draw.round == r and p.keep is None:
                t = p.draw.target
                p.keep, p.until = (outer.kept.get(t, 0.0) if outer.trust.get(t, 0.0) > 0.0 else 0.0), until

    # ---- what peers push ----------------------------------------------------------------
    def offer_answer(self, sender: str, data: bytes) -> None:
        """A target's answer receipt, pushed or relayed (``trainer/spot_answers.py``; ``PulseError`` if refused)."""
        self.answers.offer(sender, data)

    def offer_verdict(self, sender: str, data: bytes) -> None:
        """A verifier's signed verdict, held for the decisions (``PulseError`` if refused)."""
        if len(data) > MAX_VERDICT_BYTES:
            raise WireError(f"a verdict of {len(data)} bytes")
        v = VERDICTS.decode(data)
        if not (self.peers.is_member(sender) and self.peers.is_member(v.verifier)):
            raise IntegrityError(f"verdict of {v.verifier[:12]} pushed by {sender[:12]}: no member's")
        VERDICTS.verify(v, signer_key=self.peers.key_of(v.verifier), tag=f"verdict of {v.verifier[:12]}")
        if self.refutes(v):
            self.peers.book.judge(v.verifier, Lied(f"a verdict on {v.target[:12]} of round {v.round} we can refute"))
            raise IntegrityError(f"verdict of {v.verifier[:12]} on {v.target[:12]}: no answer of one whose receipt we "
                                 "hold, or a check nobody drew")
        if (v.run_id, v.epoch) != (self.cfg.run_id, self.agreement.table.epoch()) or v.key in self.verdicts or \
                not 0 <= self.agreement.current_round() - v.round <= VERDICT_WINDOW:
            return
        if sum(1 for k in self.verdicts if k[0] == v.round and k[2] == v.verifier) >= self._checks_per_verifier():
            raise WireError(f"verdict of {v.verifier[:12]} on round {v.round}: more than one verifier's checks of a round")
        self.verdicts[v.key], self.arrived[v.key] = (v, bytes(data)), time.monotonic()
        if self.peers.i_am_member():  # relayed once, like a commitment: every member holds it
            to = [p for pid, p in self.peers.live().items() if pid not in (sender, v.verifier)]
            self.ctx.push_in_background("spot_verdict", bytes(data), to, job=f"spot_verdict:{v.round}:{v.target}:{v.verifier}")

    def _checks_per_verifier(self) -> int:
        """The most checks one verifier can be drawn for in a round (one per target: every member
        but itself and the open trainers a round holds), the bound on the verdicts of one verifier
        and round held here before the round is drawn (after, the draw refutes any other)."""
        return len(self.peers.live()) + MAX_OPEN

    def offer_evidence(self, sender: str, data: bytes) -> None:
        """A member's evidence of a failed check, pushed or relayed: re-checked here in the background
        and relayed once (a decision must name its verdict: ``owed``, so every member holds it).
        Held once per check (round, target, accuser) of the last ``VERDICT_WINDOW`` rounds that the
        round's draw made (as drawn here), its accusation signed by its accuser: a re-check costs
        about an inner step, so a member's evidence costs what its drawn checks allow (``PulseError``
        if refused, a strike on the accuser for a check nobody drew)."""
        ev = decode_evidence(data)
        digest, a = blake3.blake3(data).digest(), ev.accusation
        if not (self.peers.is_member(sender) and self.peers.is_member(a.accuser)) or digest in self.evidence:
            return
        if a.run_id != self.cfg.run_id or not 0 <= self.agreement.current_round() - a.round <= VERDICT_WINDOW:
            raise WireError(f"spot evidence of round {a.round} of {a.run_id!r}: not a check of the last rounds")
        verify_accusation(a, signer_key=self.peers.key_of(a.accuser))
        drawn = self.drawn.get(a.round)
        if drawn is not None and a.target not in drawn[0] and (a.target, a.accuser) not in drawn[1]:
            self.peers.book.judge(a.accuser, Lied(f"evidence of a check of {a.target[:12]} nobody drew"))
            raise IntegrityError(f"spot evidence of {a.accuser[:12]} on {a.target[:12]}: a check nobody drew")
        if any(_slot(e) == _slot(ev) for e in self.evidence.values()):
            return  # the check accused already: its first evidence is the one re-checked
        if len(self.evidence) >= MAX_EVIDENCE:
            self.judged.pop(oldest := next(iter(self.evidence)), None)
            self.judged_at.pop(oldest, None)
            self.evidence.pop(oldest)
        self.evidence[digest] = SpotEvidence(a, {})  # its exhibits live only as long as its re-check job
        if self.peers.i_am_member():
            to = [p for pid, p in self.peers.live().items() if pid not in (sender, ev.accusation.accuser)]
            self.ctx.push_in_background("spot_evidence", bytes(data), to, job=f"spot_evidence:{digest.hex()[:16]}")
        held = self.bases.get(ev.accusation.round)
        if held is None:
            self.judged[digest] = RecheckResult(Recheck.INCONCLUSIVE, "", "this trainer does not hold the round")
            return
        base, states = held
        if not self._worker().recheck(digest, ev, base, key_of=self.peers.key_of, state_of=_state_of(base, states)):
            self._judge(digest, RecheckResult(Recheck.INCONCLUSIVE, "", "the re-check queue is full"))  # never waited for

    # ---- the loop -----------------------------------------------------------------------
    def tick(self) -> None:
        """Start the checks whose answer came, close those past their wait, take finished ones."""
        if not self.enabled:
            return
        now, old = time.monotonic(), self.agreement.current_round() - VERDICT_WINDOW
        self.pending = {k: p for k, p in self.pending.items() if k[0] >= old}  # never applied here (a re-sync)
        if self.peers.i_am_member():
            self.answers.pull(wait_s=self.spot.answer_wait_s)
        for key, p in list(self.pending.items()):
            if p.keep is None or p.queued:
                continue
            a = self.answers.fetch(p.draw.round, p.draw.target, until=p.until)
            if a is not None and a.step == p.draw.step:
                case = SpotCase(p.commitment, a.opening, a.batches, a.patch, p.payload, p.keep)
                p.queued = self._worker().check(p.draw, case, p.base, payload_bytes=p.data,
                                                state_of=_state_of(p.base, p.states))
            elif now > p.until:
                del self.pending[key]
                self._sign(p.draw, SpotFailure.UNANSWERED.value)  # no answer served us (a receipt alone is none)
        if self.worker is not None:
            for f in self.worker.done():
                self._finished(f)

    def _finished(self, f: Finished) -> None:
        with self.ctx.status.trainer() as counters:
            counters.spot_seconds += f.seconds
        if f.kind == "recheck" and f.recheck is not None and isinstance(f.key, bytes):
            self._judge(f.key, f.recheck)
            return
        if f.verdict is None or not isinstance(f.key, tuple):
            return
        self.pending.pop(f.key, None)
        if f.verdict.reason is SpotFailure.SETTINGS:
            self.ctx.status.error(f"round {f.key[0]}: {f.key[1][:12]} trains with other inner-step settings")
            return
        digest = b""
        if f.evidence is not None:
            data = encode_evidence(f.evidence)
            digest = blake3.blake3(data).digest()
            self.evidence[digest] = SpotEvidence(f.evidence.accusation, {})
            self._judge(digest, RecheckResult(Recheck.CONFIRMED, self.peers.key_of(f.key[1]), f.verdict.detail, f.verdict))
            self.ctx.push_in_background("spot_evidence", data, list(self.peers.live().values()),
                                        job=f"spot_evidence:{digest.hex()[:16]}")
        self._sign(f.verdict.draw, f.verdict.reason.value if f.verdict.reason else "", evidence=digest)

    def _sign(self, draw: SpotDraw, reason: str, *, evidence: bytes = b"") -> None:
        """Sign, keep and push our verdict of ``draw``."""
        v = make_verdict(self.ctx.identity, run_id=self.cfg.run_id, epoch=self.agreement.table.epoch(), round=draw.round,
                         target=draw.target, verifier=self.me, reason=reason, evidence=evidence)
        data = VERDICTS.encode(v)
        self.verdicts[v.key], self.arrived[v.key] = (v, data), time.monotonic()
        with self.ctx.status.trainer() as counters:
            if v.passed:
                counters.spot_passed += 1
            else:
                counters.spot_failed += 1
        self.ctx.log.info("round %d: spot check of %s %s", draw.round, draw.target[:12], "passed" if v.passed else reason)
        self.ctx.push_in_background("spot_verdict", data, list(self.peers.live().values()),
                                    job=f"spot_verdict:{draw.round}:{draw.target}")

    def _judge(self, digest: bytes, result: RecheckResult) -> None:
        self.judged[digest], self.judged_at[digest] = result, time.monotonic()
        ev = self.evidence.get(digest)
        if ev is None or result.outcome is Recheck.INCONCLUSIVE:
            return
        a = ev.accusation
        culprit = a.target if result.outcome is Recheck.CONFIRMED else a.accuser
        if culprit != self.me:
            self.peers.book.judge(culprit, Lied(f"spot check of round {a.round}: {result.detail}"))

    # ---- what a decision of ours names ---------------------------------------------------
    def verdicts_for(self, r: int) -> tuple[list[bytes], list[str]]:
        """The verdicts (encoded) a decision of round ``r`` names: those held of the last rounds the
        ledger has not applied, a failure with evidence once we re-checked it; the keys they convict."""
        ledger, out, convicted = self.ledger(), list[bytes](), list[str]()
        self.verdicts = {k: v for k, v in self.verdicts.items() if r - k[0] <= VERDICT_WINDOW}
        self.arrived = {k: t for k, t in self.arrived.items() if k in self.verdicts}
        for key, (v, data) in sorted(self.verdicts.items(), key=lambda kv: (kv[0][0], kv[0][1].encode(), kv[0][2].encode())):
            if key in ledger.applied or not 0 < r - v.round <= VERDICT_WINDOW or len(out) >= MAX_DECISION_VERDICTS \
                    or self.refutes(v):
                continue
            if v.evidence:
                culprit = self.culprit(v)
                if not culprit:
                    continue  # not re-checked (conclusively) yet: a later decision names it
                if not ledger.convicted(culprit):
                    convicted.append(culprit)
            out.append(data)
        return out, sorted(set(convicted), key=str.encode)

    def owed(self, r: int, *, since: float) -> dict[tuple[int, str, str], bytes]:
        """The failed verdicts with evidence a decision of round ``r`` must name (``trainer/decisions.py``):
        held here, their evidence re-checked here (conclusively), both before ``since`` (our round
        ``r`` opened), of a round two to ``VERDICT_WINDOW`` before ``r`` (its coordinator had a
        round to re-check it too), not applied by the ledger yet."""
        ledger, out = self.ledger(), {}
        for key, (v, data) in self.verdicts.items():
            if not self.culprit(v) or key in ledger.applied or not 2 <= r - v.round <= VERDICT_WINDOW:
                continue
            if max(self.arrived.get(key, since), self.judged_at.get(v.evidence, since)) < since:
                out[key] = data
        return out

    def answer_cap(self, r: int, target: str) -> int | None:
        """The most bytes ``target``'s answer of round ``r`` may take, if it can matter here: the
        round's draw picked it (once the round is drawn here: bounded at the drawn step), else we
        hold its inner commitment of that round (bounded at any step); None otherwise."""
        if r in self.drawn:
            return self.caps.get((r, target))
        held = self.agreement.commits.of(r, target)
        try:
            return None if held is None or not held.commit.spot else self._cap(decode_commitment(held.commit.spot))
        except WireError:
            return None

    def _cap(self, c: InnerCommitment, *, step: int | None = None) -> int:
        return answer_cap(c, params=self.params, inner_steps=self.cfg.loco.inner_steps, batch_bytes=BATCH_BYTES,
                          step=step)

    def refutes(self, v: CheckVerdict, *, before: float = float("inf")) -> bool:
        """A verdict we can show is a lie: ``unanswered`` of a target whose answer we held since
        before ``before``, a failure naming evidence held here that is not its own accusation (of
        another round, target or accuser: nobody's failure is another's), or a verdict of a check
        the round's draw (as computed here, from the same seed) did not make: a verifier nobody
        drew for its target cannot exclude it, nor anyone check a key no check could be drawn on
        (no commitment that round, or not a contributor nor owing); only a key whose commitment
        the decision named and we do not hold is one whose draw we cannot tell."""
        at = self.answers.answered(v.round, v.target)
        if v.reason == SpotFailure.UNANSWERED.value and at is not None and at <= before:
            return True
        ev = self.evidence.get(v.evidence) if v.evidence else None
        if ev is not None and not _accuses(ev, v):
            return True
        drawn = self.drawn.get(v.round)
        return drawn is not None and v.target not in drawn[0] and (v.target, v.verifier) not in drawn[1]

    def culprit(self, v: CheckVerdict) -> str | None:
        """Whom our re-check of the evidence a failed verdict ``v`` names convicts: its target
        (confirmed) or its verifier (a false accusation); "" if nobody (inconclusive here, or
        no evidence); None if not re-checked here yet, or the evidence held is not ``v``'s own."""
        ev = self.evidence.get(v.evidence) if v.evidence else None
        judged = self.judged.get(v.evidence) if ev is not None and _accuses(ev, v) else None
        if not v.evidence or judged is None:
            return "" if not v.evidence else None
        return {Recheck.CONFIRMED: v.target, Recheck.FALSE_ACCUSATION: v.verifier}.get(judged.outcome, "")

    def _worker(self) -> SpotWorker:
        if self.worker is None:
            self.worker = SpotWorker(self.cfg, self.ctx.identity, me=self.me)
        return self.worker

    def close(self) -> None:
        self.answers.close()
        if self.worker is not None:
            self.worker.close()


def round_draws(d: RoundDecision, seed: bytes, *, shapes: Mapping[str, Shape], ledger: Ledger,
                is_member: Callable[[str], bool], spot: SpotConfig) -> list[SpotDraw]:
    """The checks of decided round ``d`` (module docstring, step 2); ``shapes``: the inner
    commitment of each key ``d`` names a commitment of, as held here. Targets: the contributors
    and the keys owing a check, never a convicted one; checked always (by ``newcomer_verifiers``): owing keys, newcomers
    and unproven members (``loco/ledger.py``)."""
    contributors, targets, always = set(d.trainer_ids), dict[str, Shape](), set[str]()
    for tid, shape in shapes.items():
        if (tid not in contributors and not ledger.owing(tid)) or ledger.convicted(tid):
            continue  # a convicted key is out for good: checking it again costs the verifiers for nothing
        targets[tid] = shape
        member = tid not in d.open if tid in contributors else is_member(tid)
        if ledger.owing(tid) or ledger.newcomer(tid, member=member) or ledger.unproven(tid, member=member):
            always.add(tid)
    verifiers = [t for t in d.trainer_ids if t not in d.open]
    return draw_round(seed, round=d.round, targets=targets, verifiers=verifiers, rate=spot.rate,
                      newcomers=always, newcomer_verifiers=spot.newcomer_verifiers)


def _slot(ev: SpotEvidence) -> tuple[int, str, str]:
    return ev.accusation.round, ev.accusation.target, ev.accusation.accuser


def _accuses(ev: SpotEvidence, v: CheckVerdict) -> bool:
    """Whether ``ev`` is the accusation behind verdict ``v`` (its run, round, target and verifier)."""
    a = ev.accusation
    return (a.run_id, a.round, a.target, a.accuser) == (v.run_id, v.round, v.target, v.verifier)


def _state_of(base: RoundBase, states: Mapping[int, State]) -> Callable[[int], State | None]:
    """The BF16 states a check may verify batches on: the round's own, and those the feed held."""
    return lambda v: base.bf16 if v == base.version else states.get(v)
