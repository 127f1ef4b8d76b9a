"""Which predictor decides between pre-training recipes first: every (method, metric) pair
compared on the same row draws.

A predictor is a method (zero-shot, few-shot, soft prompt, LoRA) read through one metric: a 0/1
outcome (task accuracy, knowledge in either context) or a continuous one (the gold answer's
probability or bits per byte; see `scoring.likelihood`). Bits per byte are lower-is-better, so
they are negated here: every predictor's higher score means the better recipe.

For each predictor: decision accuracy at every budget (DataDecide's definition, see `series`),
its mean over the budgets (how early and how well it decides, in one number), the earliest
budget from which it stays at or above the threshold, and its signal-to-noise ratio (Heineman
et al., arXiv 2508.13144: signal is the spread of the recipes' final scores, max - min, over
their mean; noise the relative standard deviation, std / mean, of a recipe's last checkpoints,
averaged over recipes). Each predictor also has its checkpoint-averaged variant, which scores a
checkpoint by the mean of the last `AVERAGED` checkpoints up to it (the signal-to-noise paper's
remedy for noisy checkpoints).

One row draw per resample is shared by every predictor, every checkpoint and the target, so the
difference in decision accuracy between two predictors has a paired interval: the rows' shared
difficulty cancels, as it does in a paired difference of accuracies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from softeval.analysis.stats import CONFIDENCE, holm, quantile_interval, resample_counts, resampled_p_value

AVERAGED = 3  # the checkpoint-averaged variant: the mean of this many latest checkpoints
_DECIMALS = 12  # scores equal up to float noise tie, as they do on paper


def decision_accuracies(scores: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Decision accuracy of (recipes, ...) scores against (recipes, ...) target values, along
    the trailing axes at once: over pairs the target orders, 1 where the scores order them
    alike, 0.5 where the scores tie, 0 otherwise; nan where the target ties every pair. Scores
    and target are finite (means of outcomes): a NaN would count as a tie here."""
    scores, target = np.round(scores, _DECIMALS), np.round(target, _DECIMALS)
    shape = np.broadcast_shapes(scores.shape[1:], target.shape[1:])
    alike, tied, ordered = (np.zeros(shape, dtype=np.int64) for _ in range(3))
    # recipe a against every later recipe, as comparisons (booleans): no float copy of a pair's
    # values is made, and one target draw serves every budget by broadcasting
    for a in range(scores.shape[0] - 1):
        above, below = target[a] > target[a + 1 :], target[a] < target[a + 1 :]
        higher, lower = scores[a] > scores[a + 1 :], scores[a] < scores[a + 1 :]
        counted = above | below
        alike += ((higher & above) | (lower & below)).sum(axis=0)
        tied += (~(higher | lower) & counted).sum(axis=0)
        ordered += counted.sum(axis=0)
    return np.divide(alike + 0.5 * tied, ordered, out=np.full(shape, np.nan), where=ordered > 0)


def averaged(table: np.ndarray, n: int = AVERAGED) -> np.ndarray:
    """A (checkpoints, rows) table with each checkpoint replaced by the mean of the last `n`
    checkpoints up to it (fewer at the start of the series)."""
    sums = np.cumsum(table, axis=0)
    lagged = np.vstack([np.zeros((n, table.shape[1])), sums])[: len(table)]
    counts = np.minimum(np.arange(1, len(table) + 1), n)[:, None]
    return (sums - lagged) / counts


