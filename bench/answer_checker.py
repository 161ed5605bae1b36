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
    python bench/answer_checker.py --agreement     # how often the rewards agree with expected verdicts

``--agreement``: the ``math`` reward on the 265 answer-checking cases of math-verify's own tests
(``bench/data/answer_cases.json``, MIT, with their source) against each case's expected verdict,
beside math-verify called directly as its test did; the subset whose answer is a ``\\boxed{}`` or
bare expression apart; and 5,276 GSM8K-format integer answers (``#### N``, ``\\boxed{N}``, "The
answer is N." with and without thousands separators, against the right and a wrong reference)
under ``gsm8k`` and ``math``.

Ends with one JSON line: microseconds per completion for each kind, and ratios to numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import statistics
import time
from pathlib import Path

from pulse_node.rl.rewards import reward
from pulse_node.rl.tasks import reference_answer

CASES = Path(__file__).resolve().parent / "data" / "answer_cases.json"

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


def _direct(case: dict) -> bool:
    """math-verify called as its own test called it."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if case["match_types"] == ["default"]:
        return bool(verify(parse(case["gold"]), parse(case["pred"])))
    ex = [LatexExtractionConfig(boxed_match_priority=0) if t == "latex" else ExprExtractionConfig()
          for t in case["match_types"]]
    return bool(verify(parse(case["gold"], ex), parse(case["pred"], ex), float_rounding=case["precision"]))


def _simple(pred: str) -> bool:
    """A boxed or bare expression: no word of four letters outside LaTeX commands and \\text{}."""
    bare = re.sub(r"\\(text|textbf|mathrm|mbox|textnormal)\{[^}]*\}", "", pred).replace("boxed", "")
    return not re.search(r"(?<!\\)\b[A-Za-z]{4,}\b", bare)


def gsm8k_cases(n: int = 5276) -> list[tuple[str, str, bool]]:
    """GSM8K-format integer answers: (completion, reference, right?), half right, half wrong."""
    rng, forms = random.Random(8), ["{a}\n#### {n}", "{a} So the answer is \\boxed{{{n}}}.", "{a} The answer is {n}.",
                                   "{a}\n#### ${n}", "{a} She pays ${n} in total.\n#### {n}"]
    out = []
    for i in range(n):
        value = rng.choice([rng.randint(0, 99), rng.randint(100, 9999), rng.randint(10_000, 10**7)])
        shown = f"{value:,}" if i % 3 == 0 else str(value)
        text = forms[i % len(forms)].format(a="Work: 3 + 4 = 7, then 7 x 2 = 14.", n=shown)
        out.append((text, str(value) if i % 2 == 0 else str(value + rng.randint(1, 9)), i % 2 == 0))
    return out


def agreement() -> dict:
    logging.disable(logging.WARNING)
    data = json.loads(CASES.read_text())
    math = reward("math")
    tally: dict[str, list[int]] = {"all": [0, 0, 0], "boxed_or_bare": [0, 0, 0]}
    for case in data["cases"]:
        ours = math(case["pred"], reference_answer(case["gold"])) >= 1.0
        direct = _direct(case)
        for k in ("all", *(("boxed_or_bare",) if _simple(case["pred"]) else ())):
            tally[k][0] += 1
            tally[k][1] += ours == bool(case["expected"])
            tally[k][2] += direct == bool(case["expected"])
    out: dict = {k: {"cases": n, "ours": round(a / n, 4), "math_verify_direct": round(b / n, 4)}
                 for k, (n, a, b) in tally.items()}
    cases = gsm8k_cases()
    for name in ("gsm8k", "math"):
        fn = reward(name)
        right = sum((fn(c, ref) >= 1.0) == ok for c, ref, ok in cases)
        out[f"gsm8k_format/{name}"] = {"cases": len(cases), "judged_right": right}
    for k, v in out.items():
        print(f"{k}: {v}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--agreement", action="store_true", help="agreement with expected verdicts instead of cost")
    args = p.parse_args()
    if args.agreement:
        print(json.dumps({"bench": "answer_checker", "agreement": agreement()}))
        return
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
