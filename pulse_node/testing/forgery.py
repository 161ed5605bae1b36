"""A catalogue of rollout forgeries, each judged by the trainers' verifier (tests and bench).

``ForgeryLab`` holds a producer (a rollout worker with the version states) and a trainer's
``RolloutVerifier``. Each entry of ``FORGERIES`` makes one forged batch from honest material
(as a dishonest inference node could) and returns who sends it; ``lab.judge`` runs it through
the wire format and the verifier. ``flood`` plays a flooding sender against an honest one
through the trainer's intake. Used by ``tests/test_rl_verify.py`` and
``bench/rollout_forgery.py``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from pulse_node.codec.state import State
from pulse_node.daemon.status import NodeStatus
from pulse_node.peers.book import PeerBook
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.rl.assign import BatchKey, assigned_problems
from pulse_node.rl.config import SamplingConfig, VerifyConfig
from pulse_node.rl.policy import Policy
from pulse_node.rl.rollout import Rollout, decode_rollouts, encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.tasks import TaskSource
from pulse_node.rl.verify import BatchVerdict, RolloutVerifier
from pulse_node.trainer.intake import RolloutFeed

HONEST, FORGER = "honest-peer", "forging-peer"
#: a forgery's sender and its forged batch
Forged = tuple[str, list[Rollout]]


@dataclass
class ForgeryLab:
    """A producer and a trainer's verifier on the same versions; ``current`` is the trainer's."""

    policy: Policy  # architecture, tokenizer, task settings
    states: dict[int, State]  # the versions the trainer holds
    foreign: State  # weights of another model of the same shape
    task: TaskSource
    sampling: SamplingConfig
    verify: VerifyConfig
    run_id: str = "forgery-lab"
    batches_per_version: int = 16
    max_staleness: int = 4

    def __post_init__(self) -> None:
        self.current = max(self.states)
        self.producer = RolloutWorker(self.policy, self.sampling)
        self.verifier = self.new_verifier()
        self.rng = random.Random(0)

    def new_verifier(self) -> RolloutVerifier:
        return RolloutVerifier(RolloutWorker(self.policy, self.sampling), self.task, run_id=self.run_id,
                               batches_per_version=self.batches_per_version, max_staleness=self.max_staleness,
                               cfg=self.verify)

    def honest(self, sender: str, batch: int, version: int | None = None, *, state: State | None = None,
               key_version: int | None = None) -> list[Rollout]:
        """Batch ``batch`` of ``version`` by ``sender``, made honestly (optionally on other weights)."""
        v = self.current if version is None else version
        self.producer.set_weights(state if state is not None else self.states[v], v if key_version is None else key_version)
        return self.producer.generate_batch(self.task, BatchKey(self.run_id, self.producer.version, sender, batch))

    def judge(self, sender: str, rollouts: list[Rollout]) -> BatchVerdict:
        """The verifier's verdict on ``rollouts`` sent by ``sender`` (through the wire format)."""
        return self.verifier.check(decode_rollouts(encode_rollouts(rollouts)), sender=sender,
                                   current_version=self.current, state_of=self.states.get)

    def fresh_batch(self) -> int:
        return self.rng.randrange(self.batches_per_version)

    def problem_answer(self, r: Rollout) -> str:
        key = BatchKey(self.run_id, r.version, FORGER, r.batch)
        return assigned_problems(self.task, key, self.sampling.prompts_per_batch)[r.sample // self.sampling.group_size].answer


# ---- the forgeries: each returns (sender, forged rollouts) -----------------------------------
def _pick(rs: list[Rollout], lab: ForgeryLab, ok: Callable[[Rollout], bool] = lambda r: True) -> Rollout:
    choices = [r for r in rs if ok(r)]
    return lab.rng.choice(choices or rs)


def wrong_reward(lab: ForgeryLab) -> Forged:
    rs = lab.honest(FORGER, lab.fresh_batch())
    r = _pick(rs, lab)
    r.reward = 1.0 - r.reward
    return FORGER, rs


def edited_token(lab: ForgeryLab) -> Forged:
    rs = lab.honest(FORGER, lab.fresh_batch())
    r = _pick(rs, lab)
    k = lab.rng.randrange(len(r.completion_ids) - 1) if len(r.completion_ids) > 1 else 0
    tok = lab.policy.tokenizer
    r.completion_ids[k] = lab.rng.choice([t for t in range(tok.vocab_size) if t not in (r.completion_ids[k], tok.eos_id)])
    return FORGER, rs


def swapped_completion(lab: ForgeryLab) -> Forged:
    rs = lab.honest(FORGER, lab.fresh_batch())
    a = _pick(rs, lab)
    b = _pick(rs, lab, lambda r: r.completion_ids != a.completion_ids)
    a.completion_ids, b.completion_ids = b.completion_ids, a.completion_ids
    a.logprobs, b.logprobs = b.logprobs, a.logprobs
    a.finished, b.finished = b.finished, a.finished
    return FORGER, rs


def cherry_picked(lab: ForgeryLab) -> Forged:
    """Every member of a group gets the group's best completion (the others were re-rolled away)."""
    rs = lab.honest(FORGER, lab.fresh_batch())
    g = lab.sampling.group_size
    groups = [rs[i:i + g] for i in range(0, len(rs), g)]
    group = next((m for m in groups if 0 < sum(r.reward for r in m) < g), groups[0])
    best = max(group, key=lambda r: r.reward)
    for r in group:
        r.completion_ids, r.logprobs, r.finished, r.reward = list(best.completion_ids), list(best.logprobs), best.finished, best.reward
    return FORGER, rs


def written_completion(lab: ForgeryLab) -> Forged:
    """A completion written rather than sampled: the right answer, reward 1."""
    rs = lab.honest(FORGER, lab.fresh_batch())
    r = _pick(rs, lab, lambda r: r.reward < 1.0)
    tok = lab.policy.tokenizer
    r.completion_ids = tok.encode_target(lab.problem_answer(r))[: lab.sampling.max_new_tokens]
    r.finished = r.completion_ids[-1] == tok.eos_id
    r.logprobs, r.reward = [-0.01] * len(r.completion_ids), 1.0
    return FORGER, rs


def forged_logprobs(lab: ForgeryLab) -> Forged:
    """Behaviour log-probs lowered so the importance ratio of a rollout explodes."""
    rs = lab.honest(FORGER, lab.fresh_batch())
    r = _pick(rs, lab)
    r.logprobs = [lp - 10.0 for lp in r.logprobs]
    return FORGER, rs


def eval_prompt(lab: ForgeryLab) -> Forged:
    """A group answers an eval-split prompt instead of its assigned one."""
    rs = lab.honest(FORGER, lab.fresh_batch())
    problem = lab.rng.choice(lab.task.eval_set())
    ids = lab.policy.tokenizer.encode(problem.prompt)
    for r in rs[: lab.sampling.group_size]:
        r.prompt_ids, r.problem_id = list(ids), problem.id[:256]
    return FORGER, rs


def wrong_version(lab: ForgeryLab) -> Forged:
    """Made with the previous version's weights, labelled (and seeded) as the current version."""
    older = lab.states[min(lab.states)]
    return FORGER, lab.honest(FORGER, lab.fresh_batch(), state=older)


def relabeled_version(lab: ForgeryLab) -> Forged:
    """An honest batch of the previous version relabelled as the current one."""
    rs = lab.honest(FORGER, lab.fresh_batch(), version=min(lab.states))
    for r in rs:
        r.version = lab.current
        r.group_id = BatchKey(lab.run_id, lab.current, FORGER, r.batch).group_id(r.sample // lab.sampling.group_size)
    return FORGER, rs


def other_model(lab: ForgeryLab) -> Forged:
    """Sampled honestly under the right key, but by another model."""
    return FORGER, lab.honest(FORGER, lab.fresh_batch(), state=lab.foreign, key_version=lab.current)


def other_peers_batch(lab: ForgeryLab) -> Forged:
    """The honest peer's batch, sent by the forger as its own."""
    return FORGER, lab.honest(HONEST, lab.fresh_batch())


def replayed_batch(lab: ForgeryLab) -> Forged:
    """An accepted batch sent again."""
    rs = lab.honest(FORGER, lab.fresh_batch())
    first = lab.judge(FORGER, copy.deepcopy(rs))
    assert first.ok, first.detail
    return FORGER, rs


def truncated_finished(lab: ForgeryLab) -> Forged:
    """A completion cut short and closed with EOS, marked finished."""
    rs = lab.honest(FORGER, lab.fresh_batch())
    r = _pick(rs, lab, lambda r: len(r.completion_ids) >= 3)
    r.completion_ids = r.completion_ids[: len(r.completion_ids) // 2] + [lab.policy.tokenizer.eos_id]
    r.logprobs, r.finished = r.logprobs[: len(r.completion_ids)], True
    r.reward = float(lab.producer.reward_fn(lab.policy.tokenizer.decode(r.completion_ids), lab.problem_answer(r)))
    return FORGER, rs


def ground_batch_index(lab: ForgeryLab) -> Forged:
    """A batch index past the bound (grinding for better prompts)."""
    return FORGER, lab.honest(FORGER, lab.batches_per_version + lab.rng.randrange(1000))


def dropped_rollouts(lab: ForgeryLab) -> Forged:
    """Only the rollouts the producer likes (a subset of the batch)."""
    rs = lab.honest(FORGER, lab.fresh_batch())
    return FORGER, [r for r in rs if r.reward > 0] or rs[:-1]


FORGERIES: dict[str, Callable[[ForgeryLab], Forged]] = {
    "wrong_reward": wrong_reward, "edited_token": edited_token, "swapped_completion": swapped_completion,
    "cherry_picked": cherry_picked, "written_completion": written_completion, "forged_logprobs": forged_logprobs,
    "eval_prompt": eval_prompt, "wrong_version": wrong_version, "relabeled_version": relabeled_version,
    "other_model": other_model, "other_peers_batch": other_peers_batch, "replayed_batch": replayed_batch,
    "truncated_finished": truncated_finished, "ground_batch_index": ground_batch_index,
    "dropped_rollouts": dropped_rollouts,
}


def flood(lab: ForgeryLab, *, flood_batches: int, honest_batches: int, takes: int,
          distinct: int = 4) -> dict[str, object]:
    """A flooder pushes ``flood_batches`` valid batches (``distinct`` different ones, then copies)
    while the honest peer pushes ``honest_batches``, interleaved; the trainer then takes up to
    ``takes`` batches through its intake (``trainer/intake.py``). Returns what each sender got."""
    feed = RolloutFeed(lab.new_verifier(), lab.verify, status=NodeStatus(role="trainer", peer_id="t", run_id=lab.run_id),
                       book=PeerBook(TrainerSet(run_id=lab.run_id)))
    for v, s in lab.states.items():
        feed.keep_state(v, s)
    spam = [encode_rollouts(lab.honest(FORGER, b)) for b in range(distinct)]
    honest = [encode_rollouts(lab.honest(HONEST, b)) for b in range(honest_batches)]
    every = max(1, flood_batches // max(1, honest_batches))
    for i in range(flood_batches):
        feed.offer(FORGER, spam[i % distinct])
        if i % every == 0 and honest:
            feed.offer(HONEST, honest.pop(0))
    order: list[str] = []  # whose batch each inner step got
    before = {HONEST: 0, FORGER: 0}
    for _ in range(takes):
        if feed.next_batch(lab.current) is None:
            break
        tally = feed.intake.tallies()
        now = {s: t.accepted if (t := tally.get(s)) is not None else 0 for s in before}
        order += [s for s in before if now[s] > before[s]]
        before = now
    tally = feed.intake.tallies()
    return {"honest_used": tally[HONEST].accepted, "flood_used": tally[FORGER].accepted,
            "honest_refused": dict(tally[HONEST].rejected), "flood_refused": dict(tally[FORGER].rejected),
            "order": order}