def signal_to_noise(series_scores: Sequence[np.ndarray], last: int = AVERAGED, noise_scores: Sequence[np.ndarray] | None = None) -> float | None:
    """Heineman et al.'s ratio over recipes' score curves (each in checkpoint order): signal is
    (max - min) of the final scores over their mean, noise the mean over recipes of std / mean of
    the last `last` scores (of `noise_scores` where given: a smoothed curve's own last points
    overlap, so its noise is read off the raw curve). None where the mean is 0 or no recipe's
    last scores vary."""
    finals = np.array([s[-1] for s in series_scores], dtype=float)
    tails = [np.asarray(s[-last:], dtype=float) for s in (noise_scores if noise_scores is not None else series_scores)]
    if len(finals) < 2 or any(len(t) < 2 for t in tails) or finals.mean() == 0:
        return None
    relative = [t.std(ddof=1) / abs(t.mean()) for t in tails if t.mean() != 0]
    noise = float(np.mean(relative)) if relative else 0.0
    if noise == 0:
        return None
    return float((finals.max() - finals.min()) / abs(finals.mean()) / noise)


def compare_decisions(
    predictors: Mapping[str, Sequence[np.ndarray]], checkpoints: Sequence[list[int]], target: np.ndarray, *, threshold: float,
    n_resamples: int = 1000, seed: int = 0,
) -> dict:
    """Every predictor's decision accuracy per budget with intervals, its mean over budgets, its
    earliest decision and signal-to-noise ratio, for it and its checkpoint-averaged variant.

    `predictors[name][r]` is recipe r's (checkpoints, rows) table, oriented so higher is better;
    `checkpoints[b][r]` recipe r's latest checkpoint within budget b; `target` (recipes, rows)."""
    n_rows = target.shape[1]
    # each draw as how often it takes each row (the draws every statistic of the folder shares):
    # a resample's means are then one matrix product
    weights = resample_counts(n_rows, n_resamples, seed) / n_rows  # (rows, resamples)
    target_point, target_boot = target.mean(axis=1), target @ weights
    found, boots = {}, {}
    for name, tables in predictors.items():
        for variant, shown in ((tables, name), ([averaged(t) for t in tables], f"{name} (mean of last {AVERAGED})")):
            point, boot = _per_budget(variant, checkpoints, weights)
            values = decision_accuracies(point, target_point[:, None])  # (budgets,)
            resampled = decision_accuracies(boot, target_boot[:, None, :])  # (budgets, resamples)
            boots[shown] = resampled
            found[shown] = {
                "decision_accuracy": [_estimate(v, r) for v, r in zip(values, resampled)],
                "mean": _estimate(np.nanmean(values) if np.isfinite(values).any() else np.nan, _nanmean(resampled)),
                "earliest": _earliest(values, threshold),
                "signal_to_noise": signal_to_noise([t.mean(axis=1) for t in variant], noise_scores=[t.mean(axis=1) for t in tables]),
            }
    return {"predictors": found, "boots": boots}


def decision_difference(compared: dict, first: str, among: Sequence[str]) -> dict | None:
    """`first` against the best of `among` in decision accuracy (per budget and in the mean over
    budgets) and its verdict, from paired intervals (the same row draws for both); None where no
    candidate's mean is defined.

    The comparison shown is against the best of `among` by mean decision accuracy, per budget
    and in the mean, with that comparator held fixed in every resample (its intervals are not
    adjusted for the other candidates). The verdict compares `first` with each candidate
    (multiple comparisons with the best): "better" where every difference's interval lies above
    0 (an intersection-union test: each at the 95% level, no adjustment needed), "worse" where
    some candidate scores higher with its p-value Holm-adjusted over the candidates (that
    candidate is `decided_by`), else "no difference shown". Re-choosing the best in each
    resample instead would centre the interval on the bootstrap's maximum, which lies above the
    best's own value by the noise among the candidates: the more candidates, the worse `first`
    would look."""
    means = {name: compared["predictors"][name]["mean"]["value"] for name in among if name != first}
    candidates = [n for n in means if means[n] is not None]
    if not candidates:
        return None
    second = max(candidates, key=means.__getitem__)
    a, boot_a = compared["predictors"][first], compared["boots"][first]
    against = {name: _mean_difference(compared, first, name) for name in candidates}
    b, boot_b = compared["predictors"][second], compared["boots"][second]
    per_budget = [_estimate(_minus(x["value"], y["value"]), ra - rb) for x, y, ra, rb in
                  zip(a["decision_accuracy"], b["decision_accuracy"], boot_a, boot_b)]
    verdict, p_value, decided_by = _verdict_among(against)
    return {"first": first, "second": second, "among": len(candidates), "per_budget": per_budget, "mean": against[second]["mean"],
            "verdict": verdict, "p_value": p_value, "decided_by": decided_by,
            "against": {name: d["mean"] | {"p_value": d["p_value"]} for name, d in against.items()}}


