"""One run of honest and Byzantine trainers through a round's real pieces and the defence stages.

A round, as ``trainer/role.py`` and ``trainer/agreement.py`` run it, minus the network:

1. the sampler loads the round's global weights (the version inference nodes serve); every
   honest trainer (and an attack that trains) takes ``loco.inner_steps`` GRPO steps on its own
   batches of that version, recorded for its commitment when spot checks run, and gates its
   payload (``honest.py``);
2. the attack makes its payloads, having seen this round's honest payloads only if ``Reveal``
   lets it rush;
3. every payload is committed (a real signed ``RoundCommit`` with its inner-step commitment;
   checked by ``check_commit`` under commit-reveal: an attacker that does not train commits
   steps it cannot open) and travels as bytes: encoded with the real codec, decoded, its entries
   checked against the real payload value bound (a payload over the bound is refused), counted
   only if ``Membership`` admits its key and it is not excluded;
4. the spot checks drawn on the last round run (``spotcheck.py``): verdicts for the ledger,
   convictions from evidence re-checked; attack evidence goes to ``EvidenceJudge``; a convicted
   key is excluded from then on;
5. coordinators in the real rendezvous order (``trainer/decisions.coordinator_order``; members
   only) sign a real ``CommitList`` until ``DecisionCheck`` accepts one; the round's
   contributors are the listed keys that enter (``loco/roundrules.entered``: members, open
   trainers with earned weight, the newcomers of the ledger's draw) and arrived;
6. the real ``OuterOptimizer`` (``loco.aggregate`` of the run's config) weighs and applies the
   decided payloads with the ledger's trust weights (protocol) and records the round's facts;
   every honest trainer puts back what the round did not apply of its payload (all of it if left
   out) and resets its local weights; the round's checks are drawn.

One ``OuterOptimizer`` stands for every trainer's replica: they are bit-identical
(``tests/test_loco_aggregate.py``, ``tests/test_loco_harness.py``), and each payload is decoded
once. Held-out greedy accuracy of the final global weights is the run's result.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import blake3
import numpy as np

from pulse_node.errors import PulseError, WireError
from pulse_node.loco.bound import PayloadBoundError
from pulse_node.loco.commit import InnerCommitment, encode_commitment
from pulse_node.loco.commitlist import VERDICTS, CommitList, make_list, make_verdict
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.decision import encode_decision, make_decision, payload_digest
from pulse_node.loco.ledger import RoundFacts
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload, decode_payload, encode_payload
from pulse_node.loco.roundcommit import Expect, check_commit, commit_digest, encode_commit, make_commit
from pulse_node.loco.roundrules import Held, entered
from pulse_node.testing.byzantine.attacks import Attack, RoundView
from pulse_node.testing.byzantine.commits import fake_inner
from pulse_node.testing.byzantine.honest import InnerTrainer
from pulse_node.testing.byzantine.overhead import RoundCost, phase
from pulse_node.testing.byzantine.spotcheck import Checked, Made, SpotChecks, keep_of, round_base
from pulse_node.testing.byzantine.stages import Defences
from pulse_node.testing.byzantine.world import World, key_for, peer_of
from pulse_node.trainer.decisions import coordinator_order
from pulse_node.trainer.spot_replay import inner_settings

HISTORY = 6  # rounds of honest payloads an attacker remembers


@dataclass
class Outcome:
    """What one run gives the bench."""

    accuracy: float
    caught: list[str] = field(default_factory=list)
    """Byzantine keys convicted, or owing a check at the end (out of the rounds)."""
    false_bans: list[str] = field(default_factory=list)
    """Honest keys convicted."""
    honest_owing: int = 0
    """Honest keys owing a check at the end (a lying verifier said they did not answer)."""
    trainer_s: float = 0.0
    """CPU seconds of one honest trainer's own work per round (inner steps and gate)."""
    weigh_s: float = 0.0
    """CPU seconds per round weighing the payloads (what the robust rule adds to the mean)."""
    verify_s: float = 0.0
    """CPU seconds per trainer and round of spot checks: its share of the checks and re-checks and
    of the targets' answers (``answer_s`` of it), and its own recording of its inner steps
    (``record_s`` of it)."""
    answer_s: float = 0.0
    """CPU seconds per trainer and round answering checks (openings, the BF16 patch)."""
    batches_s: float = 0.0
    """CPU seconds per round one honest trainer spends verifying the batches it trains on, as a
    swarm's trainer does (the first honest trainer, ``InnerTrainer.verify_batches``)."""
    record_s: float = 0.0
    """CPU seconds per honest trainer and round recording its inner steps for its commitment."""
    checks: float = 0.0
    """Checks run by honest verifiers per trainer and round."""
    exchange_s: float = 0.0
    """CPU seconds per round of the first honest trainer's part of the payload exchange, as a
    swarm's trainer does it every round: encoding its payload, decoding and bound-checking every
    other payload, checking them and taking the outer step (not in ``trainer_s``: a wider basis)."""
    keep_honest: float = 1.0
    keep_byzantine: float = 1.0
    """Mean applied share (clip factor x trust weight) of honest / Byzantine payloads applied."""
    refused: int = 0
    """Payloads or commitments refused on arrival (malformed, over the value bound, unopenable)."""
    left_out: int = 0
    """Honest payloads that arrived but a decision left out."""
    lists_refused: int = 0
    """Commit lists honest trainers refused (a coordinator dropping a commitment)."""
    accusations_refused: int = 0
    """Accusations by keys nobody drew for that check, refused unread."""
    per_round: list[RoundCost] = field(default_factory=list)
    """Per round: its costs (the fields above, before the means over rounds) and its phase
    (``overhead.py``: proving, steady)."""
    trace: list[dict[str, object]] = field(default_factory=list)
    """Per round: the applied share (clip factor x trust) of each payload, by trainer name (h0.., b0..,
    s00..), the clip radius, and the keys excluded or owing after it."""


