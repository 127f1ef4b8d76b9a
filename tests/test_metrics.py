"""Metric definitions, bootstrap intervals against known answers, and the collapse and chance diagnostics."""

from __future__ import annotations

import math

import pytest

from conftest import mc_example, qa_example
from softeval.formats import Example
from softeval.formats.multiple_choice import MultipleChoice
from softeval.formats.short_answer import ShortAnswer
from softeval.scoring import Metric, aggregate, score_sample
from softeval.scoring.metrics import Judgement, Sample, diagnose


def _judged(format_ok, task_correct, lenient_correct, knowledge_correct) -> Judgement:
    return Judgement(
        strict_answer="A" if format_ok else None,
        strict_failure=None if format_ok else "x",
        lenient_answer=None,
        lenient_status="answer",
        lenient_note=None,
        format_ok=format_ok,
        task_correct=task_correct,
        lenient_correct=lenient_correct,
        knowledge_correct=knowledge_correct,
    )


def test_metric_values_follow_their_definitions():
    samples = [
        _judged(True, True, True, True),
        _judged(True, False, False, True),
        _judged(False, False, True, True),
        _judged(False, False, False, False),
    ]
    m = aggregate(samples, n_resamples=200)
    assert m["format_following"].value == 0.5
    assert m["task_accuracy"].value == 0.25
    assert m["conditional_accuracy"].value == 0.5
    assert m["lenient_accuracy"].value == 0.5
    assert m["knowledge"].value == 0.75


def test_interval_matches_the_binomial_interval():
    """300 successes in 1000: the normal-approximation binomial 95% interval is 0.3 +- 0.0284."""
    samples = [_judged(i < 300, False, False, False) for i in range(1000)]
    m = aggregate(samples, n_resamples=2000)["format_following"]
    half_width = 1.959964 * math.sqrt(0.3 * 0.7 / 1000)
    assert m.ci_low == pytest.approx(0.3 - half_width, abs=0.005)
    assert m.ci_high == pytest.approx(0.3 + half_width, abs=0.005)


@pytest.mark.parametrize(("n", "k", "seed"), [(8, 3, 2), (20, 5, 1), (20, 15, 1)])
def test_interval_bounds_are_scores_a_resample_can_have(n, k, seed):
    # k of n: every resampled share is a multiple of 1/n, and so is each bound (never 90.125% of 20)
    m = aggregate([_judged(i < k, False, False, False) for i in range(n)], seed=seed)["format_following"]
    assert [round(bound * n, 6) % 1 for bound in (m.ci_low, m.ci_high)] == [0, 0], m
    assert m.ci_low <= m.value <= m.ci_high


def test_examples_are_resampled_jointly_across_metrics():
    # every formatted answer is correct: conditional accuracy is 1 in every joint resample, while
    # resampling the two columns separately would spread it widely
    samples = [_judged(i % 2 == 0, i % 2 == 0, False, False) for i in range(40)]
    m = aggregate(samples)
    assert (m["conditional_accuracy"].ci_low, m["conditional_accuracy"].ci_high) == (1.0, 1.0)
    assert m["format_following"].ci_low < 0.4 and m["format_following"].ci_high > 0.6


def test_one_example_has_no_interval():
    m = aggregate([_judged(True, True, True, True)])
    assert m["task_accuracy"] == Metric(value=1.0, ci_low=None, ci_high=None)


def test_conditional_accuracy_is_undefined_without_formatted_answers():
    m = aggregate([_judged(False, False, True, True)] * 5)
    assert m["conditional_accuracy"].value is None
    assert m["format_following"].value == 0.0


def test_knowledge_uses_length_normalised_loglikelihood():
    example = mc_example(["no", "certainly yes"], 1)
    # raw sums favour the short option; per character the long one wins (lm-eval acc_norm)
    record = score_sample(MultipleChoice(), example, " B", [-3.0, -10.0])
    assert record.knowledge_correct is True
    assert record.task_correct and record.format_ok


def test_an_option_with_no_tokens_never_wins_knowledge():
    example = mc_example(["x", "a longer option"], 0)
    record = score_sample(MultipleChoice(), example, " A", [float("-inf"), -200.0])
    assert record.knowledge_correct is False
    assert record.option_loglikelihoods == [None, -200.0]
    nothing = score_sample(MultipleChoice(), example, " A", [float("-inf"), float("-inf")])
    assert nothing.knowledge_correct is False


def test_an_option_listed_twice_is_known_by_either_of_its_letters(mirror):
    from softeval import load_examples, load_task

    spec = load_task("commonsense_qa")
    row = next(e for e in load_examples(spec, "validation", mirror) if e.choices[0] == "indestructible" and e.answer == "D")
    assert row.choices[3] == "indestructible"  # options A and D are the same text, the gold is D
    # the two texts score alike, and the first listed wins the tie: the model cannot prefer D
    tied = [-2.0, -9.0, -9.0, -2.0, -9.0]
    record = score_sample(spec.format, row, " D", tied)
    assert (record.knowledge_answer, record.knowledge_correct, record.task_correct) == ("A", True, True)
    assert score_sample(spec.format, row, " D", [-9.0, -2.0, -9.0, -9.0, -9.0]).knowledge_correct is False
    # the text alone names two options
    reading = spec.format.lenient(" indestructible", row)
    assert (reading.answer, reading.status) == (None, "ambiguous") and "A, D" in reading.note


