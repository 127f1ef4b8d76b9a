"""Answer formats: everything softeval knows about one kind of answer lives in its class here.

A format owns the values a row must provide and their validation, the strict parser (the
benchmark's required format), the lenient parser (the answer wherever it is), the correctness
rule with its normalisation, whether the task has options (so cloze knowledge applies) and its
chance level. Adding a format means adding one class to `FORMATS`.

Both parsers of a format read a completion by the same rule and return a `Reading`: an answer,
or why there is none (`no_answer`, `ambiguous` when several candidates are named, `conflict`
when the completion contradicts itself). A completion is judged after its leading whitespace.

Multiple choice (`multiple_choice`), one rule for both parsers, applied to the first line:

* An option letter is a capital letter standing alone (`B`, `B.`, `B)`, `(B)`, `B:`), not part
  of an abbreviation ("D.C."). `A` and `I` followed by a space and a lower-case word are the
  English words ("A plant needs water", "I think"), not letters, unless that word is one of
  `LETTER_CONNECTIVES` ("A or B", "A is the answer").
* An option is *named* by its letter or by its text (whole words, case-insensitive; a text found
  inside a longer option's text counts for the longer one only; letters inside a named option
  text are part of that text).
* A leading letter may be followed by text that echoes an option ("A. break up the fight", or a
  prefix of it cut by the token limit; the longest option text written counts). If that text is
  another option's, the completion is a `conflict`: neither parser picks the letter or the text.
* After a leading letter, other option letters are hedging (`A B C D`, `A or B`: `ambiguous`);
  option texts are explanation. Without a leading letter, several different options named by
  letter or text ("pollen, not a seed") are `ambiguous`.
* Strict: the line starts with an option letter and is not ambiguous or a conflict.
  Lenient: exactly one option is named, anywhere in the line.
* A spec may map `labels` to the row's own option labels; each row must then have one per option text.
* Knowledge scores each option's text after the cloze context. With partial scoring (fields
  `cloze_contexts`, one per option, and `cloze_continuation`), it scores the one continuation after
  each option's own context instead, as fill-in-the-blank benchmarks do.

Option text (`option_text`): multiple choice answered with the option's words. Strict: the first
line equals one option's text. Lenient: the first line opens with one option's text, or exactly one
option's text appears in it (a text inside a longer option's text counts for the longer one). Texts
are compared as written (spacing, a final period and a leading article aside), then ignoring case,
then after SQuAD normalisation, at the first level that names an option. An option label opening
the line ("A)", "A.", "(A)") is not the option's text, and normalisation must not read it as the
article: strict fails, and lenient reads the text after it. The answer is recorded as that option's
letter.

Number (`number`, GSM8K): strict needs `#### <number>`; lenient takes that number where there is
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

Math (`math`, competition mathematics): strict takes the last `\\boxed{...}` or `\\fbox{...}`
(nested braces) or `\\boxed 9`; lenient also takes a final-answer line ("Final Answer: The final
answer is $7$", "Answer: 7"; at most six words unless in `$...$`). Correct
means mathematically equivalent to the gold answer by math-verify (`0.5` = `\\frac{1}{2}`,
`-8` is not `8`; intervals and tuples compare as such), never by string normalisation.

Short answer (`short_answer`, TriviaQA, NQ-open): the answer is the first non-empty line.
Strict: at most `max_answer_words` words and not a list of candidates. Lenient: a gold alias
inside that line (a numeric alias only where the line's numbers are its own); a list of several
short candidates (three or more comma-separated items, or items joined by "or", ";" or " / ",
each of at most four words) is `ambiguous` unless the whole line is an alias. Correct means
equal to an alias after the benchmark's own normalisation: `squad` (lower case, punctuation and articles removed; SQuAD and
NQ-open) or `triviaqa` (the official TriviaQA rule: punctuation and single typographic quotes
become spaces, underscores too, articles removed).
"""

from __future__ import annotations

import re
import string
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import ClassVar, Literal

from softeval.errors import SoftevalError

LETTERS = string.ascii_uppercase
Status = Literal["answer", "no_answer", "ambiguous", "conflict"]
Normalization = Literal["squad", "triviaqa"]  # short answers: the benchmark's normalisation rule
# multiple choice, knowledge: an option's log-likelihood per character of its text (lm-eval's
# acc_norm), or summed (acc; for options such as "yes" and "no", where dividing by the length would
# favour the longer word whenever both are unlikely)
ClozeNormalization = Literal["characters", "none"]