@dataclass
class _Run:
    world: World
    attack: Attack
    defences: Defences
    outer: OuterOptimizer
    seed: int
    honest: dict[str, InnerTrainer]
    byzantine: dict[str, InnerTrainer]
    members: frozenset[str]
    spot: SpotChecks
    excluded: set[str] = field(default_factory=set)
    history: list[dict[str, LocoPayload]] = field(default_factory=list)
    decisions: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    out: Outcome = field(default_factory=lambda: Outcome(0.0))
    keeps: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    last_made: dict[str, Made] = field(default_factory=dict)

    def live(self, trainers: dict[str, InnerTrainer]) -> dict[str, InnerTrainer]:
        return {t: tr for t, tr in trainers.items() if t not in self.excluded}

    @property
    def protocol(self) -> bool:
        return self.defences.spot


def _commit(run: _Run, offered: dict[str, LocoPayload]) -> dict[str, Made]:
    """Step 3, first half: each admitted payload's signed commitment (checked under commit-reveal)."""
    outer, world, cfg = run.outer, run.world, run.outer.cfg
    base = outer.params if cfg.base_coding else None
    epoch = _epoch(world.run_id, "this life")
    expect = Expect(world.run_id, epoch, outer.round, outer.state_hash(), params=world.numel,
                    inner_steps=cfg.inner_steps, settings=inner_settings(_any(run).learner, cfg), spot_required=True)
    out = {}
    first = next(iter(run.honest))
    for t, p in sorted(offered.items()):
        if t in run.excluded or not run.defences.membership.admits(t, members=run.members):
            continue
        t0 = time.process_time()
        data = encode_payload(p, level=cfg.zstd_level, base=base)
        run.out.exchange_s += time.process_time() - t0 if t == first else 0.0
        inner = _inner(run, t, p, data) if run.protocol else None
        c = make_commit(key_for(t), run_id=world.run_id, epoch=epoch, round=outer.round,
                        base=outer.state_hash(), trainer=t, payload=payload_digest(data),
                        spot=b"" if inner is None else encode_commitment(inner))
        if run.protocol:
            try:
                check_commit(c, key=key_for(t).public_key_hex, expect=expect)
            except PulseError:
                run.out.refused += 1
                continue
        out[t] = Made(p, data, inner, encode_commit(c))
    return out


