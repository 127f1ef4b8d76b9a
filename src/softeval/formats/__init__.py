"""Answer formats: everything softeval knows about one kind of answer lives in its class here.

A format owns the values a row must provide and their validation, the strict parser (the
benchmark's required format), the lenient parser (the answer wherever it is), the correctness
rule with its normalisation, whether the task has options (so cloze knowledge applies) and its
chance level. Adding a format means adding
one module here and its class to `FORMATS`.
"""

from __future__ import annotations

from softeval.errors import SoftevalError
from softeval.formats.base import LETTERS, AnswerFormat, ClozeNormalization, Example, Normalization, Reading, Status, first_line
from softeval.formats.lm_eval import LmEval
from softeval.formats.math import Math, last_boxed
from softeval.formats.multiple_choice import MultipleChoice
from softeval.formats.number import Number, canonical_number
from softeval.formats.option_text import OptionText
from softeval.formats.short_answer import ShortAnswer, normalize

__all__ = [
    "AnswerFormat", "ClozeNormalization", "Example", "FORMATS", "LETTERS", "LmEval", "Math", "MultipleChoice", "Normalization", "Number",
    "OptionText", "Reading", "ShortAnswer", "Status", "answer_format", "canonical_number", "first_line", "last_boxed", "normalize",
]

# --- the registry ------------------------------------------------------------------------------------

FORMATS: dict[str, type[AnswerFormat]] = {f.name: f for f in (MultipleChoice, OptionText, Number, Math, ShortAnswer, LmEval)}


def answer_format(
    name: str, *, max_answer_words: int = 10, normalization: Normalization = "squad", cloze_normalization: ClozeNormalization = "characters"
) -> AnswerFormat:
    """The format a task spec names, with the spec's settings."""
    if name not in FORMATS:
        raise SoftevalError(f"unknown answer_format '{name}'; choose one of: {', '.join(FORMATS)}")
    return FORMATS[name](max_answer_words=max_answer_words, normalization=normalization, cloze_normalization=cloze_normalization)