def test_options_that_share_a_continuation_are_told_apart_by_their_contexts():
    example = Example(index=0, source="t", row={}, question="q", answer="B", choices=["Ann", "Bob"], answer_index=1,
                      cloze_contexts=["Ann said that she", "Bob said that she"], cloze_continuation=" left")
    assert score_sample(MultipleChoice(), example, " B", [-1.0, -3.0]).knowledge_correct is False
    assert score_sample(MultipleChoice(), example, " B", [-3.0, -1.0]).knowledge_correct is True


def test_a_completion_that_opens_with_a_stop_string_says_so():
    # gemma-3-270m zero-shot on ARC-Easy: it starts the next question instead of answering
    example = mc_example(["pollen", "seeds"], 0)
    record = score_sample(MultipleChoice(), example, "\n", [-1.0, -2.0], raw="\nQuestion:")
    assert record.strict_failure == "a stop string came before any answer: 'Question:'"
    assert record.lenient_note == record.strict_failure and not record.format_ok
    nothing = score_sample(MultipleChoice(), example, "", [-1.0, -2.0], raw="")  # EOS at once
    assert nothing.strict_failure == nothing.lenient_note == "empty completion"


def test_at_chance_names_chance_where_no_gold_answer_is_more_frequent():
    golds = ["ABCD"[i % 4] for i in range(40)]
    wrong = [_sample("BCDA"[i % 4], gold) for i, gold in enumerate(golds)]  # never right, never one option
    d = diagnose(wrong, aggregate(wrong)["task_accuracy"], chance=0.25)
    assert d.majority_share == d.chance == 0.25 and d.flags == ["at chance (25%)"]


def test_open_ended_knowledge_is_lenient_accuracy():
    example = qa_example("Paris")
    record = score_sample(ShortAnswer(), example, " I believe that it is Paris, the capital city of France, of course", None)
    assert record.format_ok is False and record.knowledge_correct is True


def _sample(strict: str | None, gold: str, completion: str = " x", status: str = "answer", stop_reason: str = "stop") -> Sample:
    judged = _judged(strict is not None, strict == gold, False, False).model_dump() | {"strict_answer": strict, "lenient_status": status}
    return Sample(
        index=0, source="t", prompt="p", n_demos=0, truncated=False, raw_completion=completion, completion=completion,
        stop_reason=stop_reason, gold=gold, choices=["a", "b", "c", "d"], **judged,
    )


def test_collapse_onto_one_letter_is_flagged():
    # 47 of 50 answers are "A"; the gold letters are spread evenly, 13 of them "A"
    golds = ["ABCD"[i % 4] for i in range(50)]
    samples = [_sample("A" if i < 47 else "B", gold) for i, gold in enumerate(golds)]
    metrics = aggregate(samples)
    d = diagnose(samples, metrics["task_accuracy"], chance=0.25)
    assert d.answer_distribution == {"A": 47, "B": 3, "none": 0}
    assert (d.most_common_answer, d.most_common_share) == ("A", 0.94)
    assert d.most_common_accuracy == 13 / 50
    assert d.collapsed and d.at_chance and d.majority_share == 0.26
    # the level a constant answer reaches: always "A" scores 26% here, above the 25% of chance
    assert d.flags == ["at chance (majority gold 26%)", "collapsed: A 94%"]


def _yes_no_sample(strict: str | None, gold: str, knowledge: str | None = None) -> Sample:
    sample = _sample(strict, gold)
    return sample.model_copy(update={"knowledge_answer": knowledge, "option_loglikelihoods": [-1.0, -2.0], "choices": ["yes", "no"]})


def test_a_task_whose_gold_answers_lean_one_way_is_judged_against_the_majority_answer():
    # 62 of 100 gold answers are "A" (BoolQ's "yes"): answering A 70% of the time is no collapse,
    # but a score within reach of always answering A is at chance, even above 50%
    golds = ["A"] * 62 + ["B"] * 38
    # A for 48 of the 62 A rows and for 22 of the 38 B rows: 70 A answers, 48 + 16 right
    answers = ["A"] * 48 + ["B"] * 14 + ["A"] * 22 + ["B"] * 16
    leaning = [_yes_no_sample(answer, gold, answer) for answer, gold in zip(answers, golds)]
    accuracy = aggregate(leaning)["task_accuracy"]
    d = diagnose(leaning, accuracy, chance=0.5)
    assert d.majority_share == 0.62 and accuracy.value == 0.64 and 0.5 < accuracy.ci_low <= 0.62
    assert not d.collapsed and not d.knowledge_collapsed and d.at_chance and d.flags == ["at chance (majority gold 62%)"]
    always = [_yes_no_sample("A", gold, "A") for gold in golds]
    assert diagnose(always, aggregate(always)["task_accuracy"], chance=0.5).collapsed  # 100% > 62% + 20


