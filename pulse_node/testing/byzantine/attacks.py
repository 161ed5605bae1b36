"""What Byzantine trainers send and do, one class per attack (the bench's list: ``ATTACKS``).

Every attack controls ``f`` member keys (a third of the trainers) and, for the Sybil flood,
extra keys. Each round it returns its payloads (``payloads``), built against the round's base
and kept inside the payload value bound (entries at most ``CLIP`` x the bound: anything above is
refused by every receiver). Attacks that ``train`` run real inner steps (their own rollouts,
from the round's global weights) and get their own trained payloads as ``trained``. What an
attack may look at is a ``RoundView``: the global state, earlier rounds' honest payloads (public
once applied) and, if the ``Reveal`` stage lets it rush, this round's honest payloads.

An attack may also act in the protocol: as the round's coordinator (``decide``: which payloads
its decision names), with evidence (``evidence``: two signed statements it claims conflict),
and with accusations (``accusations``). ``needs`` names the later protocol piece expected to
stop what the aggregation rule alone cannot.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pulse_node.loco.outer import OuterOptimizer
from pulse_node.loco.payload import LocoPayload
from pulse_node.testing.byzantine.world import World, peer_of

CLIP = 0.999  # of the payload value bound: the largest entry every receiver accepts, with margin
Dense = dict[str, np.ndarray]  # tensor name -> flat float64 values


@dataclass
class RoundView:
    """What a Byzantine trainer knows when it makes this round's payloads."""

    round: int
    outer: OuterOptimizer
    world: World
    honest: dict[str, LocoPayload] | None
    """This round's honest payloads, when the ``Reveal`` stage lets attackers rush; else None."""
    history: list[dict[str, LocoPayload]]
    """Honest payloads of earlier rounds (public once decided), oldest first."""
    rng: np.random.Generator
    decisions: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    """round -> (coordinator, its signed decision bytes) of the rounds decided so far."""
    earlier: dict[int, bytes] = field(default_factory=dict)
    """round -> the decision its coordinator signed for that round before the swarm restarted
    (same keys and run id; filled only for an attack with ``wants_earlier_life``)."""

    def seen(self) -> dict[str, LocoPayload]:
        """The freshest honest payloads the attacker can see (this round's if rushing)."""
        if self.honest is not None:
            return self.honest
        return self.history[-1] if self.history else {}


def dense(p: LocoPayload, shapes: Mapping[str, tuple[int, ...]]) -> Dense:
    out = {n: np.zeros(int(np.prod(s)), dtype=np.float64) for n, s in shapes.items()}
    for name, (idx, vals) in p.tensors.items():
        out[name][idx] = vals
    return out


def mean_std(payloads: Mapping[str, LocoPayload], shapes: Mapping[str, tuple[int, ...]]) -> tuple[Dense, Dense]:
    """Per-coordinate mean and std of the payloads (0 where a payload did not fire)."""
    ds = [dense(p, shapes) for _, p in sorted(payloads.items())]
    mu = {n: np.mean([d[n] for d in ds], axis=0) for n in shapes}
    sd = {n: np.std([d[n] for d in ds], axis=0) for n in shapes}
    return mu, sd


def craft(view: RoundView, trainer_id: str, values: Dense) -> LocoPayload:
    """A payload of ``values`` (non-zero entries), each clipped to ``CLIP`` x the bound."""
    tensors = {}
    for name, v in values.items():
        w = view.outer.params[name].reshape(-1).numpy()
        lim = CLIP * view.world.bound.limit(w)
        v = np.clip(v, -lim, lim).astype(np.float32)
        idx = np.flatnonzero(v).astype(np.int64)
        if idx.size:
            tensors[name] = (idx, v[idx])
    return LocoPayload(view.round, trainer_id, view.outer.state_hash(), tensors,
                       {n: int(t.numel()) for n, t in view.outer.params.items()})


def relabel(view: RoundView, trainer_id: str, p: LocoPayload) -> LocoPayload:
    """Someone else's (or an older) payload as ours for this round, inside this round's bound."""
    return craft(view, trainer_id, dense(p, view.world.shapes))


