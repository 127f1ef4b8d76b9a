"""Predictors compared: decision accuracy of every (method, metric) on the same row draws,
against hand-computed tables, its paired differences, checkpoint averaging and signal to noise."""

from __future__ import annotations

import numpy as np
import pytest

from softeval.analysis.decisions import averaged, compare_decisions, decision_accuracies, decision_difference, signal_to_noise
from softeval.analysis.series import decision_accuracy

ROWS = 200


def table(*means: float, seed: int = 0, continuous: bool = False) -> np.ndarray:
    """(checkpoints, ROWS) per-row values with exactly these means: 0/1 outcomes, or continuous
    values (a fixed noise around each mean, so rows vary)."""
    rng = np.random.default_rng(seed)
    if continuous:
        noise = rng.normal(size=ROWS)
        noise -= noise.mean()
        return np.stack([m + 0.1 * noise for m in means])
    return np.stack([rng.permutation(np.arange(ROWS) < round(m * ROWS)).astype(float) for m in means])


def test_vectorised_decision_accuracy_is_the_pairwise_definition():
    rng = np.random.default_rng(0)
    for _ in range(200):
        scores, target = rng.integers(0, 4, size=(2, 5)) / 4  # ties in both
        expected = decision_accuracy(scores, target)
        got = decision_accuracies(scores, target)
        assert (np.isnan(got) and expected is None) or got == pytest.approx(expected)
    # along trailing axes at once, as the resamples are: (recipes, budgets, resamples) against (recipes, 1, resamples)
    scores, target = rng.integers(0, 4, size=(6, 3, 50)) / 4, rng.integers(0, 3, size=(6, 1, 50)) / 2
    got = decision_accuracies(scores, target)
    for b, r in np.ndindex(3, 50):
        expected = decision_accuracy(scores[:, b, r], target[:, 0, r])
        assert (np.isnan(got[b, r]) and expected is None) or got[b, r] == pytest.approx(expected)


def test_decision_accuracy_per_budget_mean_and_earliest_by_hand():
    # three recipes, three checkpoints each; the target orders them a < b < c
    target = np.stack([table(0.2)[0], table(0.5)[0], table(0.8)[0]])
    right_late = [table(0.5, 0.2, 0.1), table(0.4, 0.5, 0.5), table(0.3, 0.6, 0.7)]  # all three pairs reversed, then right
    right_early = [table(0.1, 0.1, 0.1), table(0.2, 0.3, 0.4), table(0.3, 0.5, 0.6)]  # right from the start
    checkpoints = [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
    compared = compare_decisions({"late": right_late, "early": right_early}, checkpoints, target, threshold=0.8, n_resamples=300)
    late, early = compared["predictors"]["late"], compared["predictors"]["early"]
    assert [b["value"] for b in late["decision_accuracy"]] == [0.0, 1.0, 1.0]
    assert [b["value"] for b in early["decision_accuracy"]] == [1.0, 1.0, 1.0]
    assert (late["mean"]["value"], early["mean"]["value"]) == (pytest.approx(2 / 3), 1.0)
    assert (late["earliest"], early["earliest"]) == (1, 0)
    difference = decision_difference(compared, "early", ["late"])
    assert [d["value"] for d in difference["per_budget"]] == [1.0, 0.0, 0.0]
    assert difference["mean"]["value"] == pytest.approx(1 / 3)
    # the averaged variant scores checkpoint k by the mean of checkpoints up to k (at most 3)
    averaged_late = compared["predictors"]["late (mean of last 3)"]
    expected = [decision_accuracy([t[: k + 1].mean() for t in right_late], target.mean(axis=1)) for k in range(3)]
    assert [b["value"] for b in averaged_late["decision_accuracy"]] == pytest.approx(expected)


def test_a_predictor_against_itself_differs_by_exactly_zero_and_paired_intervals_are_narrower():
    target = np.stack([table(m, seed=9)[0] for m in (0.3, 0.4, 0.5, 0.6)])
    noisy = [table(a, b, seed=s) for s, (a, b) in enumerate([(0.32, 0.35), (0.36, 0.41), (0.45, 0.49), (0.50, 0.58)])]
    compared = compare_decisions({"x": noisy, "y": [t.copy() for t in noisy]}, [[0] * 4, [1] * 4], target, threshold=0.8, n_resamples=500)
    same = decision_difference(compared, "x", ["y"])
    assert same["mean"] == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0} and same["verdict"] == "no difference shown"


def test_the_best_of_several_is_shown_as_it_is_against_one_and_more_candidates_only_change_the_verdict():
    """The comparison shown holds the best fixed, so it is the same among 3 candidates as against
    the best alone; the verdict weighs every candidate."""
    target = np.stack([table(m, seed=9)[0] for m in (0.3, 0.4, 0.5, 0.6)])
    noisy = {f"p{k}": [table(a + 0.01 * k, b, seed=10 * k + s) for s, (a, b) in enumerate([(0.32, 0.35), (0.36, 0.41), (0.45, 0.49), (0.50, 0.58)])]
             for k in range(4)}
    compared = compare_decisions(noisy, [[0] * 4, [1] * 4], target, threshold=0.8, n_resamples=400)
    means = {name: compared["predictors"][name]["mean"]["value"] for name in noisy}
    among = decision_difference(compared, "p0", ["p1", "p2", "p3"])
    best = max(["p1", "p2", "p3"], key=means.__getitem__)
    alone = decision_difference(compared, "p0", [best])
    assert among["second"] == best and among["mean"] == alone["mean"] and among["per_budget"] == alone["per_budget"]
    assert among["mean"]["value"] == pytest.approx(means["p0"] - means[best])
    assert among["against"][best] == alone["against"][best] and set(among["against"]) == {"p1", "p2", "p3"}