@dataclass
class Example:
    """One benchmark item, with the values scoring needs already pulled out of its row."""

    index: int  # position in its split
    source: str  # "file:line" or "hub:split[index]", for error messages and sample logs
    row: dict
    question: str
    answer: str  # the gold answer: an option letter, a number, or a readable short answer
    choices: list[str] | None = None
    answer_index: int | None = None
    aliases: list[str] = field(default_factory=list)
    solution: str | None = None
    # partial scoring: each option's own context, and the one continuation scored after each
    cloze_contexts: list[str] | None = None
    cloze_continuation: str | None = None

    @property
    def letters(self) -> list[str]:
        return list(LETTERS[: len(self.choices or [])])

    @property
    def scored_texts(self) -> list[str]:
        """The text whose loglikelihood is scored for each option."""
        if self.cloze_contexts is not None:
            return [self.cloze_continuation or ""] * len(self.cloze_contexts)
        return list(self.choices or [])

    def scored_alike(self, i: int, j: int) -> bool:
        """Whether options i and j are scored as the same text in the same context (a row
        listing one option twice, as some CommonsenseQA rows do): their log-likelihoods tie, so
        picking either is picking the other."""
        if self.cloze_contexts is not None:
            return self.cloze_contexts[i] == self.cloze_contexts[j]
        choices = self.choices or []
        return choices[i] == choices[j]

    def template_values(self) -> dict:
        """What prompt and target templates can refer to: the row's own fields plus ours."""
        values = dict(self.row)
        values.update(question=self.question, answer=self.answer, aliases=self.aliases, solution=self.solution)
        if self.choices is not None:
            values.update(
                choices=self.choices,
                letters=self.letters,
                letter=self.answer,
                answer_text=self.choices[self.answer_index] if self.answer_index is not None else None,
                options="\n".join(f"{l}. {c}" for l, c in zip(self.letters, self.choices)),
            )
        return values


@dataclass(frozen=True)
class Reading:
    """What a parser read in a completion: an answer, or the status saying why there is none."""

    answer: str | None
    status: Status = "answer"
    note: str | None = None  # why there is no answer, in words

    @staticmethod
    def none(status: Status, note: str) -> Reading:
        return Reading(None, status, note)


class AnswerFormat(ABC):
    """One kind of answer: its row values, parsers, correctness rule and chance level."""

    name: ClassVar[str]
    fields: ClassVar[tuple[str, ...]]  # values a row must provide (task spec `fields`)
    has_options: ClassVar[bool] = False  # multiple choice: cloze knowledge over the options

    def __init__(self, max_answer_words: int = 10, normalization: Normalization = "squad", cloze_normalization: ClozeNormalization = "characters"):
        # the task spec's answer settings; each format uses those that concern it
        self.max_words, self.normalization, self.cloze_normalization = max_answer_words, normalization, cloze_normalization

    def example(self, values: dict, *, index: int, source: str, row: dict) -> Example:
        """A validated example from the values the spec's fields computed for one row;
        a value that cannot be used is an error naming the row's file and line."""
        question = values["question"]
        if not isinstance(question, str) or not question.strip():
            raise SoftevalError(f"{source}: field 'question' is empty or not text")
        return Example(index=index, source=source, row=row, question=question, answer="")

    # The answer ends the completion, after any reasoning (numbers, math): a completion cut at the
    # token limit may stop short of it, and its last word may be unfinished ("#### 12" of "#### 125").
    answer_last: ClassVar[bool] = False

    # `cut`: generation stopped at the token limit, not at a stop string or the end of sequence.
    @abstractmethod
    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading: ...

    @abstractmethod
    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading: ...

    @abstractmethod
    def is_correct(self, answer: str | None, example: Example) -> bool: ...

    def chance(self, example: Example) -> float:
        """Accuracy of a uniform random answer: 1 / options for multiple choice, else 0."""
        return 0.0


# --- multiple choice: answer with an option letter -------------------------------------------------

# Words after "A" / "I" that make it an option letter rather than the article or pronoun.
LETTER_CONNECTIVES = frozenset(
    "or and nor is was are were seems because but then would should could might must will".split()
)
# a capital standing alone: not inside a word, and not part of an abbreviation ("D.C.", "U.S.")
_LETTER = re.compile(r"(?<![A-Za-z0-9.])\(?([A-Z])(?![A-Za-z0-9'’]|\.[A-Za-z])")
# between a leading letter and the text that follows it: a dash only before a space ("C - text"),
# so an option's own sign stays ("B. -1")
_ECHO_MARKER = re.compile(r"^(?:[\s.):]|-(?=\s))*")
_MIN_ECHO_PREFIX = 3  # characters of an option's text that identify it when the text was cut


