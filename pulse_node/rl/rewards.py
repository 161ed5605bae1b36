"""Rewards with verifiable answers, a typed registry: ``exact``, ``gsm8k`` and ``math``.

A reward is a pure function of (completion, reference answer): trainers re-score every peer's
completion (``rl/verify.py``). ``REWARDS`` maps each ``RewardName`` (``rl/config.py``, checked
when a config loads) to its ``Reward``; ``reward_for(task)`` adds the optional format reward.
``Reward.score`` also says whether its value is exact: ``math`` may leave an answer undecided when
the checker's CPU bound or the batch's ``CheckerBudget`` runs out (``rl/checker.py``), which
scores 0 and is never held against a producer's claim.

The rules (README "Answer forms"), on ``rl/answers.py``'s final answers:
- ``exact``: the stripped completion equals the answer.
- ``gsm8k``: numbers only, no sympy: the final answer is one plain number equal to the
  reference's as an exact rational (a list, an expression or a number inside a word is wrong).
- ``math``: the same string, or the same number, or, for everything else (expressions, lists,
  sets, tuples, intervals, matrices, relations, decimals against fractions, percents), the verdict
  of math-verify on both answers rendered as ``\\boxed{}`` parts (LaTeX) or as the plain text, in
  the bounded checker, when both pass ``rl/answer_bounds.is_safe``; else 0. A list never equals a
  number; two lists of plain numbers compare as sets without sympy.
``RULES`` names these rules; it is bound into the signed rollout settings with math-verify's
version (``rl/settings.py``): change it whenever a verdict can change, so nodes agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, get_args

from pulse_node.rl.answer_bounds import is_safe
from pulse_node.rl.answers import Answer, final_answer, format_ok, is_decimal, items, number, reference
from pulse_node.rl.checker import CheckerBudget, default_checker
from pulse_node.rl.config import RewardName, TaskConfig

RULES = "answers/2"


@dataclass(frozen=True)
class Score:
    """A reward value; ``exact`` False when the checker's bound cut the comparison short (value 0)."""

    value: float
    exact: bool = True


class Reward(Protocol):
    def score(self, completion: str, answer: str, *, budget: CheckerBudget | None = None) -> Score:
        """The reward of ``completion`` for reference ``answer`` (``budget``: the batch's checker time)."""

    def __call__(self, completion: str, answer: str) -> float:
        """``score(...).value``."""


class _Base:
    def __call__(self, completion: str, answer: str) -> float:
        return self.score(completion, answer).value

    def score(self, completion: str, answer: str, *, budget: CheckerBudget | None = None) -> Score:
        raise NotImplementedError


class ExactReward(_Base):
    """1.0 iff the completion (stripped) equals the answer."""

    def score(self, completion: str, answer: str, *, budget: CheckerBudget | None = None) -> Score:
        return Score(1.0 if completion.strip() == answer.strip() else 0.0)


def _single(ans: Answer) -> str | None:
    """The answer's one item, or None for a list (several parts or top-level commas)."""
    parts = [x for p in ans.parts for x in items(p, latex=ans.latex)]
    return parts[0] if len(parts) == 1 else None


class Gsm8kReward(_Base):
    """1.0 iff the final answer is one plain number equal to the reference's (exact rationals)."""

    def score(self, completion: str, answer: str, *, budget: CheckerBudget | None = None) -> Score:
        got, want = final_answer(completion), reference(answer)
        g = _single(got) if got is not None else None
        w = _single(want)
        if g is None or w is None:
            return Score(0.0)
        a, b = number(g, latex=got.latex), number(w, latex=want.latex)  # type: ignore[union-attr]
        return Score(1.0 if a is not None and a == b else 0.0)


def _numbers(ans: Answer) -> list[Fraction] | None:
    """Every item of the answer as an exact rational, or None if one is not a plain number."""
    out = [number(x, latex=ans.latex) for p in ans.parts for x in items(p, latex=ans.latex)]
    numbers = [x for x in out if x is not None]
    return numbers if len(numbers) == len(out) else None


def _render(ans: Answer) -> str:
    """The answer as math-verify reads it: ``\\boxed{}`` parts for LaTeX, else the plain text."""
    return ", ".join("\\boxed{" + p + "}" for p in ans.parts) if ans.latex else ans.parts[0]


def _cheap(got: Answer, want: Answer) -> float | None:
    """The verdict of the rules that need no sympy, or None when it takes the checker."""
    if " ".join(got.text.split()) == " ".join(want.text.split()):
        return 1.0
    g, w = _numbers(got), _numbers(want)
    if g is None or w is None:
        return None
    if len(g) != len(w) and 1 in (len(g), len(w)):
        return 0.0  # a list never equals a number
    if (set(g) if len(g) > 1 else g) == (set(w) if len(w) > 1 else w):
        return 1.0
    decimal = any(is_decimal(p) for p in (*got.parts, *want.parts))
    return None if decimal else 0.0  # decimals and percents: math-verify rounds


class MathReward(_Base):
    """1.0 iff the final answer equals the reference (see the module docstring), bounded."""

    def score(self, completion: str, answer: str, *, budget: CheckerBudget | None = None) -> Score:
        got, want = final_answer(completion), reference(answer)
        if got is None:
            return Score(0.0)
        cheap = _cheap(got, want)
        if cheap is not None:
            return Score(cheap)
        if not all(is_safe(p) for p in (*got.parts, *want.parts)):
            return Score(0.0)
        verdict = default_checker().equal(_render(want), _render(got), budget=budget)
        return Score(0.0, exact=False) if verdict is None else Score(1.0 if verdict else 0.0)


REWARDS: dict[str, Reward] = {"exact": ExactReward(), "gsm8k": Gsm8kReward(), "math": MathReward()}
assert set(REWARDS) == set(get_args(RewardName)), "every RewardName has a Reward"


def reward(name: str) -> Reward:
    """The reward registered under ``name`` (a ``RewardName``: configs are checked when loaded)."""
    return REWARDS[name]


@dataclass(frozen=True)
class WithFormat(_Base):
    """``base`` plus ``weight`` when the completion ends in a marked answer (``rl/answers.format_ok``)."""

    base: Reward
    weight: float
    think: bool

    def score(self, completion: str, answer: str, *, budget: CheckerBudget | None = None) -> Score:
        s = self.base.score(completion, answer, budget=budget)
        return Score(s.value + (self.weight if format_ok(completion, think=self.think) else 0.0), s.exact)


def reward_for(cfg: TaskConfig) -> Reward:
    """The task's reward: ``cfg.reward`` plus ``cfg.format_reward`` for a well-formed completion."""
    base = reward(cfg.reward)
    return WithFormat(base, cfg.format_reward, cfg.format_think) if cfg.format_reward else base


RewardFn = Callable[[str, str], float]


def checker_version(name: str) -> str | None:
    """What identifies reward ``name``'s verdicts beyond its name (bound into the rollout settings:
    all nodes must agree): the answer rules, and math-verify's versions for ``math``."""
    if name == "exact":
        return None
    if name == "gsm8k":
        return RULES
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{RULES}; math-verify {version('math-verify')}; latex2sympy2_extended {version('latex2sympy2_extended')}"
    except PackageNotFoundError:
        return f"{RULES}; math-verify missing"
