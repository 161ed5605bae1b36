"""PULSELoCo error feedback: the BF16 gate, exact conservation, restore after a missed round."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pulse_node.loco.config import LocoConfig
from pulse_node.loco.sparsify import ErrorFeedback


def bf16_bits_reference(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even FP32 -> BF16 in integer arithmetic (finite inputs)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def weights(seed: int, n: int = 4096) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-6, 0, n)[torch.randperm(n, generator=g)]
    w = torch.randn(n, generator=g) * scale
    w[:8] = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1.0, -1.0, 3.0e38, 2.0 ** -126])
    return {"a.weight": w.reshape(64, 64).contiguous(), "b": torch.randn(7, generator=g)}


def step(params: dict[str, torch.Tensor], seed: int, size: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: t - size * torch.randn(t.shape, generator=g) for n, t in params.items()}


def scatter(payload, name: str, shape) -> torch.Tensor:
    out = torch.zeros(shape).view(-1)
    idx, vals = payload.tensors[name]
    out[torch.from_numpy(idx)] = torch.from_numpy(vals)
    return out.view(shape)


@pytest.mark.parametrize("size", [1e-6, 1e-4, 1e-2])
def test_gate_fires_exactly_where_bf16_changes(size: float) -> None:
    glob = weights(1)
    ef = ErrorFeedback({n: t.shape for n, t in glob.items()}, cfg=LocoConfig())
    e0 = {n: (1e-5 * torch.randn(t.shape, generator=torch.Generator().manual_seed(9))) for n, t in glob.items()}
    ef.load_state_dict(e0)
    local = step(glob, 2, size)
    p = ef.make_payload(glob, local, round=0, trainer_id="a")
    for name, g in glob.items():
        gn, ln, en = g.numpy().ravel(), local[name].numpy().ravel(), e0[name].numpy().ravel()
        s = (en + (gn - ln)).astype(np.float32)
        want = np.flatnonzero(bf16_bits_reference(gn) != bf16_bits_reference((gn - s).astype(np.float32)))
        idx, vals = p.tensors[name]
        assert np.array_equal(idx, want)
        assert np.array_equal(vals.view(np.uint32), s[want].view(np.uint32))
    assert 0 < p.count < sum(t.numel() for t in glob.values()) or size == 1e-2


def test_sent_plus_kept_is_exactly_e_plus_d() -> None:
    glob = weights(3)
    shapes = {n: t.shape for n, t in glob.items()}
    ef = ErrorFeedback(shapes, cfg=LocoConfig())
    for rnd in range(5):
        e_before = ef.state_dict()
        local = step(glob, 10 + rnd, 3e-4)
        p = ef.make_payload(glob, local, round=rnd, trainer_id="a")
        for name, g in glob.items():
            s = e_before[name] + (g - local[name])
            sent, kept = scatter(p, name, g.shape), ef.e[name]
            fired = sent != 0
            assert torch.equal(kept[fired], torch.zeros_like(kept[fired]))
            assert torch.equal(kept[~fired].view(torch.int32), s[~fired].view(torch.int32))
            idx, vals = p.tensors[name]
            assert np.array_equal(vals.view(np.uint32), s.view(-1).numpy()[idx].view(np.uint32))
        assert p.count > 0


def test_restore_puts_unsent_payload_back_into_e() -> None:
    glob = weights(4)
    ef = ErrorFeedback({n: t.shape for n, t in glob.items()}, cfg=LocoConfig())
    ef.make_payload(glob, step(glob, 5, 1e-4), round=0, trainer_id="a")
    e_before = ef.state_dict()
    local = step(glob, 6, 1e-3)
    p = ef.make_payload(glob, local, round=1, trainer_id="a")
    assert p.count > 0
    ef.restore(p)
    for name, g in glob.items():
        s = e_before[name] + (g - local[name])
        assert torch.equal(ef.e[name].view(torch.int32), s.view(torch.int32))
    with pytest.raises(ValueError):
        ef.restore(p)  # only the latest unsent payload can be restored, once


def test_gate_none_sends_everything_and_keeps_nothing() -> None:
    glob = weights(5)
    ef = ErrorFeedback({n: t.shape for n, t in glob.items()}, cfg=LocoConfig(gate="none"))
    p = ef.make_payload(glob, step(glob, 7, 1e-7), round=0, trainer_id="a")
    assert p.count == sum(t.numel() for t in glob.values())
    assert all(torch.count_nonzero(e) == 0 for e in ef.e.values())


def test_buffers_are_reused_across_rounds() -> None:
    glob = weights(6)
    ef = ErrorFeedback({n: t.shape for n, t in glob.items()}, cfg=LocoConfig())
    ptrs = {t.data_ptr() for t in [*ef.e.values(), *ef._flat.values()]}
    for rnd in range(4):
        ef.make_payload(glob, step(glob, rnd, 1e-4), round=rnd, trainer_id="a")
    assert {t.data_ptr() for t in [*ef.e.values(), *ef._flat.values()]} == ptrs
    largest = max(t.numel() for t in glob.values())  # one scratch for all tensors, not one per tensor
    assert all(t.numel() == largest for t in ef._flat.values())


@pytest.mark.parametrize("c", [0.3325, 0.5, 2.0])
def test_gate_scale_changes_what_fires_and_keeps_sent_plus_kept_exact(c: float) -> None:
    glob = weights(7)
    shapes = {n: t.shape for n, t in glob.items()}
    ref, scaled = ErrorFeedback(shapes, cfg=LocoConfig()), ErrorFeedback(shapes, cfg=LocoConfig(gate_scale=c))
    local = step(glob, 8, 3e-4)
    p_ref = ref.make_payload(glob, local, round=0, trainer_id="a")
    p = scaled.make_payload(glob, local, round=0, trainer_id="a")
    for name, g in glob.items():
        gn = g.numpy().ravel()
        s = (gn - local[name].numpy().ravel()).astype(np.float32)
        cs = (np.float32(c) * s).astype(np.float32)
        want = np.flatnonzero(bf16_bits_reference(gn) != bf16_bits_reference((gn - cs).astype(np.float32)))
        idx, vals = p.tensors[name]
        assert np.array_equal(idx, want)
        assert np.array_equal(vals.view(np.uint32), s[want].view(np.uint32))  # the exact s, unscaled
        kept = scaled.e[name].numpy().ravel()
        sent = np.zeros_like(s)
        sent[idx] = vals
        assert np.array_equal((sent + kept).view(np.uint32), s.view(np.uint32))
        assert not np.any(kept[idx])
    # a smaller scale fires on fewer entries than the reference gate, a larger one on more
    assert (p.count < p_ref.count) if c < 1 else (p.count > p_ref.count)


def test_gate_scale_must_be_positive() -> None:
    import pydantic

    for bad in (0.0, -1.0):
        with pytest.raises(pydantic.ValidationError):
            LocoConfig(gate_scale=bad)
    assert LocoConfig().gate_scale == 1.0
