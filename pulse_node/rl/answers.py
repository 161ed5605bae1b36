"""The answer checker: final answers of GSM8K (``#### 42``) and MATH (``\\boxed{..}``) texts, compared as math.

``extract_answer`` finds the final answer of a text: the last ``\\boxed{...}``, else what follows
the last ``####``, else the last number. ``numbers_equal`` compares two answers as exact rationals
("1,234" = "1234", "$5.00" = "5", "3/4" = "0.75" = "\\frac{3}{4}"); ``answers_equal`` also
compares expressions (``\\sqrt{2}/2`` = ``\\frac{1}{\\sqrt{2}}``) with the ``math-verify`` package.

Completions come from peers, and trainers re-score every one, so the checker is bounded by
size, not by time (a timeout would make the reward depend on the machine, and math-verify's own
timeout uses ``SIGALRM``, main thread only): an answer longer than ``MAX_ANSWER_CHARS``, nested
deeper than ``MAX_DEPTH``, with a number over ``MAX_DIGITS`` digits, a power tower, an exponent
above ``MAX_EXPONENT`` or a LaTeX command outside ``SAFE_COMMANDS`` (``\\binom``, ``!``, sums...)
is never handed to sympy: it only matches an identical string. Pure functions, torch-free.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

MAX_TEXT_CHARS = 1 << 20  # a completion longer than this has no answer
MAX_ANSWER_CHARS = 200
MAX_DEPTH = 8
MAX_DIGITS = 40
MAX_EXPONENT = 100
MAX_POWERS = 2
SAFE_COMMANDS = frozenset({
    "frac", "dfrac", "tfrac", "sqrt", "pi", "cdot", "times", "div", "left", "right", "infty", "pm", "mp",
    "circ", "degree", "text", "textbf", "mathrm", "mbox", "le", "ge", "leq", "geq", "neq", "ne", "cup", "cap",
    "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "in", "emptyset", "varnothing", "dots",
    "ldots", "quad", "displaystyle", "mathbf", "boxed", "approx", "lt", "gt",
})
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_FRACTION = re.compile(r"([+-]?\d+)\s*/\s*([+-]?\d+)")
_LATEX_FRAC = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{([+-]?\d+)\}")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_WORDY = re.compile(r"[A-Za-z$:=\s]*?(-?\d[\d,]*(?:\.\d+)?)\s*[A-Za-z%.\s]*")
_UNITS = ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\ ", "{,}", ",", " ", "\\text{dollars}", "dollars")


def boxed_contents(text: str) -> list[str]:
    """The contents of every balanced ``\\boxed{...}`` (and ``\\fbox{...}``) in ``text``, in order."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                out.append(text[start:i])
                break
    return out


def extract_answer(text: str) -> str | None:
    """The final answer of ``text``: last ``\\boxed{}``, else after the last ``####``, else the last number."""
    if len(text) > MAX_TEXT_CHARS:
        return None
    boxed = boxed_contents(text) if "boxed" in text or "fbox" in text else []
    if boxed:
        return boxed[-1].strip()
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip().split("\n")[0].strip()
        return tail or None
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def as_number(text: str) -> Fraction | None:
    """``text`` as an exact rational if it is a plain number, fraction or ``\\frac{a}{b}`` (units stripped)."""
    t = text.strip()
    if len(t) > MAX_ANSWER_CHARS:
        return None
    for unit in _UNITS:
        t = t.replace(unit, "")
    t = t.rstrip(".")
    if sum(c.isdigit() for c in t) > MAX_DIGITS:
        return None
    try:
        if _PLAIN_NUMBER.fullmatch(t):
            return Fraction(t)
        m = _FRACTION.fullmatch(t) or _LATEX_FRAC.fullmatch(t)
        if m:
            sign = -1 if m.re is _LATEX_FRAC and m.group(1) == "-" else 1
            num, den = (int(g) for g in m.groups()[-2:])
            return None if den == 0 else sign * Fraction(num, den)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def numbers_equal(got: str | None, want: str) -> bool:
    """Whether two answers are the same number (False if either is not a plain number); a final
    answer with only words around its number ("$7 apples", "x = 7") counts by that number."""
    if got is None:
        return False
    a, b = as_number(got), as_number(want)
    if a is None and len(got) <= MAX_ANSWER_CHARS:
        wordy = _WORDY.fullmatch(got.strip())
        a = as_number(wordy.group(1)) if wordy else None
    return a is not None and a == b


