"""Scoring: per-sample judgements, the five metrics with 95% bootstrap confidence intervals, and the
diagnostics that say when a score means nothing.

| metric               | share of examples that ...                                        |
| format_following     | the strict parser accepts                                         |
| task_accuracy        | the strict parser accepts and that are correct (benchmark score)  |
| conditional_accuracy | task_accuracy / format_following: correct when the format is kept |
| lenient_accuracy     | are correct under the lenient parser                              |
| knowledge            | multiple choice: cloze loglikelihood picks the gold option        |
|                      | (length-normalised, lm-eval acc_norm); open-ended: lenient_accuracy |
"""

from __future__ import annotations

import math
import warnings
from collections import Counter

import numpy as np
from pydantic import BaseModel, computed_field

from softeval.formats import AnswerFormat, Example, Reading, Status

METRICS = ("format_following", "task_accuracy", "conditional_accuracy", "lenient_accuracy", "knowledge")
# what each metric measures, as reports explain it
MEANINGS = {
    "format_following": "share of completions the task's strict parser accepts (the benchmark's answer format)",
    "task_accuracy": "share accepted by the strict parser and correct: the benchmark score",
    "conditional_accuracy": "task accuracy / format-following: how often the model is right when it keeps the format",
    "lenient_accuracy": "share correct under a lenient parser that finds the answer anywhere in the completion",
    "knowledge": "format-free: option log-likelihood accuracy (length-normalised, as the task says) for multiple choice, lenient accuracy otherwise",
}
# the metrics that are a mean of one per-row outcome (the sample field), so rows can be paired and
# resampled across cells; conditional accuracy is a ratio of two of them
ROW_METRICS = {
    "format_following": "format_ok",
    "task_accuracy": "task_correct",
    "lenient_accuracy": "lenient_correct",
    "knowledge": "knowledge_correct",
}
COLLAPSE_SHARE = 0.6  # one answer given this often (of all strict answers) marks a collapsed cell,
COLLAPSE_MARGIN = 0.2  # if it is also this far above its share of the gold answers (BoolQ's "yes" is 62%)
COLLAPSE_MIN_ANSWERS = 10  # fewer strict answers than this say too little to call a collapse
CUT_SHARE = 0.05  # completions cut at the token limit this often, where the answer comes last, are flagged
MOSTLY_EMPTY = 0.5  # a cell with this share of empty completions or more is flagged: the model mostly said nothing


class Metric(BaseModel):
    value: float | None  # None where undefined (conditional accuracy with no formatted answer)
    ci_low: float | None  # None where undefined (fewer than two examples)
    ci_high: float | None


class Judgement(BaseModel):
    """What the parsers read in one completion and what counts as correct; the extracted answer
    is kept apart from the verdict."""

    strict_answer: str | None
    strict_failure: str | None  # why the completion does not follow the format
    lenient_answer: str | None
    lenient_status: Status  # answer, no_answer, ambiguous or conflict
    lenient_note: str | None
    format_ok: bool
    task_correct: bool
    lenient_correct: bool
    knowledge_correct: bool
    knowledge_answer: str | None = None  # multiple choice: the letter of the option the log-likelihoods pick
    # per option; None for an option that tokenises to nothing (it can never win knowledge)
    option_loglikelihoods: list[float | None] | None = None


class Sample(Judgement):
    """One line of samples.jsonl: the example, what the model saw and wrote, and the judgement."""

    index: int
    source: str
    prompt: str  # the text fed to the model, after any shortening
    n_demos: int
    truncated: bool
    raw_completion: str  # every generated token, decoded: stop string and all
    completion: str  # what the parsers judged: cut at the first stop string after the answer begins
    stop_reason: str
    gold: str
    choices: list[str] | None = None
    # continuous values (see `likelihood`); None where the cell did not score them
    gold_logprob: float | None = None
    gold_bpb: float | None = None
    gold_prob: float | None = None
    prompt_knowledge_correct: bool | None = None
    prompt_option_loglikelihoods: list[float | None] | None = None
    cloze_gold_prob: float | None = None
    cloze_gold_bpb: float | None = None