def _mean_difference(compared: dict, first: str, other: str) -> dict:
    """`first` minus `other` in mean decision accuracy over budgets: value, paired interval and p-value."""
    resampled = _nanmean(compared["boots"][first]) - _nanmean(compared["boots"][other])
    value = _minus(compared["predictors"][first]["mean"]["value"], compared["predictors"][other]["mean"]["value"])
    mean = _estimate(value, resampled)
    return {"mean": mean, "p_value": resampled_p_value(mean["value"], resampled)}


def _verdict_among(against: dict[str, dict]) -> tuple[str, float | None, str | None]:
    """"better", "worse" or "no difference shown" against every candidate (see
    `decision_difference`), its p-value and, for "worse", the candidate that decides it.

    The p-value of "worse" is that candidate's own (unadjusted: a study's findings are adjusted
    together later); otherwise the intersection-union test's for "better", the largest p-value of
    the comparisons, where a candidate scoring as high or higher counts as 1."""
    better_p = max((1.0 if d["mean"]["value"] is None or d["mean"]["value"] <= 0 or d["p_value"] is None else d["p_value"])
                   for d in against.values()) if against else None
    if against and all(d["mean"]["ci_low"] is not None and d["mean"]["ci_low"] > 0 for d in against.values()):
        return "better", better_p, None
    # adjusted over every candidate (the family tested), then read where the candidate scores higher
    adjusted = holm([d["p_value"] for d in against.values()])
    higher = [(p, name) for p, (name, d) in zip(adjusted, against.items())
              if p is not None and d["mean"]["value"] is not None and d["mean"]["value"] < 0]
    if higher and min(higher)[0] < 1 - CONFIDENCE:
        name = min(higher)[1]
        return "worse", against[name]["p_value"], name
    return "no difference shown", better_p, None


def _per_budget(tables: Sequence[np.ndarray], checkpoints: Sequence[list[int]], weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each recipe's score at each budget, (recipes, budgets), and under each row draw,
    (recipes, budgets, resamples); `weights` (rows, resamples) is each draw's row counts / rows."""
    chosen = np.stack([np.stack([tables[r][k] for r, k in enumerate(latest)]) for latest in checkpoints], axis=1)  # (recipes, budgets, rows)
    return chosen.mean(axis=2), chosen @ weights


def _nanmean(resampled: np.ndarray) -> np.ndarray:
    """The mean over budgets (axis 0) of each resample, where some budget is defined."""
    defined = np.isfinite(resampled)
    total = np.where(defined, resampled, 0.0).sum(axis=0)
    n = defined.sum(axis=0)
    return np.divide(total, n, out=np.full(n.shape, np.nan), where=n > 0)


def _earliest(values: np.ndarray, threshold: float) -> int | None:
    """The index of the first budget from which decision accuracy stays at or above threshold."""
    earliest = None
    for k in range(len(values) - 1, -1, -1):
        if not np.isfinite(values[k]) or values[k] < threshold:
            break
        earliest = k
    return earliest


def _minus(a: float | None, b: float | None) -> float:
    return np.nan if a is None or b is None else a - b


def _estimate(value: float, resampled: np.ndarray) -> dict:
    """A value (NaN: undefined) and its interval (see `stats.quantile_interval`), rounded where
    it has one, so that a value and a bound equal up to float noise compare equal."""
    found = quantile_interval(float(value) if np.isfinite(value) else None, resampled).model_dump()
    return found if found["ci_low"] is None else {key: round(v, _DECIMALS) for key, v in found.items()}
