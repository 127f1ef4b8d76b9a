"""Study statistics with honest 95% intervals: does one evaluation method predict the ranking of
post-trained models, do two methods agree across cells, and does a method change a cell's score.

Every interval is a percentile bootstrap over benchmark rows (`quantile_interval`: the
inverted-CDF percentile, widened to its estimate where the estimate falls outside it). Rows are the unit that was sampled
(the benchmark is a sample of possible questions), so they are what we resample. Within a task the
same row draw is applied to every model and every method: their outcomes on one row are correlated
(an easy question is easy for all), and resampling them separately would make the intervals wrong
(too wide for differences, too narrow or too wide for correlations). Tasks are resampled
independently of one another. Resamples where a statistic is undefined (all scores tied, say) are
left out of the percentiles; a value that is undefined on the data itself is reported as None.

Inputs are per-task tables: `table[t]` has one line per family (or cell) and one column per
benchmark row of task t; column j is the same benchmark row on every line and in every table.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
from pydantic import BaseModel
from scipy.stats import kendalltau, pearsonr, rankdata, spearmanr

from softeval.errors import SoftevalError
from softeval.scoring.metrics import CONFIDENCE, percentile_bounds

POWER = 0.8  # the power a study plans for: rows that would detect a difference 80% of the time
_SCORE_DECIMALS = 12  # scores equal up to float noise count as tied, as they are on paper
_MAX_DRAW_CELLS = 2_000_000  # rows x resamples drawn at once: bounds memory on long tasks
_SINGLE = "predictor"  # the method name rank_agreement uses for its one predictor


class Estimate(BaseModel):
    """A point value and its 95% percentile-bootstrap interval; None where undefined."""

    value: float | None
    ci_low: float | None
    ci_high: float | None


class PairedDifference(Estimate):
    """mean(a - b) over the rows of one cell; `excludes_zero` when the interval lies on one side
    of 0; the two-sided bootstrap p-value against 0, and what the rows' spread can detect (see
    `paired_power`)."""

    excludes_zero: bool
    n: int
    p_value: float | None = None
    detectable: float | None = None  # the smallest difference detected with POWER at these rows
    rows_needed: int | None = None  # rows that would detect the observed difference with POWER


class RankAgreement(BaseModel):
    """How well predictor scores order the families the way the reference scores do."""

    tau_b: Estimate
    spearman: Estimate
    n_families: int
    n_tasks: int
    predictor_scores: list[float]  # per family: mean over tasks of the task's row mean
    reference_scores: list[float]


class PredictorComparison(BaseModel):
    """Rank agreement per method, the best method by point tau-b, and tau(best) - tau(other)."""

    methods: dict[str, RankAgreement]
    best: str | None  # None when no method's tau-b is defined
    tau_difference: dict[str, Estimate]  # per other method: tau_b(best) - tau_b(other)
    # per ordered pair "a - b" of methods: tau_b(a) - tau_b(b), from the same row draws
    tau_pairwise: dict[str, Estimate] = {}
    tau_pairwise_p: dict[str, float | None] = {}  # the two-sided bootstrap p-value of each difference against 0


class Agreement(BaseModel):
    """Agreement of two methods' scores across cells."""

    pearson: Estimate
    tau_b: Estimate
    n_cells: int
    pearson_p: float | None = None  # the two-sided bootstrap p-value of Pearson r against `against`
    against: float | None = None


# ---------------------------------------------------------------- public API


