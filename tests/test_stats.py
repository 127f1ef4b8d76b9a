"""Study statistics: known answers, agreement with scipy, joint row resampling, undefined values,
helpful shape errors, and interval coverage by simulation."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from scipy.stats import kendalltau, pearsonr, spearmanr

from softeval.analysis import stats
from softeval.analysis.stats import compare_predictors, method_agreement, paired_difference, rank_agreement
from softeval.errors import SoftevalError

B = 300  # resamples in most tests: enough for the properties checked, quick on two cores


def binary_tables(rng, accuracies, n_rows=(40, 60)) -> list[np.ndarray]:
    """Per-task (n_families, n_rows) 0/1 tables, family f right with probability accuracies[f]."""
    p = np.asarray(accuracies, dtype=float)[:, None]
    return [(rng.random((len(p), n)) < p).astype(float) for n in n_rows]


def exact_tables(scores, n_rows=20) -> list[np.ndarray]:
    """One task whose row means are exactly `scores` (multiples of 1 / n_rows)."""
    table = np.zeros((len(scores), n_rows))
    for f, score in enumerate(scores):
        table[f, : round(score * n_rows)] = 1
    return [table]


def scores_of(tables) -> np.ndarray:
    return np.mean([t.mean(axis=1) for t in tables], axis=0)


# ---------------------------------------------------------------- known answers


def test_identical_ranking_gives_one_and_reversed_minus_one():
    reference = binary_tables(np.random.default_rng(0), [0.2, 0.4, 0.6, 0.8, 0.9])
    same = rank_agreement(reference, reference, n_resamples=B)
    # the same draw hits predictor and reference, so every resample agrees perfectly: a
    # resampling that drew rows separately per table would widen this interval
    assert same.tau_b.model_dump() == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    assert same.spearman.model_dump() == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    reversed_ = rank_agreement([t[::-1] for t in reference], reference, n_resamples=B)
    assert reversed_.tau_b.model_dump() == {"value": -1.0, "ci_low": -1.0, "ci_high": -1.0}
    assert reversed_.spearman.value == -1.0
    assert same.n_families == 5 and same.n_tasks == 2


def test_scores_are_the_mean_over_tasks_of_row_means():
    # task 0 has 2 rows and task 1 has 4: a pooled mean over all rows would give 3/6, not 0.625
    predictor = [np.array([[1.0, 1.0], [0.0, 1.0]]), np.array([[0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])]
    result = rank_agreement(predictor, predictor, n_resamples=10)
    assert result.predictor_scores == pytest.approx([0.625, 0.75])


def test_tau_b_handles_ties():
    # predictor ties families 0 and 1: 5 concordant pairs, 0 discordant, one pair tied in x only,
    # so tau-b = 5 / sqrt(5 * 6), not tau-a's 5 / 6
    result = rank_agreement(exact_tables([0.25, 0.25, 0.5, 0.75]), exact_tables([0.25, 0.5, 0.75, 1.0]), n_resamples=B)
    assert result.tau_b.value == pytest.approx(5 / np.sqrt(30))
    assert result.spearman.value == pytest.approx(spearmanr([1, 1, 2, 3], [1, 2, 3, 4]).statistic)


@pytest.mark.parametrize("seed", range(4))
def test_rank_agreement_point_values_equal_scipy(seed):
    rng = np.random.default_rng(seed)
    predictor = binary_tables(rng, rng.random(7), n_rows=(15, 25, 10))  # few rows: ties happen
    reference = binary_tables(rng, rng.random(7), n_rows=(15, 25, 10))
    result = rank_agreement(predictor, reference, n_resamples=50, seed=seed)
    x, y = scores_of(predictor), scores_of(reference)
    assert result.tau_b.value == pytest.approx(kendalltau(x, y, variant="b").statistic)
    assert result.spearman.value == pytest.approx(spearmanr(x, y).statistic)
    assert result.tau_b.ci_low <= result.tau_b.value <= result.tau_b.ci_high


@pytest.mark.parametrize("seed", range(3))
def test_method_agreement_point_values_equal_scipy(seed):
    rng = np.random.default_rng(seed)
    tasks = ["arc"] * 4 + ["gsm"] * 3 + ["mmlu"] * 2
    n_rows = {"arc": 30, "gsm": 20, "mmlu": 25}
    x = [(rng.random(n_rows[t]) < rng.random()).astype(float) for t in tasks]
    y = [np.clip(v + (rng.random(v.size) < 0.2), 0, 1) for v in x]
    result = method_agreement(x, y, tasks, n_resamples=50, seed=seed)
    sx, sy = [v.mean() for v in x], [v.mean() for v in y]
    assert result.pearson.value == pytest.approx(pearsonr(sx, sy).statistic)
    assert result.tau_b.value == pytest.approx(kendalltau(sx, sy, variant="b").statistic)
    assert result.n_cells == 9


def test_resample_statistics_equal_scipy_with_ties():
    # the bootstrap uses vectorised tau-b, Spearman and Pearson; they must be scipy's on every
    # resample, ties included (small integers tie often)
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 4, size=(200, 6)).astype(float), rng.integers(0, 4, size=(200, 6)).astype(float)
    tau, rho, r = stats.kendall_tau_b(x, y), stats._spearman(x, y), stats._pearson(x, y)
    for i in range(len(x)):
        if np.ptp(x[i]) == 0 or np.ptp(y[i]) == 0:
            assert np.isnan(tau[i]) and np.isnan(rho[i]) and np.isnan(r[i])
            continue
        assert tau[i] == pytest.approx(kendalltau(x[i], y[i], variant="b").statistic)
        assert rho[i] == pytest.approx(spearmanr(x[i], y[i]).statistic)
        assert r[i] == pytest.approx(pearsonr(x[i], y[i]).statistic)


def test_method_agreement_identical_methods_agree_on_every_resample():
    rng = np.random.default_rng(2)
    x = [(rng.random(30) < p).astype(float) for p in (0.1, 0.3, 0.5, 0.7, 0.9)]
    result = method_agreement(x, x, ["a", "a", "b", "b", "b"], n_resamples=B)
    assert result.pearson.model_dump() == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    assert result.tau_b.value == 1.0 and result.tau_b.ci_low == 1.0


# ---------------------------------------------------------------- paired differences


def test_paired_difference_of_equal_arrays_is_exactly_zero():
    a = (np.random.default_rng(3).random(80) < 0.5).astype(float)
    result = paired_difference(a, a.copy(), n_resamples=B)
    assert (result.value, result.ci_low, result.ci_high) == (0.0, 0.0, 0.0)
    assert result.excludes_zero is False and result.n == 80


def test_paired_difference_detects_a_clear_shift():
    rng = np.random.default_rng(4)
    a = (rng.random(200) < 0.8).astype(float)
    b = a * (rng.random(200) < 0.5)  # b loses about half of a's correct rows
    result = paired_difference(a, b, n_resamples=B)
    assert result.value == pytest.approx(np.mean(a - b))
    assert result.excludes_zero and 0 < result.ci_low < result.value < result.ci_high
    small = paired_difference(a[:20], a[:20] * (rng.random(20) < 0.97), n_resamples=B)
    assert not small.excludes_zero  # a tiny shift on few rows is not called a difference


def test_paired_difference_bounds_are_differences_a_resample_can_have():
    rng = np.random.default_rng(5)
    for n in (8, 20, 30):
        a, b = (rng.random(n) < 0.6).astype(float), (rng.random(n) < 0.4).astype(float)
        result = paired_difference(a, b, n_resamples=B, seed=n)
        assert [round(bound * n, 6) % 1 for bound in (result.ci_low, result.ci_high)] == [0, 0], (n, result)


def test_paired_difference_of_one_row_has_no_interval():
    result = paired_difference([1.0], [0.0])
    assert (result.value, result.ci_low, result.ci_high, result.excludes_zero) == (1.0, None, None, False)


def test_results_are_seeded_and_serialisable():
    rng = np.random.default_rng(5)
    a, b = rng.random(50), rng.random(50)
    assert paired_difference(a, b, seed=7, n_resamples=B) == paired_difference(a, b, seed=7, n_resamples=B)
    assert paired_difference(a, b, seed=7, n_resamples=B) != paired_difference(a, b, seed=8, n_resamples=B)
    predictor, reference = binary_tables(rng, [0.3, 0.5, 0.7]), binary_tables(rng, [0.3, 0.6, 0.8])
    comparison = compare_predictors({"m": predictor}, reference, n_resamples=B)
    assert json.loads(json.dumps(comparison.model_dump()))["methods"]["m"]["n_families"] == 3


# ---------------------------------------------------------------- choosing the best predictor


def test_best_method_and_difference_interval():
    rng = np.random.default_rng(6)
    accuracies = [0.15, 0.3, 0.45, 0.6, 0.75, 0.9]
    reference = binary_tables(rng, accuracies, n_rows=(200, 200))
    right = binary_tables(rng, accuracies, n_rows=(200, 200))  # same true order, its own noise
    backwards = binary_tables(rng, accuracies[::-1], n_rows=(200, 200))
    result = compare_predictors({"backwards": backwards, "right": right}, reference, n_resamples=B)
    assert result.best == "right"  # not merely the first in the dict
    assert result.methods["right"].tau_b.value > 0.6 > -0.6 > result.methods["backwards"].tau_b.value
    gap = result.tau_difference["backwards"]
    assert gap.value == pytest.approx(result.methods["right"].tau_b.value - result.methods["backwards"].tau_b.value)
    assert gap.ci_low > 0  # the choice of "right" is not chance
    assert list(result.tau_difference) == ["backwards"]
    # a method equal to the reference ties the difference on every shared draw
    exact = compare_predictors({"exact": reference, "reversed": [t[::-1] for t in reference]}, reference, n_resamples=B)
    assert exact.best == "exact"
    assert exact.tau_difference["reversed"].model_dump() == {"value": 2.0, "ci_low": 2.0, "ci_high": 2.0}


def test_rank_agreement_matches_its_entry_in_a_comparison():
    # the row draws depend only on the seed and the tasks' row counts, so adding methods does not
    # change a method's interval
    rng = np.random.default_rng(7)
    predictor, other, reference = (binary_tables(rng, rng.random(5)) for _ in range(3))
    alone = rank_agreement(predictor, reference, n_resamples=B, seed=3)
    together = compare_predictors({"other": other, "p": predictor}, reference, n_resamples=B, seed=3)
    assert together.methods["p"] == alone


def test_tied_best_goes_to_the_first_method():
    reference = exact_tables([0.1, 0.4, 0.7])
    result = compare_predictors({"first": reference, "second": reference}, reference, n_resamples=20)
    assert result.best == "first"
    assert result.tau_difference["second"].model_dump() == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0}


# ---------------------------------------------------------------- undefined values


def test_undefined_statistics_are_none():
    one_family = rank_agreement(exact_tables([0.5]), exact_tables([0.7]), n_resamples=20)
    assert one_family.tau_b.model_dump() == {"value": None, "ci_low": None, "ci_high": None}
    constant = rank_agreement(exact_tables([0.5, 0.5, 0.5]), exact_tables([0.2, 0.5, 0.7]), n_resamples=20)
    assert constant.tau_b.value is None and constant.spearman.value is None
    one_cell = method_agreement([np.ones(5)], [np.zeros(5)], ["t"], n_resamples=20)
    assert one_cell.pearson.value is None and one_cell.n_cells == 1
    nothing = compare_predictors({"a": exact_tables([0.5, 0.5])}, exact_tables([0.1, 0.9]), n_resamples=20)
    assert nothing.best is None and nothing.tau_difference == {}


def test_resamples_where_tau_is_undefined_are_left_out():
    # two families that differ on one row of five: some resamples tie them (tau undefined); the
    # interval comes from the others and so stays at 1
    predictor = [np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=float)]
    result = rank_agreement(predictor, predictor, n_resamples=B)
    assert result.tau_b.model_dump() == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: paired_difference(np.ones(5), np.ones(4)), "same rows, got 5 and 4"),
        (lambda: paired_difference([], []), "non-empty 1-D"),
        (lambda: paired_difference([1.0, np.nan], [1.0, 0.0]), "NaN"),
        (lambda: paired_difference(np.ones(3), np.ones(3), n_resamples=0), "at least 1"),
        (lambda: rank_agreement([np.ones((3, 5))], [np.ones((4, 5))]), r"reference has \(4, 5\)"),
        (lambda: rank_agreement([np.ones((3, 5))], [np.ones((3, 6))]), "same benchmark rows"),
        (lambda: rank_agreement([np.ones((3, 5))] * 2, [np.ones((3, 5))]), "2 tasks but the reference has 1"),
        (lambda: rank_agreement([np.ones(5)], [np.ones(5)]), "2-D"),
        (lambda: rank_agreement([], []), "no tasks"),
        (lambda: rank_agreement([np.ones((3, 5)), np.ones((2, 5))], [np.ones((3, 5))] * 2), "task 1 has 2 families"),
        (lambda: compare_predictors({}, [np.ones((3, 5))]), "no methods"),
        (lambda: compare_predictors({"lora": [np.ones((2, 5))]}, [np.ones((3, 5))]), "predictor 'lora' task 0"),
        (lambda: method_agreement([np.ones(5)], [np.ones(5)] * 2, ["t"]), "1 x cells, 2 y cells"),
        (lambda: method_agreement([np.ones(5), np.ones(6)], [np.ones(5), np.ones(6)], ["t", "t"]), "task 't'"),
        (lambda: method_agreement([np.ones(5)], [np.ones(4)], ["t"]), "same rows"),
    ],
)
def test_shape_errors_name_the_problem_and_the_fix(call, message):
    with pytest.raises(SoftevalError, match=message) as error:
        call()
    assert ": " in str(error.value) and "\n" not in str(error.value)  # problem: fix, on one line


# ---------------------------------------------------------------- coverage


def test_paired_difference_interval_covers_the_true_difference():
    # 400 datasets: the Monte Carlo standard error of a 95% coverage is about 0.011, and the
    # percentile bootstrap of a mean over 150 rows covers about 0.94-0.95 (0.94-0.96 over six
    # simulation seeds); [0.90, 0.99] is about 4 standard errors either side, so a correct
    # interval passes and a clearly too narrow (e.g. 80%) or too wide one fails
    rng = np.random.default_rng(11)
    hits = 0
    for i in range(400):
        u = rng.random(150)
        a = (u < 0.6).astype(float)  # correlated with b through u, as two methods on one row are
        b = ((u + 0.3 * rng.random(150)) % 1 < 0.5).astype(float)
        result = paired_difference(a, b, n_resamples=500, seed=i)
        hits += result.ci_low <= 0.1 <= result.ci_high  # P(a) - P(b) = 0.6 - 0.5
    assert 0.90 <= hits / 400 <= 0.99


def test_rank_agreement_interval_covers_the_true_tau():
    # Five families whose true scores are E[sigmoid(ability - difficulty)] over row difficulties
    # shared by every model on a row, so the true order is the order of abilities and the true
    # tau-b (0.6: two adjacent swaps) is known exactly. Abilities 0.15 apart on the logit scale
    # make swaps in the sample common. Tau over five families takes a few discrete values, so the
    # percentile interval is closed on that lattice and is conservative here: simulations gave
    # 0.97-1.00 over seeds. The band's lower end, 0.90, is 0.95 less about 3 Monte Carlo
    # standard errors (200 datasets); no upper end, because conservative is expected.
    # Caveat (see the rank_agreement docstring): with a true tau of +-1 and close families the
    # plug-in tau is biased toward 0 and this interval undercovers.
    rng = np.random.default_rng(12)
    abilities = 0.15 * np.arange(5)
    ref_abilities = abilities[[1, 0, 3, 2, 4]]
    true_tau = 0.6
    hits = 0
    for i in range(200):
        predictor, reference = [], []
        for n_rows in (150, 150):
            difficulty = rng.normal(size=n_rows)
            for out, ability in ((predictor, abilities), (reference, ref_abilities)):
                p = 1 / (1 + np.exp(difficulty[None, :] - ability[:, None]))
                out.append((rng.random(p.shape) < p).astype(float))
        tau = rank_agreement(predictor, reference, n_resamples=500, seed=i).tau_b
        hits += tau.ci_low is not None and tau.ci_low <= true_tau <= tau.ci_high
    assert hits / 200 >= 0.90


# --- what paired rows can detect -----------------------------------------------------------------


def test_rows_needed_reach_their_power_in_simulation():
    """Paired 0/1 outcomes with a known effect: at the rows the formula asks for, a two-sided
    paired z-test detects the effect in about 80% of simulated studies."""
    from scipy.stats import norm

    from softeval.analysis.stats import paired_power

    rng = np.random.default_rng(0)
    p_a, p_b = 0.55, 0.45  # independent rows: the per-row difference has mean 0.1
    pilot = (rng.random(100_000) < p_a).astype(float) - (rng.random(100_000) < p_b)
    detectable, needed = paired_power(pilot)
    sd = pilot.std(ddof=1)
    assert needed == pytest.approx(((norm.ppf(0.975) + norm.ppf(0.8)) * sd / 0.1) ** 2, rel=0.03)
    studies = 4000
    diffs = (rng.random((studies, needed)) < p_a).astype(float) - (rng.random((studies, needed)) < p_b)
    z = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / np.sqrt(needed))
    assert np.mean(np.abs(z) > norm.ppf(0.975)) == pytest.approx(0.8, abs=0.03)
    # and the detectable difference at those rows is the effect itself
    assert paired_power(pilot[:needed])[0] == pytest.approx(0.1, rel=0.1)
    assert detectable < 0.01  # 100,000 rows detect far less


def test_no_spread_or_no_difference_has_no_rows_needed():
    from softeval.analysis.stats import paired_power

    assert paired_power(np.zeros(50)) == (None, None)
    detectable, needed = paired_power(np.array([1.0, -1.0] * 25))
    assert detectable is not None and needed is None


def test_holm_adjusts_as_the_textbook_example():
    from softeval.analysis.stats import holm

    # p = 0.01, 0.04, 0.03, 0.005 (m = 4): sorted 0.005, 0.01, 0.03, 0.04 -> 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, None, 0.03, 0.005]) == pytest.approx([0.03, 0.06, None, 0.06, 0.02])


def test_the_bootstrap_p_value_is_below_5_percent_where_the_interval_excludes_0():
    from softeval.analysis.stats import paired_difference

    rng = np.random.default_rng(1)
    for shift in (0.0, 0.05, 0.1, 0.2):
        a, b = (rng.random(150) < 0.5 + shift).astype(float), (rng.random(150) < 0.5).astype(float)
        d = paired_difference(a, b)
        assert (d.p_value < 0.05) == d.excludes_zero or abs(d.p_value - 0.05) < 0.01


def test_the_p_values_of_agreements_test_the_bound_their_findings_use():
    """Pearson r against 0.5 (soft prompt vs LoRA) and tau differences against 0 (the ranking):
    below 5% about where the interval excludes the bound, from the same resamples."""
    rng = np.random.default_rng(4)
    x = [rng.random(80) < p for p in np.linspace(0.2, 0.8, 8)]
    close = [np.where(rng.random(80) < 0.9, xi, ~xi) for xi in x]  # y follows x closely: r far above 0.5
    agreement = method_agreement(x, close, ["t"] * 8, n_resamples=1000, against=0.5)
    assert agreement.pearson.ci_low > 0.5 and agreement.pearson_p < 0.05 and agreement.against == 0.5
    noise = [rng.random(80) < 0.5 for _ in range(8)]
    unrelated = method_agreement(x, noise, ["t"] * 8, n_resamples=1000, against=0.5)
    assert unrelated.pearson_p > 0.05 or unrelated.pearson.ci_high < 0.5
    reference = [np.stack([rng.random(60) < p for p in np.linspace(0.2, 0.8, 5)]).astype(float)]
    comparison = compare_predictors({"good": [reference[0].copy()], "poor": [np.roll(reference[0], 2, axis=0)]}, reference, n_resamples=500)
    d, p = comparison.tau_pairwise["good - poor"], comparison.tau_pairwise_p["good - poor"]
    assert (p < 0.05) == (d.ci_low > 0 or d.ci_high < 0) and p == comparison.tau_pairwise_p["poor - good"]


def test_p_values_beyond_every_resample_stay_apart_so_holm_can_confirm_clear_effects():
    """A share of B resamples cannot go below 1 / (B + 1); where none reaches the null, the p-value
    is the normal tail, so that 300 clear findings survive Holm's adjustment and weaker ones order."""
    from scipy.stats import norm

    from softeval.analysis.stats import bootstrap_p_value, holm

    rng = np.random.default_rng(3)
    boot = rng.normal(0.3, 0.05, size=2000)  # z = 6: no resample reaches 0
    p = bootstrap_p_value(boot)
    assert p == pytest.approx(2 * norm.sf(boot.mean() / boot.std(ddof=1))) and p < 1e-8
    assert bootstrap_p_value(rng.normal(0.2, 0.05, size=2000)) > p  # z = 4: further from the floor, still apart
    assert holm([p] * 300)[0] < 0.05 and 300 * 2 / 2001 > 0.05  # what the floor alone would give
    # where resamples do reach the null, the share is the p-value, as before
    near = rng.normal(0.1, 0.05, size=2000)
    k = min(np.sum(near <= 0), np.sum(near >= 0))
    assert k > 0 and bootstrap_p_value(near) == pytest.approx(2 * (k + 1) / 2001)
    assert bootstrap_p_value(np.full(50, 0.4)) == 0.0 and bootstrap_p_value(np.full(50, 0.0)) == 1.0


