"""Spot checks in the harness's rounds, with the real pieces: draw, checker, evidence, re-check.

After round ``r`` is decided, ``SpotChecks.draw`` seeds the round's draw with its decided
payloads' bytes (``loco/spotdraw.round_seed``) and draws, from the trust ledger (newcomers and
keys owing a check are always checked, by two verifiers), which trainers verifies whom
(``draw_round``); it keeps the round's base (``RoundBase``). Once round ``r + 1``'s commitments
are made (the link check opens the next round's start), ``run`` plays every drawn check:

- an honest verifier runs ``SpotChecker.check`` (``trainer/recompute.py``) on what the target
  answers: an honest or recording trainer answers from its ``InnerStepLog``, an attacker without
  one cannot answer (``unanswered``: no evidence, the target owes a check); a failure on the
  target's data becomes signed evidence (``accuse``) that a node re-checks (``recheck``): a
  confirmed one convicts the target;
- a target's answer is published (its signed receipt relayed like a commitment), so whether it
  answered is a fact every trainer holds: a target that published none fails whoever verifies it,
  and a verdict "it did not answer" of a target that did is refused (no verdict);
- a Byzantine verifier passes a Byzantine target that answered (collusion); of an honest one it
  can only claim no answer (refused) or, if its attack accuses, file false evidence, which the
  re-check pins on it;
- an accusation by a key nobody drew for that check is refused unread (a flood costs nothing).

Every check's outcome is a ``Verdict`` for the ledger (``loco/ledger.py``) of the next round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from pulse_node.chain.identity import Identity
from pulse_node.loco.commit import InnerCommitment
from pulse_node.loco.ledger import Verdict
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.loco.spotdraw import Shape, SpotDraw, draw_round, round_seed
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.testing.byzantine.honest import InnerTrainer
from pulse_node.testing.byzantine.world import World
from pulse_node.torchbits import module_state
from pulse_node.trainer.recompute import RoundBase, SpotCase, SpotChecker, SpotFailure, SpotVerdict
from pulse_node.trainer.spot_evidence import Recheck, accuse, recheck


@dataclass
class Made:
    """One trainer's round as the swarm saw it: its payload (and bytes) and inner commitment."""

    payload: LocoPayload
    data: bytes
    inner: InnerCommitment | None
    commit: bytes = b""  # its encoded round commitment


@dataclass
class Drawn:
    """A decided round's checks, and what they need."""

    round: int
    draws: list[SpotDraw]
    base: RoundBase
    made: dict[str, Made]
    keep: dict[str, float]  # share of each listed trainer's payload the round applied (0: left out)


@dataclass
class Checked:
    """What one round's checks gave: verdicts for the ledger, keys convicted, accusations refused."""

    verdicts: list[Verdict] = field(default_factory=list)
    convicted: set[str] = field(default_factory=set)
    refused: int = 0


def _checker(world: World, seed: int) -> SpotChecker:
    policy = world.policy()
    learner = GRPOLearner(policy, world.cfg.grpo, temperature=world.cfg.sampling.temperature)
    return SpotChecker(learner, RolloutWorker(policy, world.cfg.sampling), world.task, run_id=f"{world.run_id}-{seed}",
                       loco=world.cfg.loco, verify=world.cfg.verify)