def paired_difference(a, b, *, n_resamples: int = 2000, seed: int = 0) -> PairedDifference:
    """mean(a - b) for two methods scored on the same rows of one cell, with a paired bootstrap
    interval: pairing removes the row difficulty the two share, so real differences show."""
    a, b = _vector(a, "a"), _vector(b, "b")
    if a.shape != b.shape:
        raise SoftevalError(
            f"paired_difference needs a and b on the same rows, got {a.size} and {b.size} values: "
            "pass both methods' per-row outcomes for the same rows, in the same order"
        )
    _check_resamples(n_resamples)
    diff = a - b
    value = float(diff.mean())
    if diff.size < 2:  # a single row has no spread to resample
        return PairedDifference(value=value, ci_low=None, ci_high=None, excludes_zero=False, n=diff.size)
    boot = resampled_means(diff[None, :], n_resamples, seed)  # the draws of default_rng(seed), counted once per size
    estimate = _estimate(value, boot[0])
    excludes_zero = estimate.ci_low is not None and (estimate.ci_low > 0 or estimate.ci_high < 0)
    detectable, rows_needed = paired_power(diff)
    return PairedDifference(**estimate.model_dump(), excludes_zero=excludes_zero, n=diff.size, p_value=bootstrap_p_value(_round(boot[0])),
                            detectable=detectable, rows_needed=rows_needed)


def bootstrap_p_value(resampled: np.ndarray, null: float = 0.0) -> float:
    """Two-sided percentile-bootstrap p-value of `null`: twice the smaller share of resamples on
    either side of it (see `tail_share`), at most 1. It is below 1 - CONFIDENCE about where the
    percentile interval excludes `null` (resamples equal to `null` count on both sides, so the two
    can part where many tie at it)."""
    return float(min(1.0, 2 * min(tail_share(resampled, null, above=False), tail_share(resampled, null, above=True))))


def tail_share(resampled: np.ndarray, bound: float, *, above: bool, strict: bool = False) -> float:
    """The share of the defined resamples at or beyond `bound` on one side (above it, or below it;
    `strict`: beyond it only), counted as (k + 1) / (B + 1) where k resamples are there.

    Where none is, the share is only known to be below 1 / (B + 1), and every clear effect would
    get that same floor: a Holm adjustment over a study's hundreds of findings multiplies it past
    any level. There the share is the normal approximation's tail beyond `bound` (the resamples'
    mean and standard deviation), at most 1 / (B + 1); 0 where every resample is the same value."""
    from scipy.stats import norm

    resampled = resampled[np.isfinite(resampled)]  # an undefined resample is no draw
    if above:
        k = np.sum(resampled > bound) if strict else np.sum(resampled >= bound)
    else:
        k = np.sum(resampled < bound) if strict else np.sum(resampled <= bound)
    n = resampled.size
    if k > 0 or n < 2:
        return float((k + 1) / (n + 1))
    sd = float(resampled.std(ddof=1))
    if sd == 0:
        return 0.0
    distance = (bound - float(resampled.mean())) / sd
    return min(1 / (n + 1), float(norm.sf(distance if above else -distance)))


