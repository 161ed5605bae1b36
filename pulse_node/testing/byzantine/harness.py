"""One run of honest and Byzantine trainers through a round's real pieces and the defence stages.

A round, as ``trainer/role.py`` and ``trainer/agreement.py`` run it, minus the network:

1. the sampler loads the round's global weights (the version inference nodes serve); every
   honest trainer (and an attack that trains) takes ``loco.inner_steps`` GRPO steps on its own
   batches of that version and gates its payload (``honest.py``);
2. the attack makes its payloads, having seen this round's honest payloads if ``Reveal`` lets it;
3. every payload travels as bytes: encoded with the real codec against the round's base,
   decoded, its entries checked against the real payload value bound (a payload over the bound
   is refused), and counted only if ``Membership`` admits its key and no stage excluded it;
4. ``SpotCheck`` runs, accusations go to ``SpotCheck.judge``, evidence to ``EvidenceJudge``;
   a convicted key is excluded from then on;
5. coordinators in the real rendezvous order (``trainer/decisions.coordinator_order``) decide
   until ``DecisionCheck`` accepts one; the coordinator signs it (a real ``RoundDecision``);
6. the real ``OuterOptimizer`` (``loco.aggregate`` of the run's config) weighs and applies the
   decided payloads; every honest trainer puts back what the round did not apply of its payload
   (all of it if left out) and resets its local weights to the new global ones.

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

from pulse_node.chain.identity import Identity
from pulse_node.errors import WireError
from pulse_node.loco.bound import PayloadBoundError
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.decision import encode_decision, make_decision, payload_digest
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload, decode_payload, encode_payload
from pulse_node.testing.byzantine.attacks import Attack, RoundView
from pulse_node.testing.byzantine.honest import InnerTrainer
from pulse_node.testing.byzantine.stages import Defences
from pulse_node.testing.byzantine.world import World
from pulse_node.trainer.decisions import coordinator_order

HISTORY = 6  # rounds of honest payloads an attacker remembers


@dataclass
class Outcome:
    """What one run gives the bench."""

    accuracy: float
    caught: list[str] = field(default_factory=list)
    """Byzantine keys a defence excluded."""
    false_bans: list[str] = field(default_factory=list)
    """Honest keys a defence excluded."""
    trainer_s: float = 0.0
    """CPU seconds of one honest trainer's own work per round (inner steps and gate)."""
    weigh_s: float = 0.0
    """CPU seconds per round weighing the payloads (what the robust rule adds to the mean)."""
    verify_s: float = 0.0
    """CPU seconds per round of spot checks."""
    keep_honest: float = 1.0
    keep_byzantine: float = 1.0
    """Mean weight the aggregation gave honest / Byzantine payloads it applied."""
    refused: int = 0
    """Payloads refused on arrival (malformed, or an entry over the value bound)."""
    left_out: int = 0
    """Honest payloads that arrived but a decision left out."""


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
    keys: dict[str, Identity]
    excluded: set[str] = field(default_factory=set)
    history: list[dict[str, LocoPayload]] = field(default_factory=list)
    decisions: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    out: Outcome = field(default_factory=lambda: Outcome(0.0))
    keeps: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))

    def live(self, trainers: dict[str, InnerTrainer]) -> dict[str, InnerTrainer]:
        return {t: tr for t, tr in trainers.items() if t not in self.excluded}


def _wire(run: _Run, offered: dict[str, LocoPayload]) -> dict[str, tuple[LocoPayload, bytes]]:
    """Step 3: trainer id -> (decoded payload, its digest) of the payloads every receiver takes."""
    outer, cfg, world = run.outer, run.outer.cfg, run.world
    base_np = {n: t.numpy() for n, t in outer.params.items()}
    out = {}
    for t, p in sorted(offered.items()):
        if t in run.excluded or not run.defences.membership.admits(t, members=run.members):
            continue
        data = encode_payload(p, level=cfg.zstd_level, base=outer.params if cfg.base_coding else None)
        try:
            q = decode_payload(data, shapes=world.shapes, max_bytes=cfg.max_payload_bytes,
                               base=outer.params if cfg.base_coding else None, expect_base=outer.state_hash())
            world.bound.check(q.tensors, base_np, who=t)
        except (WireError, PayloadBoundError):
            run.out.refused += 1
            continue
        out[t] = (q, payload_digest(data))
    return out


def _exclude(run: _Run, keys: set[str]) -> None:
    for t in sorted(keys - run.excluded):
        run.excluded.add(t)
        (run.out.false_bans if t in run.honest else run.out.caught).append(t)


def _judge(run: _Run, view: RoundView, arrived: dict[str, tuple[LocoPayload, bytes]]) -> None:
    """Step 4: spot checks, accusations and evidence; convicted keys are excluded."""
    d = run.defences
    t0 = time.process_time()
    convicted = d.spot.check(view.round, {t: q for t, (q, _) in arrived.items()})
    for accuser, target in run.attack.accusations(view):
        if d.membership.admits(accuser, members=run.members) and d.spot.judge(accuser, target, view.round):
            convicted.add(target)
    run.out.verify_s += time.process_time() - t0
    by_key = {k.public_key_hex: t for t, k in run.keys.items()}
    for kind, first, second in run.attack.evidence(view):
        key = d.evidence.convicts(kind, first, second)
        if key in by_key:
            convicted.add(by_key[key])
    _exclude(run, convicted)
    for t in convicted:
        arrived.pop(t, None)


