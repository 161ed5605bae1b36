"""The real round's spot-check rules (``trainer/spot_round.py``, ``trainer/agreement.py``,
``trainer/decisions.py``), as the byzantine harness plays them (issue 32):

- an unproven member (one that passed no check yet) is drawn every round, by two verifiers, until it
  passes one; then at ``loco.spot.rate``;
- a failing verdict a round's decision names keeps its target's payload out of that round already:
  the coordinator leaves it out, and a decision naming it as a contributor is refused.
"""

from __future__ import annotations

from pulse_node.chain.identity import Identity
from pulse_node.loco.config import SpotConfig
from pulse_node.loco.decision import make_decision
from pulse_node.loco.ledger import Entry, Ledger
from pulse_node.loco.spotdraw import Shape
from pulse_node.testing.adversaries import peer_id
from pulse_node.trainer.spot_round import round_draws
from pulse_node.vocab import DEFAULT_RUN_ID

BASE = b"\x01" * 32
EPOCH = b"\x0e" * 32
SHAPE = Shape(steps=4, params=1024, leaf=64)


def _decided(keys: list[Identity], round: int):
    ids = [peer_id(k) for k in keys]
    return make_decision(keys[0], run_id=DEFAULT_RUN_ID, round=round, base=BASE, epoch=EPOCH, coordinator=ids[0],
                         contributors={t: bytes([i]) * 32 for i, t in enumerate(ids)},
                         committed={t: bytes([i + 8]) * 32 for i, t in enumerate(ids)})


def test_an_unproven_member_is_drawn_every_round_by_two_verifiers_until_it_passes_a_check():
    """Three members, at rate 0: a member that passed no check is drawn every round (two verifiers:
    one colluding verifier cannot pass it); once it passed one, rate 0 draws it no more."""
    keys = [Identity.generate() for _ in range(3)]
    ids = [peer_id(k) for k in keys]
    ledger, spot = Ledger(), SpotConfig(rate=0.0)
    ledger.entries[ids[0]] = Entry(0, 0, member=True, passed=1)  # proven
    for r in range(5):
        d = _decided(keys, r)
        draws = round_draws(d, bytes([r]) * 32, shapes=dict.fromkeys(ids, SHAPE), ledger=ledger,
                            is_member=set(ids).__contains__, spot=spot)
        by = {t: sorted(x.verifier for x in draws if x.target == t) for t in ids}
        assert by[ids[0]] == [], "a proven member is drawn at rate 0"
        for t in ids[1:]:
            assert len(by[t]) == 2 and t not in by[t], f"round {r}: unproven {t[:12]} drawn by {by[t]}"
    ledger.entries[ids[1]] = Entry(0, 4, member=True, passed=1)
    draws = round_draws(_decided(keys, 5), b"\x05" * 32, shapes=dict.fromkeys(ids, SHAPE), ledger=ledger,
                        is_member=set(ids).__contains__, spot=spot)
    assert {x.target for x in draws} == {ids[2]}
