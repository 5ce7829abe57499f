"""Host-side verifiers: pull an answer out of a completion's text and check it.

Pure Python on strings, no JAX: the building blocks of the built-in reward functions
(`jaxrl_llm.rewards.builtin`) and of user reward functions.

- Extraction: `extract_boxed` (the last `\\boxed{...}`, braces balanced), `extract_hash_answer`
  (GSM8K's `#### 42`), `extract_tag` (`<answer>...</answer>`), `extract_last_number`, and
  `extract_answer`, which tries them in a fixed order.
- Comparison: `parse_number` (integers, decimals, `1,234`, `$5`, `50%`, `3/4`, `\\frac{3}{4}`
  → an exact `Fraction`), `answers_match` (numeric when both sides parse, else normalised text).
- Format: `follows_tag_format` (`<think>…</think><answer>…</answer>` and nothing else).

The GSM8K convention ("Training Verifiers to Solve Math Word Problems", arXiv 2110.14168) puts
the final answer after `####` at the end of the reference solution; MATH-style answers
("Measuring Mathematical Problem Solving With the MATH Dataset", arXiv 2103.03874) are in the
last `\\boxed{}`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

ExtractMethod = Literal["auto", "boxed", "hash", "tag", "last_number", "full"]
EXTRACT_METHODS: tuple[str, ...] = ("auto", "boxed", "hash", "tag", "last_number", "full")

# thousands groups of exactly three digits (`1,2345` is the numbers 1 and 2345, not `1,234` and 5)
_UNSIGNED = r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+)"
_NUMBER = rf"[-+]?{_UNSIGNED}"
# in running text a sign right after a letter, digit, `.` or `)` is a hyphen or a binary
# operator: `3-4` ends with the number 4, not -4
_SIGN = r"(?:(?<![\w.)])[-+])?"
_FRAC_ARG = r"(?:\{([^{}]+)\}|(\d))"  # {any} or one digit: \frac{1}{2}, \frac12, \frac1{2}
_FRAC_RE = re.compile(rf"^\\[dt]?frac\s*{_FRAC_ARG}\s*{_FRAC_ARG}$")
_SLASH_RE = re.compile(rf"^({_NUMBER})\s*/\s*({_NUMBER})$")
# a fraction (LaTeX or `a/b`) before a plain number, so that `-1/2` is one match, not `2`
_LAST_NUMBER_RE = re.compile(
    rf"{_SIGN}\\[dt]?frac\s*(?:\{{[^{{}}]+\}}|\d)\s*(?:\{{[^{{}}]+\}}|\d)"
    rf"|{_SIGN}{_UNSIGNED}(?:\s*/\s*(?:{_NUMBER}))?"
)
_DEGREES = re.compile(r"\s*\^\s*\{?\\circ\}?\s*$")
_TRAILING_UNIT = re.compile(r"(.*?\S)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}")
_SPACED_MINUS = re.compile(r"^-\s+(?=\d|\.|\\)")
_MAX_DIGITS = 4000  # longer numbers are not parsed (Python's int limit is 4300 digits)
_MAX_EXPONENT = 10_000  # nor exponents beyond ±10000 (1e10000000 would take seconds)
_WRAPPERS = re.compile(r"^\\text\{(.*)\}$|^\\mathrm\{(.*)\}$|^\\textbf\{(.*)\}$")


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced.

    Nested braces inside the box are kept (`\\boxed{\\frac{1}{2}}` → `\\frac{1}{2}`). An
    unclosed box is ignored. Returns None when there is no complete box.

    Examples:
      >>> extract_boxed(r"so the answer is \\boxed{\\frac{1}{2}}.")
      '\\\\frac{1}{2}'
      >>> extract_boxed(r"\\boxed{1} then \\boxed{2}"), extract_boxed("no box"), extract_boxed(r"\\boxed{3")
      ('2', None, None)
    """
    closing = _closing_braces(text)
    found = None
    for match in re.finditer(r"\\(?:boxed|fbox)\{", text):
        close = closing.get(match.end() - 1)
        if close is not None:
            found = text[match.end() : close]
    return found


