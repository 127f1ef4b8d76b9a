"""Strict and lenient parsers on real completions of the offline models, following the format and not."""

from __future__ import annotations

import pytest

from softeval.data import Example
from softeval.parsers import MultipleChoice, Number, ShortAnswer, normalize

MC = Example(index=0, source="t", row={}, question="q", answer="B", choices=["seed", "spore", "pollen", "immature flower"], answer_index=1)


@pytest.mark.parametrize(
    "completion, strict, failure",
    [
        (" C", "C", None),  # smollm2, few-shot
        (" B. spore", "B", None),
        ("(B) spore", "B", None),
        ("B)", "B", None),
        ("", None, "empty completion"),  # smollm2 zero-shot: ends its turn at once
        (" The answer is B.", None, "does not start with an option letter"),
        (" E", None, "'E' is not one of the options ABCD"),
        (" Because spores spread", None, "does not start with an option letter"),
    ],
)
def test_multiple_choice_strict(completion, strict, failure):
    parsed = MultipleChoice().strict(completion, MC)
    assert parsed.answer == strict
    assert (parsed.failure or "").startswith(failure or "")
    assert (parsed.failure is None) == (failure is None)


@pytest.mark.parametrize(
    "completion, lenient",
    [
        (" The answer is B.", "B"),
        (" A spore is the answer", "B"),  # the article "A" is not an option; the option text is
        (" I think it is pollen, not a seed", "C"),
        (" None of these", None),
        (" C", "C"),
    ],
)
def test_multiple_choice_lenient(completion, lenient):
    assert MultipleChoice().lenient(completion, MC) == lenient


GSM = Example(index=0, source="t", row={}, question="q", answer="72")


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        (" Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips altogether.\n#### 72", "72", "72"),
        (" She sold 48 + 24 = 72 clips in total.", None, "72"),
        (" #### 1,250", "1250", "1250"),
        (" The answer is $72.00.", None, "72"),
        (" I don't know", None, None),
    ],
)
def test_number(completion, strict, lenient):
    parser = Number()
    assert parser.strict(completion, GSM).answer == strict
    assert parser.lenient(completion, GSM) == lenient
    assert parser.is_correct(parser.strict(completion, GSM).answer, GSM) == (strict == "72")


QA = Example(index=0, source="t", row={}, question="q", answer="Annie Lennox", aliases=["Annie Lennox", "Lennox"])


@pytest.mark.parametrize(
    "completion, strict_ok, strict_correct, lenient_correct",
    [
        (" Annie Lennox", True, True, True),
        (" the Annie Lennox.", True, True, True),  # normalisation drops articles and punctuation
        (" Dave Stewart", True, False, False),
        # smollm2 zero-shot: rambles past the short-answer limit
        (' The female member of the 1980\'s pop music duo, "Eurythmics" was the', False, False, False),
        (" It was singer Annie Lennox of the Eurythmics, born in Aberdeen in 1954", False, False, True),
        ("\nAnnie Lennox", False, False, True),  # first line empty
    ],
)
def test_short_answer(completion, strict_ok, strict_correct, lenient_correct):
    parser = ShortAnswer(max_words=10)
    strict = parser.strict(completion, QA)
    assert (strict.answer is not None) == strict_ok
    assert parser.is_correct(strict.answer, QA) == strict_correct
    assert parser.is_correct(parser.lenient(completion, QA), QA) == lenient_correct


def test_normalize():
    assert normalize("The  Eiffel-Tower!") == "eiffeltower"