class Attack:
    """No attack: the Byzantine keys take no part (the honest-only run)."""

    name = "none"
    trains = False
    invert_rewards = False
    wants_earlier_life = False
    needs = ""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def sybils(self) -> list[str]:
        """Extra keys beyond the members (the Sybil flood)."""
        return []

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        return {}

    def decide(self, view: RoundView, offered: set[str]) -> set[str]:
        """As the round's coordinator: the payloads its decision names."""
        return offered

    def evidence(self, view: RoundView) -> list[tuple[str, bytes, bytes]]:
        """(kind, first, second) pairs it presents as equivocation evidence this round."""
        return []

    def accusations(self, view: RoundView) -> list[tuple[str, str]]:
        """(accuser, target) spot-check accusations it makes this round."""
        return []


class SignFlip(Attack):
    """Trains honestly, sends its payload negated."""

    name, trains = "sign_flip", True

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        return {t: craft(view, t, {n: -v for n, v in dense(p, view.world.shapes).items()}) for t, p in trained.items()}


class ScaledBound(Attack):
    """Issue 32 item 1: every entry at 0.999 x bound x sign(w) (the weights shrink)."""

    name = "scaled_bound"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        vals = {n: np.where(w > 0, np.inf, np.where(w < 0, -np.inf, 0.0))
                for n, w in ((n, t.reshape(-1).numpy()) for n, t in view.outer.params.items())}
        return {t: craft(view, t, vals) for t in self.ids}


class ALIE(Attack):
    """"A little is enough": mu - z * sigma * sign(mu) over the honest payloads it saw, with the
    paper's z for n trainers and f attackers (0.43 for 6 and 2)."""

    name, needs = "alie", "commit-reveal (no rushing)"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        seen = view.seen()
        if not seen:
            return {}
        n = len(seen) + len(self.ids)
        s = n // 2 + 1 - len(self.ids)
        z = statistics.NormalDist().inv_cdf((n - s) / n)
        mu, sd = mean_std(seen, view.world.shapes)
        vals = {k: mu[k] - z * sd[k] * np.sign(mu[k]) for k in mu}
        return {t: craft(view, t, vals) for t in self.ids}


class IPM(Attack):
    """Inner-product manipulation: -eps x the mean of the honest payloads it saw."""

    needs = "commit-reveal (no rushing)"

    def __init__(self, ids: list[str], *, eps: float) -> None:
        super().__init__(ids)
        self.eps = eps
        self.name = f"ipm_{eps:g}"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        seen = view.seen()
        if not seen:
            return {}
        mu, _ = mean_std(seen, view.world.shapes)
        return {t: craft(view, t, {k: -self.eps * v for k, v in mu.items()}) for t in self.ids}


class Constant(Attack):
    """One fixed random sign direction, every entry at the bound, every round."""

    name = "constant"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        rng = np.random.default_rng(12345)
        vals = {n: rng.choice([-np.inf, np.inf], size=int(np.prod(s))) for n, s in sorted(view.world.shapes.items())}
        return {t: craft(view, t, vals) for t in self.ids}


class StaleReplay(Attack):
    """Replays honest payloads of ``lag`` rounds ago as its own."""

    name, needs = "stale_replay", "spot recomputation (a replay is not recomputable from the round's inputs)"

    def __init__(self, ids: list[str], *, lag: int = 5) -> None:
        super().__init__(ids)
        self.lag = lag

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        if not view.history:
            return {}
        old = view.history[max(0, len(view.history) - self.lag)]
        picks = sorted(old)
        return {t: relabel(view, t, old[picks[i % len(picks)]]) for i, t in enumerate(self.ids)}


class FreeRider(Attack):
    """No inner steps: noise shaped like last round's honest payloads (density, entry scale)."""

    name, needs = "free_rider", "spot recomputation"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        last = view.history[-1] if view.history else {}
        vals = np.concatenate([np.zeros(0, np.float32)] + [v for p in last.values() for _, v in p.tensors.values()])
        if not vals.size:
            return {}
        scale = float(np.sqrt(np.mean(vals.astype(np.float64) ** 2)))
        density = sum(p.count for p in last.values()) / len(last) / view.world.numel
        out = {}
        for t in self.ids:
            noise = {n: view.rng.standard_normal(int(np.prod(s))) * scale
                     * (view.rng.random(int(np.prod(s))) < density) for n, s in sorted(view.world.shapes.items())}
            out[t] = craft(view, t, noise)
        return out


class Copier(Attack):
    """Copies honest payloads of this round (rushing) as its own."""

    name, needs = "copier", "commit-reveal (no rushing)"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        seen = view.seen()
        picks = sorted(seen)
        return {t: relabel(view, t, seen[picks[i % len(picks)]]) for i, t in enumerate(self.ids)} if picks else {}


