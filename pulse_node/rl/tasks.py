"""Tasks with verifiable rewards: procedural arithmetic and GSM8K-style JSONL files.

A ``TaskSource`` hands out training problems (``sample``) and a fixed, disjoint held-out split
(``eval_set``). Rewards are plain functions ``(completion, answer) -> float`` registered by
name in ``REWARDS`` so configs can pick one (``task.reward = "exact"``).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from pulse_node.errors import ConfigError, DataError
from pulse_node.rl.config import TaskConfig

RewardFn = Callable[[str, str], float]
REWARDS: dict[str, RewardFn] = {}
MAX_JSONL_BYTES = 1 << 30


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; ``source`` says where it came from (file:line)."""

    id: str
    prompt: str
    answer: str
    source: str = ""


class TaskSource(Protocol):
    def sample(self, n: int, rng: random.Random) -> list[Problem]: ...

    def eval_set(self) -> list[Problem]: ...


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def deco(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return deco


def reward(name: str) -> RewardFn:
    """The reward function registered under ``name``."""
    try:
        return REWARDS[name]
    except KeyError:
        raise ConfigError(f"unknown reward {name!r}; known: {sorted(REWARDS)}") from None


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalize_number(text: str) -> str:
    """'1,234.50' -> '1234.5'; non-numbers are returned stripped."""
    t = text.strip().replace(",", "").rstrip(".")
    try:
        value = float(t)
    except ValueError:
        return t
    return str(int(value)) if value.is_integer() else repr(value)


def final_answer(text: str) -> str | None:
    """The final answer of a GSM8K-style text: after the last '####', else the last number."""
    if "####" in text:
        return normalize_number(text.rsplit("####", 1)[1].strip().split("\n")[0])
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


@register_reward("exact")
def exact_reward(completion: str, answer: str) -> float:
    """1.0 iff the completion (stripped) equals the answer."""
    return 1.0 if completion.strip() == answer.strip() else 0.0


@register_reward("gsm8k")
def gsm8k_reward(completion: str, answer: str) -> float:
    """1.0 iff the completion's final answer ('#### 42' or last number) equals the answer."""
    got = final_answer(completion)
    return 1.0 if got is not None and got == normalize_number(answer) else 0.0


class ArithmeticTask:
    """Procedural problems ``a<op>b=``; difficulty = operand digits; held-out split by set."""

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        lo = 0 if cfg.min_digits == 1 else 10 ** (cfg.min_digits - 1)
        space = (10**cfg.digits - lo) ** 2 * len(set(cfg.ops))
        if space < 4 * cfg.eval_size:
            raise ConfigError(f"task: only {space} distinct problems; too few for "
                              f"task.eval_size={cfg.eval_size} plus a training split")
        rng = random.Random(f"eval:{cfg.seed}")
        evals: dict[str, Problem] = {}
        while len(evals) < cfg.eval_size:
            p = self._make(rng)
            evals.setdefault(p.id, p)
        self._eval = list(evals.values())
        self._eval_ids = frozenset(evals)

    def _operand(self, rng: random.Random) -> int:
        d = rng.randint(self.cfg.min_digits, self.cfg.digits)
        return rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)

    def _make(self, rng: random.Random) -> Problem:
        a, b, op = self._operand(rng), self._operand(rng), rng.choice(self.cfg.ops)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        text = f"{a}{op}{b}="
        return Problem(id=text, prompt=text, answer=str(value), source="arithmetic")

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < n:
            p = self._make(rng)
            if p.id not in self._eval_ids:
                out.append(p)
        return out

    def eval_set(self) -> list[Problem]:
        return list(self._eval)


def _parse_line(raw: str, where: str) -> Problem:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    prompt = obj.get("prompt", obj.get("question"))
    answer = obj.get("answer")
    if not isinstance(prompt, str) or not prompt:
        raise DataError(f"{where}: needs a non-empty string 'prompt' (or 'question')")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise DataError(f"{where}: needs a non-empty string 'answer'")
    final = final_answer(answer) if "####" in answer else answer.strip()
    pid = obj.get("id", where)
    return Problem(id=str(pid), prompt=prompt, answer=final or answer.strip(), source=where)


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems of a JSONL file ({"question"|"prompt", "answer"[, "id"]} per line)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_JSONL_BYTES:
            raise DataError(f"{p}: larger than {MAX_JSONL_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{p}: task file not found") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{p}: cannot read ({exc.strerror})") from None
    problems = [_parse_line(line, f"{p}:{i}") for i, line in enumerate(text.splitlines(), 1)
                if line.strip()]
    if not problems:
        raise DataError(f"{p}: no problems")
    return problems


class JsonlTask:
    """Problems from a local JSONL file; held-out split = ``eval_path`` or a seeded split."""

    def __init__(self, cfg: TaskConfig) -> None:
        problems = load_jsonl(cfg.path or "")
        if cfg.eval_path:
            self._train, self._eval = problems, load_jsonl(cfg.eval_path)[: cfg.eval_size]
        else:
            if len(problems) <= cfg.eval_size:
                raise DataError(f"{cfg.path}: {len(problems)} problems, need more than "
                                f"task.eval_size={cfg.eval_size} to split off a held-out set")
            order = list(range(len(problems)))
            random.Random(f"split:{cfg.seed}").shuffle(order)
            self._eval = [problems[i] for i in sorted(order[: cfg.eval_size])]
            self._train = [problems[i] for i in sorted(order[cfg.eval_size:])]

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self._train) for _ in range(n)]

    def eval_set(self) -> list[Problem]:
        return list(self._eval)

    def all_problems(self) -> list[Problem]:
        return self._train + self._eval


def make_task_source(cfg: TaskConfig) -> TaskSource:
    """The task named by ``cfg.kind``; also checks the reward name exists."""
    reward(cfg.reward)
    if cfg.kind == "arithmetic":
        return ArithmeticTask(cfg)
    return JsonlTask(cfg)
