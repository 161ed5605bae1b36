"""The final answer of a text and the forms it is written in (README "Answer forms").

``final_answer`` finds what a completion answers: every ``\\boxed{}`` part (LaTeX; several parts
are one list, as math-verify reads them), else what follows the last ``####`` (plain text), else
the math span after "final answer is" / "answer:", else whichever ends last of the last math span
(``$..$``, ``$$..$$``, ``\\(..\\)``, ``\\[..\\]``: LaTeX) and the last number standing on its own
(plain text; a number inside a word such as ``AZYUK2A`` never counts). ``reference`` reads a
task's reference answer the same way, and as LaTeX (the content of a ``\\boxed{}``) when it has no
marks of its own.

``number`` reads one part as an exact rational when it is a plain number, by the context's rules:
thousands separators (``1,234``, ``1{,}234``, ``1 234``: groups of exactly three digits) in both;
a decimal comma (``1000,99``, ``0,111``) in plain text; in LaTeX a comma separates the items of a
list (``\\boxed{1, 2}``, ``\\boxed{-2,1}``) unless it groups thousands or follows a lone ``0``.
Units, currency and words around a number (``5\\text{ cm}``, ``\\$5``, ``x = 7``, ``50\\%``) are
dropped; ``a/b`` and ``\\frac{a}{b}`` (``\\dfrac``, ``\\tfrac``, ``\\cfrac``) are exact fractions.
``items`` splits a list at its top-level commas: a list never equals a number. Pure functions,
torch-free and sympy-free; the comparison is ``rl/rewards.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

MAX_TEXT_CHARS = 1 << 20  # a completion longer than this has no answer
MAX_ANSWER_CHARS = 200  # a part longer than this is only ever compared as a string
MAX_PARTS = 6  # more \boxed{} parts than this: no answer (math-verify joins at most six)
MAX_DIGITS = 40

_SEP = r"(?:,|\{,\}|\\,|\\ |\s)"  # between groups of three digits
_THOUSANDS = rf"[1-9]\d{{0,2}}(?:{_SEP}\d{{3}})+(?:\.\d+)?"
_PLAIN = r"\d+(?:\.\d+)?|\.\d+"
_DECIMAL_COMMA = r"\d+,\d+"
_LATEX_NUMBER = re.compile(rf"[+-]?(?:{_THOUSANDS}|0,\d+|{_PLAIN})")
_TEXT_NUMBER = re.compile(rf"[+-]?(?:{_THOUSANDS}|{_DECIMAL_COMMA}|{_PLAIN})")
_FRACTION = re.compile(r"([+-]?)\s*(?:\\[dtc]?frac\{\s*([+-]?\d+)\s*\}\{\s*([+-]?\d+)\s*\}|(\d+)\s*/\s*(\d+))")
# a number standing on its own in plain text: after the start, a space, "=", "(", or a currency sign
_STANDALONE = re.compile(rf"(?:^|(?<=[\s=(:$€£]))[+-]?(?:\d+\s*/\s*\d+|{_THOUSANDS}|{_DECIMAL_COMMA}|{_PLAIN})(?![\w.]*\d)")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_SPAN = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\)|\$([^$]+?)\$", re.DOTALL)
_ANCHOR = re.compile(r"final answer.{0,100}?\bis\b|answer\s*:", re.IGNORECASE | re.DOTALL)
_WRAPPERS = re.compile(r"\\(?:text|textnormal|textrm|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_UNIT = r"[A-Za-z]+\.?(?:\^\{?\d\}?|²|³)?"
_UNIT_WORDS = re.compile(rf"(?:\s*(?:\\[,;:! ]|~))*\s*{_UNIT}(?:\s+{_UNIT}){{0,3}}\s*$")  # 5 cm, 3 sq. ft
_LEAD = re.compile(r"^\s*(?:[A-Za-z](?:_\{?\w+\}?)?\s*=|\\approx|≈)\s*")
_UNITS = ("\\$", "$", "\\%", "%", "€", "£", "\\!", "\\left", "\\right", "^\\circ", "^{\\circ}", "\\circ", "°")


@dataclass(frozen=True)
class Answer:
    """A final answer: one part, or the parts of several ``\\boxed{}``; ``latex`` says which
    context's rules read its commas (see the module docstring)."""

    parts: tuple[str, ...]
    latex: bool

    @property
    def text(self) -> str:
        return ", ".join(self.parts)


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


def _strip_math(part: str) -> str:
    """``part`` without enclosing ``$``/``\\(..\\)``/``\\[..\\]`` marks, spaces and a final period."""
    t = part.strip()
    for a, b in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if t.startswith(a) and t.endswith(b) and len(t) >= len(a) + len(b):
            t = t[len(a):len(t) - len(b)].strip()
    return t.rstrip(".").strip()


def _span_text(m: re.Match[str]) -> str:
    return next(g for g in m.groups() if g is not None).strip().rstrip(".,").strip()


def _last(matches: Iterator[re.Match[str]]) -> re.Match[str] | None:
    found = None
    for found in matches:  # noqa: B007  (the last one is kept)
        pass
    return found