def _closing_braces(text: str) -> dict[int, int]:
    """The index of the `}` that closes each `{` of `text` (unclosed ones absent): one pass,
    so that many unclosed boxes cost linear time."""
    closing, opened = {}, []
    for i, char in enumerate(text):
        if char == "{":
            opened.append(i)
        elif char == "}" and opened:
            closing[opened.pop()] = i
    return closing


def extract_hash_answer(text: str) -> str | None:
    """GSM8K's final answer: the rest of the line after the last `####`, stripped; when that
    is not a number, its first number (`#### Answer: 18` → `18`), or, with more text after the
    line, None (a Markdown heading: `"auto"` extraction goes on to the other forms).

    Examples:
      >>> extract_hash_answer("48 / 2 = 24 clips.\\n#### 72")
      '72'
      >>> extract_hash_answer("no marker") is None, extract_hash_answer("####  ") is None
      (True, True)
      >>> extract_hash_answer("#### 18 apples"), extract_hash_answer("#### Final\\nIt is 18") is None
      ('18', True)
    """
    at = text.rfind("####")
    if at == -1:
        return None
    line, _, rest = text[at + 4 :].partition("\n")
    answer = line.strip()
    if not answer or parse_number(answer) is not None:
        return answer or None
    if rest.strip():  # a Markdown heading (`#### Step 2`) with text after it: not an answer
        return None
    number = _LAST_NUMBER_RE.search(answer)  # `#### Answer: 18`, `#### 18 apples`
    return number[0] if number else answer


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """The stripped content of the last complete `<tag>...</tag>` in `text` (None if absent).

    Examples:
      >>> extract_tag("<think>hmm</think><answer> 42 </answer>")
      '42'
      >>> extract_tag("<answer>1</answer><answer>2", "answer")
      '1'
    """
    # the leftmost-first, non-greedy matches of `<tag>(.*?)</tag>`, found in linear time (the
    # regex is quadratic on a text of many unclosed tags)
    opening, closing = f"<{tag}>", f"</{tag}>"
    found, at = None, 0
    while (begin := text.find(opening, at)) != -1:
        end = text.find(closing, begin + len(opening))
        if end == -1:
            break
        found, at = text[begin + len(opening) : end], end + len(closing)
    return found.strip() if found is not None else None


def extract_last_number(text: str) -> str | None:
    """The last number written in `text` (sign, thousands commas, decimals, exponent kept); a
    fraction `a/b` or `\\frac{a}{b}` counts as one number, and a Unicode minus `−` as `-`. A
    `-` or `+` right after a digit, letter, `.` or `)` is a hyphen or an operator, not a sign:
    `pages 3-4` ends with 4.

    Examples:
      >>> extract_last_number("it costs $1,234.50, not 7")
      '7'
      >>> extract_last_number("from -3 to -2.5"), extract_last_number("none")
      ('-2.5', None)
      >>> extract_last_number("half: -1/2"), extract_last_number(r"so \\frac{-1}{2}"), extract_last_number("−4")
      ('-1/2', '\\\\frac{-1}{2}', '-4')
      >>> extract_last_number("pages 3-4"), extract_last_number("x=-2")
      ('4', '-2')
    """
    matches = _LAST_NUMBER_RE.findall(text.replace("\u2212", "-"))
    return matches[-1] if matches else None


