"""A tiny FP32 trainer (MLP regression, AdamW) for PULSELoCo tests, demos and smoke runs."""

from __future__ import annotations

from collections.abc import Mapping

import torch


class ToyTrainer:
    """A 2-layer MLP regressing a fixed random target on its own data shard with AdamW."""

    def __init__(self, rank: int, *, lr: float = 1e-3, width: int = 32) -> None:
        gen = torch.Generator().manual_seed(1000 + rank)
        torch.manual_seed(rank)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Tanh(),
                                         torch.nn.Linear(width, 2))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.95))
        self.x = torch.randn(256, 8, generator=gen)
        teacher = torch.randn(8, 2, generator=torch.Generator().manual_seed(7))
        self.y = torch.sin(self.x @ teacher) + 0.1 * torch.randn(256, 2, generator=gen)
        self._params = dict(self.model.named_parameters())
        self._gen = gen

    def local_params(self) -> Mapping[str, torch.Tensor]:
        return self._params

    def inner_step(self) -> float:
        i = torch.randint(0, 256, (32,), generator=self._gen)
        loss = torch.nn.functional.mse_loss(self.model(self.x[i]), self.y[i])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())
