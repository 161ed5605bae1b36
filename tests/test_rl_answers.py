"""The answer rules (README "Answer forms"): every form a model writes, math-verify as the oracle,
and a checker that a hostile answer cannot stall."""

from __future__ import annotations

import logging
import time

import pytest

from pulse_node.rl.answer_bounds import expansion, is_safe
from pulse_node.rl.answers import final_answer, format_ok, items, number, reference
from pulse_node.rl.checker import CheckerBudget, MathChecker
from pulse_node.rl.config import task_config
from pulse_node.rl.rewards import reward, reward_for
from pulse_node.rl.tasks import reference_answer

MATH, GSM8K = reward("math"), reward("gsm8k")

# every example of issue 35's "Answers" section: (completion, reference as a task stores it, verdict)
ISSUE_EXAMPLES = [
    ("so \\boxed{32, 349}", "32349", 0.0),  # a list is not a number...
    ("so \\boxed{32,349}", "32349", 1.0),  # ...but 3-digit groups are thousands
    ("\\boxed{1, 2}", "12", 0.0),
    ("\\boxed{-2,1}", "-21", 0.0),
    ("\\boxed{-2,1}", "-2,1", 1.0),
    ("\\boxed{1,-2}", "-2,1", 1.0),  # a list of roots compares as a set
    ("AZYUK2A", "2", 0.0),  # a number inside a word never counts
    ("\\boxed{1} and \\boxed{2}", reference_answer("so $x=\\boxed{1}$ or $x=\\boxed{2}$"), 1.0),  # every part kept
    ("\\boxed{2}", reference_answer("so $x=\\boxed{1}$ or $x=\\boxed{2}$"), 0.0),
    ("\\boxed{1} and \\boxed{2}", "2", 0.0),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 1.0),
    ("\\boxed{\\begin{pmatrix}1\\\\3\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 0.0),
    ("\\boxed{\\cfrac{1}{2}}", "0.5", 1.0),
    ("The distance is $\\boxed{125\\textnormal{ miles}}.$", "125", 1.0),
    ("\\boxed{\\sum_{k=1}^{3} k}", "6", 1.0),
    ("\\boxed{x != 2}", "x \\neq 2", 1.0),
    ("1000,99", "1000.99", 1.0),  # a decimal comma in plain text
    ("\\boxed{\\frac{1}{12}}", "0.0833333333333333", 1.0),
    ("$0.0833333333333333$", "\\frac{1}{12}", 1.0),
]


@pytest.mark.parametrize("completion, answer, verdict", ISSUE_EXAMPLES)
def test_every_example_of_the_issue(completion: str, answer: str, verdict: float) -> None:
    assert MATH(completion, answer) == verdict


# forms compared with math-verify's own verdict (completion, reference content)
ORACLE = [
    ("\\boxed{(1, 2)}", "(1,2)"), ("\\boxed{(2, 1)}", "(1,2)"), ("\\boxed{\\{2,1\\}}", "\\{1,2\\}"),
    ("\\boxed{[0,1)}", "[0,1)"), ("\\boxed{(0,1]}", "[0,1)"), ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3, \\frac{\\pi}{2})"), ("\\boxed{1, 2, 3}", "3, 2, 1"),
    ("\\boxed{15\\mbox{ cm}^2}", "15"), ("\\boxed{50\\%}", "50"), ("\\boxed{50\\%}", "0.5"),
    ("\\boxed{\\$1,000}", "1000"), ("\\boxed{1{,}234}", "1234"), ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"), ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{x=7}", "7"), ("\\boxed{3 \\pm 2\\sqrt{2}}", "3 \\pm 2 \\sqrt{2}"), ("\\boxed{0.333}", "\\frac{1}{3}"),
    ("\\boxed{0.3333333}", "\\frac{1}{3}"), ("\\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}"), ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}}", "\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}"),
    ("#### 1,234", "1234"), ("The total is 7 apples.", "7"), ("$x \\in [-2,7]$", "[-2,7]"),
]


def _math_verify(completion: str, answer: str) -> bool:
    logging.disable(logging.WARNING)
    from math_verify import parse, verify

    return bool(verify(parse("\\boxed{" + answer + "}", parsing_timeout=None),
                       parse(completion, parsing_timeout=None), timeout_seconds=None))


@pytest.mark.parametrize("completion, answer", ORACLE)
def test_forms_agree_with_math_verify(completion: str, answer: str) -> None:
    assert MATH(completion, answer) == float(_math_verify(completion, answer))


def test_extraction_and_contexts() -> None:
    assert final_answer("so \\boxed{1} then \\boxed{\\frac{1}{2}} done").parts == ("1", "\\frac{1}{2}")  # type: ignore[union-attr]
    hashes = final_answer("48/2 = 24 clips.\n#### 1,234\nmore")
    assert hashes is not None and hashes.parts == ("1,234",) and not hashes.latex
    assert final_answer("x 5 y 7.").parts == ("7",) and final_answer("none") is None  # type: ignore[union-attr]
    assert final_answer("The final answer is $\\frac{1}{2}$. I hope it is correct.").parts == ("\\frac{1}{2}",)  # type: ignore[union-attr]
    assert final_answer("AZYUK2A") is None and final_answer("1 " * (1 << 20)) is None
    assert number("1000,99", latex=False) == number("1000.99", latex=False)
    assert number("1,22", latex=True) is None and items("1,22", latex=True) == ["1", "22"]
    assert number("0,111", latex=True) == number("0.111", latex=False) and number("1 234", latex=True) == 1234
    assert reference("-2,1").latex and reference_answer("a \\boxed{1} b \\boxed{2}") == "\\boxed{1}, \\boxed{2}"