def _any(run: _Run) -> InnerTrainer:
    return next(iter(run.honest.values()))


def _inner(run: _Run, t: str, p: LocoPayload, data: bytes) -> InnerCommitment:
    """Its inner commitment: a recording trainer's own, else steps it cannot open."""
    tr = run.honest.get(t) or run.byzantine.get(t)
    if tr is not None and tr.recorded(p.round):
        return tr.commitment(key_for(t), run_id=run.world.run_id, payload=payload_digest(data))
    return fake_inner(key_for(t), run.world, run_id=run.world.run_id, round=p.round, trainer=t,
                      base=run.outer.state_hash(), payload=payload_digest(data),
                      settings=inner_settings(_any(run).learner, run.outer.cfg))


def _wire(run: _Run, made: dict[str, Made]) -> dict[str, tuple[LocoPayload, bytes]]:
    """Step 3, second half: trainer id -> (decoded payload, its digest) every receiver takes."""
    outer, cfg, world = run.outer, run.outer.cfg, run.world
    base_np = {n: t.numpy() for n, t in outer.params.items()}
    out, first = {}, next(iter(run.honest))
    for t, m in sorted(made.items()):
        t0 = time.process_time()
        try:
            q = decode_payload(m.data, shapes=world.shapes, max_bytes=cfg.max_payload_bytes,
                               base=outer.params if cfg.base_coding else None, expect_base=outer.state_hash())
            world.bound.check(q.tensors, base_np, who=t)
        except (WireError, PayloadBoundError):
            run.out.refused += 1
            continue
        finally:  # the first honest trainer decodes every payload but its own
            run.out.exchange_s += time.process_time() - t0 if t != first else 0.0
        out[t] = (q, payload_digest(m.data))
    return out


def _exclude(run: _Run, keys: set[str]) -> None:
    for t in sorted(keys - run.excluded):
        run.excluded.add(t)
        if t in run.honest:
            run.out.false_bans.append(t)
        else:
            run.out.caught.append(t)


def _judge(run: _Run, view: RoundView, made: dict[str, Made]) -> Checked:
    """Step 4: the last round's checks, accusations and evidence; convicted keys are excluded."""
    checked = Checked()
    accusations = run.attack.accusations(view)
    if run.protocol:
        drawn = {(d.verifier, d.target) for d in run.spot.pending.draws} if run.spot.pending else set()
        run.out.accusations_refused += sum(1 for a in accusations if a not in drawn)
        checked = run.spot.run(next_made=made, trainers={**run.honest, **run.byzantine},
                               byzantine=set(run.byzantine) | set(run.attack.ids) | set(run.attack.sybils()),
                               keys=key_for, accusers={a for a, _ in accusations})
    by_key = {key_for(t).public_key_hex: t for t in (*run.members, *run.attack.sybils())}
    for kind, first, second in run.attack.evidence(view):
        key = run.defences.evidence.convicts(kind, first, second)
        if key in by_key:
            checked.convicted.add(by_key[key])
    _exclude(run, checked.convicted)
    return checked


