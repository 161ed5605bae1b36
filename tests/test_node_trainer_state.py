"""The trainer-state file (how trainers join and re-sync) read as hostile input: any damaged copy
is refused with a ``PulseError`` (never another exception, which would end the trainer), and
nothing that reads back differs from what was written, FP32 low bits and momentum included."""

from __future__ import annotations

import random

import torch

from pulse_node.chain.identity import Identity
from pulse_node.chain.record import make_record
from pulse_node.codec.statehash import state_hash
from pulse_node.errors import PulseError
from pulse_node.loco.config import TrustConfig
from pulse_node.loco.ledger import Ledger, RoundFacts, Verdict
from pulse_node.torchbits import module_state
from pulse_node.trainer.state import export_trainer_state, read_trainer_state


def _written(tmp_path):
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(16, 8, generator=gen), "b": torch.randn(8, generator=gen)}
    momentum = {n: torch.randn(t.shape, generator=gen) for n, t in params.items()}
    record = make_record(Identity.generate(), run_id="r", version=0, parent=None,
                         state_hash=state_hash(module_state(params.items())), patch=None, anchor_version=0,
                         is_anchor=True, codec="pulsesync/compact/1")
    ledger = Ledger(TrustConfig())
    ledger.record(RoundFacts(1, b"d" * 32, contributors=("a", "b"), members=frozenset({"a"}),
                             verdicts=(Verdict(0, "b", "a", True),)))
    return export_trainer_state(tmp_path, params=params, momentum=momentum, record=record,
                                ledger=ledger), params, momentum


def test_round_trip(tmp_path):
    path, params, momentum = _written(tmp_path)
    state, record = read_trainer_state(path, names={"w", "b"}, trust=TrustConfig())
    assert record.version == 0 and state["round"] == 0
    assert Ledger.decode(state["ledger"], cfg=TrustConfig()).entries["b"].passed == 1
    assert all(torch.equal(state["params"][n], params[n]) and torch.equal(state["momentum"][n], momentum[n])
               for n in params)


def test_every_single_bit_flip_is_refused_or_harmless(tmp_path):
    path, params, momentum = _written(tmp_path)
    clean = path.read_bytes()
    rng = random.Random(1)
    low_bit_of_a_param = clean.rindex(params["w"][3, 5].numpy().tobytes())  # FP32 bits bf16 ignores
    positions = [low_bit_of_a_param] + rng.sample(range(len(clean)), 300)
    for i in positions:
        damaged = bytearray(clean)
        damaged[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        try:
            state, _ = read_trainer_state(path, names={"w", "b"}, trust=TrustConfig())
        except PulseError:
            continue
        for n in params:  # accepted: must be exactly what was written
            assert torch.equal(state["params"][n], params[n]) and torch.equal(state["momentum"][n], momentum[n]), i