def test_a_tail_share_counts_defined_resamples_on_its_side():
    from softeval.analysis.stats import tail_share

    resampled = np.array([0.1, 0.2, 0.3, 0.3, np.nan, np.nan])
    assert tail_share(resampled, 0.2, above=True) == pytest.approx(4 / 5)  # 0.2, 0.3, 0.3 of 4 defined, as (k + 1) / (B + 1)
    assert tail_share(resampled, 0.2, above=True, strict=True) == pytest.approx(3 / 5)  # beyond it only
    assert tail_share(resampled, 0.2, above=False) == pytest.approx(3 / 5)
    # none at or below 0: the normal tail below 0, at most 1 / (B + 1)
    tail = tail_share(np.array([0.1, 0.2, 0.3, 0.3]), 0.0, above=False)
    assert 0 < tail < 1 / 5


def test_kendall_tau_b_by_sorting_counts_the_pairs_every_pair_comparison_counts():
    """Hundreds of checkpoints: tau-b counts pairs by sorting, and must give the value the pair by
    pair count gives, bit for bit, ties in x, in y and in both included, and scipy's."""
    rng = np.random.default_rng(2)
    for n in (2, 3, 63, 64, 150):
        for levels in (1, 2, 7, 10**7):  # one level: every value tied
            x, y = rng.integers(0, levels, size=(2, 30, n)) / levels
            by_pairs, by_sorting = stats._pair_counts(x, y), stats._sorted_counts(x, y)
            assert all(np.array_equal(a, b) for a, b in zip(by_pairs, by_sorting)), (n, levels)
            tau = stats.kendall_tau_b(x, y)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = np.array([kendalltau(a, b).statistic for a, b in zip(x, y)])
            np.testing.assert_allclose(tau, expected, rtol=0, atol=1e-12)