def _list(run: _Run, coord: str, names: set[str], made: dict[str, Made], checked: Checked) -> CommitList:
    epoch = _epoch(run.world.run_id, "this life")
    verdicts = [make_verdict(key_for(v.verifier), run_id=run.world.run_id, epoch=epoch, round=v.round, target=v.target,
                             verifier=v.verifier, reason="" if v.passed else "unanswered") for v in checked.verdicts]
    return make_list(key_for(coord), run_id=run.world.run_id, epoch=_epoch(run.world.run_id, "this life"),
                     round=run.outer.round, base=run.outer.state_hash(), coordinator=coord,
                     commits=[made[t].commit for t in names],
                     members=sorted({*names, *(v.target for v in verdicts)} & run.members),
                     verdicts=[VERDICTS.encode(v) for v in verdicts])


def _decide(run: _Run, view: RoundView, made: dict[str, Made], arrived: dict[str, tuple[LocoPayload, bytes]],
            checked: Checked) -> tuple[CommitList | None, set[str]]:
    """Step 5: the first coordinator in turn whose list trainers accept; the round's contributors."""
    live = [t for t in run.members if t not in run.excluded]
    committed = {t for t in made if t not in run.excluded}
    held = {t: Held(commit_digest(made[t].commit), 0.0) for t in committed}
    held_v = {v.key: Held(b"", 0.0) for v in checked.verdicts}
    for coord in coordinator_order(run.world.run_id, view.round, live):
        names = run.attack.decide(view, committed) if coord not in run.honest else committed
        lst = _list(run, coord, names, made, checked)
        if run.defences.decision.accepts(lst, commits=held, verdicts=held_v, is_member=run.members.__contains__,
                                         convicted=run.excluded.__contains__):
            break
        run.out.lists_refused += 1
    else:
        return None, set()
    names = set(lst.listed())
    decided = (entered(lst, run.outer.ledger) if run.defences.membership.open_trainers() or run.protocol else names)
    decided &= set(arrived)
    run.out.left_out += len([t for t in committed - names if t in run.honest and t in arrived])
    if decided:
        d = make_decision(key_for(coord), run_id=run.world.run_id, round=view.round,
                          base=run.outer.state_hash(), epoch=_epoch(run.world.run_id, "this life"), coordinator=coord,
                          contributors={t: arrived[t][1] for t in decided})
        run.decisions[view.round] = (coord, encode_decision(d))
    return lst, decided


def _epoch(run_id: str, life: str) -> bytes:
    """Stand-in for the genesis chain hash of one life of the swarm (a restart with fresh stores
    publishes a new genesis)."""
    return blake3.blake3(f"{run_id}/{life}".encode()).digest()


def _earlier_life(run: _Run, rnd: int) -> dict[int, bytes]:
    """The decisions the coordinators of rounds < ``rnd`` signed before the swarm restarted
    (same keys and run id, fresh stores): another epoch, the earlier life's base."""
    out = {}
    for r, (coord, _) in run.decisions.items():
        if r < rnd:
            out[r] = encode_decision(make_decision(
                key_for(coord), run_id=run.world.run_id, round=r, base=_epoch(run.world.run_id, f"base {r}"),
                epoch=_epoch(run.world.run_id, "earlier life"), coordinator=coord, contributors={coord: bytes(32)}))
    return out


