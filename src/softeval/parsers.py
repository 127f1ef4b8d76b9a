"""Answer parsers: a strict one for the benchmark's required format, a lenient one that finds the
answer wherever it is. Each answer format has one of each, and a rule for what counts as correct.

Strict parsing returns the extracted answer or the reason it failed; a failure is never a silent
"wrong answer". Lenient parsing returns an answer or None.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Protocol

from softeval.data import Example


@dataclass(frozen=True)
class Strict:
    answer: str | None
    failure: str | None = None  # why the completion does not follow the format


class AnswerParser(Protocol):
    def strict(self, completion: str, example: Example) -> Strict: ...
    def lenient(self, completion: str, example: Example) -> str | None: ...
    def is_correct(self, answer: str | None, example: Example) -> bool: ...


# --- multiple choice: answer with an option letter -----------------------------------------------


class MultipleChoice:
    """Strict: the stripped completion starts with a valid letter and then a boundary (B, B., B)).
    Lenient: the first option letter standing alone, or option text, mentioned anywhere."""

    def strict(self, completion: str, example: Example) -> Strict:
        text = completion.strip()
        if not text:
            return Strict(None, "empty completion")
        match = re.match(r"\(?([A-Za-z])(?=$|[^A-Za-z0-9])", text)
        if not match:
            return Strict(None, f"does not start with an option letter: {text[:20]!r}")
        letter = match.group(1)
        if letter not in example.letters:
            return Strict(None, f"'{letter}' is not one of the options {''.join(example.letters)}")
        return Strict(letter)

    def lenient(self, completion: str, example: Example) -> str | None:
        candidates = []  # (position, letter)
        letters = "".join(example.letters)
        for m in re.finditer(rf"(?<![A-Za-z0-9])([{letters}])(?![A-Za-z0-9'])", completion):
            # "A" followed by a lowercase word is the article, not an option
            if m.group(1) == "A" and re.match(r"\s+[a-z]", completion[m.end() :]):
                continue
            candidates.append((m.start(), m.group(1)))
            break
        lowered = completion.lower()
        for letter, choice in zip(example.letters, example.choices):
            needle = choice.strip().lower()
            if needle:
                found = re.search(rf"(?<![a-z0-9]){re.escape(needle)}(?![a-z0-9])", lowered)
                if found:
                    candidates.append((found.start(), letter))
        return min(candidates)[1] if candidates else None

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer == example.answer


# --- number: "#### <number>" (GSM8K) --------------------------------------------------------------

NUMBER = r"-?[$]?\d[\d,]*(?:\.\d+)?"


def _canonical_number(text: str) -> str | None:
    cleaned = text.replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else repr(value)


class Number:
    """Strict: the completion has `#### <number>`. Lenient: the last number in the completion."""

    def strict(self, completion: str, example: Example) -> Strict:
        if not completion.strip():
            return Strict(None, "empty completion")
        match = re.search(rf"####\s*({NUMBER})", completion)
        if not match:
            return Strict(None, "no '#### <number>' in the completion")
        return Strict(_canonical_number(match.group(1)))

    def lenient(self, completion: str, example: Example) -> str | None:
        numbers = re.findall(NUMBER, completion)
        return _canonical_number(numbers[-1]) if numbers else None

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and answer == _canonical_number(example.answer)


# --- short answer: the first line is the answer (TriviaQA, NQ-open) --------------------------------


def normalize(text: str) -> str:
    """SQuAD-style answer normalisation: lower case, no punctuation, articles or extra spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


class ShortAnswer:
    """Strict: the first line, non-empty and at most `max_words` words, matches an alias exactly
    after normalisation. Lenient: a gold alias appears inside the first non-empty line."""

    def __init__(self, max_words: int = 10):
        self.max_words = max_words

    def strict(self, completion: str, example: Example) -> Strict:
        first = completion.split("\n", 1)[0].strip()
        if not first:
            return Strict(None, "first line is empty")
        words = len(first.split())
        if words > self.max_words:
            return Strict(None, f"first line has {words} words (at most {self.max_words})")
        return Strict(first)

    def lenient(self, completion: str, example: Example) -> str | None:
        line = next((l.strip() for l in completion.split("\n") if l.strip()), "")
        padded = f" {normalize(line)} "
        for alias in example.aliases:
            if normalize(alias) and f" {normalize(alias)} " in padded:
                return alias
        return line or None

    def is_correct(self, answer: str | None, example: Example) -> bool:
        if answer is None:
            return False
        got = normalize(answer)
        return any(got == normalize(alias) for alias in example.aliases)


def parser_for(answer_format: str, max_answer_words: int = 10) -> AnswerParser:
    parsers: dict[str, AnswerParser] = {
        "multiple_choice": MultipleChoice(),
        "number": Number(),
        "short_answer": ShortAnswer(max_answer_words),
    }
    return parsers[answer_format]
