"""Verified rollouts: honest batches pass on any batch shape and thread count, every forgery of
the catalogue is refused with its reason, refusals that are nobody's fault do not strike, and a
flooding sender does not take an honest sender's share."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import tiny_solo

from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.config import VerifyConfig
from pulse_node.rl.grpo import GRPOLearner
from pulse_node.rl.policy import build_policy, build_tiny
from pulse_node.rl.rollout import decode_rollouts, encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import make_task_source
from pulse_node.rl.verify import STRIKES
from pulse_node.testing.forgery import FORGER, FORGERIES, HONEST, ForgeryLab, flood
from pulse_node.testing.steering import steered_batch
from pulse_node.torchbits import module_state

EXPECTED = {
    "wrong_reward": {"wrong_reward"}, "edited_token": {"not_sampled", "termination"},
    "swapped_completion": {"not_sampled"}, "cherry_picked": {"not_sampled"},
    "written_completion": {"not_sampled", "termination"}, "forged_logprobs": {"forged_logprobs"},
    # another model's (or version's) draws may agree with the version's where both are near uniform (the
    # tiny test model is): the tokens are then the version's own draws, and its claimed log-probs give it away
    "eval_prompt": {"eval_prompt"}, "wrong_version": {"not_sampled", "forged_logprobs"},
    "relabeled_version": {"prompt_not_assigned"}, "other_model": {"not_sampled", "forged_logprobs"}, "other_peers_batch": {"prompt_not_assigned"}, "replayed_batch": {"replayed"},
    "truncated_finished": {"not_sampled"}, "ground_batch_index": {"batch_index"},
    "dropped_rollouts": {"batch_shape"},
}


@pytest.fixture(scope="module")
def lab(warm_cache) -> ForgeryLab:
    """Versions 0 and 1 of a tiny policy (one GRPO step apart), and a foreign model's weights."""
    cfg = tiny_solo(warm_cache)
    torch.manual_seed(0)
    policy = build_policy(cfg.model, cfg.task, seed=1, grpo_cfg=cfg.grpo)
    task = make_task_source(cfg.task)
    states = {0: policy.bf16_state()}
    lab = ForgeryLab(policy=policy, states=dict(states), foreign=module_state(
        build_tiny(cfg.model, seed=99, device=policy.device).module.named_parameters()),
        task=task, sampling=cfg.sampling, verify=VerifyConfig(), batches_per_version=4)
    learner = GRPOLearner(policy, cfg.grpo)
    rs = lab.honest(HONEST, 0, 0)
    for i, r in enumerate(rs):
        r.reward = float(i % 2)
    learner.step(rs, current_version=0)
    states[1] = policy.bf16_state()
    return ForgeryLab(policy=policy, states=states, foreign=lab.foreign, task=task, sampling=cfg.sampling,
                      verify=VerifyConfig(), batches_per_version=4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows_per_pass", [None, 1, 5])
def test_honest_batches_pass_on_any_shape_and_thread_count(lab, threads, rows_per_pass) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lab.producer.set_weights(lab.states[1], 1)
        key = BatchKey(lab.run_id, 1, HONEST, 1)
        rs = lab.producer.generate(assigned_problems(lab.task, key, lab.sampling.prompts_per_batch), key=key,
                                   rows_per_pass=rows_per_pass)
        verdict = lab.new_verifier().check(rs, sender=HONEST, current_version=1, state_of=lab.states.get)
    finally:
        torch.set_num_threads(before)
    assert verdict.ok, verdict.detail
    assert max(c.gap for c in verdict.checks) <= lab.verify.score_tolerance / 10
    # the trainer learns with its own numbers: recomputed rewards, its own log-probs
    assert all(v.local and v.reward == r.reward for v, r in zip(verdict.rollouts, rs))
    assert max(abs(a - b) for v, r in zip(verdict.rollouts, rs) for a, b in zip(v.logprobs, r.logprobs)) < 1e-4


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_every_forgery_is_refused_with_its_reason(lab, kind) -> None:
    lab.verifier = lab.new_verifier()  # forget accepted batches of other cases
    sender, rollouts = FORGERIES[kind](lab)
    verdict = lab.judge(sender, rollouts)
    assert not verdict.ok and verdict.reason in EXPECTED[kind], (verdict.reason, verdict.detail)
    assert verdict.strike == (verdict.reason in STRIKES) and not verdict.rollouts


def test_refusals_that_are_nobodys_fault_do_not_strike(lab) -> None:
    verifier = lab.new_verifier()
    rs = lab.honest(HONEST, 2, 0)
    assert verifier.check(copy.deepcopy(rs), sender=HONEST, current_version=1, state_of=lambda v: None).reason == "unknown_version"
    assert verifier.check(copy.deepcopy(rs), sender=HONEST, current_version=9, state_of=lab.states.get).reason == "stale"
    ahead = verifier.check(copy.deepcopy(rs), sender=HONEST, current_version=0, state_of=lab.states.get)
    assert ahead.ok  # version 0 is current for a trainer at 0
    early = lab.honest(HONEST, 2, 1)
    assert verifier.check(early, sender=HONEST, current_version=0, state_of=lab.states.get).reason == "future_version"
    for reason in ("unknown_version", "stale", "future_version", "replayed"):
        assert reason not in STRIKES


def test_full_check_reports_every_rollout(lab) -> None:
    _, rs = FORGERIES["forged_logprobs"](lab)
    rs[0].reward = 1.0 - rs[0].reward
    verdict = lab.new_verifier().check(rs, sender=FORGER, current_version=1, state_of=lab.states.get, full=True)
    assert len(verdict.checks) == len(rs)
    assert {c.reason for c in verdict.checks} >= {"wrong_reward", "forged_logprobs", ""}


def test_a_flood_does_not_take_the_honest_senders_share(lab) -> None:
    out = flood(lab, flood_batches=20, honest_batches=2, takes=6, distinct=2)
    assert out["honest_used"] == 2, out  # every honest batch trained on
    assert out["order"][:4].count(HONEST) == 2, out["order"]  # alternating turns while both have batches
    assert out["flood_refused"].get("queue_full", 0) >= 14 and not out["honest_refused"], out


def test_a_fork_with_the_same_version_number_is_not_mistaken_for_the_held_state(lab) -> None:
    """After a re-sync the trainer's worker may hold another fork's weights under the same version
    number: the verifier loads the state it is given, not whatever carries that number."""
    verifier = lab.new_verifier()
    verifier.worker.set_weights(lab.states[0], 1)  # "version 1" of a fork
    rs = lab.honest(HONEST, 3, 1)
    assert verifier.check(rs, sender=HONEST, current_version=1, state_of=lab.states.get).ok


def test_junk_completions_cost_only_the_spot_rows_forward(lab) -> None:
    """Random completions under the right prompts pass every cheap check; the spot rows (picked by
    the verifier's secret) refuse the batch before the forward over the whole batch."""
    rs = lab.honest(FORGER, 2)
    rng, tok = torch.Generator().manual_seed(5), lab.policy.tokenizer
    for r in rs:
        n = len(r.completion_ids)
        ids = torch.randint(0, tok.vocab_size, (n,), generator=rng).tolist()
        r.completion_ids = [t if t != tok.eos_id else (t + 1) % tok.vocab_size for t in ids[:-1]] + \
            [tok.eos_id if r.finished else (ids[-1] if ids[-1] != tok.eos_id else (ids[-1] + 1) % tok.vocab_size)]
    verifier = lab.new_verifier()
    verdict = verifier.check(rs, sender=FORGER, current_version=1, state_of=lab.states.get)
    assert verdict.reason == "not_sampled" and verdict.strike, verdict.detail
    assert 1 <= verifier.forwarded_rows <= 2  # the spot rows only, not the batch's 16
    honest = lab.new_verifier()
    assert honest.check(lab.honest(HONEST, 2), sender=HONEST, current_version=1, state_of=lab.states.get).ok
    assert honest.forwarded_rows <= len(rs) + 2
    # which rows are spot-checked depends on the verifier's secret, not only on the batch
    key = BatchKey(lab.run_id, 1, FORGER, 2)
    picks = {tuple(lab.new_verifier().spot_rows(list(range(len(rs))), key)) for _ in range(8)}
    assert len(picks) > 1


class _Counting:
    """A reward that counts the completions it was asked to score (and scores like the real one)."""

    def __init__(self, base) -> None:
        self.base, self.seen = base, []

    def score(self, completion, answer, *, budget=None):
        self.seen.append(completion)
        return self.base.score(completion, answer, budget=budget)

    def __call__(self, completion, answer):
        return self.score(completion, answer).value


def test_unverified_text_never_reaches_the_answer_checker(lab) -> None:
    """Cheap before expensive: a row whose draws fail is refused before its reward is computed, so
    hostile text written under the right prompts costs the checker nothing."""
    rs = lab.honest(FORGER, 1)
    tok = lab.policy.tokenizer
    for r in rs:  # every completion rewritten (not sampled), ending as the honest one did
        r.completion_ids = (tok.encode_target("(a+b+c+d)^{40}") * 4)[: len(r.completion_ids) - 1] + r.completion_ids[-1:]
    verifier = lab.new_verifier()
    counting = verifier.worker.reward_fn = _Counting(verifier.worker.reward_fn)
    verdict = verifier.check(rs, sender=FORGER, current_version=1, state_of=lab.states.get, full=True)
    assert verdict.reason == "not_sampled" and all(c.reason == "not_sampled" for c in verdict.checks)
    assert counting.seen == []
    honest = lab.new_verifier()
    counting = honest.worker.reward_fn = _Counting(honest.worker.reward_fn)
    assert honest.check(lab.honest(HONEST, 1), sender=HONEST, current_version=1, state_of=lab.states.get).ok
    assert 0 < len(counting.seen) <= len(rs)  # each distinct (completion, answer) scored once


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_bf16_and_fp16_producers_pass_with_the_tolerances_of_their_precision(lab, precision) -> None:
    """A producer computing in BF16/FP16 declares it; the verifier widens by the error it measures."""
    producer = RolloutWorker(lab.policy, lab.sampling, compute=precision)
    producer.set_weights(lab.states[1], 1)
    for b in range(3):
        rs = producer.generate_batch(lab.task, BatchKey(lab.run_id, 1, HONEST, b))
        assert {r.precision for r in rs} == {precision}
        verifier = lab.new_verifier()
        verdict = verifier.check(decode_rollouts(encode_rollouts(rs)), sender=HONEST, current_version=1,
                                 state_of=lab.states.get)
        assert verdict.ok, verdict.detail
        assert verifier.tol.spread > 0 and lab.verify.score_tolerance < verifier.tol.widest < 0.25 and verifier.tol.rate > 0
    fp32 = lab.new_verifier()
    assert fp32.check(lab.honest(HONEST, 3, 1), sender=HONEST, current_version=1, state_of=lab.states.get).ok
    assert fp32.tol.widest == lab.verify.score_tolerance and fp32.tol.rate == 0  # FP32 keeps FP32's tolerances


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rollouts_of_the_static_decoder_pass(lab, precision) -> None:
    """A producer decoding with a static KV cache (``decode = "static"``) is verified as an eager
    one: FP32 within the FP32 tolerances (gap ~0), BF16 within its precision's."""
    producer = RolloutWorker(lab.policy, lab.sampling, compute=precision, decode="static")
    producer.set_weights(lab.states[1], 1)
    rs = producer.generate_batch(lab.task, BatchKey(lab.run_id, 1, HONEST, 2))
    verdict = lab.new_verifier().check(decode_rollouts(encode_rollouts(rs)), sender=HONEST, current_version=1,
                                       state_of=lab.states.get)
    assert verdict.ok, verdict.detail
    if precision == "fp32":
        assert max(c.gap for c in verdict.checks) <= lab.verify.score_tolerance / 10


def test_a_forger_steering_every_draw_within_the_bf16_tolerance_gains_little(lab) -> None:
    """Steering every draw it can toward the answer (full knowledge of the key and the tolerance)
    moves a token only where u falls within the tolerance of a boundary (~2 tol per token), so its
    gain is bounded by that; a batch that moves more tokens than BF16 rounding explains is refused."""
    producer = RolloutWorker(lab.policy, lab.sampling, compute="bf16")
    producer.set_weights(lab.states[1], 1)
    verifier = lab.new_verifier()
    assert verifier.check(producer.generate_batch(lab.task, BatchKey(lab.run_id, 1, FORGER, 0)), sender=FORGER,
                          current_version=1, state_of=lab.states.get).ok
    tol, moved_all, tokens_all, gain = verifier.tol, 0, 0, 0.0
    for b in range(4):
        key = BatchKey(lab.run_id, 1, FORGER, b)
        honest = producer.generate_batch(lab.task, key)
        forged, moved = steered_batch(producer, lab.task, key, tol=tol)
        tokens = sum(len(r.completion_ids) for r in forged)
        check = lab.new_verifier()
        verdict = check.check(forged, sender=FORGER, current_version=1, state_of=lab.states.get)
        assert verdict.ok or verdict.reason == "not_sampled", verdict.detail
        assert verdict.ok or moved > 0
        if moved > check.tol.near_limit(tokens):
            assert not verdict.ok
        moved_all, tokens_all = moved_all + moved, tokens_all + tokens
        gain += (sum(r.reward for r in forged) - sum(r.reward for r in honest)) / len(forged)
    assert moved_all <= 3 * tol.widest * tokens_all + 3  # the margin: a choice only within the tolerance of a boundary
    assert gain / 4 <= moved_all / (4 * len(honest)) + 1e-9  # no reward without a moved token
