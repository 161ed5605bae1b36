"""The trust ledger (``loco/ledger.py``) and the trust-weighted robust rule (``loco/aggregate.py``):
members weigh 1, newcomers share one capped weight however many they are, open trainers earn
weight by checks passed, a convicted key weighs 0; the ledger changes only by the facts a decision
names, hashes into the outer state, survives a trainer-state round trip and refuses hostile bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pulse_node.errors import WireError
from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.config import LocoConfig, TrustConfig
from pulse_node.loco.ledger import Ledger, RoundFacts, Verdict
from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.testing.byzantine.toy import at_bound
from pulse_node.testing.toy import ToyTrainer


def test_newcomers_share_one_weight_whatever_their_number() -> None:
    ledger = Ledger(TrustConfig(newcomer_weight=0.5))
    for n in (1, 10, 1000):
        w = ledger.weights(["m0", "m1", *(f"s{i:04d}" for i in range(n))], members={"m0", "m1"})
        assert w["m0"] == w["m1"] == 1.0
        assert sum(v for k, v in w.items() if k.startswith("s")) == pytest.approx(0.5, rel=1e-6)


def test_open_trainers_earn_weight_by_checks_passed_and_lose_it_for_good_when_convicted() -> None:
    cfg = TrustConfig(newcomer_checks=2, earn_checks=4)
    ledger = Ledger(cfg)
    for r in range(1, 3):
        ledger.record(RoundFacts(r, bytes([r]) * 32, contributors=("o",), verdicts=(Verdict(r - 1, "o", "m", True),)))
    assert not ledger.newcomer("o", member=False)
    assert ledger.weights(["m", "o"], members={"m"}) == {"m": 1.0, "o": 0.5}
    again = Verdict(1, "o", "m", True)  # named a second time: counted once
    ledger.record(RoundFacts(3, b"x" * 32, contributors=("o", "m"), members=frozenset({"m"}),
                             verdicts=(again, Verdict(2, "o", "m", False), Verdict(2, "m", "o", False))))
    assert ledger.weights(["o", "m"], members={"m"}) == {"o": 0.0, "m": 0.0}  # both failed: owing a check
    assert ledger.owing("m") and ledger.owing("o")
    ledger.record(RoundFacts(4, b"z" * 32, verdicts=(Verdict(3, "m", "o", True), Verdict(3, "o", "m", True))))
    assert ledger.weights(["o", "m"], members={"m"}) == {"o": 0.25, "m": 1.0}  # 3 passed - 2 x 1 failed of 4
    ledger.record(RoundFacts(5, b"y" * 32, convicted=("o",)))
    for r in range(6, 20):
        ledger.record(RoundFacts(r, bytes([r]) * 32, contributors=("o",), verdicts=(Verdict(r - 1, "o", "m", True),)))
    assert ledger.weights(["o"], members={"o"})["o"] == 0.0


def test_entry_is_bounded_and_drawn_by_the_last_decision() -> None:
    ledger = Ledger(TrustConfig(open_per_round=2))
    keys = [f"k{i}" for i in range(50)]
    ledger.record(RoundFacts(0, b"a" * 32))
    first = ledger.entrants(keys)
    assert len(first) == 2 and first == Ledger(TrustConfig(open_per_round=2), seed=b"a" * 32).entrants(keys[::-1])
    ledger.record(RoundFacts(1, b"b" * 32))
    assert ledger.entrants(keys) != first  # another decision, another draw


def test_round_trip_hash_and_hostile_bytes() -> None:
    ledger = Ledger(TrustConfig(max_entries=16))
    for r in range(40):  # more keys than it keeps: the idle newcomers go, members stay
        ledger.record(RoundFacts(r, bytes([r]) * 32, contributors=("m", f"n{r}"), members=frozenset({"m"}),
                                 verdicts=(Verdict(r - 1, "m", f"n{r}", True),)))
    assert len(ledger.entries) == 16 and "m" in ledger.entries and "n39" in ledger.entries
    back = Ledger.decode(ledger.encode(), cfg=TrustConfig(max_entries=16))
    assert back.digest() == ledger.digest() and back.entries == ledger.entries
    for bad in (b"", b"\x00" * 64, ledger.encode()[:-3], b"\x93" + ledger.encode()[1:]):
        with pytest.raises(WireError):
            Ledger.decode(bad, cfg=TrustConfig(max_entries=16))


def test_the_ledger_is_part_of_the_outer_state() -> None:
    params = {"w": torch.ones(4)}
    a, b = OuterOptimizer(dict(params), LocoConfig()), OuterOptimizer({"w": torch.ones(4)}, LocoConfig())
    assert a.state_hash() == b.state_hash()
    a.ledger.record(RoundFacts(0, b"d" * 32, contributors=("x",)))
    a.set_round(a.round)
    assert a.state_hash() != b.state_hash()
    b.load_state_dict(a.state_dict())
    assert b.state_hash() == a.state_hash()


def _flood(n: int, *, lr: float = 1e-3, rounds: int = 3, weighted: bool = True) -> float:
    """|w| / |w0| after ``rounds`` of 4 honest members and ``n`` newcomers at 0.999 x bound x sign(w)."""
    cfg = LocoConfig(inner_steps=5)
    bound = PayloadBound.of(cfg, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    trainers = [ToyTrainer(r, lr=lr) for r in range(4)]
    start = {k: t.detach().clone() for k, t in trainers[0].local_params().items()}
    outer = OuterOptimizer({k: t.clone() for k, t in start.items()}, cfg)
    attack = at_bound(np.sign, ids=[f"s{i:04d}" for i in range(n)])
    for rnd in range(rounds):
        honest = []
        for i, tr in enumerate(trainers):
            with torch.no_grad():
                for k, t in tr.local_params().items():
                    t.copy_(outer.params[k])
            for _ in range(cfg.inner_steps):
                tr.inner_step()
            delta = {k: (outer.params[k] - t.detach()).reshape(-1).numpy() for k, t in tr.local_params().items()}
            honest.append(LocoPayload(rnd, f"h{i}", outer.state_hash(),
                                      {k: (np.arange(v.size, dtype=np.int64), v.astype(np.float32))
                                       for k, v in delta.items()}, {k: v.size for k, v in delta.items()}))
        payloads = honest + attack(rnd, outer, bound, honest)
        trust = outer.ledger.weights([p.trainer_id for p in payloads], members={p.trainer_id for p in honest})
        outer.apply(payloads, trust=trust if weighted else None)
    w = torch.cat([t.reshape(-1) for t in outer.params.values()])
    return float(w.norm() / torch.cat([t.reshape(-1) for t in start.values()]).norm())


def test_one_or_a_hundred_newcomers_at_the_bound_move_the_model_alike() -> None:
    """Each newcomer at 0.999 x bound x sign(w) (issue 32 item 1): weighted, 100 of them shrink
    the weights as much as one does; counted one key one vote, they would own the median."""
    one, many, unweighted = _flood(1), _flood(100), _flood(100, weighted=False)
    assert one == pytest.approx(many, rel=1e-4)
    assert 1 - many < 0.5 * (1 - unweighted)


def test_a_member_is_checked_every_round_until_it_passes_one_check() -> None:
    """A member that passed no check is ``unproven`` (drawn every round by one verifier), so one that
    cannot answer is out after its first round rather than after a 1 / rate wait."""
    ledger = Ledger(TrustConfig())
    assert ledger.unproven("m", member=True) and not ledger.unproven("o", member=False)
    ledger.record(RoundFacts(1, b"a" * 32, contributors=("m", "n"), members=frozenset({"m", "n"}),
                             verdicts=(Verdict(0, "m", "n", False), Verdict(0, "n", "m", True))))
    assert ledger.unproven("m", member=True) and ledger.owing("m")  # failed: still unproven, and out
    assert not ledger.unproven("n", member=True)
    ledger.record(RoundFacts(2, b"b" * 32, verdicts=(Verdict(1, "m", "n", True),)))
    assert not ledger.unproven("m", member=True) and not ledger.owing("m")


def test_a_flood_of_convicted_throwaway_keys_forgets_neither_members_nor_earned_standing() -> None:
    """Two throwaway keys convicted every round for many times the ledger's size: the convicted
    member stays convicted, the open trainer keeps what it earned; only keys with no standing go."""
    cfg = TrustConfig(max_entries=16, earn_checks=2)
    ledger = Ledger(cfg)
    ledger.record(RoundFacts(0, b"\0" * 32, contributors=("m", "bad-m", "open"), members=frozenset({"m", "bad-m"}),
                             convicted=("bad-m",)))
    for r in range(1, 4):
        ledger.record(RoundFacts(r, bytes([r]) * 32, contributors=("m", "open"), members=frozenset({"m"}),
                                 verdicts=(Verdict(r - 1, "open", "m", True),)))
    earned = ledger.earned("open")
    assert earned == 1.0 and ledger.convicted("bad-m")
    for r in range(4, 200):
        junk = (f"junk{r}a", f"junk{r}b")
        ledger.record(RoundFacts(r, bytes([r % 256]) * 32, contributors=("m", *junk), members=frozenset({"m"}),
                                 convicted=junk))
    assert len(ledger.entries) == 16
    assert ledger.convicted("bad-m") and ledger.earned("open") == earned
    assert ledger.convicted("junk199a")  # the newest throwaway keys are still held
