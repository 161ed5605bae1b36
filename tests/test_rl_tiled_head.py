"""The tiled head gives each chosen token the interval and log-prob that whole logits give."""

from __future__ import annotations

import pytest
import torch

from pulse_node.rl import tiled_head
from pulse_node.rl.seeded import draw, intervals, outside
from pulse_node.rl.tiled_head import chosen_intervals


def _case(n: int, d: int, width: int, *, scale: float, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g)
    weight = torch.randn(width, d, generator=g) * scale
    b = torch.randn(width, generator=g) if bias else None
    return h, (weight, b)


def _reference(h, head, tokens, *, vocab, temperature):
    logits = torch.nn.functional.linear(h, *head)
    return intervals(logits, torch.arange(h.shape[0]), tokens, vocab=vocab, temperature=temperature)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize(("scale", "temperature", "bias"), [(0.05, 1.0, False), (0.3, 0.7, True), (20.0, 1.3, False)])
def test_equals_whole_logits(compiled: bool, scale: float, temperature: float, bias: bool) -> None:
    """Tile edges, the first and last drawable id, padding ids past the vocabulary and logits far
    past +-80 (the online maximum rescales earlier tiles) give the whole-logits numbers."""
    if compiled and not tiled_head.AVAILABLE:
        pytest.skip("numba is not importable")
    width, vocab, tile = 1000, 990, 64
    h, head = _case(70, 16, width, scale=scale, bias=bias)
    tokens = torch.randint(0, vocab, (70,), generator=torch.Generator().manual_seed(1))
    tokens[:8] = torch.tensor([0, 63, 64, 65, 127, 128, vocab - 1, 960])
    lo, hi, logp = chosen_intervals(h, head, tokens, vocab=vocab, temperature=temperature, tile=(32, tile),
                                    compiled=compiled)
    rlo, rhi, rlogp = _reference(h, head, tokens, vocab=vocab, temperature=temperature)
    assert torch.allclose(lo, rlo, atol=1e-6) and torch.allclose(hi, rhi, atol=1e-6)
    assert torch.allclose(logp, rlogp, atol=1e-4, rtol=1e-5)
    exact = torch.log_softmax(torch.nn.functional.linear(h, *head).double()[:, :vocab] / temperature, -1)
    assert torch.allclose(logp.double(), exact[torch.arange(70), tokens], atol=1e-3, rtol=1e-5)


def test_the_draw_lies_in_its_interval_and_no_other() -> None:
    """The sampler's draw from whole logits is inside its tiled interval; a neighbour id is not."""
    h, head = _case(40, 8, 300, scale=0.5, bias=False, seed=2)
    u = torch.rand(40, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    token, _ = draw(torch.nn.functional.linear(h, *head), u, vocab=300, temperature=1.0)
    lo, hi, _ = chosen_intervals(h, head, token, vocab=300, temperature=1.0, tile=(16, 50))
    assert float(outside(u, lo, hi)[0].max()) == 0.0
    lo2, hi2, _ = chosen_intervals(h, head, (token + 1) % 300, vocab=300, temperature=1.0, tile=(16, 50))
    assert bool((outside(u, lo2, hi2)[0] > 0).all())


def test_compiled_and_torch_paths_agree_at_a_real_vocabulary() -> None:
    """At 151,936 ids in the default tiles, both paths agree with each other to float rounding."""
    if not tiled_head.AVAILABLE:
        pytest.skip("numba is not importable")
    h, head = _case(48, 32, 151_936, scale=0.2, bias=False, seed=4)
    tokens = torch.randint(0, 151_936, (48,), generator=torch.Generator().manual_seed(5))
    a = chosen_intervals(h, head, tokens, vocab=151_936, temperature=1.0)
    b = chosen_intervals(h, head, tokens, vocab=151_936, temperature=1.0, compiled=False)
    for x, y in zip(a, b):
        assert torch.allclose(x.double(), y.double(), atol=1e-6)


def test_a_token_far_below_its_maximum_is_redone_exactly(monkeypatch) -> None:
    """Sums shifted by the chosen logit overflow when the token is far below its row's maximum
    (a forged token, never an honest draw): only those rows are redone with the running maximum."""
    if not tiled_head.AVAILABLE:
        pytest.skip("numba is not importable")
    redone: list[int] = []
    online = tiled_head._online
    monkeypatch.setattr(tiled_head, "_online", lambda h, *a, **k: (redone.append(h.shape[0]), online(h, *a, **k))[1])
    h, head = _case(10, 8, 500, scale=0.1, bias=False, seed=6)
    weight = head[0].clone()
    weight[7] = -h[0] * 40.0  # id 7 sits ~hundreds below row 0's maximum
    tokens = torch.nn.functional.linear(h, weight).argmax(-1)  # the other rows choose their maximum
    tokens[0] = 7
    lo, hi, logp = chosen_intervals(h, (weight, None), tokens, vocab=500, temperature=1.0, tile=(4, 128))
    rlo, rhi, rlogp = _reference(h, (weight, None), tokens, vocab=500, temperature=1.0)
    assert redone == [1]
    assert torch.allclose(lo, rlo, atol=1e-6) and torch.allclose(hi, rhi, atol=1e-6)
    assert torch.allclose(logp, rlogp, atol=1e-4, rtol=1e-5) and float(logp[0]) < -100 and float(logp.max()) <= 0
