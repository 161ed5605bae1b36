"""The trainer's rollout intake: round robin between senders, caps, bans and tallies."""

from __future__ import annotations

from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Lied
from pulse_node.peers.strikes import Strikes
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.rl.config import VerifyConfig
from pulse_node.trainer.intake import RolloutIntake

KIB = 1 << 10


def intake(**cfg) -> RolloutIntake:
    return RolloutIntake(VerifyConfig(**({"max_queued_bytes": 64 * KIB, "max_total_bytes": 256 * KIB} | cfg)), book=PeerBook(TrainerSet(run_id="r")))


def drain(q: RolloutIntake) -> list[tuple[str, bytes]]:
    out = []
    while (item := q.take()) is not None:
        out.append(item)
    return out


def test_round_robin_between_senders() -> None:
    q = intake(max_queued_batches=10)
    for i in range(6):
        q.offer("flooder", b"f%d" % i)
    q.offer("a", b"a0")
    q.offer("a", b"a1")
    q.offer("b", b"b0")
    got = drain(q)
    assert [s for s, _ in got[:5]] == ["flooder", "a", "b", "flooder", "a"]
    assert [d for s, d in got if s == "flooder"] == [b"f%d" % i for i in range(6)]  # FIFO per sender
    assert len(q) == 0 and q.total_bytes == 0 and q.take() is None


def test_per_sender_caps_drop_that_senders_oldest() -> None:
    q = intake(max_queued_batches=3)
    kept = [q.offer("flooder", b"%03d" % i) for i in range(10)]
    assert all(kept) and len(q) == 3
    assert [d for _, d in drain(q)] == [b"007", b"008", b"009"]
    t = q.tallies()["flooder"]
    assert t.rejected == {"queue_full": 7} and t.queued == 0 and t.strikes == 0
    assert not q.offer("big", b"x" * (64 * KIB + 1))  # larger than a sender may queue
    assert q.tallies()["big"].rejected == {"too_large": 1}
    q.offer("s", b"x" * (40 * KIB))
    q.offer("s", b"y" * (40 * KIB))  # over the sender's byte cap: the first goes
    assert [d[:1] for _, d in drain(q)] == [b"y"]


def test_total_cap_evicts_from_the_largest_queue() -> None:
    q = intake(max_queued_batches=8, max_total_bytes=100 * KIB)
    for _ in range(4):
        q.offer("big", b"b" * (20 * KIB))
    q.offer("small", b"s" * (10 * KIB))
    q.offer("small2", b"t" * (15 * KIB))  # 4*20 + 10 + 15 > 100: "big" loses its oldest
    t = q.tallies()
    assert t["big"].queued == 3 and t["big"].rejected == {"queue_full": 1}
    assert t["small"].queued == 1 and t["small2"].queued == 1 and q.total_bytes <= 100 * KIB


def test_strikes_ban_a_sender_and_are_tallied() -> None:
    q = RolloutIntake(VerifyConfig(), book=PeerBook(TrainerSet(run_id="r"), strikes=Strikes(max_strikes=3, ban_s=60)))
    for reason in ("not_sampled", "wrong_reward"):
        q.refused("liar", reason, strike=True)
    q.refused("liar", "stale", strike=False)
    assert q.offer("liar", b"batch")  # two strikes: not banned yet
    q.refused("liar", "forged_logprobs", strike=True)
    assert not q.offer("liar", b"batch2")  # third strike: banned, refused on arrival
    q.accepted("honest", 256)
    t = q.tallies()
    assert t["liar"].banned and t["liar"].strikes == 3
    assert t["liar"].rejected == {"not_sampled": 1, "wrong_reward": 1, "stale": 1, "forged_logprobs": 1,
                                     "banned": 1}
    h = t["honest"]
    assert (h.accepted, h.accepted_rollouts, h.banned, h.strikes) == (1, 256, False, 0)


def test_batches_queued_before_a_ban_are_dropped_unverified() -> None:
    """A sender banned after its batches were queued costs no verification for them."""
    q = intake(max_queued_batches=10)
    for i in range(5):
        q.offer("liar", b"l%d" % i)
    q.offer("honest", b"h0")
    for _ in range(3):
        q.book.judge("liar", Lied())
    assert drain(q) == [("honest", b"h0")]
    t = q.tallies()["liar"]
    assert t.rejected == {"banned": 5} and t.queued == 0 and q.total_bytes == 0


def test_fresh_keys_share_one_turn_together() -> None:
    """Senders with standing (a batch accepted before) take turns; 1 or 1,000 fresh keys get one
    take in ``NEWCOMER_EVERY`` together, so the honest senders' share is the same."""
    from pulse_node.trainer.intake import NEWCOMER_EVERY

    shares = []
    for n in (1, 1000):
        q = intake(max_queued_batches=50)
        q.accepted("a", 4)
        q.accepted("b", 4)
        for i in range(n):
            for _ in range(max(1, 20 // n)):  # one key with many batches, or many keys with one
                q.offer(f"sybil-{i}", b"junk")
        for i in range(20):
            q.offer("a", b"a%d" % i)
            q.offer("b", b"b%d" % i)
        first = [q.take()[0] for _ in range(4 * NEWCOMER_EVERY)]
        shares.append(sum(s in ("a", "b") for s in first))
    assert shares[0] == shares[1] == 4 * (NEWCOMER_EVERY - 1)