class Diagnostics(BaseModel):
    """When a cell's score means little: answers collapsed onto one option, accuracy at chance,
    empty or ambiguous answers."""

    n: int
    chance: float | None = None  # multiple choice: mean of 1 / number of options
    majority_share: float | None = None  # multiple choice: accuracy of always giving the most frequent gold answer
    answer_distribution: dict[str, int] | None = None  # strict answers; "none" counts failures
    most_common_answer: str | None = None
    most_common_share: float | None = None  # of all strict answers
    most_common_accuracy: float | None = None  # accuracy of always giving the most common answer
    knowledge_distribution: dict[str, int] | None = None  # the options the log-likelihoods pick; "none": no option scored
    empty_share: float
    ambiguous_share: float  # lenient reading names several candidates
    conflict_share: float  # letter and option text disagree
    # completions stopped by the token limit (not by a stop string or EOS) without a strict answer
    cut_share: float = 0.0
    many_cut: bool = False  # where the answer comes last (numbers, math): cut before it, perhaps
    # no completion followed the format: accuracy is 0 by format alone, whatever the model knows
    no_strict_answers: bool = False
    at_chance: bool = False  # task accuracy not above chance or the majority answer by its confidence interval
    collapsed: bool = False
    knowledge_collapsed: bool = False  # the log-likelihoods pick one option as a collapsed cell answers one
    mostly_empty: bool = False  # MOSTLY_EMPTY of the completions or more are empty
    # the model has a chat template the cell ran without (a post-trained model often ends at once then)
    chat_template_unused: bool = False
    # the tuned prompt or adapter the cell evaluates was tuned on rows it is scored on
    tuned_on_eval_rows: bool = False

    @computed_field
    @property
    def flags(self) -> list[str]:
        flags = []
        if self.tuned_on_eval_rows:
            flags.append("tuned on its evaluation rows")
        if self.no_strict_answers:  # "at chance" would blame knowledge for a format failure
            empty = f" ({100 * self.empty_share:.0f}% empty)" if self.empty_share else ""
            flags.append(f"no strict answers{empty}")
        elif self.mostly_empty:
            flags.append(f"mostly empty ({100 * self.empty_share:.0f}%)")
        if self.mostly_empty and self.chat_template_unused:
            flags.append("--chat runs it with its chat template")
        if not self.no_strict_answers:
            if self.at_chance:
                level = f"{100 * self.chance_level:.0f}%"
                majority = (self.majority_share or 0.0) > (self.chance or 0.0)
                flags.append(f"at chance (majority gold {level})" if majority else f"at chance ({level})")
            if self.collapsed:
                flags.append(f"collapsed: {self.most_common_answer} {100 * (self.most_common_share or 0):.0f}%")
        if self.knowledge_collapsed and self.knowledge_distribution:
            top, share = _most_common(self.knowledge_distribution)
            flags.append(f"knowledge collapsed: {top} {100 * share:.0f}%")
        if self.many_cut:
            flags.append(f"{100 * self.cut_share:.0f}% cut at the token limit")
        return flags

    @property
    def chance_level(self) -> float:
        """What a constant answer scores: chance, or always the most frequent gold answer if that scores more."""
        return max(self.chance or 0.0, self.majority_share or 0.0)


def _most_common(distribution: dict[str, int]) -> tuple[str, float]:
    """The most common answer of a distribution and its share of the answers ("none" left out)."""
    answers = {k: v for k, v in distribution.items() if k != "none"}
    top = max(answers, key=answers.__getitem__)
    return top, answers[top] / sum(answers.values())


