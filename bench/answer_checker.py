"""What the answer checker costs a trainer per completion, by kind of answer, side by side.

Trainers re-score every completion a peer sends (``rl/verify.py``), so the reward is on the
verification path. Times ``reward("gsm8k")`` and ``reward("math")`` (``rl/tasks.py`` over
``rl/answers.py``) on four kinds of completions, interleaved round by round so machine load
spoils every kind alike: GSM8K-style numbers (exact rationals, no sympy), MATH-style
expressions (math-verify, sympy), expressions that match neither (sympy, both sides parsed),
and hostile answers (power towers, huge factorials and binomials, 5,000-digit numbers: refused
by the size bounds before sympy). Each completion is ~600 characters of reasoning plus its
answer. Parsed answers are cached by their text (``rl/answers._parsed``), as in a GRPO group
whose samples often reach the same answer: round 0 is reported apart ("cold": both sides
parsed), later rounds hit the cache for the same answer strings ("warm": the comparison only).
"fresh_expressions" are new in every round (half right, half wrong): never cached.

    python bench/answer_checker.py [--rounds 5]

Ends with one JSON line: microseconds per completion for each kind, and ratios to numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pulse_node.rl.tasks import reward

FILLER = "Let me work through this step by step. " * 15
NUMBERS = [("She pays 3 + 4 = 7 dollars, so the total is $1,234.00.\n#### 1,234", "1234"),
           ("Half of 3/2 is 3/4.\n#### 0.75", "3/4"), ("That leaves 12 apples.\n#### 12", "13")]
EXPRESSIONS = [("so \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"), ("\\boxed{x^2+2x+1}", "(x+1)^2"),
               ("\\boxed{\\frac{\\pi}{3}}", "\\frac{\\pi}{3}"), ("\\boxed{(1,2)}", "(1, 2)")]
WRONG = [("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{1}{\\sqrt{2}}"), ("\\boxed{x^2+1}", "(x+1)^2"),
         ("\\boxed{2\\pi}", "\\frac{\\pi}{3}")]
HOSTILE = [("\\boxed{2^{2^{2^{100}}}}", "2"), ("\\boxed{(10^{100})!}", "2"), ("\\boxed{9^{9^{9}}}", "3"),
           ("\\boxed{\\binom{10^{30}}{10^{29}}}", "3"), ("\\boxed{" + "9" * 5000 + "}", "9"), ("#### 2**2**99", "4")]
KINDS = {"numbers": NUMBERS, "expressions": EXPRESSIONS, "wrong_expressions": WRONG, "hostile": HOSTILE}


def fresh(rnd: int, n: int = 6) -> list[tuple[str, str]]:
    """Expressions never seen before (new every round): the parse cache never helps."""
    ks = range(3 + rnd * n, 3 + (rnd + 1) * n)
    return [(f"\\boxed{{\\frac{{\\sqrt{{{k}}}}}{{{k + 1}}}}}", f"\\frac{{{k}}}{{\\sqrt{{{k + 3}}}}}") for k in ks[::2]] + \
        [(f"\\boxed{{x^2+{2 * k}x+{k * k}}}", f"(x+{k})^2") for k in ks[1::2]]


def time_kind(cases: list[tuple[str, str]], name: str, salt: int) -> float:
    """Seconds per completion of reward ``name`` over ``cases`` (each completion made unique by ``salt``)."""
    fn = reward(name)
    t0 = time.perf_counter()
    for completion, answer in cases:
        fn(f"{FILLER} ({salt})\n{completion}", answer)
    return (time.perf_counter() - t0) / len(cases)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    reward("math")("\\boxed{1}", "1")  # imports (sympy, math-verify) are not per-completion cost
    reward("math")("\\boxed{\\sqrt{2}}", "\\sqrt{2}+0")
    samples: dict[str, list[float]] = {f"{k}/{r}": [] for k in KINDS for r in ("gsm8k", "math")}
    samples.update({"fresh_expressions/gsm8k": [], "fresh_expressions/math": []})
    for rnd in range(args.rounds):
        for kind, cases in [*KINDS.items(), ("fresh_expressions", fresh(rnd))]:
            for name in ("gsm8k", "math"):
                samples[f"{kind}/{name}"].append(time_kind(cases, name, rnd))
    cold = {k: round(v[0] * 1e6, 1) for k, v in samples.items()}
    warm = {k: round(statistics.median(v[1:] or v) * 1e6, 1) for k, v in samples.items()}
    for k in samples:
        print(f"{k:28s} cold {cold[k]:12.1f} us   warm {warm[k]:12.1f} us per completion")
    base = warm["numbers/math"] or 1.0
    ratios = {k: round(v / base, 1) for k, v in cold.items() if k.endswith("/math")}
    print(json.dumps({"bench": "answer_checker", "rounds": args.rounds, "cold_us": cold, "warm_us": warm,
                      "cold_ratio_to_numbers_math": ratios}))


if __name__ == "__main__":
    main()
