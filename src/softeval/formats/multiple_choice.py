"""Multiple choice (`multiple_choice`), one rule for both parsers, applied to the first line:

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from softeval.errors import SoftevalError
from softeval.formats.base import LETTERS, AnswerFormat, Example, Reading, first_line

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
        text = first_line(completion)
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
        text = first_line(completion)
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
