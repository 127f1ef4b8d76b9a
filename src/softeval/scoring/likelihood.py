"""Continuous metrics: how likely a model finds the gold answer, per row and per cell.

Accuracy moves in steps of one row; the gold answer's likelihood moves with every bit a model
learns, which is why pre-training teams decide early with it (DataDecide, arXiv 2504.11393; the
signal-to-noise study, arXiv 2508.13144). Each is scored under the cell's own conditioning: its
soft prompt, demonstrations or chat template.

| metric          | per row                                                                  |
| gold_logprob    | summed log-probability of the gold target after the cell's prompt       |
| gold_bpb        | bits per byte of it: -gold_logprob / (ln 2 x UTF-8 bytes); lower is better |
| gold_prob       | multiple choice: the gold option's target probability, normalised over  |
|                 | every option's target after the cell's prompt (options shown)           |
| prompt_knowledge| multiple choice: the likeliest option target after the prompt is gold    |
| cloze_gold_prob | multiple choice: the gold option's probability in the cloze context     |
| cloze_gold_bpb  | multiple choice: bits per byte of the gold option in the cloze context  |

Bits per byte sum a continuation's token log-probabilities and divide by its UTF-8 bytes, as
lm-evaluation-harness and OLMES define it, so tokenizers of any vocabulary compare.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from softeval.formats import Example
from softeval.scoring.metrics import Metric, finite_rounded, percentile_bounds

# results.json name -> the sample field holding its per-row value
GOLD_METRICS = {
    "gold_logprob": "gold_logprob",
    "gold_bpb": "gold_bpb",
    "gold_prob": "gold_prob",
    "prompt_knowledge": "prompt_knowledge_correct",
    "cloze_gold_prob": "cloze_gold_prob",
    "cloze_gold_bpb": "cloze_gold_bpb",
}
LOWER_IS_BETTER = frozenset({"gold_bpb", "cloze_gold_bpb"})
GOLD_MEANINGS = {
    "gold_logprob": "summed log-probability of the gold answer, as the strict format writes it, after the cell's prompt",
    "gold_bpb": "bits per UTF-8 byte of the gold answer after the cell's prompt (lower is better)",
    "gold_prob": "probability of the gold option's answer among every option's, after the cell's prompt (options shown)",
    "prompt_knowledge": "share of rows whose likeliest option answer after the cell's prompt (options shown) is the gold one",
    "cloze_gold_prob": "probability of the gold option among the options in the cloze context (knowledge's context)",
    "cloze_gold_bpb": "bits per UTF-8 byte of the gold option in the cloze context (lower is better)",
}


# How cloze bits per byte count a continuation's bytes, a version recorded in a cell's versions. 2: the text
# its tokens encode, a space its context ended in included (1 counted from the option's text
# alone, one byte short where a cloze context ends in a space).
CLOZE_BYTES = "2"


def bits_per_byte(loglikelihood: float, text: str) -> float | None:
    """-loglikelihood / (ln 2 x bytes of `text`); None where the text is empty or unscorable."""
    n_bytes = len(text.encode("utf-8"))
    if not n_bytes or not math.isfinite(loglikelihood):
        return None
    return -loglikelihood / (math.log(2) * n_bytes)


def option_probability(loglikelihoods: Sequence[float], gold: int) -> float | None:
    """The gold option's share of the options' probability mass (a softmax over summed
    log-likelihoods); None where no option could be scored."""
    scores = np.array([x if math.isfinite(x) else -np.inf for x in loglikelihoods], dtype=float)
    if not np.isfinite(scores).any():
        return None
    weights = np.exp(scores - scores.max())
    return float(weights[gold] / weights.sum())


def gold_fields(example: Example, answers: Sequence[float] | None, answer_texts: Sequence[str] | None,
                cloze: Sequence[float] | None, cloze_texts: Sequence[str] | None) -> dict:
    """One row's continuous values. `answers`: log-likelihood of each answer text after the
    cell's prompt (the gold target alone, or one target per option for multiple choice);
    `cloze`: the options' log-likelihoods in the cloze context, with the texts they scored."""
    fields: dict = {}
    if answers is not None and answer_texts is not None:
        # one answer per option, or the gold answer alone (a target that does not name its option)
        per_option = example.choices is not None and len(answers) == len(example.choices)
        gold = example.answer_index if per_option else 0
        fields["gold_logprob"] = answers[gold] if math.isfinite(answers[gold]) else None
        fields["gold_bpb"] = bits_per_byte(answers[gold], answer_texts[gold])
        if per_option:
            fields["prompt_option_loglikelihoods"] = [x if math.isfinite(x) else None for x in answers]
            fields["gold_prob"] = option_probability(answers, gold)
            pick = int(np.argmax([x if math.isfinite(x) else -np.inf for x in answers]))
            # an option listed twice answers alike: either one is the gold answer
            fields["prompt_knowledge_correct"] = fields["gold_prob"] is not None and answer_texts[pick] == answer_texts[gold]
    if cloze is not None and cloze_texts is not None and example.answer_index is not None:
        fields["cloze_gold_prob"] = option_probability(cloze, example.answer_index)
        fields["cloze_gold_bpb"] = bits_per_byte(cloze[example.answer_index], cloze_texts[example.answer_index])
    return fields


def gold_aggregate(samples: Sequence, *, seed: int = 0, n_resamples: int = 1000) -> dict[str, Metric]:
    """Each continuous metric the samples hold: (mean, 95% percentile-bootstrap interval),
    resampling rows. A metric some rows lack is undefined (None) rather than a mean over a subset:
    cells are compared row by row. Metrics no row holds are left out."""
    found = {}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(samples), size=(n_resamples, len(samples))) if len(samples) >= 2 else None
    for name, field in GOLD_METRICS.items():
        values = [getattr(s, field, None) for s in samples]
        if all(v is None for v in values):
            continue
        if any(v is None for v in values):
            found[name] = Metric(value=None, ci_low=None, ci_high=None)
            continue
        column = np.array(values, dtype=float)
        if draws is None:
            found[name] = Metric(value=finite_rounded(column.mean()), ci_low=None, ci_high=None)
            continue
        low, high = percentile_bounds(column[draws].mean(axis=1))
        found[name] = Metric(value=finite_rounded(column.mean()), ci_low=finite_rounded(low), ci_high=finite_rounded(high))
    return found