def recipes(*finals: float, seed: int = 0) -> list[np.ndarray]:
    """One (2 checkpoints, ROWS) table per recipe, its score at both checkpoints as given."""
    return [table(f, f, seed=seed + r) for r, f in enumerate(finals)]


def test_better_needs_every_candidate_beaten_and_worse_one_candidate_after_holm():
    from softeval.analysis.stats import holm

    target = np.stack([table(m, seed=9)[0] for m in (0.2, 0.4, 0.6, 0.8)])
    right = recipes(0.2, 0.4, 0.6, 0.8)  # orders every pair as the target does
    wrong = recipes(0.8, 0.6, 0.4, 0.2, seed=20)  # orders every pair the other way
    compared = compare_decisions({"right": right, "wrong": wrong, "wrong too": recipes(0.7, 0.6, 0.4, 0.3, seed=30),
                                  "right too": recipes(0.2, 0.4, 0.6, 0.8, seed=40)}, [[0] * 4, [1] * 4], target, threshold=0.8, n_resamples=400)
    assert decision_difference(compared, "right", ["wrong", "wrong too"])["verdict"] == "better"
    # as good as one candidate: not better than each
    tied = decision_difference(compared, "right", ["wrong", "wrong too", "right too"])
    assert tied["verdict"] == "no difference shown" and tied["second"] == "right too"
    worse = decision_difference(compared, "wrong", ["right", "wrong too"])
    against = worse["against"]
    assert worse["verdict"] == "worse" and worse["decided_by"] == "right"
    assert holm([against["right"]["p_value"], against["wrong too"]["p_value"]])[0] < 0.05  # the rule: Holm over the candidates
    assert worse["p_value"] == against["right"]["p_value"]  # reported unadjusted: a study's findings are adjusted together


def difference(value: float, low: float, high: float, p: float) -> dict:
    return {"mean": {"value": value, "ci_low": low, "ci_high": high}, "p_value": p}


def test_the_p_value_of_each_verdict_tests_what_the_verdict_says():
    from softeval.analysis.decisions import _verdict_among

    # ten candidates each a little higher: Holm over ten leaves none, and "better" is as far as it can be
    ten = {f"c{k}": difference(-0.1, -0.18, -0.02, 0.01) for k in range(10)}
    assert _verdict_among(ten) == ("no difference shown", 1.0, None)
    # better than one, worse than another: neither shown, and the p-value of "better" counts the higher one as 1
    mixed = {"a": difference(0.1, 0.02, 0.18, 0.03), "b": difference(-0.1, -0.18, -0.02, 0.03)}
    assert _verdict_among(mixed) == ("no difference shown", 1.0, None)
    # better than both: the intersection-union test's p-value is the larger
    assert _verdict_among({"a": difference(0.1, 0.02, 0.18, 0.03), "b": difference(0.2, 0.1, 0.3, 0.001)}) == ("better", 0.03, None)
    # worse, decided by a tight candidate that is not the best by its mean
    worse = _verdict_among({"best": difference(-0.05, -0.15, 0.05, 0.4), "tight": difference(-0.04, -0.06, -0.02, 0.001)})
    assert worse == ("worse", 0.001, "tight")
    assert _verdict_among({}) == ("no difference shown", None, None)



def test_continuous_values_decide_where_their_means_order_the_recipes():
    target = np.stack([table(m)[0] for m in (0.2, 0.4, 0.6)])
    bpb = [-table(1.4, 1.2, seed=r, continuous=True) + r * 0.05 for r in range(3)]  # negated bits per byte: higher is better
    compared = compare_decisions({"bpb": bpb}, [[0, 0, 0], [1, 1, 1]], target, threshold=0.8, n_resamples=200)
    assert [b["value"] for b in compared["predictors"]["bpb"]["decision_accuracy"]] == [1.0, 1.0]


def test_averaged_checkpoints_are_running_means():
    t = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    assert averaged(t, 2).tolist() == [[0.0, 1.0], [0.5, 1.0], [1.0, 0.5], [0.5, 0.0]]
    assert averaged(t, 3)[3].tolist() == pytest.approx([2 / 3, 1 / 3])


def test_signal_to_noise_as_heineman_et_al_define_it():
    curves = [np.array([0.30, 0.40, 0.38, 0.42]), np.array([0.50, 0.55, 0.60, 0.58])]
    finals = np.array([0.42, 0.58])
    signal = (finals.max() - finals.min()) / finals.mean()
    noise = np.mean([np.std(c[-3:], ddof=1) / np.mean(c[-3:]) for c in curves])
    assert signal_to_noise(curves) == pytest.approx(signal / noise)
    assert signal_to_noise([np.array([0.3, 0.3, 0.3]), np.array([0.5, 0.5, 0.5])]) is None  # no noise to divide by
    assert signal_to_noise([np.array([0.3])]) is None


def test_against_no_defined_candidate_there_is_no_comparison():
    target = np.stack([table(m, seed=9)[0] for m in (0.2, 0.8)])
    compared = compare_decisions({"x": recipes(0.2, 0.8), "y": recipes(0.3, 0.7, seed=5)}, [[0] * 2, [1] * 2], target, threshold=0.8, n_resamples=100)
    assert decision_difference(compared, "x", []) is None and decision_difference(compared, "x", ["x"]) is None
    assert decision_difference(compared, "x", ["x", "y"])["among"] == 1  # the predictor itself is no candidate
