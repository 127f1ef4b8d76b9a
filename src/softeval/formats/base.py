"""What every answer format shares: the row it reads (`Example`), what a parser returns
(`Reading`), and the interface each format implements (`AnswerFormat`).

Both parsers of a format read a completion by the same rule and return a `Reading`: an answer,
or why there is none (`no_answer`, `ambiguous` when several candidates are named, `conflict`
when the completion contradicts itself). A completion is judged after its leading whitespace.
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
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

def first_line(completion: str) -> str:
    return completion.strip().split("\n", 1)[0].strip()
