"""Scoring: per-sample judgements and the five metrics with 95% bootstrap confidence intervals.

| metric               | share of examples that ...                                        |
| format_following     | the strict parser accepts                                         |
| task_accuracy        | the strict parser accepts and that are correct (benchmark score)  |
| conditional_accuracy | task_accuracy / format_following: correct when the format is kept |
| lenient_accuracy     | are correct under the lenient parser                              |
| knowledge            | multiple choice: cloze loglikelihood picks the gold option        |
|                      | (length-normalised, lm-eval acc_norm); open-ended: lenient_accuracy |
"""

from __future__ import annotations

import warnings

import numpy as np
from pydantic import BaseModel
from scipy.stats import bootstrap

from softeval.data import Example
from softeval.parsers import AnswerParser

METRICS = ("format_following", "task_accuracy", "conditional_accuracy", "lenient_accuracy", "knowledge")


class Metric(BaseModel):
    value: float | None  # None where undefined (conditional accuracy with no formatted answer)
    ci_low: float | None
    ci_high: float | None


def score_sample(
    parser: AnswerParser, example: Example, completion: str, option_loglikelihoods: list[float] | None
) -> dict:
    """Everything the sample log records about one example, with its metric judgements."""
    strict = parser.strict(completion, example)
    lenient = parser.lenient(completion, example)
    record = {
        "strict_answer": strict.answer,
        "strict_failure": strict.failure,
        "lenient_answer": lenient,
        "format_ok": strict.answer is not None,
        "task_correct": strict.answer is not None and parser.is_correct(strict.answer, example),
        "lenient_correct": parser.is_correct(lenient, example),
    }
    if option_loglikelihoods is None:
        record["knowledge_correct"] = record["lenient_correct"]
    else:
        lengths = np.array([max(len(c), 1) for c in example.choices], dtype=float)
        normalised = np.array(option_loglikelihoods) / lengths
        record["option_loglikelihoods"] = option_loglikelihoods
        record["knowledge_correct"] = int(np.argmax(normalised)) == example.answer_index
    return record


def aggregate(samples: list[dict], *, seed: int = 0, n_resamples: int = 1000) -> dict[str, Metric]:
    """Point values and percentile-bootstrap 95% intervals, resampling examples jointly."""
    columns = [np.array([s[k] for s in samples], dtype=float) for k in ("format_ok", "task_correct", "lenient_correct", "knowledge_correct")]
    values = _statistic(*[c[None, :] for c in columns], axis=-1)[:, 0]
    if len(samples) < 2:
        low = high = values
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
            # percentiles over the resamples where a metric is defined (conditional accuracy is
            # undefined in a resample with no formatted answer)
            low, high = np.nanpercentile(result.bootstrap_distribution, [2.5, 97.5], axis=-1)
    return {
        name: Metric(value=_clean(v), ci_low=_clean(lo), ci_high=_clean(hi))
        for name, v, lo, hi in zip(METRICS, values, low, high)
    }


def _statistic(format_ok, task_correct, lenient_correct, knowledge_correct, axis=-1):
    ff = format_ok.mean(axis)
    acc = task_correct.mean(axis)
    conditional = np.divide(acc, ff, out=np.full_like(acc, np.nan), where=ff > 0)
    return np.stack([ff, acc, conditional, lenient_correct.mean(axis), knowledge_correct.mean(axis)])


def _clean(x) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 6)
