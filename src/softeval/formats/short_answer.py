"""Short answer (`short_answer`, TriviaQA, NQ-open): the answer is the first non-empty line.
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

from softeval.errors import SoftevalError
from softeval.formats.base import AnswerFormat, Example, Normalization, Reading, first_line

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
        line = first_line(completion)
        if not line:
            return Reading.none("no_answer", "empty completion")
        words = len(line.split())
        if words > self.max_words:
            return Reading.none("no_answer", f"first line has {words} words (at most {self.max_words})")
        if _is_list(line) and not self._alias_equal(line, example):
            return Reading.none("ambiguous", "lists several candidate answers")
        return Reading(line)

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        line = first_line(completion)
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


