"""Text verifiers: answer extraction, exact number comparison, format checks, built-in rewards."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jaxrl_llm.rewards import (
    answers_match,
    exact_answer,
    exact_match,
    extract_answer,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    extract_tag,
    follows_tag_format,
    math_answer,
    normalize_text,
    overlong,
    parse_number,
    regex_format,
    tag_format,
)

GSM8K_REFERENCE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{42}", "42"),
        (r"first \boxed{1}, finally \boxed{2}.", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{a{b}c}", "a{b}c"),
        (r"\fbox{7}", "7"),
        (r"\boxed{3} and an unclosed \boxed{4", "3"),
        (r"\boxed{5", None),
        ("no box at all", None),
        (r"\boxed{}", ""),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_hash_answer_reads_gsm8k_references():
    assert extract_hash_answer(GSM8K_REFERENCE) == "72"
    assert extract_hash_answer("#### 1,234\nextra line") == "1,234"
    assert extract_hash_answer("#### 1 #### 2") == "2"
    assert extract_hash_answer("####\n5") is None
    assert extract_hash_answer("no marker") is None


def test_extract_tag_and_last_number():
    assert extract_tag("<answer>\n 12 \n</answer>") == "12"
    assert extract_tag("<answer>1</answer> <answer>2</answer>") == "2"
    assert extract_tag("<answer>1", "answer") is None
    assert extract_tag("<think>x</think>", "think") == "x"
    assert extract_last_number("a 3.5e2 b") == "3.5e2"
    assert extract_last_number("total: -1,000,000 dollars") == "-1,000,000"
    assert extract_last_number("1,2,3") == "3"
    assert extract_last_number("1,2345") == "2345"  # not a thousands group: 1 and 2345
    assert extract_last_number(".5 cups") == ".5"
    assert extract_last_number("nothing here") is None
    # a fraction is one number (not its denominator), a Unicode minus is a minus
    assert extract_last_number("half of it: -1/2.") == "-1/2"
    assert extract_last_number(r"so x = \frac{-1}{2}") == r"\frac{-1}{2}"
    assert extract_last_number("3/4 of 12 is 9") == "9"
    assert extract_last_number("it is \u22123") == "-3"
    # a sign after a digit, letter, `.` or `)` is a hyphen or an operator, not the number's sign
    assert extract_last_number("pages 3-4") == "4"
    assert extract_last_number("x = 5-2") == "2"
    assert extract_last_number(r"so 3-\frac12") == r"\frac12"
    assert extract_last_number("(2)-3 or x+4") == "4"
    assert extract_last_number("x=-2, then (-3)") == "-3"
    assert extract_last_number("x: -4 and 1e-5") == "1e-5"
    # the tag's leftmost-first matches, and many unclosed tags or boxes (linear scans)
    assert extract_tag("<answer>a<answer>b</answer>") == "a<answer>b"
    assert extract_tag("<answer>" * 20000) is None
    assert extract_boxed("\\boxed{" * 5000) is None
    assert extract_boxed("\\boxed{ \\boxed{1}") == "1"


def test_extract_answer_priority_and_methods():
    text = r"<answer>3</answer> so \boxed{4} #### 5 and 6"
    assert extract_answer(text) == "4"  # boxed first
    assert extract_answer("#### 5\n<answer>3</answer>") == "5"  # then ####
    assert extract_answer("<answer>3</answer> then 9") == "3"  # then the tag
    assert extract_answer("x = 3, so y = 9") == "9"  # then the last number
    assert extract_answer("nothing") is None
    assert extract_answer(text, "tag") == "3"
    assert extract_answer(text, "hash") == "5"  # the line is not a number: its first number
    assert extract_answer(text, "last_number") == "6"
    assert extract_answer("  x  ", "full") == "x"
    with pytest.raises(ValueError, match="`method` must be one of"):
        extract_answer("x", "first")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", Fraction(42)),
        ("-7", Fraction(-7)),
        ("+7", Fraction(7)),
        ("1,234", Fraction(1234)),
        ("1,234,567.25", Fraction(123456725, 100)),
        ("0.1", Fraction(1, 10)),
        (".5", Fraction(1, 2)),
        ("2e3", Fraction(2000)),
        ("$18", Fraction(18)),
        (r"\$18.00", Fraction(18)),
        ("50%", Fraction(50)),
        ("72.", Fraction(72)),
        ("3/4", Fraction(3, 4)),
        ("-6 / 8", Fraction(-3, 4)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"\dfrac{-1}{3}", Fraction(-1, 3)),
        (r"\text{12}", Fraction(12)),
        (r"-\frac{1}{2}", Fraction(-1, 2)),
        ("\u22125", Fraction(-5)),  # a Unicode minus
        ("1" * 5000, None),  # beyond 4000 digits: not parsed (Python's int limit is 4300)
        ("1e10000000", None),  # an exponent beyond ±10000: not parsed (seconds of big-int work)
        ("1e" + "1" * 5000, None),  # an exponent of 5,000 digits: int() would raise
        ("1e-" + "0" * 4400 + "1", Fraction(1, 10)),  # leading zeros, however many
        ("1E+05", Fraction(100000)),
        ("1e400", Fraction(10) ** 400),
        ("1/0", None),
        ("12 apples", None),
        ("1,23", None),
        ("", None),
        ("abc", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


def test_answers_match_is_exact_for_numbers_and_normalised_for_text():
    assert answers_match("0.5", "1/2")
    assert answers_match("1,000", "1000.0")
    assert not answers_match("0.3333", "1/3")  # exact rationals, no tolerance
    assert answers_match(r"\text{Paris}", "Paris") and math_answer(
        ["q"], [r"\boxed{\text{Paris}}"], answer=["Paris"]
    ) == [1.0]
    assert not answers_match(
        r"\text{Paris}", "Paris", numeric=False
    )  # exact_match: texts as written
    assert not answers_match("72", "73")
    assert answers_match(" Paris. ", "Paris")
    assert not answers_match("paris", "Paris")
    assert answers_match("paris", "Paris", ignore_case=True)
    assert not answers_match("1.0", "1", numeric=False)
    assert not answers_match(None, "1")
    assert normalize_text("a\n\tb  c.") == "a b c"


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("<think>because</think><answer>4</answer>", True),
        ("\n<think>a\nb</think>\n\n<answer> 4 </answer>\n", True),
        ("<answer>4</answer><think>a</think>", False),  # wrong order
        ("<think>a</think>", False),  # missing block
        ("<think></think><answer>4</answer>", False),  # empty content
        ("<think> </think><answer>4</answer>", False),  # only whitespace
        ("<think>a</think>x<answer>4</answer>", False),  # text between blocks
        ("<think>a</think><answer>4</answer> trailing", False),
        ("<think>a<think>b</think><answer>4</answer>", False),  # nested opening tag
        ("<think>a</think><answer>4</answer><answer>5</answer>", False),  # repeated
        ("<think>a</think><answer>4<think>b</think></answer>", False),  # another tag inside
        ("<think>a</answer></think><answer>4</answer>", False),  # a stray closing mark
    ],
)
def test_follows_tag_format(text, ok):
    assert follows_tag_format(text) is ok


def test_follows_tag_format_rejects_no_tags():
    with pytest.raises(ValueError, match="at least one tag"):
        follows_tag_format("x", ())


def test_math_answer_on_gsm8k_and_boxed_completions():
    completions = [
        "She sold 72 clips.",  # last number
        r"The answer is \boxed{72}.",
        "#### 72.00",
        "#### 71",
        "I do not know.",
        r"\boxed{70} wait, 72",  # boxed wins over the later number
    ]
    n = len(completions)
    rewards = math_answer(["q"] * n, completions, answer=[GSM8K_REFERENCE] * n)
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    # a reference without marker is used whole; another field name via answer_field
    assert math_answer(["q"], ["3/4"], short=[r"\frac{3}{4}"], answer_field="short") == [1.0]
    assert math_answer(["q"], [r"\boxed{3}"], answer=["7 #### 3"], extract="boxed") == [1.0]


def test_math_answer_takes_a_reference_without_marker_whole():
    # MATH-style answer columns: the last number of "1/2" is 2, which must not be the target
    cases = [
        (r"\boxed{0.5}", "1/2", 1.0),
        ("2", "1/2", 0.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{-\frac{1}{2}}", "-1/2", 1.0),
        ("The answer is 2", "-1/2", 0.0),
        (r"\boxed{(3, 4)}", "(3, 4)", 1.0),
        ("4", "(3, 4)", 0.0),
        ("the answer is \u22123", "-3", 1.0),
        ("the answer is \u22123", "3", 0.0),
    ]
    for completion, reference, want in cases:
        assert math_answer(["q"], [completion], answer=[reference]) == [want], (
            completion,
            reference,
        )
    # a reference with a marker is still its marker's content
    assert math_answer(["q"], ["72"], answer=[GSM8K_REFERENCE]) == [1.0]
    assert math_answer(["q"], ["5"], answer=[r"so \boxed{5}"]) == [1.0]


def test_builtin_rewards_name_missing_fields_and_bad_options():
    with pytest.raises(
        ValueError, match="the field 'answer' is missing; the examples have the fields: solution"
    ):
        math_answer(["q"], ["1"], solution=["1"])
    with pytest.raises(ValueError, match="has 2 entries for 1 completions"):
        exact_answer(["q"], ["1"], answer=["1", "2"])
    with pytest.raises(ValueError, match="`extract` must be one of"):
        math_answer(["q"], ["1"], answer=["1"], extract="box")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid regex"):
        regex_format(["q"], ["1"], pattern="(")
    with pytest.raises(ValueError, match="non-empty tag names"):
        tag_format(["q"], ["1"], tags=["", "a"])
    with pytest.raises(ValueError, match=r"got the string 'answer' \(write \[answer\]\)"):
        tag_format(["q"], ["<answer>7</answer>"], tags="answer")  # not its letters
    with pytest.raises(ValueError, match="must be a sequence of names"):
        follows_tag_format("<answer>7</answer>", "answer")
    # a degenerate completion scores 0 instead of raising (an exponent of 5,000 digits)
    assert math_answer(["q"], ["answer 1e" + "9" * 5000], answer=["5"]) == [0.0]


def test_exact_match_and_exact_answer_differ_in_normalisation():
    completions = ["19", " 19", "19.", "019", "Nineteen"]
    refs = ["19"] * 4 + ["nineteen"]
    assert exact_answer(["p"] * 5, completions, answer=refs) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert exact_match(["p"] * 5, completions, answer=refs) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert exact_match(["p"] * 5, completions, answer=refs, ignore_case=True)[4] == 1.0


def test_overlong_uses_the_losses_formula_on_token_counts():
    lengths = [0, 80, 85, 90, 100, 130]
    # reference from ALGORITHMS.md §10.1 with max=100, buffer=20, factor=2: L0 = 80
    expected = [0.0, 0.0, -2 * 5 / 20, -2 * 10 / 20, -2.0, -2.0]
    got = overlong(
        ["q"] * 6,
        ["c"] * 6,
        max_length=100,
        buffer_length=20,
        factor=2.0,
        completion_lengths=lengths,
    )
    assert got == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="'completion_lengths' is missing"):
        overlong(["q"], ["c"], max_length=10, buffer_length=5)


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        (r"\boxed{\frac12}", "1/2"),  # one-digit \frac arguments
        (r"\boxed{\tfrac12}", "1/2"),
        (r"so \frac {1}{2}", "0.5"),  # a space after \frac
        (r"\boxed{1.5}", r"\frac32"),
        (r"\boxed{1{,}000}", "1000"),  # LaTeX's thousands separator
        (r"\boxed{5\text{ cm}}", "5"),  # a unit after the number
        (r"\boxed{30^{\circ}}", "30"),  # degrees
        (r"\boxed{3^\circ}", "3"),
        (r"\boxed{- 3}", "-3"),
        (r"\boxed{\left( 3, 4 \right)}", "(3, 4)"),  # sized brackets, spaces
        (r"\boxed{(3,4)}", "(3, 4)"),
        (r"\boxed{\sqrt{2}}", r"\sqrt2"),
        ("#### 18 apples", "18"),  # GSM8K's marker with words after the number
        ("## Solution\n12 + 6 = 18\n#### Answer: 18", "18"),
        ("#### Step 1\n12 + 6 = 18\n#### Final Answer\nThe answer is 18.", "18"),  # headings
    ],
)
def test_common_spellings_of_a_right_answer_match(completion, reference):
    """MATH- and GSM8K-style spellings a model writes for the reference (all scored 0 before)."""
    assert math_answer(["q"], [completion], answer=[reference]) == [1.0]


@pytest.mark.parametrize(
    ("completion", "reference"),
    [(r"\boxed{5\text{ cm}}", "6"), ("#### 17 apples", "18"), (r"\boxed{(3,5)}", "(3, 4)")],
)
def test_those_spellings_of_a_wrong_answer_do_not(completion, reference):
    assert math_answer(["q"], [completion], answer=[reference]) == [0.0]


def test_the_edges_of_number_and_text_normalisation():
    """Exponents up to ±10000 are parsed, beyond are not; one trailing `.` is removed with the
    spaces before it, not several (mutation testing)."""
    assert parse_number("1e10000") == Fraction(10) ** 10000
    assert parse_number("1e10001") is None
    assert normalize_text("Paris .") == "Paris" and answers_match("Paris .", "Paris")
    assert normalize_text("Paris..") == "Paris." and not answers_match("Paris..", "Paris")