def _decide(run: _Run, view: RoundView, arrived: dict[str, tuple[LocoPayload, bytes]]) -> set[str]:
    """Step 5: the first coordinator in turn whose decision trainers accept; it signs it."""
    live = [t for t in (*run.members, *run.attack.sybils()) if t not in run.excluded
            and run.defences.membership.admits(t, members=run.members)]
    committed = set(arrived)
    for coord in coordinator_order(run.world.run_id, view.round, live):
        decided = run.attack.decide(view, committed) if coord not in run.honest else committed
        if run.defences.decision.accepts(decided, committed=committed):
            break
    else:
        return set()
    run.out.left_out += len([t for t in committed - decided if t in run.honest])
    d = make_decision(run.keys[coord], run_id=run.world.run_id, round=view.round, base=run.outer.state_hash(),
                      epoch=_epoch(run.world.run_id, "this life"), coordinator=coord,
                      contributors={t: arrived[t][1] for t in decided})
    run.decisions[view.round] = (coord, encode_decision(d))
    return decided


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
                run.keys[coord], run_id=run.world.run_id, round=r, base=_epoch(run.world.run_id, f"base {r}"),
                epoch=_epoch(run.world.run_id, "earlier life"), coordinator=coord, contributors={coord: bytes(32)}))
    return out


def _apply(run: _Run, arrived: dict[str, tuple[LocoPayload, bytes]], decided: set[str],
           honest_p: dict[str, LocoPayload]) -> None:
    """Step 6: weigh and apply the decided payloads; honest trainers settle their error feedback."""
    payloads = [arrived[t][0] for t in sorted(decided)]
    run.outer.check(payloads)
    t0 = time.process_time()
    weights = run.outer.weigh(payloads)
    run.out.weigh_s += time.process_time() - t0
    run.outer.step(payloads, keep=weights.keep)
    for t, k in run.outer.kept.items():
        run.keeps[0 if t in run.honest else 1].append(k)
    for t, p in honest_p.items():
        run.honest[t].settle(p, run.outer.kept.get(t, 0.0))
    for tr in (*run.honest.values(), *run.byzantine.values()):
        tr.reset(run.outer)


def _train(run: _Run, trainers: dict[str, InnerTrainer], rnd: int) -> dict[str, LocoPayload]:
    """Inner steps and payloads of the live ``trainers``. Round 0 starts from the base weights in
    every scenario, so a trainer's first round (same key, seed and rewards: the same batches) is
    made once per process and copied (``World.first_rounds``); exact, and the copy keeps the
    trainer's CPU seconds."""
    out = {}
    for t, tr in run.live(trainers).items():
        key = (run.seed, t, tr.invert_rewards, run.outer.cfg.inner_steps)
        if rnd == 0 and key in run.world.first_rounds:
            tr = trainers[t] = copy.deepcopy(run.world.first_rounds[key])
        else:
            tr.train(rnd)
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
    offered = {**run.attack.payloads(view, trained), **honest_p}
    arrived = _wire(run, offered)
    _judge(run, view, arrived)
    decided = _decide(run, view, arrived)
    _apply(run, arrived, decided, honest_p)
    run.history = (run.history + [honest_p])[-HISTORY:]


def run(world: World, attack: Attack, *, loco: LocoConfig, seed: int, rounds: int, defences: Defences,
        n_honest: int = 4, outer_cls: type[OuterOptimizer] = OuterOptimizer) -> Outcome:
    """``rounds`` rounds of ``n_honest`` honest trainers and ``attack``'s keys; the outcome
    (``outer_cls``: another aggregation for the bench's comparison, ``candidates.py``)."""
    honest = {f"h{i}": InnerTrainer(world, f"h{i}", seed=seed) for i in range(n_honest)}
    byz = ({t: InnerTrainer(world, t, seed=seed, invert_rewards=attack.invert_rewards) for t in attack.ids}
           if attack.trains else {})
    members = frozenset(honest) | frozenset(attack.ids)
    keys = {t: Identity.generate() for t in (*members, *attack.sybils())}
    r = _Run(world, attack, defences, outer_cls({n: t.clone() for n, t in world.base.items()}, loco),
             seed, honest, byz, members, keys)
    for rnd in range(rounds):
        if hasattr(attack, "trainers"):
            attack.trainers = byz  # (the EF dump reaches into its trainers' error feedback)
        _round(r, rnd)
    r.out.accuracy = world.accuracy(r.outer.params)
    per_round = max(1, rounds)
    r.out.trainer_s = sum(tr.seconds for tr in honest.values()) / len(honest) / per_round
    r.out.weigh_s /= per_round
    r.out.verify_s /= per_round
    r.out.keep_honest = float(np.mean(r.keeps[0])) if r.keeps[0] else 1.0
    r.out.keep_byzantine = float(np.mean(r.keeps[1])) if r.keeps[1] else 1.0
    return r.out
