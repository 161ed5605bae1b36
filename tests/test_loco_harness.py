"""PULSELoCo with N in-process trainers agreeing as the node does: identical global state, partial participation."""

from __future__ import annotations

import numpy as np
import torch

from pulse_node.loco.config import LocoConfig
from pulse_node.loco.sparsify import ErrorFeedback
from pulse_node.testing.loco_harness import run_inprocess
from pulse_node.testing.toy import ToyTrainer

CFG = LocoConfig(inner_steps=4)


class RecordingFeedback(ErrorFeedback):
    """Remembers the last payload and ``e`` right after it was restored."""

    def make_payload(self, *args, **kwargs):
        self.last = super().make_payload(*args, **kwargs)
        self.restored_e = None
        return self.last

    def restore(self, payload, *, keep=0.0):
        super().restore(payload, keep=keep)
        if keep == 0.0:  # left out of the round (a partial keep is the aggregation's)
            self.restored_e = self.state_dict()


def test_all_trainers_share_bit_identical_global_state_every_round() -> None:
    run = run_inprocess(4, ToyTrainer, rounds=6, cfg=CFG)
    for rec in run.records:
        assert len(set(rec.hashes.values())) == 1
        assert rec.contributors == ["t000", "t001", "t002", "t003"]
        assert sum(rec.fired.values()) > 0
    assert run.records[-1].loss < run.records[0].loss
    first = run.replicas[0].outer.params
    for rep in run.replicas[1:]:
        for name, t in rep.outer.params.items():
            assert torch.equal(t.view(torch.int32), first[name].view(torch.int32))
            assert torch.equal(rep.trainer.local_params()[name], t)  # local reset to global


def test_dropped_trainer_keeps_its_error_feedback_and_others_proceed() -> None:
    seen = {}

    def on_round(rec, replicas):
        if rec.round == 2:
            fb = replicas[1].feedback
            seen["payload"], seen["e"] = fb.last, fb.restored_e

    run = run_inprocess(3, ToyTrainer, rounds=4, cfg=CFG, drop=lambda r: {1} if r == 2 else set(),
                        make_feedback=RecordingFeedback, on_round=on_round)
    rec = run.records[2]
    assert rec.contributors == ["t000", "t002"] and len(set(rec.hashes.values())) == 1
    assert seen["payload"].count > 0
    for name, (idx, vals) in seen["payload"].tensors.items():
        kept = seen["e"][name].view(-1).numpy()[idx]
        assert np.array_equal(kept.view(np.uint32), vals.view(np.uint32))
    assert all(len(r.contributors) == 3 for i, r in enumerate(run.records) if i != 2)
    assert all(len(set(r.hashes.values())) == 1 for r in run.records)


def test_dense_gate_matches_plain_diloco_fp32() -> None:
    """gate="none" through the same pipeline equals a hand-written dense DiLoCo round."""
    cfg = LocoConfig(inner_steps=3, gate="none")
    run = run_inprocess(2, ToyTrainer, rounds=1, cfg=cfg)
    trainers = [ToyTrainer(r) for r in range(2)]
    start = {n: t.detach().clone() for n, t in trainers[0].local_params().items()}
    with torch.no_grad():
        for t in trainers[1:]:
            for n, p in t.local_params().items():
                p.copy_(start[n])
    for t in trainers:
        for _ in range(3):
            t.inner_step()
    for name, g0 in start.items():
        d = [g0 - t.local_params()[name].detach() for t in trainers]
        mean = (d[0] + d[1]) / 2
        want = g0 - 0.7 * (mean + 0.9 * mean)
        torch.testing.assert_close(run.global_params()[name], want, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- outer_placement = "trainer"

TRAINER_CFG = LocoConfig(inner_steps=4, outer_placement="trainer")


def test_trainer_placement_dense_equals_the_reference_outer_step() -> None:
    """Dense (gate "none"): the plain mean of the trainers' own Nesterov updates is the
    reference's shared Nesterov step on the mean pseudo-gradient, round after round."""
    mean = {"rule": "mean"}  # the equivalence is the plain mean's (a linear step)
    ref = run_inprocess(3, ToyTrainer, rounds=4, cfg=LocoConfig(inner_steps=4, gate="none", aggregate=mean))
    moved = run_inprocess(3, ToyTrainer, rounds=4, cfg=LocoConfig(inner_steps=4, gate="none", aggregate=mean,
                                                                  outer_placement="trainer"))
    for name, want in ref.global_params().items():
        torch.testing.assert_close(moved.global_params()[name], want, rtol=1e-5, atol=1e-7)
    assert all(float(m.abs().max()) == 0.0 for m in moved.replicas[0].outer.momentum.values())
    assert any(float(m.abs().max()) > 0.0 for m in ref.replicas[0].outer.momentum.values())


def test_trainer_placement_keeps_trainers_bit_identical_and_learning() -> None:
    run = run_inprocess(4, ToyTrainer, rounds=6, cfg=TRAINER_CFG)
    assert all(len(set(r.hashes.values())) == 1 for r in run.records)
    assert run.records[-1].loss < run.records[0].loss
    assert all(sum(r.fired.values()) > 0 for r in run.records)


def test_trainer_placement_gates_the_update_not_the_pseudo_gradient() -> None:
    """sent + kept == e + u exactly, with u = lr * (d + mu * v), v = d in the first round; sent
    values lie on their weight's FP32 grid (w - (w - sent) == sent) and restore is exact."""
    trainer = ToyTrainer(0)
    g = {n: t.detach().clone() for n, t in trainer.local_params().items()}
    for _ in range(3):
        trainer.inner_step()
    local = {n: t.detach().clone() for n, t in trainer.local_params().items()}
    fb = ErrorFeedback({n: t.shape for n, t in g.items()}, cfg=TRAINER_CFG)
    p = fb.make_payload(g, local, round=0, trainer_id="t")
    for name in g:
        d = g[name] - local[name]
        u = (d + d * 0.9) * 0.7  # v = 0.9 * 0 + d
        sent = torch.zeros_like(u).view(-1)
        idx, vals = p.tensors[name]
        sent[torch.from_numpy(idx)] = torch.from_numpy(vals)
        torch.testing.assert_close(sent.view_as(u) + fb.e[name], u, rtol=0, atol=0)
        torch.testing.assert_close(fb.v[name], d, rtol=0, atol=0)
        w = g[name].view(-1)[torch.from_numpy(idx)]
        v = torch.from_numpy(vals)
        assert torch.equal((w - (w - v)).view(torch.int32), v.view(torch.int32))
        assert bool((v != 0).all())
    state = fb.state_dict()
    assert {k for k in state if k.startswith("momentum/")} == {f"momentum/{n}" for n in g}
    other = ErrorFeedback({n: t.shape for n, t in g.items()}, cfg=TRAINER_CFG)
    other.load_state_dict(state)
    assert all(torch.equal(other.v[n], fb.v[n]) and torch.equal(other.e[n], fb.e[n]) for n in g)
    fb.restore(p)  # missed the round: e holds all of u again, bit for bit
    for name in g:
        u = ((g[name] - local[name]) + (g[name] - local[name]) * 0.9) * 0.7
        assert torch.equal(fb.e[name].view(torch.int32), u.view(torch.int32))