def paired_power(diff: np.ndarray, *, power: float = POWER) -> tuple[float | None, int | None]:
    """What paired rows with these per-row differences can detect, by the normal approximation
    of a two-sided test at 1 - CONFIDENCE: the minimum detectable difference at these rows,
    (z_alpha/2 + z_power) x sd / sqrt(n), and the rows that would detect the observed mean
    difference with `power`, ((z_alpha/2 + z_power) x sd / mean)^2 rounded up. None where the
    differences do not vary (or, for the rows, where the mean difference is 0)."""
    from scipy.stats import norm

    diff = np.asarray(diff, dtype=float)
    if diff.size < 2:
        return None, None
    sd = float(diff.std(ddof=1))
    if sd == 0:
        return None, None
    z = float(norm.ppf(1 - (1 - CONFIDENCE) / 2) + norm.ppf(power))
    mean = float(diff.mean())
    needed = int(np.ceil((z * sd / abs(mean)) ** 2)) if mean != 0 else None
    return z * sd / np.sqrt(diff.size), needed


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None: not in the family): the i-th
    smallest of m is multiplied by m - i + 1, then kept at least as large as those before it."""
    family = sorted((p, k) for k, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for i, (p, k) in enumerate(family):
        running = max(running, min(1.0, (len(family) - i) * p))
        adjusted[k] = running
    return adjusted


def rank_agreement(
    predictor: Sequence[np.ndarray], reference: Sequence[np.ndarray], *, n_resamples: int = 2000, seed: int = 0
) -> RankAgreement:
    """Kendall tau-b and Spearman rho between families' predictor and reference scores.

    predictor[t], reference[t]: (n_families, n_rows_t) per-row values for task t, families in the
    same order. Equal to `compare_predictors({name: predictor}, reference).methods[name]`.

    The interval is the sampling spread of tau on benchmarks like this one. Tau over a few
    families takes few values, so it is usually conservative; but when families' true scores are
    close and the true tau is near +-1, the sample tau is biased toward 0 and the interval can
    miss the true tau far more often than 5% of the time."""
    comparison = compare_predictors({_SINGLE: predictor}, reference, n_resamples=n_resamples, seed=seed)
    return comparison.methods[_SINGLE]


def compare_predictors(
    predictors: Mapping[str, Sequence[np.ndarray]],
    reference: Sequence[np.ndarray],
    *,
    n_resamples: int = 2000,
    seed: int = 0,
) -> PredictorComparison:
    """Rank agreement of every method with the reference, which method predicts best (highest
    point tau-b; ties go to the first in `predictors`' order) and tau(best) - tau(other) with
    intervals from the same row draws, so the shared noise of the reference cancels."""
    if not predictors:
        raise SoftevalError("compare_predictors got no methods: pass {method name: per-task tables}")
    _check_resamples(n_resamples)
    names = list(predictors)
    tables = {name: _task_tables(predictors[name], _label(name)) for name in names}
    ref = _task_tables(reference, "reference")
    for name in names:
        _check_same_layout(tables[name], ref, _label(name))

    # one stacked table per task: every method's families, then the reference's
    stacked = [np.vstack([tables[name][t] for name in names] + [ref[t]]) for t in range(len(ref))]
    point = np.mean([table.mean(axis=1) for table in stacked], axis=0)  # (units,)
    boot = np.mean(_resampled_means(stacked, n_resamples, np.random.default_rng(seed)), axis=0)  # (units, B)
    point, boot = _round(point), _round(boot)
    n_families = ref[0].shape[0]
    ref_point, ref_boot = point[-n_families:], boot[-n_families:]

    methods, boot_tau = {}, {}
    for m, name in enumerate(names):
        rows = slice(m * n_families, (m + 1) * n_families)
        pred_point, pred_boot = point[rows], boot[rows]
        boot_tau[name] = kendall_tau_b(pred_boot.T, ref_boot.T)
        methods[name] = RankAgreement(
            tau_b=_estimate(scipy_point(kendalltau, pred_point, ref_point, variant="b"), boot_tau[name]),
            spearman=_estimate(scipy_point(spearmanr, pred_point, ref_point), _spearman(pred_boot.T, ref_boot.T)),
            n_families=n_families,
            n_tasks=len(ref),
            predictor_scores=pred_point.tolist(),
            reference_scores=ref_point.tolist(),
        )

    best = _best_by_tau(methods)
    pairwise = {
        f"{a} - {b}": _estimate(_difference(methods[a].tau_b.value, methods[b].tau_b.value), boot_tau[a] - boot_tau[b])
        for a in names for b in names if a != b
    }
    differences = {name: pairwise[f"{best} - {name}"] for name in names if best is not None and name != best}
    p_values = {f"{a} - {b}": resampled_p_value(pairwise[f"{a} - {b}"].value, boot_tau[a] - boot_tau[b]) for a in names for b in names if a != b}
    return PredictorComparison(methods=methods, best=best, tau_difference=differences, tau_pairwise=pairwise, tau_pairwise_p=p_values)


def resampled_p_value(value: float | None, resampled: np.ndarray, null: float = 0.0) -> float | None:
    """`bootstrap_p_value` over the defined resamples, as the interval `quantile_interval` gives
    reads it: 1 where the estimate itself is not beyond `null` on the side most resamples are
    (the interval, widened to the estimate, then holds `null`); None where the statistic is
    undefined."""
    defined = _round(resampled[np.isfinite(resampled)])
    if value is None or not defined.size:
        return None
    side = np.sign(float(np.median(defined)) - null)
    if side == 0 or np.sign(_round(value) - null) != side:
        return 1.0
    return bootstrap_p_value(defined, null)


def method_agreement(
    x: Sequence[np.ndarray],
    y: Sequence[np.ndarray],
    task_of_cell: Sequence[str],
    *,
    n_resamples: int = 2000,
    seed: int = 0,
    against: float | None = None,
) -> Agreement:
    """Pearson r and Kendall tau-b across cells between method X's and method Y's cell scores
    (with `against`, the bootstrap p-value of r against that value).

    x[c], y[c]: per-row outcomes of cell c (a model on a task) under each method, on the same rows;
    cells of the same task must cover the same rows in the same order, and share each row draw."""
    _check_resamples(n_resamples)
    if not (len(x) == len(y) == len(task_of_cell)):
        raise SoftevalError(
            f"method_agreement got {len(x)} x cells, {len(y)} y cells and {len(task_of_cell)} task labels: "
            "pass one x array, one y array and one task label per cell"
        )
    xs = [_vector(v, f"x[{c}]") for c, v in enumerate(x)]
    ys = [_vector(v, f"y[{c}]") for c, v in enumerate(y)]
    groups: dict[str, list[int]] = {}
    for c, task in enumerate(task_of_cell):
        groups.setdefault(task, []).append(c)
    for task, cells in groups.items():
        lengths = {xs[c].size for c in cells} | {ys[c].size for c in cells}
        if len(lengths) > 1:
            raise SoftevalError(
                f"method_agreement: the cells of task {task!r} have different row counts {sorted(lengths)}: "
                "every cell of a task, under both methods, must hold the same rows in the same order"
            )

    # one stacked table per task: its cells under X, then under Y; scattered back to cell order
    stacked = [np.vstack([xs[c] for c in cells] + [ys[c] for c in cells]) for cells in groups.values()]
    boots = _resampled_means(stacked, n_resamples, np.random.default_rng(seed))
    n_cells = len(xs)
    point_x, point_y = np.empty(n_cells), np.empty(n_cells)
    boot_x, boot_y = np.empty((n_cells, n_resamples)), np.empty((n_cells, n_resamples))
    for cells, table, boot in zip(groups.values(), stacked, boots):
        k = len(cells)
        point_x[cells], point_y[cells] = table[:k].mean(axis=1), table[k:].mean(axis=1)
        boot_x[cells], boot_y[cells] = boot[:k], boot[k:]
    point_x, point_y, boot_x, boot_y = map(_round, (point_x, point_y, boot_x, boot_y))
    r, resampled_r = scipy_point(pearsonr, point_x, point_y), _pearson(boot_x.T, boot_y.T)
    return Agreement(
        pearson=_estimate(r, resampled_r),
        tau_b=_estimate(scipy_point(kendalltau, point_x, point_y, variant="b"), kendall_tau_b(boot_x.T, boot_y.T)),
        n_cells=n_cells,
        pearson_p=None if against is None else resampled_p_value(r, resampled_r, against),
        against=against,
    )


# ---------------------------------------------------------------- bootstrap


def _resampled_means(tables: Sequence[np.ndarray], n_resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per task, the row means of every line under `n_resamples` row draws: (n_lines, n_resamples).

    One draw of row indices per task and resample, applied to every line of that task's table:
    that is what makes the resampling joint across models and methods. A draw is turned into row
    counts, so the means are one matrix product rather than a (lines x resamples x rows) copy."""
    means = []
    for table in tables:
        n_rows = table.shape[1]
        chunk = max(1, _MAX_DRAW_CELLS // n_rows)
        parts = []
        for start in range(0, n_resamples, chunk):
            size = min(chunk, n_resamples - start)
            counts = row_counts(rng.integers(0, n_rows, size=(size, n_rows)))
            parts.append(table @ counts.T / n_rows)
        means.append(np.concatenate(parts, axis=1))
    return means


def row_counts(draws: np.ndarray) -> np.ndarray:
    """(resamples, rows): how often each resample's draw of row indices takes each row."""
    size, n_rows = draws.shape
    flat = (draws + n_rows * np.arange(size)[:, None]).ravel()
    return np.bincount(flat, minlength=size * n_rows).reshape(size, n_rows)


@lru_cache(maxsize=16)
def resample_counts(n_rows: int, n_resamples: int, seed: int) -> np.ndarray:
    """(rows, resamples), read-only: how often each resample of `n_rows` rows takes each row, the
    draws those of `default_rng(seed).integers(0, n_rows, (n_resamples, n_rows))`. A table's
    resampled means are then one matrix product, `table @ counts / n_rows`, instead of a gather of
    every draw; a 0/1 table's sums stay whole numbers, so its means are those of the gathered rows,
    bit for bit."""
    draws = np.random.default_rng(seed).integers(0, n_rows, size=(n_resamples, n_rows))
    counts = row_counts(draws).T.astype(float)
    counts.setflags(write=False)
    return counts


def resampled_means(table: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(cells, resamples): each row of a (cells, rows) table averaged over each resample of its rows
    (see `resample_counts`)."""
    return (table @ resample_counts(table.shape[1], n_resamples, seed)) / table.shape[1]


def quantile_interval(value: float | None, resampled: np.ndarray) -> Estimate:
    """A value and its 95% interval: the inverted-CDF percentile interval of the defined (not NaN)
    resamples (`scoring.metrics.percentile_bounds`, each bound a value some resample had),
    widened to take in the value where it lies outside. Resampling rows adds noise to every mean
    a rank or decision statistic orders, which pulls the resampled statistic towards 0, and can
    leave the estimate beside its percentile interval. A coverage simulation with a known truth
    (benchmarks/interval_coverage.py; its figures in docs/studies.md#intervals) found this rule
    covering rank statistics and differences between predictors better than BCa, and no rule
    near 95% for decision accuracies at few rows. No interval where none is defined."""
    defined = resampled[~np.isnan(resampled)]
    if value is None or not len(defined):
        return Estimate(value=value, ci_low=None, ci_high=None)
    low, high = percentile_bounds(defined)
    return Estimate(value=value, ci_low=min(float(low), value), ci_high=max(float(high), value))


def _estimate(value: float | None, boot: np.ndarray) -> Estimate:
    """`quantile_interval` of a value and its resamples, rounded (float noise dropped); None
    where the value is undefined."""
    if value is None or not np.isfinite(value):
        return Estimate(value=None, ci_low=None, ci_high=None)
    found = quantile_interval(float(_round(value)), _round(boot[np.isfinite(boot)]))
    return found


# ---------------------------------------------------------------- statistics


def scipy_point(fn, x: np.ndarray, y: np.ndarray, **kwargs) -> float | None:
    """The point value from scipy's own function; None with fewer than 2 values or a constant side."""
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = float(fn(x, y, **kwargs).statistic)
    return value if np.isfinite(value) else None


# Vectorised equivalents for the resamples (scipy takes ~1 ms a call; 2000 resamples x methods
# would take seconds). Each takes (..., n) arrays and returns (...); nan where undefined. The tests
# check them against scipy, ties included.


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall tau-b along the last axis: (concordant - discordant pairs) / sqrt(pairs untied in x
    * pairs untied in y). Up to SORTED_FROM points, over every pair at once; from there (hundreds
    of checkpoints: tens of thousands of pairs per resample) by sorting (Knight's algorithm, the
    discordant pairs counted with a Fenwick tree), which counts the same whole numbers, so the two
    give the same value, bit for bit."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    lead, n = x.shape[:-1], x.shape[-1]
    flat_x, flat_y = x.reshape(-1, n), y.reshape(-1, n)
    if n >= SORTED_FROM:  # in chunks of rows: a chunk's sort keys and tree hold a few times its values
        chunk = max(1, _MAX_DRAW_CELLS // n)
        parts = [_sorted_counts(flat_x[start:start + chunk], flat_y[start:start + chunk]) for start in range(0, len(flat_x), chunk)]
        numerator, untied_x, untied_y = (np.concatenate(column) for column in zip(*parts)) if parts else (np.empty(0),) * 3
    else:
        numerator, untied_x, untied_y = _pair_counts(flat_x, flat_y)
    denominator = np.sqrt(untied_x * untied_y)
    tau = np.divide(numerator, denominator, out=np.full(numerator.shape, np.nan), where=denominator > 0)
    return tau.reshape(lead)


SORTED_FROM = 64  # points from which Kendall's tau counts pairs by sorting, not one by one


def _pair_counts(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of (rows, n) arrays: the sum of sign products over pairs, and the pairs untied in x
    and in y, every pair compared; rows in chunks of _MAX_DRAW_CELLS pair values at most."""
    i, j = np.triu_indices(x.shape[-1], k=1)
    chunk = max(1, _MAX_DRAW_CELLS // max(1, len(i)))
    parts = []
    for start in range(0, len(x), chunk):
        dx = np.sign(x[start:start + chunk, i] - x[start:start + chunk, j])
        dy = np.sign(y[start:start + chunk, i] - y[start:start + chunk, j])
        parts.append(((dx * dy).sum(-1), np.abs(dx).sum(-1), np.abs(dy).sum(-1)))
    if not parts:
        return np.empty(0), np.empty(0), np.empty(0)
    return tuple(np.concatenate(column) for column in zip(*parts))


def _sorted_counts(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `_pair_counts` gives, by sorting: of the n(n-1)/2 pairs, those tied in x, in y and in
    both, and the discordant ones, give concordant - discordant = pairs - tied x - tied y + tied
    both - 2 discordant. Two sorts per row serve all four counts: by x then y (ties in x and in
    both are runs there), and that order's y values by value (ties in y, and y's dense ranks)."""
    n = x.shape[-1]
    pairs = n * (n - 1) // 2
    by_x = np.lexsort((y, x), axis=-1)
    xs, ys = np.take_along_axis(x, by_x, axis=-1), np.take_along_axis(y, by_x, axis=-1)
    same_x = xs[:, 1:] == xs[:, :-1]
    tied_x, tied_both = _run_pairs(same_x), _run_pairs(same_x & (ys[:, 1:] == ys[:, :-1]))
    by_y = np.argsort(ys, axis=-1, kind="stable")
    ordered_y = np.take_along_axis(ys, by_y, axis=-1)
    same_y = ordered_y[:, 1:] == ordered_y[:, :-1]
    ranks = np.empty(ys.shape, dtype=np.int64)  # 1 for the smallest y, each larger value the next whole number
    np.put_along_axis(ranks, by_y, 1 + np.concatenate([np.zeros((len(ys), 1), dtype=np.int64), np.cumsum(~same_y, axis=-1)], axis=-1), axis=-1)
    tied_y = _run_pairs(same_y)
    numerator = pairs - tied_x - tied_y + tied_both - 2 * _discordant_pairs(ranks)
    return numerator.astype(float), (pairs - tied_x).astype(float), (pairs - tied_y).astype(float)


def _run_pairs(same: np.ndarray) -> np.ndarray:
    """Per row of a sorted (rows, n) array, given `same` (each element equal to the one before):
    the pairs within runs of equal elements, each element counting the equal ones before it."""
    position = np.broadcast_to(np.arange(1, same.shape[-1] + 1), same.shape)
    run_start = np.maximum.accumulate(np.where(same, 0, position), axis=-1)
    return (position - run_start).sum(axis=-1)


def _discordant_pairs(ranks: np.ndarray) -> np.ndarray:
    """Per row of y's dense ranks in the order sorted by x (ties by y): the pairs that x orders one
    way and y strictly the other, each element's earlier partners of a larger y. A Fenwick tree
    over the ranks counts the earlier ones at or below, every row at once."""
    rows, n = ranks.shape
    size = 1 << int(ranks.max(initial=0)).bit_length()  # the tree holds ranks 1..size-1; 0 and size are sinks
    tree = np.zeros(rows * (size + 1), dtype=np.int64)
    base = np.arange(rows) * (size + 1)
    discordant = np.zeros(rows, dtype=np.int64)
    for j in range(n):
        rank = ranks[:, j]
        index, at_or_below = rank.copy(), np.zeros(rows, dtype=np.int64)
        for _ in range(size.bit_length()):
            at_or_below += tree[base + index]
            index &= index - 1
        discordant += j - at_or_below
        index = rank.copy()
        for _ in range(size.bit_length()):
            tree[base + index] += 1
            index = np.minimum(index + (index & -index), size)
    return discordant


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xc, yc = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    numerator = (xc * yc).sum(-1)
    denominator = np.sqrt((xc * xc).sum(-1) * (yc * yc).sum(-1))
    defined = (np.ptp(x, axis=-1) > 0) & (np.ptp(y, axis=-1) > 0)
    r = np.divide(numerator, denominator, out=np.full(numerator.shape, np.nan), where=defined)
    return np.clip(r, -1.0, 1.0)


def _spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson on average ranks, as scipy.stats.spearmanr."""
    return _pearson(rankdata(x, axis=-1), rankdata(y, axis=-1))


# ---------------------------------------------------------------- helpers


def _best_by_tau(methods: dict[str, RankAgreement]) -> str | None:
    best = None
    for name, agreement in methods.items():
        tau = agreement.tau_b.value
        if tau is not None and (best is None or tau > methods[best].tau_b.value):
            best = name
    return best


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _round(scores):
    """Drops float noise, so scores (and a value and its interval) that are equal compare equal."""
    return np.round(scores, _SCORE_DECIMALS)


def _label(name: str) -> str:
    """How an error names a method's tables."""
    return "predictor" if name == _SINGLE else f"predictor {name!r}"


def _check_resamples(n_resamples: int) -> None:
    if n_resamples < 1:
        raise SoftevalError(f"n_resamples must be at least 1, got {n_resamples}: use e.g. 2000")


def _vector(values, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise SoftevalError(
            f"{name} must be a non-empty 1-D array of per-row values, got shape {array.shape}: "
            "pass one value per benchmark row"
        )
    if not np.all(np.isfinite(array)):
        raise SoftevalError(f"{name} holds NaN or infinite values: pass finite per-row values (e.g. 0/1 outcomes)")
    return array


def _task_tables(tables: Sequence[np.ndarray], name: str) -> list[np.ndarray]:
    """Per-task (n_families, n_rows) float tables, checked to have rows and the same families."""
    arrays = [np.asarray(table, dtype=float) for table in tables]
    if not arrays:
        raise SoftevalError(f"{name} has no tasks: pass one (n_families, n_rows) table per task")
    for t, array in enumerate(arrays):
        if array.ndim != 2 or array.shape[1] == 0:
            raise SoftevalError(
                f"{name} task {t} has shape {array.shape}: pass a 2-D (n_families, n_rows) table "
                "with one line per family and at least one row"
            )
        if not np.all(np.isfinite(array)):
            raise SoftevalError(f"{name} task {t} holds NaN or infinite values: pass finite per-row values")
        if array.shape[0] != arrays[0].shape[0]:
            raise SoftevalError(
                f"{name} task {t} has {array.shape[0]} families but task 0 has {arrays[0].shape[0]}: "
                "every task's table needs one line per family, in the same family order"
            )
    return arrays


def _check_same_layout(tables: list[np.ndarray], reference: list[np.ndarray], name: str) -> None:
    if len(tables) != len(reference):
        raise SoftevalError(
            f"{name} has {len(tables)} tasks but the reference has {len(reference)}: "
            "pass one table per task, in the same task order"
        )
    for t, (table, ref) in enumerate(zip(tables, reference)):
        if table.shape != ref.shape:
            raise SoftevalError(
                f"{name} task {t} has shape {table.shape} (families, rows) but the reference has {ref.shape}: "
                "predictor and reference tables must cover the same families and the same benchmark rows"
            )
