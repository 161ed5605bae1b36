"""Spot recomputation end to end on a tiny model: honest rounds pass (other thread counts and
micro-batches), every cheat is caught for the reason it should be, evidence re-checks both ways."""

from __future__ import annotations

import dataclasses

import blake3
import numpy as np
import pytest
import torch
from helpers import tiny_solo

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.codec.patch import apply_patch, make_patch
from pulse_node.config import TrainerConfig
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.commit import InnerCommitment, check_header
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.payload import encode_payload
from pulse_node.loco.spot_answer import SpotAnswer, answer_cap, encode_answer
from pulse_node.loco.spot_evidence import decode_evidence, encode_evidence, make_evidence, sign_accusation
from pulse_node.loco.spotdraw import draw_check
from pulse_node.rl.config import VerifyConfig
from pulse_node.rl.rollout import encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.testing.spot_harness import RoundTrainer, make_batches, verifier_parts
from pulse_node.trainer.engine import LocalEngine
from pulse_node.trainer.recompute import SpotCase, SpotChecker, SpotFailure
from pulse_node.trainer.spot_answers import BATCH_BYTES
from pulse_node.trainer.spot_evidence import Recheck, accuse, recheck
from pulse_node.trainer.spot_record import InnerStepLog
from pulse_node.trainer.spot_replay import _common, inner_settings

STEPS, LEAF, RUN = 3, 256, "spot-test"


def solo_cfg(cache, **grpo):
    cfg = tiny_solo(cache, warmstart_steps=150, warmstart_lr=1e-2, **grpo)
    return cfg.model_copy(update={"task": cfg.task.model_copy(update={"digits": 1}),
                                  "sampling": cfg.sampling.model_copy(update={"prompts_per_batch": 6})})


class World:
    """A verifier, the round's base, and batches for two trainers (module-scoped: built once)."""

    def __init__(self, cache) -> None:
        torch.set_num_threads(1)
        self.solo, self.loco = solo_cfg(cache), LocoConfig(inner_steps=STEPS)
        self.task = make_task_source(self.solo.task)
        self.keys = {n: Identity.generate() for n in ("a", "b", "v")}
        self.ids = {n: peer_id_of_key(k.public_key_hex) for n, k in self.keys.items()}
        learner, worker = verifier_parts(self.solo)
        self.checker = SpotChecker(learner, worker, self.task, run_id=RUN, loco=self.loco, verify=VerifyConfig())
        self.victim = self.trainer("b")
        self.base0 = self.victim.base(0)
        self.gen = RolloutWorker(self.victim.policy, self.solo.sampling)
        self.batches = {p: self.make(p, version=0, base=self.base0) for p in ("infer-a", "infer-b")}
        self.victim_round = self.victim.run_round(self.batches["infer-b"], version=0)

    def make(self, producer: str, *, version: int, base):
        self.gen.set_weights(base.bf16, version)
        return make_batches(self.gen, self.task, run_id=RUN, version=version, producer=producer, count=STEPS)

    def trainer(self, name: str, solo=None) -> RoundTrainer:
        return RoundTrainer(solo or self.solo, self.loco, trainer_id=self.ids[name], identity=self.keys[name],
                            run_id=RUN, leaf=LEAF)

    def rounds(self, cheat: str, *, included: bool = True, solo=None, threads: int = 1, batches=None):
        """Trainer a's round 0 (with ``cheat``) and its honest round 1."""
        t = self.trainer("a", solo)
        torch.set_num_threads(threads)  # the inner steps only (many threads on tiny tensors crawl on busy cores)
        try:
            m0 = t.run_round(batches or self.batches["infer-a"], version=0, cheat=cheat,
                             copy_of=self.victim_round.payload)
        finally:
            torch.set_num_threads(1)
        t.finish_round([m0.payload] if included else [self.victim_round.payload], included=included,
                       mine=m0.payload)
        m1 = t.run_round(self.make("infer-a", version=1, base=t.base(1)), version=1)
        return t, m0, m1

    def draw(self, c: InnerCommitment, step: int, seed: bytes = b"seed"):
        d = draw_check(seed, round=0, target=self.ids["a"], verifier=self.ids["v"], steps=len(c.steps),
                       params=c.params, leaf=c.leaf)
        return dataclasses.replace(d, step=step)

    def check(self, trainer, m0, m1, step: int, *, included: bool = True):
        d = self.draw(m0.commitment, step)
        case = trainer.answer(d, m0, included=included, next_made=m1)
        return self.checker.check(d, case, self.base0), case


