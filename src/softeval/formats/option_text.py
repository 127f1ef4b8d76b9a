"""Option text (`option_text`): multiple choice answered with the option's words. Strict: the first
line equals one option's text. Lenient: the first line opens with one option's text, or exactly one
option's text appears in it (a text inside a longer option's text counts for the longer one). Texts
are compared as written (spacing, a final period and a leading article aside), then ignoring case,
then after SQuAD normalisation, at the first level that names an option. An option label opening
the line ("A)", "A.", "(A)") is not the option's text, and normalisation must not read it as the
article: strict fails, and lenient reads the text after it. The answer is recorded as that option's
letter.
"""

from __future__ import annotations

import re

from softeval.formats.base import Example, Reading, first_line
from softeval.formats.multiple_choice import MultipleChoice, _ends_word, _leading_article_length
from softeval.formats.short_answer import normalize

# --- option text: answer with the option's own words ---------------------------------------------------


class OptionText(MultipleChoice):
    """Multiple choice answered with the text of an option rather than its letter. The answer is
    still recorded as the option's letter, so diagnostics and knowledge work as for letters.

    Texts are compared at the strictest of three levels that tells the options apart: as written
    (spaces, a final period and a leading article aside), then ignoring case, then after SQuAD
    normalisation. So "+2" and "-2", or "WW or ww" and "WW or Ww", stay different options."""

    name = "option_text"

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        line = first_line(completion)
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
        line = first_line(completion)
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
