"""What an answer may look like before sympy sees it: size, depth, commands and expansion bounds.

Completions come from peers and trainers re-score every one, so the text bound is the first line
against an answer that would keep sympy busy (the second is the checker's CPU deadline,
``rl/checker.py``). An answer part is handed to the checker only when ``is_safe``: at most
``MAX_ANSWER_CHARS`` characters, nested at most ``MAX_DEPTH`` deep, no number over ``MAX_DIGITS``
digits, no power tower (``2^{2^{..}}``, ``9**9**9``), no exponent above ``MAX_EXPONENT``, at most
``MAX_POWERS`` powers, only LaTeX commands of ``SAFE_COMMANDS``, factorials and binomials of
small literals only, sums and products up to small literal limits, and an **expansion bound**:
the number of monomials the answer could expand to (a sum adds its terms' counts, a product
multiplies them, ``(s terms)^n`` has ``C(n+s-1, s-1)``) at most ``MAX_TERMS``. So
``(a+b+c+d)^{40}`` (12,341 monomials; sympy ran past 90 s on one) and ``(a+b+c+d)^{6}`` (84)
are refused in microseconds, ``(x+1)^{40}`` (41) is checked. Pure functions, torch-free.
"""

from __future__ import annotations

import math
import re
from typing import ClassVar

from pulse_node.rl.answers import MAX_ANSWER_CHARS, MAX_DIGITS

MAX_DEPTH = 8
MAX_EXPONENT = 100
MAX_POWERS = 8
MAX_TERMS = 64
MAX_LIMIT = 1000  # largest literal limit of a \sum or \prod, and argument of a factorial or binomial
SAFE_COMMANDS = frozenset({
    "frac", "dfrac", "tfrac", "cfrac", "sqrt", "pi", "cdot", "times", "div", "left", "right", "infty", "pm", "mp",
    "circ", "degree", "text", "textbf", "textnormal", "textrm", "textit", "mathrm", "mathbf", "mathbb", "mbox",
    "operatorname", "le", "ge", "leq", "geq", "neq", "ne", "lt", "gt", "cup", "cap", "setminus", "in", "notin",
    "emptyset", "varnothing", "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "log", "ln",
    "exp", "dots", "ldots", "cdots", "quad", "qquad", "displaystyle", "boxed", "approx", "sum", "prod", "binom",
    "dbinom", "begin", "end", "pmatrix", "bmatrix", "matrix", "vmatrix", "array", "alpha", "beta", "gamma", "theta",
    "lambda", "mu", "sigma", "phi", "omega", "angle", "mid", "to", "rightarrow", "equiv", "pmod", "bmod", "mod",
    "lfloor", "rfloor", "lceil", "rceil", "overline", "bar", "vec", "hat", "big", "Big", "max", "min", "gcd",
})
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_ARG = r"(?:[^{}]|\{[^{}]*\})*"  # a braced argument's content, one level of braces inside
_TOKEN = re.compile(r"\\[A-Za-z]+|\d+(?:\.\d+)?|[A-Za-z]|\*\*|\S")


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
    """What follows each ``^`` or ``**``: a braced group, else one number or character (a power
    of a power, ``2^3^4``, gets a trailing ``^``: a tower)."""
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
        out.append(token + ("^" if after.startswith(("^", "**")) else ""))
    return out


def _small_literals(text: str) -> bool:
    """Factorials, binomials, sums and products only of (or up to) literals <= ``MAX_LIMIT``."""
    for m in re.finditer(r"(\S?)!(?!=)", text.replace("\\!", "")):
        arg = re.search(r"(\d+)\s*$", text[: m.start() + len(m.group(1))])
        if arg is None or int(arg.group(1)) > MAX_LIMIT:
            return False
    for m in re.finditer(rf"\\d?binom\s*\{{({_ARG})\}}\s*\{{({_ARG})\}}|\\(?:sum|prod)\s*_\s*\{{{_ARG}\}}\s*\^\s*(\{{{_ARG}\}}|\w)",
                         text):
        args = " ".join(g for g in m.groups() if g)
        if "^" in args or any(int(n) > MAX_LIMIT for n in re.findall(r"\d+", args)):
            return False
    return not re.search(r"\\(?:sum|prod)(?!\s*_\s*\{[^{}]*\}\s*\^)", text)  # limits must be written


def is_safe(expr: str) -> bool:
    """Whether ``expr`` is small enough to hand to sympy (see the module docstring)."""
    if len(expr) > MAX_ANSWER_CHARS or _depth(expr) > MAX_DEPTH or not _small_literals(expr):
        return False
    if any(len(n) > MAX_DIGITS for n in re.findall(r"\d+", expr)) or re.search(r"\d[eE][+-]?\d{3,}", expr):
        return False
    if any(c not in SAFE_COMMANDS for c in _COMMAND.findall(expr)):
        return False
    powers = _exponents(expr)
    if len(powers) > MAX_POWERS:
        return False
    for e in powers:
        if "^" in e or "**" in e or any(int(n) > MAX_EXPONENT for n in re.findall(r"\d+", e)):
            return False
    return expansion(expr) <= MAX_TERMS


class _Terms:
    """A recursive-descent count of the monomials an expression could expand to (capped)."""

    OPEN: ClassVar[dict[str, str]] = {"(": ")", "{": "}", "[": "]", "\\left(": "\\right)"}

    def __init__(self, text: str) -> None:
        self.toks = _TOKEN.findall(text)
        self.i = 0

    def peek(self) -> str:
        return self.toks[self.i] if self.i < len(self.toks) else ""

    def total(self) -> int:
        out = 0
        while self.i < len(self.toks):
            out += self.sum_(stop="")
            self.i += 1  # a separator (",", "=", "&", an unmatched bracket) or the end
        return min(out, MAX_TERMS + 1)

    def sum_(self, stop: str) -> int:
        terms = self.term(stop)
        while self.peek() in ("+", "-", "\\pm", "\\mp"):
            self.i += 1
            terms = min(terms + self.term(stop), MAX_TERMS + 1)
        return terms

    def term(self, stop: str) -> int:
        size = 1
        while (t := self.peek()) and t not in ("+", "-", "\\pm", "\\mp", ",", "=", "&", "<", ">", stop) \
                and t not in self.OPEN.values():
            size = min(size * self.factor(stop), MAX_TERMS + 1)
        return size

    def factor(self, stop: str) -> int:
        t = self.peek()
        self.i += 1
        if t in self.OPEN:
            size = self.sum_(stop=self.OPEN[t])
            while self.peek() not in (self.OPEN[t], ""):  # commas inside: a tuple, counted by its items
                self.i += 1
                size = min(size + self.sum_(stop=self.OPEN[t]), MAX_TERMS + 1)
            self.i += 1
        elif t in ("\\frac", "\\dfrac", "\\tfrac", "\\cfrac") and self.peek() == "{":
            size = self.factor(stop) * self.factor(stop)
        else:
            size = 1
        if self.peek() in ("^", "**"):
            self.i += 1
            exp = self.peek()
            if exp == "{":
                self.i += 1
                exp = self.peek()
                while self.peek() not in ("}", ""):
                    self.i += 1
                self.i += 1
            else:
                self.i += 1
            if size > 1 and exp.isdigit():
                size = math.comb(int(exp) + size - 1, size - 1)
        return size


def expansion(expr: str) -> int:
    """How many monomials ``expr`` could expand to (``MAX_TERMS + 1`` stands for "more")."""
    return _Terms(expr).total()