@pytest.fixture(scope="module")
def world(warm_cache) -> World:
    return World(warm_cache)


@pytest.mark.parametrize(("included", "threads"), [
    (True, 1), (False, 1),
    # two threads on tiny tensors crawl on busy shared cores (2-10 s); bench/spot_calibrate.py covers them too
    pytest.param(True, 2, marks=pytest.mark.slow)])
def test_honest_rounds_pass_on_other_threads_and_micro_batches(world: World, warm_cache, included: bool,
                                                               threads: int) -> None:
    other = solo_cfg(warm_cache, micro_batch_tokens=16)  # many micro-batches: another summation order
    t, m0, m1 = world.rounds("honest", included=included, solo=other, threads=threads)
    assert len(m0.commitment.stepped) == STEPS
    c = m0.commitment
    for step in range(STEPS):
        v, case = world.check(t, m0, m1, step, included=included)
        assert v.ok, (step, v.reason, v.detail)
        assert 0 < v.gradient_error < 1e-4 and v.weights_off == v.payload_off == v.link_off == 0.0
        size = len(encode_answer(SpotAnswer(0, c.trainer, step, case.opening, case.batches, case.patch)))
        assert size <= answer_cap(c, params=c.params, inner_steps=STEPS, batch_bytes=BATCH_BYTES, step=step)


@pytest.mark.parametrize(("cheat", "reason"), [
    ("flip", SpotFailure.GRADIENT), ("flip_quarter", SpotFailure.GRADIENT), ("free_rider", SpotFailure.GRADIENT),
    ("copier", SpotFailure.GRADIENT), ("lazy_copier", SpotFailure.PAYLOAD), ("scaled", SpotFailure.PAYLOAD),
    ("ef_inflate", SpotFailure.LINK)])
def test_each_cheat_is_caught_at_every_step(world: World, cheat: str, reason: SpotFailure) -> None:
    t, m0, m1 = world.rounds(cheat)
    for step in range(STEPS):
        v, _ = world.check(t, m0, m1, step)
        assert v.reason == reason, (step, v.reason, v.detail)
        if reason == SpotFailure.GRADIENT:
            assert v.gradient_error > 0.1


def test_a_batch_that_is_not_the_seeded_draw_is_caught(world: World) -> None:
    forged = [(p, [dataclasses.replace(r) for r in rs]) for p, rs in world.batches["infer-a"]]
    r = forged[1][1][0]
    r.prompt_ids = r.prompt_ids[:-1] + [(r.prompt_ids[-1] + 1) % 10 + 1]  # another prompt than the assigned one
    t, m0, m1 = world.rounds("honest", batches=forged)
    v, _ = world.check(t, m0, m1, 1)
    assert v.reason == SpotFailure.BATCH and "prompt" in v.detail, v.detail


def test_a_stale_foreign_or_misconfigured_commitment_fails_the_header_check(world: World, warm_cache) -> None:
    _t, m0, m1 = world.rounds("honest")
    c = m0.commitment
    check_header(c, run_id=RUN, round=0, base=c.base, payload=c.payload, params=c.params, inner_steps=STEPS,
                 settings=world.checker.settings)
    other = world.trainer("a", solo_cfg(warm_cache, lr=2e-2))  # honest, but another learning rate
    theirs = other.run_round(world.batches["infer-a"], version=0)
    v = world.checker.check(world.draw(theirs.commitment, 1), other.answer(world.draw(theirs.commitment, 1), theirs),
                            world.base0)
    assert v.reason == SpotFailure.SETTINGS  # refused before any recomputation, and not evidence of a lie
    with pytest.raises(ValueError):
        accuse(world.keys["v"], accuser=world.ids["v"], run_id=RUN, verdict=v, case=other.answer(v.draw, theirs),
               payload_bytes=theirs.data)
    for kwargs in ({"round": 1, "base": m1.commitment.base}, {"payload": m1.commitment.payload},
                   {"inner_steps": STEPS - 1}, {"params": c.params + 1}, {"settings": theirs.commitment.settings}):
        args = {"run_id": RUN, "round": 0, "base": c.base, "payload": c.payload, "params": c.params,
                "inner_steps": STEPS} | kwargs
        with pytest.raises(IntegrityError):
            check_header(c, **args)