def final_answer(text: str) -> Answer | None:
    """The final answer of a completion (see the module docstring), or None when it has none."""
    if len(text) > MAX_TEXT_CHARS:
        return None
    if "boxed" in text or "fbox" in text:
        boxed = list(dict.fromkeys(_strip_math(b) for b in boxed_contents(text)))  # a set: repeats count once
        if boxed:
            return Answer(tuple(boxed), latex=True) if len(boxed) <= MAX_PARTS else None
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip().split("\n")[0].strip()
        return Answer((tail,), latex=False) if tail else None
    bare = text.strip()
    if "\\" in bare and len(bare) <= MAX_ANSWER_CHARS and not _WORD.search(_WRAPPERS.sub("", bare)) and "$" not in bare:
        return Answer((_strip_math(bare),), latex=True)  # a bare LaTeX expression: -\frac{3}{4}
    for anchor in reversed(list(_ANCHOR.finditer(text))):
        at = anchor.end()
        while at < len(text) and text[at] in " \t\n:":
            at += 1
        m = _SPAN.match(text, at)
        if m is not None:
            return Answer((_span_text(m),), latex=True)
    span = _last(_SPAN.finditer(text))
    number = _last(_STANDALONE.finditer(text))
    if span is not None and (number is None or span.end() >= number.end()):
        return Answer((_span_text(span),), latex=True)
    return Answer((number.group(0),), latex=False) if number is not None else None


def reference(text: str) -> Answer:
    """A task's reference answer: its ``\\boxed{}`` parts or math span if it has them, else all of
    it read as LaTeX (what a ``\\boxed{}`` would hold)."""
    t = text.strip()
    if "boxed" in t or "fbox" in t or "####" in t or t.startswith(("$", "\\[", "\\(")):
        found = final_answer(t)
        if found is not None:
            return found
    return Answer((_strip_math(t),), latex=True)


def _clean(part: str) -> str:
    """``part`` without units, currency, words around it and a leading ``x =``."""
    t = re.sub(r",\s*\\!\s*", ",", _WRAPPERS.sub(lambda m: m.group(1), part)).strip()  # 32,\! 349
    for unit in _UNITS:
        t = t.replace(unit, "")
    t = _LEAD.sub("", t).strip().rstrip(".").strip()
    if re.search(r"\d", t):
        t = _UNIT_WORDS.sub("", t).strip()
    t = t.replace("{,}", ",").replace("\\,", " ").replace("\\ ", " ").strip()
    while t.startswith("{") and t.endswith("}") and _balanced(t[1:-1]):
        t = t[1:-1].strip()
    return t


def _balanced(t: str) -> bool:
    depth = 0
    for c in t:
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def number(part: str, *, latex: bool) -> Fraction | None:
    """``part`` as an exact rational if it is one plain number in its context, else None."""
    if len(part) > MAX_ANSWER_CHARS:
        return None
    t = _clean(part)
    if sum(c.isdigit() for c in t) > MAX_DIGITS:
        return None
    if (_LATEX_NUMBER if latex else _TEXT_NUMBER).fullmatch(t):
        return _rational(t)
    m = _FRACTION.fullmatch(t)
    if m is None:
        return None
    sign, a, b, c, d = m.groups()
    num, den = (int(a), int(b)) if a is not None else (int(c), int(d))
    return None if den == 0 else (-1 if sign == "-" else 1) * Fraction(num, den)


def _rational(t: str) -> Fraction:
    """A matched number: separators between groups of three dropped, a decimal comma read as a point."""
    core = re.sub(r"(?<=\d)(?:,|\s)(?=\d{3}(?:\D|$))", "", t) if re.search(_THOUSANDS, t) else t
    return Fraction(core.replace(",", ".").replace(" ", ""))


def is_decimal(part: str) -> bool:
    """Whether a number is written with decimals or a percent sign (math-verify then compares it
    rounded, so an unequal exact value is not yet a verdict)."""
    return bool(re.search(r"\d[.,]\d|%", part))


def items(part: str, *, latex: bool) -> list[str]:
    """The items of a list (split at top-level commas that do not belong to a number); one item
    for anything else."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(part):
        depth += 1 if c in "([{" else -1 if c in ")]}" else 0
        if c == "," and depth == 0 and not _inside_number(part, i, latex=latex):
            out.append(part[start:i].strip())
            start = i + 1
    out.append(part[start:].strip())
    return [x for x in out if x]


def _inside_number(part: str, i: int, *, latex: bool) -> bool:
    """Whether the comma at ``i`` groups thousands (or, in plain text, is a decimal comma)."""
    before = re.search(r"[+-]?\d+$", part[:i])
    after = re.match(r"\d+", part[i + 1:])
    if before is None or after is None:
        return False
    lead, tail = before.group(0).lstrip("+-"), after.group(0)
    grouped = before.start() > 0 and part[before.start() - 1] == ","  # 12,345,678: the second group on
    if len(tail) == 3 and len(lead) <= 3 and (lead[0] != "0" or grouped):
        return True
    return lead == "0" if latex else True


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
