"""Metric definitions and their bootstrap intervals."""

from __future__ import annotations

import pytest

from softeval.data import Example
from softeval.metrics import aggregate, score_sample
from softeval.parsers import MultipleChoice


def _sample(format_ok, task_correct, lenient_correct, knowledge_correct):
    return dict(format_ok=format_ok, task_correct=task_correct, lenient_correct=lenient_correct, knowledge_correct=knowledge_correct)


def test_metric_values_follow_their_definitions():
    samples = [
        _sample(True, True, True, True),
        _sample(True, False, False, True),
        _sample(False, False, True, True),
        _sample(False, False, False, False),
    ]
    m = aggregate(samples, n_resamples=200)
    assert m["format_following"].value == 0.5
    assert m["task_accuracy"].value == 0.25
    assert m["conditional_accuracy"].value == 0.5
    assert m["lenient_accuracy"].value == 0.5
    assert m["knowledge"].value == 0.75
    for metric in m.values():
        assert metric.ci_low <= metric.value <= metric.ci_high


def test_interval_narrows_with_more_samples():
    few = aggregate([_sample(i % 2 == 0, False, False, False) for i in range(20)])
    many = aggregate([_sample(i % 2 == 0, False, False, False) for i in range(2000)])
    width = lambda m: m["format_following"].ci_high - m["format_following"].ci_low  # noqa: E731
    assert width(many) < width(few) / 3


def test_conditional_accuracy_is_undefined_without_formatted_answers():
    m = aggregate([_sample(False, False, True, True)] * 5)
    assert m["conditional_accuracy"].value is None
    assert m["format_following"].value == 0.0


def test_knowledge_uses_length_normalised_loglikelihood():
    example = Example(index=0, source="t", row={}, question="q", answer="B", choices=["no", "certainly yes"], answer_index=1)
    # raw sums favour the short option; per character the long one wins (lm-eval acc_norm)
    record = score_sample(MultipleChoice(), example, " B", [-3.0, -10.0])
    assert record["knowledge_correct"] is True
    assert record["task_correct"] and record["format_ok"]


def test_open_ended_knowledge_is_lenient_accuracy():
    example = Example(index=0, source="t", row={}, question="q", answer="Paris", aliases=["Paris"])
    from softeval.parsers import ShortAnswer

    record = score_sample(ShortAnswer(), example, " I believe that it is Paris, the capital city of France, of course", None)
    assert record["format_ok"] is False and record["knowledge_correct"] is True


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_samples_do_not_crash(n):
    m = aggregate([_sample(True, True, True, True)] * n)
    assert m["task_accuracy"].value == 1.0