def test_an_answer_that_does_not_open_the_commitment_is_unanswered_not_evidence(world: World) -> None:
    t, m0, _m1 = world.rounds("honest")
    d = world.draw(m0.commitment, 0)
    other = dataclasses.replace(d, leaves=tuple(sorted({*d.leaves[1:], max(d.leaves) + 1} - {-1})))
    case = t.answer(other, m0)  # opened at leaves the draw did not pick
    v = world.checker.check(d, case, world.base0)
    assert v.reason == SpotFailure.UNANSWERED
    with pytest.raises(ValueError):
        accuse(world.keys["v"], accuser=world.ids["v"], run_id=RUN, verdict=v, case=case, payload_bytes=m0.data)


def test_evidence_of_a_flip_is_confirmed_by_anyone(world: World) -> None:
    t, m0, m1 = world.rounds("flip")
    v, case = world.check(t, m0, m1, 2)
    ev = accuse(world.keys["v"], accuser=world.ids["v"], run_id=RUN, verdict=v, case=case, payload_bytes=m0.data)
    again = decode_evidence(encode_evidence(ev))
    result = recheck(again, checker=world.checker, base=world.base0)
    assert result.outcome == Recheck.CONFIRMED and result.culprit == world.keys["a"].public_key_hex


def test_a_false_accusation_convicts_the_accuser(world: World) -> None:
    t, m0, m1 = world.rounds("honest")
    v, case = world.check(t, m0, m1, 1)
    assert v.ok
    v.reason = SpotFailure.GRADIENT  # the accuser claims the honest step failed
    ev = accuse(world.keys["v"], accuser=world.ids["v"], run_id=RUN, verdict=v, case=case, payload_bytes=m0.data)
    result = recheck(decode_evidence(encode_evidence(ev)), checker=world.checker, base=world.base0)
    assert result.outcome == Recheck.FALSE_ACCUSATION and result.culprit == world.keys["v"].public_key_hex


def test_exhibits_the_target_never_made_convict_the_accuser(world: World) -> None:
    t, m0, m1 = world.rounds("honest")
    v, case = world.check(t, m0, m1, 0)
    forged = [encode_rollouts(world.batches["infer-b"][0][1])]  # another batch under this commitment's step
    v.reason = SpotFailure.BATCH
    ev = accuse(world.keys["v"], accuser=world.ids["v"], run_id=RUN, verdict=v,
                case=dataclasses.replace(case, batches=forged), payload_bytes=m0.data)
    result = recheck(ev, checker=world.checker, base=world.base0)
    assert result.outcome == Recheck.FALSE_ACCUSATION and result.culprit == world.keys["v"].public_key_hex


def test_evidence_exhibits_by_digest_and_tampering(world: World) -> None:
    t, m0, m1 = world.rounds("scaled")
    v, case = world.check(t, m0, m1, 0)
    assert v.reason == SpotFailure.PAYLOAD
    full = accuse(world.keys["v"], accuser=world.ids["v"], run_id=RUN, verdict=v, case=case, payload_bytes=m0.data)
    bare = make_evidence(full.accusation, {})  # every exhibit by digest only
    assert recheck(bare, checker=world.checker, base=world.base0).outcome == Recheck.INCONCLUSIVE
    fetched = recheck(bare, checker=world.checker, base=world.base0, fetch=full.exhibits.get)
    assert fetched.outcome == Recheck.CONFIRMED
    data = bytearray(encode_evidence(full))
    data[-5] ^= 1  # an exhibit's byte: it no longer matches its digest
    with pytest.raises(WireError):
        decode_evidence(bytes(data))
    resigned = sign_accusation(world.keys["b"], full.accusation)  # signed by a key that is not the accuser's
    assert recheck(dataclasses.replace(full, accusation=resigned), checker=world.checker,
                   base=world.base0).outcome == Recheck.INCONCLUSIVE


def test_the_engine_records_its_inner_steps_for_a_check(world: World, node_cfg) -> None:
    s = world.solo  # the same model, task, warm start and inner settings as the verifier's
    cfg = node_cfg(TrainerConfig, "trainer", seed=0, model=s.model.model_dump(), task=s.task.model_dump(),
                   sampling=s.sampling.model_dump(), grpo=s.grpo.model_dump(), loco={"inner_steps": STEPS})
    engine = LocalEngine(cfg)
    engine.inner_log = InnerStepLog(engine.shapes, leaf=LEAF)
    engine.begin_inner_log(round=0, base_hash=engine.outer.state_hash())
    for producer, rollouts in world.batches["infer-a"]:
        engine.step(rollouts, current_version=0, producer=producer)
    payload = engine.make_payload(round=0, trainer_id=world.ids["a"], base_hash=engine.outer.state_hash())
    data = encode_payload(payload, base=None)
    c = engine.inner_log.commitment(world.keys["a"], run_id=RUN, trainer=world.ids["a"],
                                    payload=blake3.blake3(data).digest(),
                                    settings=inner_settings(engine.learner, cfg.loco))
    assert [b.producer for s in c.steps for b in s.batches] == ["infer-a"] * STEPS
    d = world.draw(c, 2)
    case = SpotCase(c, engine.inner_log.open(0, d.leaves), engine.inner_log.batch_bytes(0, 2),
                    engine.inner_log.weights_patch(0, 2), payload, keep=1.0)
    v = world.checker.check(d, case, world.base0)
    assert v.ok, v.detail