def test_log_likelihoods_that_always_pick_one_option_are_flagged():
    golds = ["A"] * 62 + ["B"] * 38
    right = [_yes_no_sample(gold, gold, gold) for gold in golds]  # the strict answers are right
    d = diagnose(right, aggregate(right)["task_accuracy"], chance=0.5)
    assert d.knowledge_distribution == {"A": 62, "B": 38, "none": 0} and not d.knowledge_collapsed and d.flags == []
    yes = [s.model_copy(update={"knowledge_answer": "A"}) for s in right[:95]] + right[95:]  # B's rows picked A but 5
    d = diagnose(yes, aggregate(yes)["task_accuracy"], chance=0.5)
    assert d.knowledge_distribution == {"A": 95, "B": 5, "none": 0} and d.knowledge_collapsed
    assert d.flags == ["knowledge collapsed: A 95%"]


def test_knowledge_sums_log_likelihoods_where_the_task_says_so():
    from softeval.formats import answer_format

    example = Example(index=0, source="t", row={}, question="q", answer="B", choices=["yes", "no"], answer_index=1)
    likely_no = [math.log(0.02), math.log(0.06)]  # "no" is three times as likely
    per_character = score_sample(answer_format("multiple_choice"), example, " B", likely_no)
    summed = score_sample(answer_format("multiple_choice", cloze_normalization="none"), example, " B", likely_no)
    assert (per_character.knowledge_answer, per_character.knowledge_correct) == ("A", False)  # -1.30 per character beats -1.41
    assert (summed.knowledge_answer, summed.knowledge_correct) == ("B", True)


def test_a_cell_above_chance_with_spread_answers_is_not_flagged():
    golds = ["ABCD"[i % 4] for i in range(80)]
    samples = [_sample(gold if i % 5 else "ABCD"[(i + 1) % 4], gold) for i, gold in enumerate(golds)]
    metrics = aggregate(samples)
    d = diagnose(samples, metrics["task_accuracy"], chance=0.25)
    assert metrics["task_accuracy"].value == 0.8
    assert not d.collapsed and not d.at_chance and d.flags == []


def test_a_cell_without_strict_answers_is_flagged_as_such_not_at_chance():
    # nothing followed the format: accuracy 0 is a format failure, not chance-level knowledge
    samples = [_sample(None, "ABCD"[i % 4], completion="" if i % 2 else " hmm", status="no_answer") for i in range(20)]
    d = diagnose(samples, aggregate(samples)["task_accuracy"], chance=0.25)
    assert d.no_strict_answers and d.at_chance
    assert d.flags == ["no strict answers (50% empty)"]
    open_ended = diagnose(samples, aggregate(samples)["task_accuracy"], chance=None)
    assert open_ended.flags == ["no strict answers (50% empty)"]
    samples[3] = _sample("A", "A")
    assert not diagnose(samples, aggregate(samples)["task_accuracy"], chance=None).no_strict_answers


def test_open_ended_cells_report_empty_and_ambiguous_shares():
    samples = [_sample(None, "x", completion="", status="no_answer")] * 2 + [_sample(None, "x", status="ambiguous")] * 3 + [_sample("x", "x")] * 5
    d = diagnose(samples, aggregate(samples)["task_accuracy"], chance=None)
    assert (d.empty_share, d.ambiguous_share) == (0.2, 0.3)
    assert d.answer_distribution is None and not d.collapsed


def test_cuts_at_the_token_limit_are_flagged_where_the_answer_comes_last():
    # 3 of 20 completions ran to the token limit, 2 of them without a strict answer: cut before it
    samples = [_sample("x" if i % 2 else None, "x", stop_reason="length" if i < 3 else "eos") for i in range(20)]
    accuracy = aggregate(samples)["task_accuracy"]
    last = diagnose(samples, accuracy, chance=None, answer_last=True)
    assert last.cut_share == 0.1 and last.many_cut
    assert last.flags == ["10% cut at the token limit"]
    # a letter or a short answer comes first: a cut after it says nothing of the score
    first = diagnose(samples, accuracy, chance=None)
    assert first.cut_share == 0.1 and first.flags == []
    # one cut in 25 is under the 5% that is flagged
    few = diagnose(samples[2:] + [_sample("x", "x")] * 7, accuracy, chance=None, answer_last=True)
    assert few.cut_share == 0.04 and not few.many_cut


def test_an_unscorable_option_never_wins_knowledge_however_it_failed():
    example = mc_example(["a", "b"], 1)
    # NaN as the engine may give it, None as the sample log records it: the same verdict
    assert score_sample(MultipleChoice(), example, " B", [float("nan"), -5.0]).knowledge_correct
    assert score_sample(MultipleChoice(), example, " B", [float("-inf"), -5.0]).knowledge_correct
