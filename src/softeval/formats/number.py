"""Number (`number`, GSM8K): strict needs `#### <number>`; lenient takes that number where there is
one, else the last number. A number has optional decimals and thousands separators: commas, or
no-break or thin spaces (groups of three digits after the first's one to three). Digits grouped
so by plain spaces or tabs (`1 000`) are `ambiguous`: one number or two? Its sign is an ASCII or
Unicode minus, next to it or to its dollar sign (`-$3`, `$-3`), or after `####` also apart
(`#### - 3`). A numeral the format cannot read is never replaced by a number before it or inside
it: a decimal comma or mixed grouping (`5,5`, `1.000,50`, `2 500,00`) is `ambiguous`, a fraction
(`1/2`) is no answer. A "/" before a non-digit is no fraction (`72/month` reads 72). Answers are
compared as exact decimal numbers (`1,250` = `1250.0`).

Numbers and math put the answer last, after the reasoning (`answer_last`), so a completion cut at
the token limit may stop short of it. A number completion cut there is read without its last word,
which may be unfinished (`#### 12` of `#### 125`), nor the digit groups that word may go on
(`#### 1 000` of `#### 1 000 000`), and its last number is wherever the limit fell, not an
answer: lenient takes the last number it stated as its answer instead ("The answer is 18",
"Answer: 18" opening a line; not "The answer is 6 + 3 = 9"), or none. A math completion cut there
is read without its unfinished last line, but for a closed `\\boxed{...}`.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from softeval.errors import SoftevalError
from softeval.formats.base import AnswerFormat, Example, Reading

# --- number: "#### <number>" (GSM8K) ----------------------------------------------------------------

# Thousands grouped by spaces: a no-break or thin space groups digits (ISO 80000, "1\u202f000"); a
# plain space or a tab may as well separate two numbers ("page 3 100 times"), so "1 000" is not read
# as 1000 (nor as 1, nor as the 0 of its last group) but as ambiguous.
_GROUPING_SPACES = "\u00a0\u2009\u202f"
_GROUP_SPACE = f"[ \t{_GROUPING_SPACES}]"  # a plain space or tab too: read, then found ambiguous
# The sign may be ASCII or the Unicode minus, before or after a dollar sign ("-$3", "$-3").
_SIGN = r"(?:[-\u2212][$]?|[$][-\u2212]?)"
# digits with optional thousands separators and decimals; not part of a fraction or a longer number.
# Not the "12" of "12.5" or of "12/5": no digits may follow, nor a decimal part, a fraction's "/"
# or, after one to three digits, a thousands group ("2" is not the number of "2 500,00").
NUMBER = (
    rf"(?<![\d.,/]){_SIGN}?"
    rf"(?:\d{{1,3}}(?:,\d{{3}})+|\d{{1,3}}(?:{_GROUP_SPACE}\d{{3}})+|\d{{4,}}|\d{{1,3}}(?!{_GROUP_SPACE}\d{{3}}(?!\d)))"
    r"(?:\.\d+)?(?!\d|/\d|[.,]\d)"
)
# A numeral as written: digits joined by the separators a number may have, and "/" (a fraction).
# Where `NUMBER` does not read all of it ("5,5", "1.000,50", "2 500,00", "1/2"), the completion's
# number is in a form the format cannot read, and no other number stands in for it.
_NUMERAL = rf"\.?\d(?:\d|[.,/](?=\d)|(?<!\d{{4}}){_GROUP_SPACE}(?=\d{{3}}(?!\d)))*"  # "2019 150": two
_NUMBERS, _NUMERALS = re.compile(NUMBER), re.compile(_NUMERAL)
_SIGN_BEFORE = re.compile(rf"{_SIGN}\Z")  # of a numeral: what `NUMBER` takes as its sign
_PLAIN_SPACE_GROUPED = re.compile(r"\d[ \t]\d")
# A cut completion's unfinished end, read backwards (reversed text): its last word, and where that
# word opens with digits, the digit groups of the number it may continue ("1 000" of "1 000 000").
_UNFINISHED_END = re.compile(rf"\S*\d{_GROUP_SPACE}(?:\d{{3}}{_GROUP_SPACE})*\d{{1,3}}(?![\d.,/])|\S+")
# after "####" a sign may stand apart ("#### - 3"); elsewhere "5 - 3" is a subtraction
# "####", an optional sign and the numeral after it; a bullet on the next line is no sign
MARKED_NUMERAL = re.compile(rf"####(?:[ \t]*([-\u2212])[ \t]+|\s*)({_SIGN}?{_NUMERAL})")
# "The answer is 18", "The final answer is: **$18**", "Answer: 18" opening a line, "\boxed{18}" after
# "answer is": a number the completion states as its answer. Not the first term of a calculation
# ("The answer is 6 + 3 = 9", "6 x 3", "9 plus 9"), and not "the answer: 48 clips" inside a sentence.
_CALCULATION = r"\s*(?:[-+/=^\u00d7\u00f7\u2212\u2013\u00b7\u22c5\\]|\*(?!\*)|x\s*\d|(?:times|plus|minus|divided|multiplied)\b)"
STATED_NUMBER = re.compile(
    rf"(?:\banswer\s+is\b\s*[:\uff1a]?|^[ \t]*(?:final\s+)?answer\s*[:\uff1a])[ \t]*(?:\*\*|\\boxed\{{)?[ \t]*({NUMBER})(?!{_CALCULATION})",
    re.IGNORECASE | re.MULTILINE,
)
_MAX_DIGITS = 1000


def canonical_number(text: str) -> str | None:
    """`1,250`, `$1250.00` and `1250` all read as "1250", `\u22123` and `$-3` as "-3"; None for
    what is not a number. Exact at any length: decimal, not floating-point, arithmetic."""
    cleaned = text.strip().replace(",", "").replace("$", "").replace("\u2212", "-").rstrip(".")
    cleaned = re.sub(rf"(?<=\d)[{_GROUPING_SPACES}](?=\d)", "", cleaned)  # digits grouped by no-break or thin spaces
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if abs(value.adjusted()) > _MAX_DIGITS:  # written out, "1e999999999" would fill the memory
        return str(value)
    if value == value.to_integral_value():
        return str(int(value))
    return format(value, "f").rstrip("0")  # exact: normalize() would round to 28 digits


def _finished_part(completion: str, cut: bool) -> str:
    """A completion cut at the token limit without its last word, which may be unfinished
    ("#### 12" of "#### 125"), and without the digit groups before it ("#### 1 000" may go on as
    "#### 1 000 000"); a word that closes a brace ("\\boxed{18}") is finished."""
    if not cut or completion.endswith("}"):
        return completion
    unfinished = _UNFINISHED_END.match(completion[::-1])  # from the end backwards: linear time
    return completion[: len(completion) - unfinished.end()] if unfinished else completion


def _number_reading(text: str) -> Reading:
    """The answer a number the parser found reads as; digits grouped by plain spaces are ambiguous."""
    if _PLAIN_SPACE_GROUPED.search(text):
        return Reading.none("ambiguous", f"{_quoted(text)} may be one number with its digits grouped by spaces or several numbers")
    return Reading(canonical_number(text))


def _unreadable(numeral: str) -> Reading:
    """The reading of a numeral as written that `NUMBER` does not read whole: there is no number."""
    if "/" in numeral:
        return Reading.none("no_answer", f"{_quoted(numeral)} is a fraction; the number format reads whole and decimal numbers")
    if re.search(rf",|{_GROUP_SPACE}", numeral):
        return Reading.none("ambiguous", f"{_quoted(numeral)} may have a decimal comma or its digits grouped another way")
    return Reading.none("no_answer", f"{_quoted(numeral)} is not a number the number format reads")


def _quoted(text: str, limit: int = 40) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


# a Markdown heading that numbers a step, with the work below it ("#### 1. Eggs left\n16 - 3 = 13"):
# not a "#### <answer>" line, as "#### 18. I hope it is correct." at the end is
_NUMBERED_HEADING = re.compile(r"(?:^|\n)[ \t]*####[ \t]*\d+[.)][ \t]+[^\W\d_][^\n]*\n\s*\S")


def _marked_number(text: str) -> Reading | None:
    """The reading of the first "####" followed by a numeral, numbered headings aside; None
    where there is none."""
    marked = next((m for m in MARKED_NUMERAL.finditer(text) if not _NUMBERED_HEADING.match(text, _line_start(text, m.start()))), None)
    if marked is None:
        return None
    written = (marked.group(1) or "") + marked.group(2)
    return _number_reading(written) if _NUMBERS.fullmatch(written) else _unreadable(written)


def _line_start(text: str, position: int) -> int:
    """Where the line holding `position` starts, with the newline before it."""
    return max(text.rfind("\n", 0, position), 0)


def _last_number(text: str) -> Reading:
    """The reading of the last numeral in the text, with a sign before it: no earlier number
    stands in for one the format cannot read ("5,5" is not read as a "2" before it)."""
    numeral = None
    for numeral in _NUMERALS.finditer(text):
        pass
    if numeral is None:
        return Reading.none("no_answer", "no number")
    sign = _SIGN_BEFORE.search(text, max(0, numeral.start() - 2), numeral.start())
    for start in ([sign.start()] if sign else []) + [numeral.start()]:  # "10-3" ends in 3, not -3
        number = _NUMBERS.match(text, start)
        if number is not None and number.end() == numeral.end():
            return _number_reading(number.group())
    return _unreadable(numeral.group())


class Number(AnswerFormat):
    name = "number"
    fields = ("question", "answer", "solution")
    answer_last = True

    def example(self, values: dict, *, index: int, source: str, row: dict) -> Example:
        example = super().example(values, index=index, source=source, row=row)
        answer = values["answer"]
        if isinstance(answer, bool) or not isinstance(answer, str | int | float) or canonical_number(str(answer)) is None:
            raise SoftevalError(f"{source}: gold answer {answer!r} is not a number; the number format needs one")
        example.answer = str(answer).strip()
        example.solution = values.get("solution")
        return example

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        if not completion.strip():
            return Reading.none("no_answer", "empty completion")
        marked = _marked_number(_finished_part(completion, cut))
        return marked or Reading.none("no_answer", "no '#### <number>' in the completion")

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        finished = _finished_part(completion, cut)
        marked = _marked_number(finished)
        if marked is not None:  # its own "#### <number>" is its answer, read or not
            return marked
        if cut:  # its last number is wherever the token limit fell: only an answer it stated counts
            stated = STATED_NUMBER.findall(finished)
            if stated:
                return _number_reading(stated[-1])
            return Reading.none("no_answer", "cut at the token limit before an answer ('####' or 'the answer is N')")
        return _last_number(completion)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and answer == canonical_number(example.answer)