def test_rounds_recorded_into_the_arrays_of_rounds_dropped_pass_their_checks(world: World) -> None:
    t, made = world.trainer("a"), []
    for r in range(4):  # the log keeps 2 rounds: rounds 2 and 3 refill the arrays of rounds 0 and 1
        base = t.base(r)
        made.append((t.run_round(world.make("infer-a", version=r, base=base), version=r), base))
        t.finish_round([made[-1][0].payload], included=True, mine=made[-1][0].payload)
        if r == 0:
            first = [*t.log.rounds[0].arrays, *(s.grad for s in t.log.rounds[0].steps)]
    assert sorted(t.log.rounds) == [2, 3]
    again = [*t.log.rounds[2].arrays, *(s.grad for s in t.log.rounds[2].steps)]
    assert any(np.shares_memory(a, b) for a in again for b in first)
    (m2, base2), (m3, _) = made[2], made[3]
    for step in (0, STEPS - 1):
        d = dataclasses.replace(world.draw(m2.commitment, step), round=2)
        v = world.checker.check(d, t.answer(d, m2, next_made=m3), base2)
        assert v.ok, (step, v.reason, v.detail)


def test_a_checker_reusing_its_buffers_gives_a_fresh_checkers_verdicts(world: World) -> None:
    """The checker keeps its batch verifier and the arrays it patches the weights in across checks:
    a case checked again, after refused answers (wrong or corrupt patch) and on another round's
    base, gets the verdict a fresh checker gives it (no batch ``replayed``, no weights left over)."""
    t, m0, m1 = world.rounds("honest")
    d = world.draw(m0.commitment, 1)
    case = t.answer(d, m0, next_made=m1)
    fresh = SpotChecker(*verifier_parts(world.solo), world.task, run_id=RUN, loco=world.loco, verify=VerifyConfig())
    want = fresh.check(d, case, world.base0)
    assert want.ok, (want.reason, want.detail)
    later = t.answer(world.draw(m0.commitment, 2), m0).patch
    wrong = dataclasses.replace(case, patch=later)
    corrupt = dataclasses.replace(case, patch=case.patch[:-1] + bytes([case.patch[-1] ^ 1]))
    # step 2's weights under step 1's hash: decoded into the checker's arrays, then rolled back
    lying = dataclasses.replace(case, patch=make_patch(world.base0.bf16, apply_patch(world.base0.bf16, later),
                                                       new_hash=m0.commitment.steps[1].weights.hex()))
    for other in (wrong, corrupt, lying):
        assert world.checker.check(d, other, world.base0).reason == SpotFailure.UNANSWERED
    r2 = world.trainer("a")
    for r in range(3):
        base = r2.base(r)
        m = r2.run_round(world.make("infer-a", version=r, base=base), version=r)
        r2.finish_round([m.payload], included=True, mine=m.payload)
    d2 = dataclasses.replace(world.draw(m.commitment, STEPS - 1), round=2)
    assert world.checker.check(d2, r2.answer(d2, m), base).ok
    for _ in range(2):
        got = world.checker.check(d, case, world.base0)
        assert (got.reason, got.gradient_error, got.weights_off, got.payload_off, got.link_off) == (
            want.reason, want.gradient_error, want.weights_off, want.payload_off, want.link_off)


def test_the_common_positions_of_a_replay_are_intersect1d_s() -> None:
    rng = np.random.default_rng(3)
    for trial in range(200):
        a = np.unique(rng.integers(0, 5000, int(rng.integers(0, 4000))))
        b = np.unique(rng.integers(0, 5000, int(rng.integers(0, 4000))))
        if trial % 4 == 0:
            a = rng.permutation(a)  # not ascending: the sort
        if trial % 7 == 0:
            b = b - 2500  # negative: the sort
        want = np.intersect1d(a, b, assume_unique=True, return_indices=True)
        for x, y in zip(want, _common(a, b)):
            assert x.dtype == y.dtype and np.array_equal(x, y), trial