def score_sample(
    answer_format: AnswerFormat, example: Example, completion: str, option_loglikelihoods: list[float] | None,
    *, cut: bool = False, raw: str | None = None,
) -> Judgement:
    """The judgement of one completion (`cut`: generation stopped at the token limit; `raw`: what
    was generated before the stop string cut it); knowledge from option loglikelihoods where the
    format has options."""
    strict = answer_format.strict(completion, example, cut=cut)
    lenient = answer_format.lenient(completion, example, cut=cut)
    if not completion.strip() and raw and raw.strip():
        # a completion that opens with a stop string ("\nQuestion:") wrote something, not nothing
        stopped = f"a stop string came before any answer: {raw.strip()[:30]!r}"
        strict, lenient = (Reading.none(r.status, stopped) if r.answer is None else r for r in (strict, lenient))
    lenient_correct = answer_format.is_correct(lenient.answer, example)
    judgement = dict(
        strict_answer=strict.answer,
        strict_failure=None if strict.answer is not None else strict.note or strict.status,
        lenient_answer=lenient.answer,
        lenient_status=lenient.status,
        lenient_note=lenient.note,
        format_ok=strict.answer is not None,
        task_correct=answer_format.is_correct(strict.answer, example),
        lenient_correct=lenient_correct,
        knowledge_correct=lenient_correct,
    )
    if option_loglikelihoods is not None:
        # NaN as -inf, as the sample log records it: a cell judged again from its log picks the same
        scorable = [x if math.isfinite(x) else float("-inf") for x in option_loglikelihoods]
        pick = cloze_pick(scorable, example.scored_texts, per_character=answer_format.cloze_normalization == "characters")
        judgement["knowledge_answer"] = None if pick is None else example.letters[pick]
        # an option listed twice ties with its twin, and the first listed wins the tie
        judgement["knowledge_correct"] = pick is not None and example.scored_alike(pick, example.answer_index)
        judgement["option_loglikelihoods"] = [x if math.isfinite(x) else None for x in option_loglikelihoods]
    return Judgement(**judgement)


def cloze_pick(loglikelihoods: list[float], scored: list[str], *, per_character: bool = True) -> int | None:
    """The option with the highest loglikelihood, per character of the scored text (lm-eval's
    acc_norm) or in all (acc); None when no option could be scored."""
    normalised = [ll / max(len(c), 1) for ll, c in zip(loglikelihoods, scored)] if per_character else loglikelihoods
    best = max(range(len(normalised)), key=normalised.__getitem__)
    return best if math.isfinite(normalised[best]) else None


def aggregate(samples: list[Judgement], *, seed: int = 0, n_resamples: int = 1000) -> dict[str, Metric]:
    """Point values and percentile-bootstrap 95% intervals, resampling examples jointly across metrics."""
    from scipy.stats import (
        bootstrap,  # 1.5 s to import: not for every command that names a metric
    )

    names = ("format_ok", "task_correct", "lenient_correct", "knowledge_correct")
    columns = [np.array([getattr(s, k) for s in samples], dtype=float) for k in names]
    values = _statistic(*[c[None, :] for c in columns], axis=-1)[:, 0]
    if len(samples) < 2:  # no spread to resample: the interval is undefined
        low = high = np.full_like(values, np.nan)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant or all-undefined columns are expected here
            result = bootstrap(
                columns,
                _statistic,
                paired=True,
                vectorized=True,
                n_resamples=n_resamples,
                method="percentile",
                rng=np.random.default_rng(seed),
            )
            # over the resamples where a metric is defined (conditional accuracy is undefined
            # in a resample with no formatted answer)
            low, high = percentile_bounds(result.bootstrap_distribution)
    return {
        name: Metric(value=finite_rounded(v), ci_low=finite_rounded(lo), ci_high=finite_rounded(hi))
        for name, v, lo, hi in zip(METRICS, values, low, high)
    }