def _apply(run: _Run, arrived: dict[str, tuple[LocoPayload, bytes]], lst: CommitList | None, decided: set[str],  # noqa: PLR0917
           settling: dict[str, LocoPayload], made: dict[str, Made], checked: Checked) -> None:
    """Step 6: weigh and apply the decided payloads; the trainers that sent their own trained
    payload (``settling``: the honest ones, and attackers that look honest, such as the advantage
    flip and the sleeper) settle their error feedback as the node's trainer does."""
    payloads = [arrived[t][0] for t in sorted(decided)]
    outer, members = run.outer, set(lst.members) if lst is not None else set()
    t0 = time.process_time()
    outer.check(payloads)
    run.out.exchange_s += time.process_time() - t0
    base = round_base(outer) if run.protocol else None
    trust = outer.ledger.weights(decided, members=members) if run.protocol else None
    t0 = time.process_time()
    weights = outer.weigh(payloads, trust=trust)
    run.out.weigh_s += time.process_time() - t0
    t0 = time.process_time()
    outer.step(payloads, keep=weights.keep, trust=trust)
    run.out.exchange_s += time.process_time() - t0
    for t, k in outer.kept.items():
        run.keeps[0 if t in run.honest else 1].append(k * outer.trust[t])
    run.out.trace.append({"round": outer.round - 1, "tau": weights.tau,
                          "share": {_name(run, t): round(k * outer.trust[t], 4) for t, k in outer.kept.items()}})
    for t, p in settling.items():
        (run.honest.get(t) or run.byzantine[t]).settle(p, outer.kept.get(t, 0.0) if outer.trust.get(t, 0.0) > 0 else 0.0)
    targets = {v.target for v in checked.verdicts}
    outer.ledger.record(RoundFacts(outer.round - 1, lst.digest() if lst is not None else b"", tuple(sorted(decided)),
                                   frozenset((members | targets) & run.members), (), tuple(checked.verdicts),
                                   tuple(sorted(checked.convicted))))
    outer.set_round(outer.round)
    run.out.trace[-1]["out"] = sorted(_name(run, t) for t in {*run.excluded, *outer.ledger.entries}
                                      if t in run.excluded or outer.ledger.owing(t))
    if base is not None and lst is not None:
        listed = set(lst.listed())
        always = {t for t in listed if outer.ledger.newcomer(t, member=t in run.members) or outer.ledger.owing(t)}
        unproven = {t for t in listed if outer.ledger.unproven(t, member=t in run.members)}
        run.spot.draw(base=base, made={t: made[t] for t in listed}, keep=keep_of(outer, listed),
                      members={t for t in run.members if t not in run.excluded}, always=always, excluded=run.excluded,
                      unproven=unproven)
    for tr in (*run.honest.values(), *run.byzantine.values()):
        tr.reset(outer)


def _name(run: _Run, t: str) -> str:
    """A trainer's bench name (h0.., b0.., s00..) for the trace."""
    ids = [*run.honest, *run.attack.ids, *run.attack.sybils()]
    names = [*(f"h{i}" for i in range(len(run.honest))), *(f"b{i}" for i in range(len(run.attack.ids))),
             *(f"s{i:02d}" for i in range(len(run.attack.sybils())))]
    return dict(zip(ids, names)).get(t, t[-6:])


def _train(run: _Run, trainers: dict[str, InnerTrainer], rnd: int) -> dict[str, LocoPayload]:
    """Inner steps and payloads of the live ``trainers``. Round 0 starts from the base weights in
    every scenario, so a trainer's first round (same key, seed and rewards: the same batches) is
    made once per process and copied (``World.first_rounds``); exact, and the copy keeps the
    trainer's CPU seconds."""
    out = {}
    for t, tr in run.live(trainers).items():
        key = (run.seed, t, tr.invert_rewards, run.outer.cfg.inner_steps, tr.log is not None)
        if rnd == 0 and key in run.world.first_rounds:
            tr = trainers[t] = copy.deepcopy(run.world.first_rounds[key])
        else:
            tr.train(rnd, run.outer)
            if rnd == 0:
                run.world.first_rounds[key] = copy.deepcopy(tr)
        out[t] = tr.payload(run.outer)
    return out


def _round(run: _Run, rnd: int) -> None:
    run.world.load(run.outer.params, rnd)
    honest_p = _train(run, run.honest, rnd)
    trained = _train(run, run.byzantine, rnd)
    view = RoundView(rnd, run.outer, run.world, honest_p if run.defences.reveal.rushing() else None,
                     run.history, np.random.default_rng([run.seed, rnd]), dict(run.decisions),
                     _earlier_life(run, rnd) if run.attack.wants_earlier_life else {})
    sent = run.attack.payloads(view, trained)
    offered = {**sent, **honest_p}
    own = {t: p for t, p in sent.items() if trained.get(t) is p}  # sent as trained: settled as honest ones settle
    made = _commit(run, offered)
    arrived = _wire(run, made)
    checked = _judge(run, view, made)
    lst, decided = _decide(run, view, made, arrived, checked)
    _apply(run, arrived, lst, decided, {**honest_p, **own}, made, checked)
    run.history = (run.history + [honest_p])[-HISTORY:]


