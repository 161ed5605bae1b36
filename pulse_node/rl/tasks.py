"""Tasks with verifiable rewards: procedural arithmetic and GSM8K- or MATH-style JSONL files.

Every task has two explicit, disjoint splits, fixed by the task config alone (never by the run
seed), so every node derives the same ones: ``eval`` (the held-out problems, ``eval_set``) and
``train`` (everything ``sample`` draws from). Disjoint means by prompt text: a prompt of the
eval split is never drawn for training, even when a JSONL file repeats it, or the training file
also holds a problem of ``eval_path``. ``split_of`` says which split a prompt belongs to.
Rollout prompts are drawn from ``train`` only (``rl/assign.py``); trainers refuse any other.
Rewards are ``rl/rewards.py``'s.

A JSONL line is ``{"question"|"prompt"|"problem": ..., "answer"|"solution": ...}``: GSM8K's
answers end in ``#### 42`` and MATH's solutions in ``\\boxed{..}``; the reference answer is
what follows the last ``####``, else the ``\\boxed{}`` contents (several parts kept, each in its
box), else the whole text.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pulse_node.errors import ConfigError, DataError
from pulse_node.rl.answers import boxed_contents
from pulse_node.rl.config import ArithmeticTaskConfig, JsonlTaskConfig, TaskConfig

Split = Literal["train", "eval"]
MAX_JSONL_BYTES = 1 << 30


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; ``source`` says where it came from (file:line)."""

    id: str
    prompt: str
    answer: str
    source: str = ""


class TaskSource(Protocol):
    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """``n`` problems of the train split, drawn with ``rng`` (deterministic given its state)."""

    def eval_set(self) -> list[Problem]:
        """The eval split, in a fixed order."""

    def split_of(self, prompt: str) -> Split | None:
        """Which split ``prompt`` belongs to (None: not a problem of this task)."""


class ArithmeticTask:
    """Procedural problems ``a<op>b=``; difficulty = operand digits.

    eval split: ``eval_size`` distinct problems drawn with ``task.seed``; train split: every other
    problem of the space (operands of ``min_digits..digits`` digits, an op of ``ops``).
    """

    def __init__(self, cfg: ArithmeticTaskConfig) -> None:
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
        ops = "".join(re.escape(o) for o in sorted(set(cfg.ops)))
        self._form = re.compile(rf"(0|[1-9]\d{{0,{cfg.digits - 1}}})([{ops}])(0|[1-9]\d{{0,{cfg.digits - 1}}})=")

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

    def split_of(self, prompt: str) -> Split | None:
        m = self._form.fullmatch(prompt)
        if m is None or any(len(m.group(i)) < self.cfg.min_digits for i in (1, 3)):
            return None
        return "eval" if prompt in self._eval_ids else "train"


def _parse_line(raw: str, where: str) -> Problem:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    prompt = next((obj[k] for k in ("prompt", "question", "problem") if k in obj), None)
    answer = next((obj[k] for k in ("answer", "solution") if k in obj), None)
    if not isinstance(prompt, str) or not prompt:
        raise DataError(f"{where}: needs a non-empty string 'prompt' (or 'question', 'problem')")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise DataError(f"{where}: needs a non-empty string 'answer' (or 'solution')")
    pid = obj.get("id", where)
    return Problem(id=str(pid), prompt=prompt, answer=reference_answer(answer) or answer.strip(), source=where)


def reference_answer(text: str) -> str:
    """The final answer of a reference solution: after '####', else its \\boxed{} content (several:
    each kept in its box), else all of it."""
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().split("\n")[0].strip().replace(",", "")
    boxed = [b.strip() for b in boxed_contents(text)]
    if len(boxed) > 1:
        return ", ".join("\\boxed{" + b + "}" for b in boxed)
    return boxed[0] if boxed else text.strip()


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
    """Problems from a local JSONL file.

    eval split: the first ``eval_size`` problems of ``eval_path``, else ``eval_size`` problems of
    ``path`` chosen with ``task.seed``; train split: the other problems of ``path`` whose prompt
    is not in the eval split.
    """

    def __init__(self, cfg: JsonlTaskConfig) -> None:
        problems = load_jsonl(cfg.path)
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
        self._eval_prompts = frozenset(p.prompt for p in self._eval)
        self._train = [p for p in self._train if p.prompt not in self._eval_prompts]
        if not self._train:
            raise DataError(f"{cfg.path}: no training problems left once the eval split's prompts are removed")
        self._train_prompts = frozenset(p.prompt for p in self._train)

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self._train) for _ in range(n)]

    def eval_set(self) -> list[Problem]:
        return list(self._eval)

    def split_of(self, prompt: str) -> Split | None:
        if prompt in self._eval_prompts:
            return "eval"
        return "train" if prompt in self._train_prompts else None

    def all_problems(self) -> list[Problem]:
        return self._train + self._eval


def make_task_source(cfg: TaskConfig) -> TaskSource:
    """The task named by ``cfg.kind``."""
    if isinstance(cfg, ArithmeticTaskConfig):
        return ArithmeticTask(cfg)
    return JsonlTask(cfg)
