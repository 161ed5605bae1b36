"""Tasks, rewards and the JSONL loader (including its error messages)."""

from __future__ import annotations

import json
import random

import pydantic
import pytest

from pulse_node.errors import ConfigError, DataError
from pulse_node.rl.answers import final_answer
from pulse_node.rl.config import task_config
from pulse_node.rl.rewards import reward
from pulse_node.rl.tasks import load_jsonl, make_task_source


def test_arithmetic_answers_split_and_determinism() -> None:
    task = make_task_source(task_config(digits=3, ops="+-*", eval_size=250))
    evals = task.eval_set()
    assert len(evals) == 250 and len({p.id for p in evals}) == 250
    train = task.sample(2000, random.Random(1))
    assert not {p.id for p in train} & {p.id for p in evals}
    for p in train[:200] + evals[:50]:
        assert str(eval(p.prompt.rstrip("="))) == p.answer
    assert [p.id for p in task.sample(20, random.Random(7))] == [p.id for p in task.sample(20, random.Random(7))]
    assert [p.id for p in make_task_source(task_config(digits=3, ops="+-*", eval_size=250)).eval_set()] == [p.id for p in evals]


def test_arithmetic_difficulty_and_too_small_space() -> None:
    task = make_task_source(task_config(digits=4, min_digits=4, eval_size=10))
    a, b = task.sample(1, random.Random(0))[0].prompt.rstrip("=").split("+")
    assert len(a) == len(b) == 4
    with pytest.raises(ConfigError):
        make_task_source(task_config(digits=1, eval_size=200))


def test_rewards() -> None:
    assert reward("exact")(" 42 ", "42") == 1.0 and reward("exact")("421", "42") == 0.0
    g = reward("gsm8k")
    assert g("so she pays 3 + 4 = 7 dollars.\n#### 7", "7") == 1.0
    assert g("the answer is 1,234", "1234") == 1.0
    assert g("no number here", "5") == 0.0 and g("#### 8", "7") == 0.0
    answer = final_answer("Natalia sold 48/2 = 24 clips.\n#### 72")
    assert answer is not None and answer.parts == ("72",) and not answer.latex
    with pytest.raises(pydantic.ValidationError, match="reward"):
        task_config(reward="nope")  # an unknown reward fails when the config loads


def test_jsonl_gsm8k_style(tmp_path) -> None:
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i:,}"} for i in range(600, 640)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    task = make_task_source(task_config(kind="jsonl", path=str(path), eval_size=10, reward="gsm8k"))
    evals = task.eval_set()
    train_ids = {p.id for p in task.sample(500, random.Random(0))}
    assert len(evals) == 10 and not train_ids & {p.id for p in evals}
    assert all(p.answer == str(2 * int(p.prompt.split()[2])) for p in evals)
    assert evals[0].source.startswith(f"{path}:")


@pytest.mark.parametrize("line, needle", [
    ('{"question": "x", "answer": "1"', "invalid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"answer": "1"}', "'prompt'"),
    ('{"question": "x"}', "'answer'"),
    ('{"question": "x", "answer": ""}', "'answer'"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, line: str, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "ok", "answer": "#### 1"}\n\n' + line + "\n")
    with pytest.raises(DataError) as err:
        load_jsonl(path)
    assert f"{path}:3" in str(err.value) and needle in str(err.value)


def test_jsonl_missing_and_too_small(tmp_path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_jsonl(tmp_path / "none.jsonl")
    path = tmp_path / "small.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n')
    with pytest.raises(DataError, match="eval_size"):
        make_task_source(task_config(kind="jsonl", path=str(path), eval_size=5))
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(DataError, match="UTF-8"):
        load_jsonl(tmp_path / "bin.jsonl")