def _depth(text: str) -> int:
    depth = worst = 0
    for c in text:
        if c in "{([":
            depth += 1
            worst = max(worst, depth)
        elif c in "})]":
            depth -= 1
    return worst


def _exponents(text: str) -> list[str]:
    """What follows each ``^`` or ``**``: a braced group, else one number or character."""
    out = []
    for m in re.finditer(r"\^|\*\*", text):
        rest = text[m.end():].lstrip()
        if rest.startswith("{"):
            close = rest.find("}")
            token = rest[: close + 1] if close > 0 else rest
        else:
            num = re.match(r"[+-]?\d+|.", rest)
            token = num.group(0) if num else ""
        after = rest[len(token):].lstrip().lstrip(")]}").lstrip()
        # a power of a power (2^3^4, 2**3**4) counts as a tower: its exponent holds a power
        out.append(token + ("^" if after.startswith(("^", "**")) else ""))
    return out


def is_safe(expr: str) -> bool:
    """Whether ``expr`` is small enough to hand to sympy (see the module docstring)."""
    if len(expr) > MAX_ANSWER_CHARS or _depth(expr) > MAX_DEPTH or "!" in expr.replace("\\!", ""):
        return False
    if any(len(n) > MAX_DIGITS for n in re.findall(r"\d+", expr)):
        return False
    if any(c not in SAFE_COMMANDS for c in _COMMAND.findall(expr)):
        return False
    if re.search(r"\d[eE][+-]?\d{3,}", expr):
        return False
    powers = _exponents(expr)
    if len(powers) > MAX_POWERS:
        return False
    for e in powers:
        if "^" in e or "**" in e or any(int(n) > MAX_EXPONENT for n in re.findall(r"\d+", e)):
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _parsed(expr: str) -> tuple:
    import logging

    from math_verify import parse

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": bounded above
    return tuple(parse("\\boxed{" + expr + "}", parsing_timeout=None, raise_on_error=False))


def symbolic_equal(got: str, want: str) -> bool:
    """``math-verify``'s verdict on two bounded answers (False for unsafe or unparsable ones)."""
    if not (is_safe(got) and is_safe(want)):
        return False
    from math_verify import verify

    try:
        gold, pred = _parsed(want), _parsed(got)
        return bool(gold and pred and verify(list(gold), list(pred), timeout_seconds=None, raise_on_error=False))
    except Exception:  # sympy raises assorted types on odd input; an unscorable answer is wrong
        return False


def answers_equal(got: str | None, want: str) -> bool:
    """Same string, same number, or (both bounded) the same expression."""
    if got is None:
        return False
    if got.strip() == want.strip() or numbers_equal(got, want):
        return True
    if as_number(got) is not None and as_number(want) is not None:
        return False  # two different numbers: no need for sympy
    return symbolic_equal(got.strip(), want.strip())


def checker_version() -> str:
    """Which checker scores ``math`` rewards (bound into the rollout settings: all nodes must agree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"math-verify {version('math-verify')}; latex2sympy2_extended {version('latex2sympy2_extended')}"
    except PackageNotFoundError:
        return "math-verify missing"


_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


def format_ok(text: str, *, think: bool) -> bool:
    """Whether ``text`` ends its reasoning in a marked answer (``\\boxed{..}`` or ``#### ..``),
    after a closed ``<think>...</think>`` block at the start when ``think``."""
    if len(text) > MAX_TEXT_CHARS:
        return False
    if think:
        m = _THINK.match(text)
        if m is None:
            return False
        text = text[m.end():]
    return bool(boxed_contents(text)) or bool(re.search(r"####\s*\S", text))