def extract_answer(text: str, method: ExtractMethod = "auto") -> str | None:
    """The answer written in a completion (or a reference solution).

    `"auto"` tries, in order: the last `\\boxed{}`, GSM8K's `####`, the last `<answer>` tag,
    the last number. `"full"` is the whole text, stripped. The others use one extractor.

    Examples:
      >>> extract_answer("work... #### 1,000")
      '1,000'
      >>> extract_answer(r"\\boxed{5} #### 6"), extract_answer("x = 3, y = 4"), extract_answer(" 19 ", "full")
      ('5', '4', '19')
    """
    if method not in EXTRACT_METHODS:
        raise ValueError(
            f"extract_answer: `method` must be one of {', '.join(EXTRACT_METHODS)}, got {method!r}."
        )
    if method == "boxed":
        return extract_boxed(text)
    if method == "hash":
        return extract_hash_answer(text)
    if method == "tag":
        return extract_tag(text, "answer")
    if method == "last_number":
        return extract_last_number(text)
    if method == "full":
        return text.strip()
    for extractor in (extract_boxed, extract_hash_answer, extract_tag, extract_last_number):
        found = extractor(text)
        if found is not None:
            return found
    return None


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact rational number, or None if it is not one number.

    Accepts an optional sign (`-` or a Unicode minus `−`), thousands commas (`1,234`), decimals
    and exponents, a leading `$` / `\\$`, a trailing `%` (kept as the number written: `50%` → 50)
    or `.`, `\\text{}` wrappers, `a/b` and `\\frac{a}{b}` (also `\\dfrac`, `\\tfrac`, and
    `-\\frac{a}{b}`). Numbers of more than 4000 digits or with an exponent beyond ±10000 are not
    parsed (None): a degenerate completion must not take seconds or raise.

    Examples:
      >>> parse_number("1,234.5"), parse_number(r"\\frac{3}{4}"), parse_number("$-2")
      (Fraction(2469, 2), Fraction(3, 4), Fraction(-2, 1))
      >>> parse_number("12 apples") is None, parse_number("1/0") is None
      (True, True)
    """
    s = _unwrapped(text)  # nested wrappers such as \text{\textbf{5}} too
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "").strip()
    s = s.replace("{,}", ",")  # LaTeX's thousands separator 1{,}000
    s = _DEGREES.sub("", s)  # 30^\circ, 30^{\circ}
    unit = _TRAILING_UNIT.fullmatch(s)  # 5\text{ cm}: the number before a unit
    if unit and unit[1]:
        s = unit[1]
    s = _SPACED_MINUS.sub("-", s)  # - 3
    s = s.removesuffix(".").removesuffix("\\%").removesuffix("%").strip()
    s = s.replace("\u2212", "-")  # a Unicode minus
    if s.startswith("+"):
        s = s[1:]
    if s[:1] == "-" and _FRAC_RE.match(s[1:]):  # -\frac{a}{b}
        inner = parse_number(s[1:])
        return None if inner is None else -inner
    latex, slash = _FRAC_RE.match(s), _SLASH_RE.match(s)
    if latex or slash:
        parts = [g for g in latex.groups() if g is not None] if latex else [slash[1], slash[2]]
        num, den = parse_number(parts[0]), parse_number(parts[1])
        if num is None or den is None or den == 0:
            return None
        return num / den
    if not re.fullmatch(_NUMBER, s):
        return None
    plain = s.replace(",", "")
    mantissa, _, exponent = plain.lower().partition("e")
    # the exponent's digits bounded before int(): Python refuses to parse over 4,300 digits
    digits = exponent.lstrip("+-").lstrip("0")
    if len(mantissa) > _MAX_DIGITS or len(digits) > len(str(_MAX_EXPONENT)):
        return None
    if digits and int(digits) > _MAX_EXPONENT:
        return None
    if exponent:  # without its leading zeros, which Fraction would parse in full too
        plain = f"{mantissa}e{'-' if exponent.startswith('-') else ''}{digits or '0'}"
    return Fraction(plain)


def normalize_text(text: str, *, ignore_case: bool = False) -> str:
    """Whitespace collapsed to single spaces, ends stripped, one trailing `.` removed.

    Examples:
      >>> normalize_text("  Paris\\n is   nice. "), normalize_text("ABC", ignore_case=True)
      ('Paris is nice', 'abc')
    """
    s = " ".join(text.split()).removesuffix(".").strip()
    return s.lower() if ignore_case else s


def answers_match(
    predicted: str | None, reference: str, *, numeric: bool = True, ignore_case: bool = False
) -> bool:
    """Whether an extracted answer equals the reference.

    With `numeric=True` and both sides parsing as numbers (`parse_number`), they are compared
    exactly as rationals (`0.5` = `1/2` = `\\frac{1}{2}`); otherwise the normalised texts
    (`normalize_text`; with `numeric=True` also without `\\text{}`-style wrappers, `\\left` /
    `\\right` and spaces after commas, and with `\\sqrt2` read as `\\sqrt{2}`) must be
    equal. A missing prediction (None) never matches.

    Examples:
      >>> answers_match("1,000", "1000"), answers_match("0.50", r"\\frac{1}{2}")
      (True, True)
      >>> answers_match(None, "3"), answers_match("Paris.", "paris", ignore_case=True)
      (False, True)
      >>> answers_match(r"\\text{Paris}", "Paris")  # MATH's text answers
      True
    """
    if predicted is None:
        return False
    if numeric:
        a, b = parse_number(predicted), parse_number(reference)
        if a is not None and b is not None:
            return a == b
        predicted, reference = _math_text(predicted), _math_text(reference)
    return normalize_text(predicted, ignore_case=ignore_case) == normalize_text(
        reference, ignore_case=ignore_case
    )


def _math_text(text: str) -> str:
    """A math answer's text in one spelling: without `\\text{}`-style wrappers, `\\left` /
    `\\right`, spaces after commas and inside brackets (`\\left( 3, 4 \\right)` = `(3,4)`),
    `\\sqrt2` as `\\sqrt{2}`."""
    s = _unwrapped(text).replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"([(\[{])\s+", r"\1", re.sub(r"\s+([)\]}])", r"\1", s))  # ( 3,4 ) = (3,4)
    return re.sub(r",\s+", ",", s)


def _unwrapped(text: str) -> str:
    """`text` without enclosing `\\text{}` / `\\mathrm{}` / `\\textbf{}` wrappers (nested too)."""
    s = text.strip()
    for _ in range(3):
        wrapped = _WRAPPERS.match(s)
        if not wrapped:
            break
        s = next(g for g in wrapped.groups() if g is not None).strip()
    return s


def follows_tag_format(text: str, tags: Sequence[str] = ("think", "answer")) -> bool:
    """Whether `text` is exactly `<t1>…</t1> <t2>…</t2> …` for `tags`, in order.

    Each tag appears once with non-empty content that holds none of the `tags`' opening or
    closing marks; only whitespace may sit between, before or after the blocks (the R1-style
    format reward of "DeepSeek-R1", arXiv 2501.12948).

    Examples:
      >>> follows_tag_format("<think>2+2</think>\\n<answer>4</answer>")
      True
      >>> follows_tag_format("<answer>4</answer>"), follows_tag_format("x<think>a</think><answer>4</answer>")
      (False, False)
      >>> follows_tag_format("<think>a</think><answer>4<think>b</think></answer>")
      False
    """
    if isinstance(tags, str):  # its letters would be the tags
        raise ValueError(f"follows_tag_format: `tags` must be a sequence of names, got {tags!r}.")
    if not tags:
        raise ValueError("follows_tag_format: `tags` must name at least one tag, got ().")
    marks = [m for t in tags for m in (f"<{t}>", f"</{t}>")]
    position = 0
    for tag in tags:
        block = re.compile(rf"\s*<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", flags=re.DOTALL)
        found = block.match(text, position)
        if found is None or not found.group(1).strip():
            return False
        if any(mark in found.group(1) for mark in marks):  # another block nested inside
            return False
        position = found.end()
    return not text[position:].strip()