class SpotChecks:
    """The real spot checks of the protocol (module docstring)."""

    def __init__(self, world: World, *, seed: int) -> None:
        self.world, self.seed = world, seed
        self.checker: SpotChecker | None = None
        self.pending: Drawn | None = None
        self.seconds = 0.0
        self.answer_seconds = 0.0  # the targets' CPU answering (openings, patch)
        self.checks = 0

    def draw(self, *, base: RoundBase, made: Mapping[str, Made], keep: Mapping[str, float], members: set[str],
             always: set[str], excluded: set[str], unproven: Collection[str] = ()) -> None:
        """Round ``base.version`` was decided (``keep``: the applied shares of the listed trainers;
        ``always``: newcomers and keys owing a check; ``unproven``: members that passed no check yet;
        both checked by ``spot.newcomer_verifiers`` verifiers, so a colluding one cannot pass them alone)."""
        t0 = time.process_time()
        applied = {t: m.data for t, m in made.items() if keep.get(t, 0.0) > 0.0}
        seed = round_seed(base.version, applied)
        targets = {t: Shape(len(m.inner.steps), m.inner.params, m.inner.leaf) for t, m in made.items()
                   if m.inner is not None and t in keep and (t in applied or t in always or t in unproven)
                   and t not in excluded}
        verifiers = [v for v in members if v not in excluded]
        spot = self.world.cfg.loco.spot
        draws = draw_round(seed, round=base.version, targets=targets, verifiers=verifiers, rate=spot.rate,
                           newcomers=(always | set(unproven)) & set(targets), newcomer_verifiers=spot.newcomer_verifiers)
        self.pending = Drawn(base.version, draws, base, dict(made), dict(keep))
        self.seconds += time.process_time() - t0

    def run(self, *, next_made: Mapping[str, Made], trainers: Mapping[str, InnerTrainer], byzantine: set[str],
            keys: Callable[[str], Identity], accusers: set[str]) -> Checked:
        """Play the pending round's checks (module docstring); ``accusers``: Byzantine keys that file
        false evidence against honest targets when drawn."""
        out, d = Checked(), self.pending
        self.pending = None
        if d is None:
            return out
        answers: dict[str, SpotCase | None] = {}  # a target answers once a round (trainer/spot_round.py)
        for draw in d.draws:
            passed = self._one(d, draw, next_made=next_made, trainers=trainers, byzantine=byzantine, keys=keys,
                               accusers=accusers, out=out, answers=answers)
            if passed is not None:
                out.verdicts.append(Verdict(d.round, draw.target, draw.verifier, passed))
            else:
                out.refused += 1
        return out

    def _one(self, d: Drawn, draw: SpotDraw, *, next_made: Mapping[str, Made], trainers: Mapping[str, InnerTrainer],
             byzantine: set[str], keys: Callable[[str], Identity], accusers: set[str], out: Checked,
             answers: dict[str, SpotCase | None]) -> bool | None:
        """The verdict of one check: passed, failed, or None (a lie every trainer refuses). Its
        target's answer is made once a round, as a swarm's target publishes it (every draw on one
        target opens the same step and leaves), and kept in ``answers`` for the round's other draws."""
        target, verifier = draw.target, draw.verifier
        if target not in answers:
            t0 = time.process_time()
            answers[target] = self._answer(d, draw, next_made, trainers.get(target))
            self.answer_seconds += time.process_time() - t0
        case = answers[target]
        if case is None:
            return False  # no answer published: every trainer sees it, whoever the verifier is
        if verifier in byzantine:
            if target in byzantine:
                return True  # a colluding verifier passes its partner
            if verifier in accusers:
                self._file(d, SpotVerdict(draw, SpotFailure.GRADIENT, "a false accusation"), case, keys, out)
            return None  # "it did not answer" of a target whose answer every trainer holds: refused
        t0 = time.process_time()
        self.checker = self.checker or _checker(self.world, self.seed)
        verdict = self.checker.check(draw, case, d.base)
        self.seconds += time.process_time() - t0
        self.checks += 1
        if verdict.reason in (None, SpotFailure.UNANSWERED, SpotFailure.SETTINGS):
            return verdict.ok
        self._file(d, verdict, case, keys, out)
        return False

    def _answer(self, d: Drawn, draw: SpotDraw, next_made: Mapping[str, Made],
                trainer: InnerTrainer | None) -> SpotCase | None:
        m = d.made[draw.target]
        if trainer is None or trainer.log is None or m.inner is None or draw.target not in d.keep:
            return None
        nxt = next_made.get(draw.target)
        try:
            return trainer.answer(draw, m.inner, m.payload, keep=d.keep[draw.target],
                                  next_commitment=nxt.inner if nxt is not None else None)
        except KeyError:  # its log no longer holds the round: it cannot answer
            return None

    def _file(self, d: Drawn, verdict: SpotVerdict, case: SpotCase | None, keys: Callable[[str], Identity],
              out: Checked) -> None:
        """The verifier's evidence, re-checked as any node would: the culprit is convicted."""
        if case is None:
            return
        t0 = time.process_time()
        v = verdict.draw.verifier
        ev = accuse(keys(v), accuser=v, run_id=self.world.run_id, verdict=verdict, case=case,
                    payload_bytes=d.made[verdict.draw.target].data)
        self.checker = self.checker or _checker(self.world, self.seed)
        result = recheck(ev, checker=self.checker, base=d.base)
        self.seconds += time.process_time() - t0
        if result.outcome is Recheck.CONFIRMED:
            out.convicted.add(verdict.draw.target)
        elif result.outcome is Recheck.FALSE_ACCUSATION:
            out.convicted.add(v)


def keep_of(outer: OuterOptimizer, listed: set[str]) -> dict[str, float]:
    """Each listed trainer's applied share in the step ``outer`` just took (0: left out)."""
    return {t: outer.kept.get(t, 0.0) if outer.trust.get(t, 0.0) > 0.0 else 0.0 for t in listed}


def round_base(outer: OuterOptimizer) -> RoundBase:
    """The round as every trainer holds it before its outer step (a copy)."""
    fp32 = {n: t.clone() for n, t in outer.params.items()}
    return RoundBase(outer.round, module_state(fp32.items()), fp32)