@pytest.mark.parametrize("got, want", [("1,234", "1234"), ("$5.00", "5"), ("3/4", "0.75"), ("\\frac{3}{4}", "0.75"),
                                       ("-\\frac{3}{4}", "-0.75"), ("\\dfrac{6}{8}", "3/4"), ("72.", "72"),
                                       ("\\$1,000", "1000"), ("#### $7 apples", "7"), ("It costs $1,234.00", "1234"),
                                       ("so \\boxed{6,085,719}", "6085719"), ("#### 12,345,678", "12345678")])
def test_gsm8k_numbers(got: str, want: str) -> None:
    assert GSM8K(got, want) == 1.0 and MATH(got, want) == 1.0


@pytest.mark.parametrize("got, want", [("5", "6"), ("0.75", "0.7"), ("3/4", "4/3"), ("1/0", "0"), ("abc", "5"),
                                       ("\\boxed{3, 4}", "34"), ("\\boxed{x+1}", "2")])
def test_gsm8k_refuses(got: str, want: str) -> None:
    assert GSM8K(got, want) == 0.0


HOSTILE = ["2^{2^{2^{100}}}", "10^{10^{10}}", "9**9**9", "2^3^4", "(10^{100})!", "123456789^{123456789}",
           "\\binom{10^{30}}{10^{29}}", "9" * 5000, "1e999999", "{" * 50 + "1" + "}" * 50, "\\prod_{k=1}^{10^{9}} k",
           "(a+b+c+d)^{40}", "(a+b+c+d)^{20}", "(x+y)^{99}(x-y)^{99}", "\\frac{(a+b+c)^{9}}{(a-b)^{9}}"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_answers_are_refused_by_the_text_bound(hostile: str) -> None:
    assert not is_safe(hostile)
    completion = "work...\n\\boxed{" + hostile + "}"
    assert MATH(completion, "2") == 0.0 and GSM8K(completion, "2") == 0.0


def test_a_hostile_batch_costs_under_a_second_of_cpu() -> None:
    """256 distinct (a+b+c+d)^{40}-style answers (one trainer batch): scored 0, < 1 s of CPU in all."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    batch = [f"So the answer is \\boxed{{({letters[i % 26]}+{letters[(i + 1) % 26]}+c+d)^{{{40 + i}}}}}"
             for i in range(256)]
    budget = CheckerBudget(1.0)
    start = time.process_time()
    scores = [MATH.score(c, "2", budget=budget) for c in batch]
    assert time.process_time() - start < 1.0 and budget.left == 1.0  # the checker was never asked
    assert all(s.value == 0.0 for s in scores)
    assert expansion("(a+b+c+d)^{40}") > 64 and expansion("(x+1)^{40}") == 41


def test_the_checker_deadline_and_the_batch_budget() -> None:
    """What the text bound lets through is cut at its CPU deadline; a batch's budget caps the sum."""
    checker = MathChecker(call_cpu_s=0.05)
    try:
        slow = ["\\boxed{(a+b+c+d)^{4} - (a+b+c+e)^{4}}"] + [f"\\boxed{{(a+b+c+{v})^{{4}}}}" for v in "efghij"]
        start = time.monotonic()
        assert checker.equal("\\boxed{2}", slow[0]) is None and checker.timeouts == 1
        budget = CheckerBudget(0.2)
        verdicts = [checker.equal("\\boxed{2}", s, budget=budget) for s in slow[1:]]
        assert budget.left <= 0 and verdicts[-1] is None and verdicts.count(None) >= 2
        assert time.monotonic() - start < 20  # the deadline is CPU time: generous on a loaded machine
        assert checker.equal("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}") is True  # still answers
    finally:
        checker.close()


def test_format_reward_is_weighted_off_by_default_and_pure() -> None:
    plain = task_config(reward="gsm8k")
    assert reward_for(plain) is reward("gsm8k")
    fmt = reward_for(task_config(reward="gsm8k", format_reward=0.2, format_think=True))
    assert fmt("<think>3+4</think> so \\boxed{7}", "7") == pytest.approx(1.2)
    assert fmt("<think>3+4</think> so \\boxed{8}", "7") == pytest.approx(0.2)
    assert fmt("so \\boxed{7}", "7") == 1.0  # no think block: no format reward
    assert format_ok("#### 7", think=False) and not format_ok("7", think=False)
    assert not format_ok("<think>unclosed \\boxed{7}", think=True)
    with pytest.raises(ValueError):
        task_config(format_reward=1.0)  # a formatted wrong answer must score < 1 (not "solved")