@dataclass(frozen=True)
class _Named:
    letter: str
    start: int
    end: int
    by_letter: bool = True  # named by its letter, not its text


class MultipleChoice(AnswerFormat):
    name = "multiple_choice"
    fields = ("question", "choices", "answer")
    has_options = True

    def example(self, values: dict, *, index: int, source: str, row: dict) -> Example:
        example = super().example(values, index=index, source=source, row=row)
        choices, gold = values["choices"], values["answer"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise SoftevalError(f"{source}: field 'choices' must be a list of at least two strings")
        if len(choices) > len(LETTERS):
            raise SoftevalError(f"{source}: {len(choices)} options; at most {len(LETTERS)} are supported")
        empty = [LETTERS[i] for i, c in enumerate(choices) if not c.strip()]
        if empty:
            raise SoftevalError(f"{source}: option {empty[0]} has empty text; fix the row or drop it")
        labels = values.get("labels")  # optional: the row's own option labels, to check against
        if labels is not None and not isinstance(labels, list):
            raise SoftevalError(f"{source}: field 'labels' must be a list (one label per option)")
        if labels is not None and len(labels) != len(choices):
            raise SoftevalError(f"{source}: {len(labels)} option labels but {len(choices)} option texts; fix the row or drop it")
        if isinstance(gold, str) and gold.strip().isdigit():
            raise SoftevalError(f"{source}: answer index {gold!r} is text, not a number; add `| int` to the spec's answer field")
        if isinstance(gold, bool) or not isinstance(gold, int):
            raise SoftevalError(
                f"{source}: answer index {gold!r} is a {type(gold).__name__}, not an integer; "
                "the spec's answer field must give the correct option's position (0, 1, ...)"
            )
        if not 0 <= gold < len(choices):
            raise SoftevalError(f"{source}: answer index {gold!r} is out of range for {len(choices)} options (0 to {len(choices) - 1}); fix the row or drop it")
        example.choices, example.answer_index, example.answer = choices, gold, LETTERS[gold]
        example.cloze_contexts, example.cloze_continuation = _partial_scoring(values, len(choices), source)
        return example

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        text = _first_line(completion)
        if not text:
            return Reading.none("no_answer", "empty completion")
        lead = self._leading_letter(text, example)
        if lead is None:
            first = _LETTER.match(text)
            if first and _is_word(text, first):
                return Reading.none("no_answer", f"starts with the word '{first.group(1)}', not an option letter: {text[:30]!r}")
            if first and first.group(1) not in example.letters:
                return Reading.none("no_answer", f"'{first.group(1)}' is not one of the options {''.join(example.letters)}")
            return Reading.none("no_answer", f"does not start with an option letter: {text[:30]!r}")
        return self.read(text, example, cut=cut)

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        text = _first_line(completion)
        if not text:
            return Reading.none("no_answer", "empty completion")
        return self.read(text, example, cut=cut)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and answer == example.answer

    def chance(self, example: Example) -> float:
        return 1.0 / len(example.choices or [None])

    # --- the one reading both parsers share ------------------------------------------------------

    def read(self, text: str, example: Example, *, cut: bool = False) -> Reading:
        """The option a completion's first line names, by the rules in the module docstring."""
        rest_start = 0
        lead = self._leading_letter(text, example)
        if lead is not None:
            echo_start = lead.end + _ECHO_MARKER.match(text[lead.end :]).end()
            echoed, echo_end = self._echo(text[echo_start:], example, lead.letter, cut=cut)
            if echoed and lead.letter not in echoed:
                return Reading.none(
                    "conflict", f"letter {lead.letter} but the text of option {'/'.join(sorted(echoed))}"
                )
            rest_start = echo_start + echo_end if echoed else lead.end
        named = self._named(text[rest_start:], example)
        if lead is not None:  # after a committed letter, option texts are explanation; letters hedge
            named = [lead] + [n for n in named if n.by_letter]
        named = [n.letter for n in named]
        distinct = list(dict.fromkeys(named))
        if not distinct:
            return Reading.none("no_answer", "names no option")
        if len(distinct) > 1:
            return Reading.none("ambiguous", f"names several options: {', '.join(distinct)}")
        return Reading(distinct[0])

    def _leading_letter(self, text: str, example: Example) -> _Named | None:
        match = _LETTER.match(text)
        if match is None or match.group(1) not in example.letters or _is_word(text, match):
            return None
        return _Named(match.group(1), match.start(), match.end())

    def _echo(self, text: str, example: Example, lead: str, *, cut: bool = False) -> tuple[set[str], int]:
        """Options whose text the words after the leading letter `lead` start with (or, stopping
        short, begin with those words), and where that echo ends. A leading article on either side
        is ignored ("C. index fossils" echoes "the index fossils in the rock"). Words that begin
        the lead's own text are its echo, stopped short, where they go on past every other text
        they start with, or the completion was `cut` at the token limit: "C. The ribs, sternum
        and" echoes C "The ribs, sternum and clavicle", not A "The ribs"."""
        line = text.split("\n", 1)[0].lower()
        offset = _leading_article_length(line)
        body = line[offset:]
        options = [(letter, _without_article(choice.strip().lower())) for letter, choice in zip(example.letters, example.choices or [])]
        written = [(len(needle), letter) for letter, needle in options if needle and body.startswith(needle) and _ends_word(body, len(needle))]
        longest = max((length for length, _ in written), default=0)
        begun = body.strip().rstrip(".")
        own = dict(options)[lead]
        if len(begun) >= _MIN_ECHO_PREFIX and own.startswith(begun) and (cut or len(begun) > longest):
            return {lead}, len(line)
        if written:  # the longest text written counts ("heat and light" is not "heat")
            return {letter for length, letter in written if length == longest}, offset + longest
        if len(begun) < _MIN_ECHO_PREFIX:
            return set(), 0
        matched = {letter for letter, needle in options if needle.startswith(begun)}
        return matched, len(line) if matched else 0

    def _named(self, text: str, example: Example) -> list[_Named]:
        """Options named in `text`, by their text or their letter, in order of appearance."""
        lowered = text.lower()
        spans = []
        for letter, choice in zip(example.letters, example.choices or []):
            needle = re.escape(choice.strip().lower())
            if needle:
                found = re.finditer(rf"(?<![a-z0-9]){needle}(?![a-z0-9])", lowered)
                spans += [_Named(letter, m.start(), m.end(), by_letter=False) for m in found]
        # a text inside a longer named text ("heat" in "heat and light") belongs to the longer one
        # (an option listed twice names both: the reading is ambiguous)
        spans = [s for s in spans if not any(o.end - o.start > s.end - s.start and o.start <= s.start and s.end <= o.end for o in spans)]
        for match in _LETTER.finditer(text):
            inside = any(s.start <= match.start(1) < s.end for s in spans)
            if match.group(1) in example.letters and not inside and not _is_word(text, match):
                spans.append(_Named(match.group(1), match.start(), match.end()))
        return sorted(spans, key=lambda s: s.start)


def _is_word(text: str, match: re.Match) -> bool:
    """"A plant", "I think": the article or pronoun, not an option letter."""
    if match.group(1) not in ("A", "I") or match.group(0).startswith("("):
        return False
    following = re.match(r"[^\S\n]+([a-z]+)", text[match.end() :])
    return following is not None and following.group(1) not in LETTER_CONNECTIVES


def _leading_article_length(text: str) -> int:
    article = re.match(r"(?:the|an|a)\s+", text)
    return article.end() if article else 0


def _without_article(text: str) -> str:
    return text[_leading_article_length(text) :]


def _ends_word(text: str, position: int) -> bool:
    return position >= len(text) or not text[position].isalnum()


def _partial_scoring(values: dict, n_options: int, source: str) -> tuple[list[str] | None, str | None]:
    """The optional `cloze_contexts` (one per option) and `cloze_continuation` fields, checked."""
    contexts, continuation = values.get("cloze_contexts"), values.get("cloze_continuation")
    if contexts is None and continuation is None:
        return None, None
    if not (isinstance(contexts, list) and len(contexts) == n_options and all(isinstance(c, str) and c for c in contexts)):
        raise SoftevalError(f"{source}: field 'cloze_contexts' must be a list of {n_options} non-empty texts, one per option")
    if not isinstance(continuation, str) or not continuation.strip():
        raise SoftevalError(f"{source}: field 'cloze_continuation' must be the non-empty text scored after each context")
    return contexts, continuation


# --- option text: answer with the option's own words ---------------------------------------------------


class OptionText(MultipleChoice):
    """Multiple choice answered with the text of an option rather than its letter. The answer is
    still recorded as the option's letter, so diagnostics and knowledge work as for letters.

    Texts are compared at the strictest of three levels that tells the options apart: as written
    (spaces, a final period and a leading article aside), then ignoring case, then after SQuAD
    normalisation. So "+2" and "-2", or "WW or ww" and "WW or Ww", stay different options."""

    name = "option_text"

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        line = _first_line(completion)
        if not line:
            return Reading.none("no_answer", "empty completion")
        label = _option_label(line, example)
        if label is not None:  # normalisation would read "A)" as the article and judge the text after it
            return Reading.none("no_answer", f"starts with the option label {label.strip()!r}, not an option's text")
        for level in _text_levels():
            equal = [letter for letter, text in _option_texts(example, level) if text == level(line)]
            if len(equal) == 1:
                return Reading(equal[0])
            if equal:
                return Reading.none("ambiguous", f"equals the text of several options: {', '.join(equal)}")
        return Reading.none("no_answer", f"first line is not one option's text: {line[:30]!r}")

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        line = _first_line(completion)
        # the text is the answer: a label before it is a habit (the options are not lettered)
        label = _option_label(line, example)
        if label is not None:
            line = line[len(label) :]
        # an option's text opening the line commits to it, as a leading letter does
        for level in _text_levels():
            opening = _opening_option(level(line), _option_texts(example, level))
            if opening is not None:
                return Reading(opening)
        for level in _text_levels():
            said = level(line)
            found = {letter: t for letter, t in _option_texts(example, level) if re.search(rf"(?<!\w){re.escape(t)}(?!\w)", said)}
            # a text inside a longer named text ("heat" in "heat and light") belongs to the longer one
            named = [l for l, t in found.items() if not any(o != t and t in o for o in found.values())]
            if len(named) == 1:
                return Reading(named[0])
            if named:
                return Reading.none("ambiguous", f"names several options: {', '.join(named)}")
        return Reading.none("no_answer", "names no option's text")


# "A)", "A.", "A:", "(A)" (or lower case) opening a line: an option label, not the article "a"
_OPTION_LABEL = re.compile(r"\(?([A-Za-z])[.):]\)?(?=\s|$)\s*")


def _option_label(line: str, example: Example) -> str | None:
    """The option label a line opens with, as written with the spaces after it; None without one,
    or where the line opens with an option whose own text starts that way ("A. Lincoln")."""
    match = _OPTION_LABEL.match(line)
    if match is None or match.group(1).upper() not in example.letters:
        return None
    label, opening = match.group(0).strip().lower(), line.lower()
    if any(c.strip().lower().startswith(label) and opening.startswith(c.strip().lower()) for c in example.choices or []):
        return None
    return match.group(0)


def _opening_option(said: str, texts: list[tuple[str, str]]) -> str | None:
    """The option whose text (the longest one) opens the line, unless the line goes on to list
    another option."""
    leading = [(len(t), letter) for letter, t in texts if said.startswith(t) and _ends_word(said, len(t))]
    if not leading:
        return None
    longest = max(length for length, _ in leading)
    opening = [letter for length, letter in leading if length == longest]
    if len(opening) > 1 or _lists_another(said[longest:], [t for _, t in texts]):
        return None
    return opening[0]


def _lists_another(rest: str, texts: list[str]) -> bool:
    """Whether the words after an opening option text go straight on to another option ("water or
    wind", "water, wind"): a hedge, not an answer."""
    joined = re.match(r"\s*(?:,|;|/|\bor\b)?\s*", rest)  # normalisation may have dropped the comma
    following = rest[joined.end() :]
    return bool(following) and any(following.startswith(t) and _ends_word(following, len(t)) for t in texts)


def _as_written(text: str) -> str:
    text = " ".join(text.split()).rstrip(".").strip()
    return text[_leading_article_length(text.lower()) :]


def _casefolded(text: str) -> str:
    return _as_written(text).casefold()


def _text_levels():
    return (_as_written, _casefolded, normalize)  # normalize is defined with the short answers


def _option_texts(example: Example, level) -> list[tuple[str, str]]:
    return [(letter, t) for letter, choice in zip(example.letters, example.choices or []) if (t := level(choice))]


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


# --- short answer: the first line is the answer (TriviaQA, NQ-open) -----------------------------------

_TRIVIAQA_PUNCTUATION = set(string.punctuation) | set("‘’´`")
_SQUAD_PUNCTUATION = set(string.punctuation)
_LIST_ITEM_WORDS = 4


def normalize(text: str, rule: Normalization = "squad") -> str:
    """The benchmark's answer normalisation. `squad`: lower case, punctuation deleted, articles
    and extra spaces removed. `triviaqa` (the official script): underscores, punctuation and the
    quote marks ‘ ’ ´ ` become spaces; then articles and extra spaces go."""
    text = text.lower()
    if rule == "triviaqa":
        text = text.replace("_", " ")
        text = "".join(" " if ch in _TRIVIAQA_PUNCTUATION else ch for ch in text)
    else:
        text = "".join(ch for ch in text if ch not in _SQUAD_PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _is_list(line: str) -> bool:
    """Several short candidate answers: three or more comma-separated items, or items joined by
    "or", ";" or " / ", each of at most `_LIST_ITEM_WORDS` words. Two comma-separated items
    ("Paris, France") are one answer; a sentence with commas is not a list."""
    for separator, least in ((r",\s+", 3), (r"\s+or\s+|;|\s/\s", 2)):
        items = [p.strip() for p in re.split(separator, line.rstrip(".")) if p.strip()]
        if len(items) >= least and all(len(item.split()) <= _LIST_ITEM_WORDS for item in items):
            return True
    return False


class ShortAnswer(AnswerFormat):
    name = "short_answer"
    fields = ("question", "answer", "aliases")

    def example(self, values: dict, *, index: int, source: str, row: dict) -> Example:
        example = super().example(values, index=index, source=source, row=row)
        answer = values["answer"]
        if not isinstance(answer, str | int | float) or not str(answer).strip():
            raise SoftevalError(f"{source}: field 'answer' is empty")
        aliases = values.get("aliases") or []
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise SoftevalError(f"{source}: field 'aliases' must be a list of strings")
        gold = str(answer).strip()
        example.aliases = list(dict.fromkeys([gold, *(a for a in aliases if a.strip())]))
        example.answer = self.readable(gold, example.aliases)
        return example

    def readable(self, gold: str, aliases: list[str]) -> str:
        """The gold answer as demonstrations and tuning targets show it: an ALL-CAPS gold answer
        ("CHAS CHANDLER") becomes an alias that says the same in ordinary case; without one, its
        words of five or more capitals are capitalised ("STEPTOE" -> "Steptoe") while shorter ones,
        likely acronyms ("NATO", "USA", "A66"), stay."""
        if not any(len(word) >= 4 and word.isupper() for word in gold.split()):
            return gold
        bare = gold.strip("'\" .").lower()
        readable = [a for a in aliases if not a.isupper()]
        same_words = [a for a in readable if a.lower() == bare]
        same_answer = [a for a in readable if normalize(a, self.normalization) == normalize(gold, self.normalization)]
        if same_words or same_answer:
            return (same_words or same_answer)[0]
        return " ".join(w.capitalize() if len(w) >= 5 and w.isalpha() and w.isupper() else w for w in gold.split(" "))

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        line = _first_line(completion)
        if not line:
            return Reading.none("no_answer", "empty completion")
        words = len(line.split())
        if words > self.max_words:
            return Reading.none("no_answer", f"first line has {words} words (at most {self.max_words})")
        if _is_list(line) and not self._alias_equal(line, example):
            return Reading.none("ambiguous", "lists several candidate answers")
        return Reading(line)

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        line = _first_line(completion)
        if not line:
            return Reading.none("no_answer", "empty completion")
        exact = self._alias_equal(line, example)
        if exact:
            return Reading(exact)
        if _is_list(line):
            return Reading.none("ambiguous", "lists several candidate answers")
        found, restated = self._alias_inside(line, example)
        if found is None and restated is not None:
            return Reading(line, note=f"the gold answer '{restated}' is in the question too: not read inside the line")
        return Reading(found or line)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and self._alias_equal(answer, example) is not None

    def _alias_equal(self, text: str, example: Example) -> str | None:
        got = normalize(text, self.normalization)
        for alias in example.aliases:
            wanted = normalize(alias, self.normalization)
            # an alias the normalisation empties ("A+", "*", ")") is compared as written: read
            # normalised, it would equal any answer made only of articles and punctuation
            if (got == wanted) if wanted else _typed_equal(text, alias):
                return alias
        return None

    def _alias_inside(self, line: str, example: Example) -> tuple[str | None, str | None]:
        """The first alias found inside the line; else None, and the first alias passed over
        because the question holds it too (None if none was)."""
        said, asked = _Words(line, self.normalization), _Words(example.question, self.normalization)
        numbers = sorted(_NUMBER_WORDS.findall(line))
        restated = None
        for alias in example.aliases:
            if not said.hold(alias):
                continue
            # an alias the question holds is no evidence: a line restating the question holds it
            # too ("The capital of Maryland is Baltimore" for the alias "Capital of Maryland", or
            # "Christian Slater was born first, Kiefer Sutherland" when the question names both);
            # but the gold answer opening the line commits to it ("Kiefer Sutherland was born first")
            if asked.hold(alias) and not (alias == example.aliases[0] and said.open_with(alias)):
                restated = restated or alias
                continue
            # a numeric alias counts where the line's numbers are its own: "2^0 = 1" is no evidence
            # of the answer "1", "The war lasted 1914-1918" is of "1914-1918"
            needle = normalize(alias, self.normalization)
            if needle.replace(" ", "").isdigit() and numbers != sorted(_NUMBER_WORDS.findall(alias)):
                continue
            return alias, None
        return None, restated


class _Words:
    """A text as aliases are looked for in it: normalised once, for every alias."""

    def __init__(self, text: str, rule: Normalization):
        self.text, self.rule = text, rule
        self.normalised = normalize(text, rule)

    def hold(self, alias: str) -> bool:
        """Whether the alias is in the text as whole words, after the normalisation (as written
        where the normalisation empties it)."""
        needle = normalize(alias, self.rule)
        if not needle:  # "A+", "The The"; but an article alone ("A") is in most lines as the article
            return (len(alias.split()) > 1 or not alias.strip().isalpha()) and _typed_inside(self.text, alias)
        return f" {needle} " in f" {self.normalised} "

    def open_with(self, alias: str) -> bool:
        """Whether the text opens with the alias, as whole words, after the normalisation."""
        needle = normalize(alias, self.rule)
        return bool(needle) and f"{self.normalised} ".startswith(f"{needle} ")


_NUMBER_WORDS = re.compile(r"\d+(?:[.,]\d+)*")


def _typed(text: str) -> str:
    return " ".join(text.split()).casefold()


def _typed_equal(text: str, alias: str) -> bool:
    """Whether an answer is an alias as written, but for case, runs of space and punctuation
    around it that the alias does not have ("**A+**", "(A+).")."""
    wanted = _typed(alias)
    wrapping = "".join(ch for ch in _TRIVIAQA_PUNCTUATION if ch not in wanted) + " "
    return _typed(text).strip(wrapping) == wanted


def _typed_inside(line: str, alias: str) -> bool:
    """Whether an alias, as written, is in a line, not as part of a longer word or sign ("A+" is
    in "The answer is A+.", not in "AB+" or "A++")."""
    wanted = re.escape(_typed(alias))
    signs = re.escape("".join(set(alias) - set(string.whitespace)))  # a sign the alias is made of may not extend it
    return re.search(rf"(?<![\w{signs}]){wanted}(?![\w{signs}])", _typed(line)) is not None


def _first_line(completion: str) -> str:
    return completion.strip().split("\n", 1)[0].strip()


# --- math: a \\boxed{} answer, compared by mathematical equivalence ---------------------------------

# "Final Answer: The final answer is $7$. I hope it is correct.", "The final answer is 7", "Answer: 7"
# "final answer is" anywhere in a line; "Answer:" only at its start
_FINAL_ANSWER = re.compile(
    r"(?:final answer is\s*:?|^\s*(?:final\s+)?answer\s*:)\s*(?P<answer>.+?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_HOPE = re.compile(r"\.?\s*I hope it is correct\.?$", re.IGNORECASE)
_MAX_ANSWER_WORDS = 6  # longer captures are prose ("the answer: first we compute ..."), not answers


def _ends_braced(text: str) -> bool:
    """Whether the last `\\boxed` of a text opens a brace (so `last_boxed` can tell it is closed)."""
    found = list(re.finditer(r"\\(?:boxed|fbox)\s*(\{)?", text))
    return bool(found) and found[-1].group(1) is not None


def _superseded(answer: str, completion: str) -> bool:
    """Whether the line the token limit cut begins a `\\boxed` answer that does not begin as
    `answer` (read before that line) does: the completion was writing another answer ("\\boxed{7}
    then \\boxed{1"), not repeating this one ("\\boxed{7} so \\boxed{7")."""
    cut_line = completion[len(_complete_lines(completion)) :]
    begun = list(re.finditer(r"\\(?:boxed|fbox)\s*\{?", cut_line))
    return bool(begun) and not answer.startswith(cut_line[begun[-1].end() :].strip())


def _complete_lines(text: str) -> str:
    """The lines a newline ended: not the one the token limit cut."""
    return text[: text.rfind("\n") + 1]


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` or `\\fbox{...}` (braces nested to any depth),
    or of `\\boxed 9` (up to the closing `$`)."""
    found = list(re.finditer(r"\\(?:boxed|fbox)", text))
    if not found:
        return None
    rest = text[found[-1].end() :]
    opening = re.match(r"\s*\{", rest)
    if opening is None:
        bare = re.match(r"\s+([^$\n]+)", rest)  # "\boxed 9": up to the closing $
        return bare.group(1).strip().rstrip(".,;").strip() if bare else None
    depth = 0
    for i in range(opening.end() - 1, len(rest)):
        depth += {"{": 1, "}": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[opening.end() : i].strip()
    return None  # unbalanced: the completion was cut


def final_answer_line(text: str) -> str | None:
    """The answer of the last final-answer line, its math if it is written in `$...$`."""
    for match in reversed(list(_FINAL_ANSWER.finditer(text))):
        answer = _HOPE.sub("", match.group("answer")).strip()
        math = re.findall(r"\$([^$]+)\$", answer)
        if math:
            return math[-1].strip()
        answer = answer.rstrip(".").strip()
        if answer and len(answer.split()) <= _MAX_ANSWER_WORDS:
            return answer
    return None


_CUT_IN_BOXED = "cut at the token limit inside its last \\boxed answer"


class Math(AnswerFormat):
    name = "math"
    fields = ("question", "answer", "solution")
    answer_last = True

    def example(self, values: dict, *, index: int, source: str, row: dict) -> Example:
        example = super().example(values, index=index, source=source, row=row)
        answer = values["answer"]
        if not isinstance(answer, str | int | float) or isinstance(answer, bool) or not str(answer).strip():
            raise SoftevalError(
                f"{source}: no gold answer ({answer!r}); the math format needs one (a solution without \\boxed{{}}?)"
            )
        if not _parsed(str(answer)):
            raise SoftevalError(f"{source}: gold answer {answer!r} is not mathematics math-verify can read")
        example.answer = str(answer).strip()
        example.solution = values.get("solution")
        return example

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        boxed = last_boxed(completion) if not cut or _ends_braced(completion) else None
        if cut and boxed is None:  # the limit fell in a bare or unclosed \boxed, or after the last one
            boxed = last_boxed(_complete_lines(completion))
            if boxed is not None and _superseded(boxed, completion):
                return Reading.none("no_answer", _CUT_IN_BOXED)
        if boxed is None:
            return Reading.none("no_answer", "no \\boxed{} answer")
        return Reading(boxed) if boxed else Reading.none("no_answer", "an empty \\boxed{}")

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        boxed = self.strict(completion, example, cut=cut)
        if boxed.answer is not None or boxed.note == _CUT_IN_BOXED:  # no final-answer line stands in for it
            return boxed
        line = final_answer_line(_complete_lines(completion) if cut else completion)
        if line and cut and _superseded(line, completion):
            return Reading.none("no_answer", _CUT_IN_BOXED)
        return Reading(line) if line else Reading.none("no_answer", "no boxed answer or final-answer line")

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and equivalent(answer, example.answer)


def equivalent(answer: str, gold: str) -> bool:
    """Mathematical equivalence by math-verify: 0.5 = \\frac{1}{2}, intervals and tuples as such.
    An answer math-verify cannot read is not equivalent to anything."""
    from math_verify import verify

    return bool(verify(_parsed(gold), _parsed(answer), timeout_seconds=_timeout()))


@lru_cache(maxsize=65536)
def _parsed(latex: str) -> list:
    from math_verify import parse

    return parse(f"${latex}$", parsing_timeout=_timeout())


def _timeout() -> int | None:
    # math-verify times out with signals, which only the main thread may use
    return 5 if threading.current_thread() is threading.main_thread() else None


# --- the registry ------------------------------------------------------------------------------------

FORMATS: dict[str, type[AnswerFormat]] = {f.name: f for f in (MultipleChoice, OptionText, Number, Math, ShortAnswer)}


def answer_format(
    name: str, *, max_answer_words: int = 10, normalization: Normalization = "squad", cloze_normalization: ClozeNormalization = "characters"
) -> AnswerFormat:
    """The format a task spec names, with the spec's settings."""
    if name not in FORMATS:
        raise SoftevalError(f"unknown answer_format '{name}'; choose one of: {', '.join(FORMATS)}")
    return FORMATS[name](max_answer_words=max_answer_words, normalization=normalization, cloze_normalization=cloze_normalization)