def run(world: World, attack: Attack, *, loco: LocoConfig, seed: int, rounds: int, defences: Defences,
        n_honest: int = 4, outer_cls: type[OuterOptimizer] = OuterOptimizer) -> Outcome:
    """``rounds`` rounds of ``n_honest`` honest trainers and ``attack``'s keys; the outcome
    (``outer_cls``: another aggregation for the bench's comparison, ``candidates.py``)."""
    record = defences.spot
    honest = {peer_of(f"h{i}"): InnerTrainer(world, peer_of(f"h{i}"), seed=seed, record=record, verify_batches=i == 0)
              for i in range(n_honest)}
    byz = ({t: InnerTrainer(world, t, seed=seed, invert_rewards=attack.invert_rewards, record=record)
            for t in attack.ids} if attack.trains else {})
    members = frozenset(honest) | frozenset(attack.ids)
    r = _Run(world, attack, defences, outer_cls({n: t.clone() for n, t in world.base.items()}, loco),
             seed, honest, byz, members, SpotChecks(world, seed=seed))
    for rnd in range(rounds):
        if hasattr(attack, "trainers"):
            attack.trainers = byz  # (the EF dump reaches into its trainers' error feedback)
        before = _totals(r, "")
        _round(r, rnd)
        r.out.per_round.append(_totals(r, before.phase).since(before))
    return _outcome(r, rounds)


def _totals(r: _Run, ph: str) -> RoundCost:
    """The run's costs so far, as ``_outcome`` counts them; ``ph`` or, if empty, the phase of the
    round about to run."""
    n, honest = len(r.honest) + len(r.attack.ids), list(r.honest.values())
    live = [t for t in r.members if t not in r.excluded]
    ph = ph or phase(r.outer.ledger, honest=[t for t in r.honest if t in live], live=live)
    return RoundCost(ph, trainer_s=sum(tr.seconds for tr in honest) / len(honest), batches_s=honest[0].verify_s,
                     weigh_s=r.out.weigh_s, record_s=sum(tr.record_s for tr in honest) / len(honest),
                     answer_s=r.spot.answer_seconds / n, check_s=r.spot.seconds / n, checks=r.spot.checks / n,
                     exchange_s=r.out.exchange_s)


def _outcome(r: _Run, rounds: int) -> Outcome:
    ledger, out = r.outer.ledger, r.out
    out.caught += [t for t in (*r.attack.ids, *r.attack.sybils()) if ledger.owing(t) and t not in r.excluded]
    out.honest_owing = sum(1 for t in r.honest if ledger.owing(t))
    out.accuracy = r.world.accuracy(r.outer.params)
    per_round = max(1, rounds)
    n = len(r.honest) + len(r.attack.ids)
    out.trainer_s = sum(tr.seconds for tr in r.honest.values()) / len(r.honest) / per_round
    out.weigh_s /= per_round
    out.exchange_s /= per_round
    record_s = sum(tr.record_s for tr in r.honest.values()) / len(r.honest) / per_round
    out.record_s = record_s
    out.answer_s = r.spot.answer_seconds / n / per_round
    out.verify_s = (r.spot.seconds + r.spot.answer_seconds) / n / per_round + record_s
    first = next(iter(r.honest.values()))
    out.batches_s = first.verify_s / per_round
    out.refused += first.refused
    out.checks = r.spot.checks / n / per_round
    out.keep_honest = float(np.mean(r.keeps[0])) if r.keeps[0] else 1.0
    out.keep_byzantine = float(np.mean(r.keeps[1])) if r.keeps[1] else 1.0
    return out
