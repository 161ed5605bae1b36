"""Per-trainer side of PULSELoCo: pseudo-gradient, BF16 gate and the error-feedback buffer.

Each round, per tensor (all in FP32; the scratch is one set of buffers the size of the largest
tensor, allocated once and reused for every tensor and round, so it costs ~13 B per element of
that tensor instead of per parameter, and the heap does not grow round after round)::

    d = theta_global - theta_local          # the pseudo-gradient
    s = e + d                               # plus what earlier rounds did not send
    fire = bits(bf16(theta_global)) != bits(bf16(theta_global - c * s))   # c = cfg.gate_scale
    send (positions of fire, s[fire]);  e = s with the fired entries set to 0

(``c = 1``, the default, is the reference gate; ``c`` only changes which entries fire, a fired
entry is still sent as the exact ``s``), so ``sent + kept == s`` entrywise and exactly (every
entry of ``s`` is either sent unchanged or kept unchanged). With ``cfg.outer_placement ==
"trainer"`` the trainer first runs the outer step on ``d`` with its own momentum ``v`` and
gates that update instead: ``v = mu * v + d; u = lr * (d + mu * v)`` (``lr * v`` without
Nesterov), ``s = e + u``. BF16 casts round to nearest even;
the comparison is bitwise (int16 views), so a change of sign of zero also fires. A trainer left
out of a round calls ``restore(payload)``, which puts the sent values back into ``e`` exactly
(they were zeroed, so ``0 + v == v``; with the trainer placement ``e`` holds the sub-ulp
remainder of each sent value, see ``_on_weight_grid``, and ``remainder + sent == v``). A trainer
whose payload the round's aggregation applied only in part (weight ``k < 1``,
``loco/aggregate.py``) calls ``restore(payload, keep=k)``: the part not applied goes back into
``e``, so its work is delayed, not lost.

With a ``bound`` (``loco/bound.py``, what the trainer role passes) a fired entry is sent clipped
to half the payload value bound and the excess stays in ``e`` (``clipped`` counts such entries
of the last payload): receivers refuse entries above the bound, and only a trainer left out of
several rounds in a row accumulates that much. ``restore`` is then exact up to one FP32
rounding of ``excess + sent`` per clipped entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from pulse_node.loco.bound import SENDER_SHARE, PayloadBound
from pulse_node.loco.config import LocoConfig
from pulse_node.loco.payload import LocoPayload


class ErrorFeedback:
    """The error-feedback buffer ``e`` of one trainer plus scratch buffers for the gate."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], *, cfg: LocoConfig,
                 bound: PayloadBound | None = None) -> None:
        self.cfg = cfg
        self.bound = bound
        self.clipped = 0  # entries of the last payload clipped to the bound
        self.shapes = {n: tuple(int(d) for d in shapes[n]) for n in sorted(shapes)}
        f32 = torch.float32
        self.e = {n: torch.zeros(s, dtype=f32) for n, s in self.shapes.items()}
        self.v = ({n: torch.zeros(s, dtype=f32) for n, s in self.shapes.items()}
                  if cfg.outer_placement == "trainer" else {})  # this trainer's own outer momentum
        largest = max((math.prod(s) for s in self.shapes.values()), default=0)
        self._flat = {"s": torch.zeros(largest, dtype=f32), "tmp": torch.zeros(largest, dtype=f32),
                      "a": torch.zeros(largest, dtype=torch.bfloat16), "b": torch.zeros(largest, dtype=torch.bfloat16),
                      "mask": torch.zeros(largest, dtype=torch.bool)}
        self._pending: tuple[int, str] | None = None

    def _scratch(self, key: str, name: str) -> torch.Tensor:
        """Scratch buffer ``key`` viewed as tensor ``name`` (valid until the next tensor)."""
        shape = self.shapes[name]
        return self._flat[key][:math.prod(shape)].view(shape)

    def _gate(self, name: str, g: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Bool mask of the entries of ``s`` where ``c * s`` would change ``bf16(g)``."""
        mask = self._scratch("mask", name)
        if self.cfg.gate == "none":
            return mask.fill_(True)
        tmp, a, b = self._scratch("tmp", name), self._scratch("a", name), self._scratch("b", name)
        c = self.cfg.gate_scale
        if c == 1.0:
            torch.sub(g, s, out=tmp)
        else:
            torch.mul(s, c, out=tmp)
            tmp.neg_().add_(g)  # g - fp32(c * s)
        a.copy_(g)
        b.copy_(tmp)
        return torch.ne(a.view(torch.int16), b.view(torch.int16), out=mask)

    def _outer_step(self, name: str, d: torch.Tensor) -> None:
        """``d`` becomes this trainer's outer update ``u`` (in place; ``outer_placement="trainer"``)."""
        v, tmp, cfg = self.v[name], self._scratch("tmp", name), self.cfg
        v.mul_(cfg.outer_momentum).add_(d)
        if cfg.nesterov:
            torch.mul(v, cfg.outer_momentum, out=tmp)
            d.add_(tmp)
        else:
            d.copy_(v)
        d.mul_(cfg.outer_lr)

    def _split(self, name: str, g: torch.Tensor, local: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        s, e = self._scratch("s", name), self.e[name]
        torch.sub(g, local, out=s)  # d
        if self.v:
            self._outer_step(name, s)  # u
        torch.add(e, s, out=s)  # s = e + d (or e + u)
        mask = self._gate(name, g, s)
        idx = mask.view(-1).nonzero().view(-1)
        vals = s.view(-1).index_select(0, idx)
        # s becomes the new e with the fired entries cleared
        e.copy_(s).masked_fill_(mask, 0.0)
        if self.bound is not None:
            vals = self._clip(self.bound, g.view(-1).index_select(0, idx), vals, e.view(-1), idx)
        if self.v:
            vals = self._on_weight_grid(g.view(-1).index_select(0, idx), vals, e.view(-1), idx)
        return idx.numpy(), vals.numpy()

    def _clip(self, bound: PayloadBound, w: torch.Tensor, vals: torch.Tensor, e: torch.Tensor,
              idx: torch.Tensor) -> torch.Tensor:
        """Fired values clipped to ``SENDER_SHARE`` of the bound at their base weights ``w``; the
        excess is added to ``e`` (0 there: the entries fired)."""
        lim = torch.from_numpy(bound.limit(w.numpy()) * SENDER_SHARE).to(torch.float32)
        sent = torch.clamp(vals, min=-lim, max=lim)
        over = sent != vals
        if bool(over.any()):
            e.index_add_(0, idx[over], (vals - sent)[over])
            self.clipped += int(over.sum())
        return sent

    @staticmethod
    def _on_weight_grid(w: torch.Tensor, vals: torch.Tensor, e: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Send ``w - fp32(w - v)``, the part of each fired ``v`` the FP32 weight can take; keep the rest.

        The outer update ``u`` has FP32 bits far below ``w``'s ulp (it is scaled by ``lr`` and
        ``mu``), which the payload value coder can only send raw (~4 B per entry instead of
        ~2.5); rounded to ``w``'s grid it codes like a pseudo-gradient. The remainder
        ``v - sent`` (at most half an FP32 ulp of ``w``) stays in ``e`` at that position, so
        ``sent + kept == v`` still holds exactly (Sterbenz: ``v`` and ``sent`` are within a
        factor 2 of each other, or ``sent`` is 0 and the remainder is ``v``).
        """
        sent = w - (w - vals)
        e.index_add_(0, idx, vals - sent)  # e is 0 there, or a clipped excess
        return sent

    @torch.no_grad()
    def make_payload(self, global_params: Mapping[str, torch.Tensor],
                     local_params: Mapping[str, torch.Tensor], *, round: int, trainer_id: str,
                     base_hash: bytes = b"") -> LocoPayload:
        """Gate ``e + (global - local)``, move the fired entries into a payload, keep the rest."""
        if set(global_params) != set(self.shapes) or set(local_params) != set(self.shapes):
            raise KeyError("global/local parameters do not match the error-feedback tensors")
        tensors, numel = {}, {}
        self.clipped = 0
        for name in self.shapes:
            g, local = global_params[name].detach(), local_params[name].detach()
            if g.dtype != torch.float32 or local.dtype != torch.float32:
                raise TypeError(f"{name}: PULSELoCo needs FP32 global and local weights")
            tensors[name] = self._split(name, g, local)
            numel[name] = int(g.numel())
        self._pending = (round, trainer_id)
        return LocoPayload(round=round, trainer_id=trainer_id, base_hash=base_hash,
                           tensors=tensors, numel=numel)

    @torch.no_grad()
    def restore(self, payload: LocoPayload, *, keep: float = 0.0) -> None:
        """Put what the round did not apply of our payload back into ``e``: all of it (``keep``
        0: the trainer missed the round's deadline or was left out), or ``v - fp32(keep * v)``
        when the round's aggregation (``loco/aggregate.py``) applied the share ``keep`` of it
        (the outer step applied exactly ``fp32(keep * v)``). Exact for ``keep`` 0: ``e`` holds 0
        or the remainder ``v - sent`` there, and ``remainder + sent == v`` in FP32; otherwise up
        to one FP32 rounding per entry."""
        if self._pending != (payload.round, payload.trainer_id):
            raise ValueError("restore() takes the payload of this trainer's latest make_payload()")
        for name, (idx, vals) in payload.tensors.items():
            v = torch.from_numpy(vals)
            if keep != 0.0:
                v = v - torch.mul(v, float(np.float32(keep)))
            self.e[name].view(-1).index_add_(0, torch.from_numpy(idx), v)
        self._pending = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The error-feedback buffers (for a trainer checkpoint), and with ``outer_placement =
        "trainer"`` this trainer's outer momentum as ``momentum/<name>``."""
        return {**{n: t.clone() for n, t in self.e.items()},
                **{f"momentum/{n}": t.clone() for n, t in self.v.items()}}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        if set(state) != set(self.e) | {f"momentum/{n}" for n in self.v}:
            raise KeyError("error-feedback state does not match the model's tensors")
        for n, t in self.e.items():
            t.copy_(state[n])
        for n, t in self.v.items():
            t.copy_(state[f"momentum/{n}"])
        self._pending = None
