"""The answer checker: GSM8K and MATH answers compared as math, bounded against hostile completions."""

from __future__ import annotations

import time

import pytest

from pulse_node.rl.answers import answers_equal, as_number, extract_answer, format_ok, is_safe, numbers_equal
from pulse_node.rl.config import TaskConfig
from pulse_node.rl.tasks import reward, reward_for


@pytest.mark.parametrize("got, want", [("1,234", "1234"), ("$5.00", "5"), ("3/4", "0.75"), ("0.75", "3/4"),
                                       ("\\frac{3}{4}", "0.75"), ("-\\frac{3}{4}", "-0.75"), ("\\dfrac{6}{8}", "3/4"),
                                       ("50\\%", "50"), ("72.", "72"), ("\\$1,000", "1000")])
def test_equal_numbers(got: str, want: str) -> None:
    assert numbers_equal(got, want) and answers_equal(got, want)


@pytest.mark.parametrize("got, want", [("5", "6"), ("0.75", "0.7"), ("3/4", "4/3"), ("1/0", "0"), ("abc", "5")])
def test_different_numbers(got: str, want: str) -> None:
    assert not answers_equal(got, want)


def test_extract_answer_boxed_then_hashes_then_last_number() -> None:
    assert extract_answer("so \\boxed{1} then \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("48/2 = 24 clips.\n#### 1,234\nmore") == "1,234"
    assert extract_answer("x 5 y 7.") == "7" and extract_answer("none") is None
    assert extract_answer("\\boxed{unclosed") is None


def test_symbolic_answers_with_math_verify() -> None:
    assert answers_equal("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}")
    assert not answers_equal("\\frac{\\sqrt{3}}{2}", "\\frac{1}{\\sqrt{2}}")


@pytest.mark.parametrize("hostile", ["2^{2^{2^{100}}}", "10^{10^{10}}", "9**9**9", "2^3^4", "(10^{100})!",
                                     "123456789^{123456789}", "\\binom{10^{30}}{10^{29}}", "9" * 5000,
                                     "1e999999", "{" * 50 + "1" + "}" * 50, "\\prod_{k=1}^{10^{9}} k"])
def test_hostile_answers_are_refused_fast(hostile: str) -> None:
    assert not is_safe(hostile) or as_number(hostile) is None
    t0 = time.monotonic()
    completion = "work...\n\\boxed{" + hostile + "}"
    assert reward("math")(completion, "2") == 0.0 and reward("gsm8k")(completion, "2") == 0.0
    assert time.monotonic() - t0 < 2.0


def test_huge_completion_has_no_answer() -> None:
    assert extract_answer("1 " * (1 << 20)) is None


def test_rewards_gsm8k_and_math() -> None:
    g, m = reward("gsm8k"), reward("math")
    assert g("so she pays 3 + 4 = 7 dollars.\n#### 7", "7") == 1.0 and g("It costs $1,234.00", "1234") == 1.0
    assert g("#### 8", "7") == 0.0 and g("no number", "5") == 0.0 and g("#### $7 apples", "7") == 1.0
    assert m("The answer is $\\boxed{\\dfrac{3}{4}}$.", "0.75") == 1.0 and m("\\boxed{x^2+2x+1}", "(x+1)^2") == 1.0


def test_format_reward_is_weighted_off_by_default_and_pure() -> None:
    plain = TaskConfig(reward="gsm8k")
    assert reward_for(plain) is reward("gsm8k")
    fmt = reward_for(TaskConfig(reward="gsm8k", format_reward=0.2, format_think=True))
    assert fmt("<think>3+4</think> so \\boxed{7}", "7") == pytest.approx(1.2)
    assert fmt("<think>3+4</think> so \\boxed{8}", "7") == pytest.approx(0.2)
    assert fmt("so \\boxed{7}", "7") == 1.0  # no think block: no format reward
    assert format_ok("#### 7", think=False) and not format_ok("7", think=False)
    assert not format_ok("<think>unclosed \\boxed{7}", think=True)
    with pytest.raises(ValueError):
        TaskConfig(format_reward=1.0)  # a formatted wrong answer must score < 1 (not "solved")