def diagnose(samples: list[Sample], task_accuracy: Metric, chance: float | None, *, answer_last: bool = False) -> Diagnostics:
    """Answer distribution, collapse and chance for multiple choice (`chance` given); empty,
    ambiguous and cut shares for every format, flagged cuts where the answer comes last."""
    n = len(samples)
    share = lambda count: round(count / n, 6) if n else 0.0  # noqa: E731
    empty = sum(not s.completion.strip() for s in samples)
    cut = share(sum(s.stop_reason == "length" and not s.format_ok for s in samples))
    diagnostics = Diagnostics(
        n=n,
        empty_share=share(empty),
        ambiguous_share=share(sum(s.lenient_status == "ambiguous" for s in samples)),
        conflict_share=share(sum(s.lenient_status == "conflict" for s in samples)),
        cut_share=cut,
        many_cut=answer_last and cut >= CUT_SHARE,
        no_strict_answers=n > 0 and not any(s.format_ok for s in samples),
        mostly_empty=n > 0 and share(empty) >= MOSTLY_EMPTY,
    )
    if chance is None:
        return diagnostics
    gold = Counter(s.gold for s in samples)
    answers = Counter(s.strict_answer for s in samples if s.strict_answer is not None)
    picks = Counter(s.knowledge_answer for s in samples if s.knowledge_answer is not None)
    diagnostics.chance = round(chance, 6)
    diagnostics.majority_share = share(max(gold.values(), default=0))
    diagnostics.answer_distribution = dict(sorted(answers.items())) | {"none": n - sum(answers.values())}
    if answers:
        top, count = answers.most_common(1)[0]
        diagnostics.most_common_answer = top
        diagnostics.most_common_share = round(count / sum(answers.values()), 6)
        diagnostics.most_common_accuracy = share(gold[top])
        diagnostics.collapsed = _collapsed(answers, gold)
    if any(s.option_loglikelihoods is not None for s in samples):
        diagnostics.knowledge_distribution = dict(sorted(picks.items())) | {"none": n - sum(picks.values())}
        diagnostics.knowledge_collapsed = _collapsed(picks, gold)
    bound = task_accuracy.ci_low if task_accuracy.ci_low is not None else task_accuracy.value
    diagnostics.at_chance = bound is not None and bound <= diagnostics.chance_level
    return diagnostics


def _collapsed(answers: Counter, gold: Counter) -> bool:
    """Whether one answer is given so often that the answers tell more of a habit than of the
    questions: over COLLAPSE_SHARE of the answers (of COLLAPSE_MIN_ANSWERS or more), and
    COLLAPSE_MARGIN over that option's share of the gold answers."""
    given = sum(answers.values())
    if given < COLLAPSE_MIN_ANSWERS:
        return False
    top, count = answers.most_common(1)[0]
    return count / given > max(COLLAPSE_SHARE, gold[top] / sum(gold.values()) + COLLAPSE_MARGIN)


def _statistic(format_ok, task_correct, lenient_correct, knowledge_correct, axis=-1):
    ff = format_ok.mean(axis)
    acc = task_correct.mean(axis)
    conditional = np.divide(acc, ff, out=np.full_like(acc, np.nan), where=ff > 0)
    return np.stack([ff, acc, conditional, lenient_correct.mean(axis), knowledge_correct.mean(axis)])


CONFIDENCE = 0.95  # of every interval softeval gives
# the rule of every percentile interval softeval gives, recorded with each cell
INTERVALS = "inverted-cdf"


def percentile_bounds(resampled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile interval along the last axis, over the resamples that are defined (not
    NaN): the inverted-CDF quantiles, so each bound is a value some resample took (an
    interpolated bound, 80.1% of 20 rows, is a score no resample had). Every interval of
    softeval's is this rule (the analysis widens one to its estimate, see analysis.stats)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a metric undefined in every resample has no interval
        low, high = np.nanquantile(resampled, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2], axis=-1, method="inverted_cdf")
    return low, high


def finite_rounded(x) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 6)