class AdvantageFlip(Attack):
    """Trains correctly on verified rollouts with inverted rewards: every payload looks honest."""

    name, trains, invert_rewards, needs = "advantage_flip", True, True, "spot recomputation"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        return dict(trained)


class Sleeper(Attack):
    """Trains honestly until it has passed its first check, then as ``AdvantageFlip`` does: only
    the draws at ``loco.spot.rate`` can catch it, not the checks every unproven member gets."""

    name, trains, needs = "sleeper", True, "spot recomputation"

    def __init__(self, ids: list[str], *, wake: int = 2) -> None:
        super().__init__(ids)
        self.wake = wake  # its first round on inverted rewards (round 0's work is checked in round 1)
        self.trainers: dict[str, Any] = {}  # trainer id -> its InnerTrainer (set by the harness)

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        if view.round + 1 >= self.wake:  # the next round trains on inverted rewards
            for t in self.trainers.values():
                t.invert_rewards = True
        return dict(trained)


class EFDump(Attack):
    """Trains honestly but sends nothing for ``hoard`` rounds (its error feedback grows), then
    sends all it holds in one round, every entry up to the bound."""

    name, trains = "ef_dump", True

    def __init__(self, ids: list[str], *, hoard: int = 3) -> None:
        super().__init__(ids)
        self.hoard = hoard
        self.trainers: dict[str, Any] = {}  # trainer id -> its InnerTrainer (set by the harness)

    def dumping(self, round: int) -> bool:
        return round % (self.hoard + 1) == self.hoard

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        out = {}
        for t, p in trained.items():
            ef = self.trainers[t].ef
            if not self.dumping(view.round):
                ef.restore(p)  # hoarded: everything stays in its error feedback
                continue
            vals = dense(p, view.world.shapes)
            for n in vals:
                vals[n] += ef.e[n].reshape(-1).numpy()
                ef.e[n].zero_()
            out[t] = craft(view, t, vals)
        return out


class CoordinatorDrop(Attack):
    """Sends the item-1 payload; as coordinator, names only its own payloads."""

    name, needs = "coordinator_drop", "decisions naming every committed payload"

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        return ScaledBound(self.ids).payloads(view, trained)

    def decide(self, view: RoundView, offered: set[str]) -> set[str]:
        return {t for t in offered if t in self.ids} or offered


class SybilFlood(Attack):
    """``sybils`` extra keys and the members all send the item-1 payload, and every one of them
    accuses every honest trainer every round."""

    name, needs = "sybil_flood", "one capped weight for new keys; accusations re-checked"

    def __init__(self, ids: list[str], *, sybils: int = 20) -> None:
        super().__init__(ids)
        self.extra = [peer_of(f"s{i:02d}") for i in range(sybils)]

    def sybils(self) -> list[str]:
        return self.extra

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        return ScaledBound(self.ids + self.extra).payloads(view, trained)

    def accusations(self, view: RoundView) -> list[tuple[str, str]]:
        honest = sorted(view.seen()) or []
        return [(a, h) for a in self.ids + self.extra for h in honest]


class EvidenceReplay(Attack):
    """Holds round decisions honest coordinators signed before the swarm restarted (same keys,
    same run id, fresh stores) and, at ``at``, presents each with the one its signer made for
    the same round after the restart. The members themselves only free-ride."""

    name, needs, wants_earlier_life = "evidence_replay", "evidence scoped to one chain", True

    def __init__(self, ids: list[str], *, at: int = 3) -> None:
        super().__init__(ids)
        self.at = at

    def payloads(self, view: RoundView, trained: Mapping[str, LocoPayload]) -> dict[str, LocoPayload]:
        return FreeRider(self.ids).payloads(view, trained)

    def evidence(self, view: RoundView) -> list[tuple[str, bytes, bytes]]:
        if view.round != self.at:
            return []
        return [("decision", view.earlier[r], data) for r, (coord, data) in sorted(view.decisions.items())
                if r in view.earlier and coord not in self.ids]


def attacks(ids: list[str]) -> dict[str, Attack]:
    """Every attack of the bench, by name, for the member keys ``ids``."""
    made: list[Attack] = [SignFlip(ids), ScaledBound(ids), ALIE(ids), IPM(ids, eps=0.1), IPM(ids, eps=100.0),
                          Constant(ids), StaleReplay(ids), FreeRider(ids), Copier(ids), AdvantageFlip(ids),
                          Sleeper(ids), EFDump(ids), CoordinatorDrop(ids), SybilFlood(ids), EvidenceReplay(ids)]
    return {a.name: a for a in made}
