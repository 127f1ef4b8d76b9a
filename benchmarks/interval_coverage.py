"""Which bootstrap interval to give a rank or decision statistic: a coverage simulation with a
known truth.

The analysis resamples benchmark rows and recomputes a statistic of the checkpoints' (or
recipes') mean scores: Kendall tau-b against true knowledge, decision accuracy against a target.
Resampling rows adds noise to every mean, so the resampled statistic is pulled towards 0 (a
rank statistic of noisier means agrees less) and its percentile interval can lie beside the
estimate. Each interval rule is scored here on data whose truth is set: checkpoints (or recipes)
with a latent ability, rows of varied difficulty, per-row outcomes drawn from both; the
statistic's true value is that of the expected scores. For each rule it prints the share of
simulations whose interval holds the true value (coverage, aiming at 95%), the share whose
interval excludes its own estimate, and the mean width.

    python benchmarks/interval_coverage.py --simulations 400

Rules: the percentile interval (inverted CDF: each bound a value some resample took); BCa (bias
corrected and accelerated, Efron 1987: the bias from the share of resamples below the estimate,
the acceleration from the leave-one-row-out jackknife); and each of them widened to take in its
estimate where it falls outside.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy.special import expit
from scipy.stats import norm

from softeval.analysis.series import decision_accuracy
from softeval.analysis.stats import CONFIDENCE, kendall_tau_b


def percentile(boot: np.ndarray, alphas=((1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2)) -> tuple[float, float]:
    defined = boot[np.isfinite(boot)]
    low, high = np.quantile(defined, list(alphas), method="inverted_cdf")
    return float(low), float(high)


def bca(value: float, boot: np.ndarray, jackknife: np.ndarray) -> tuple[float, float]:
    """Efron's BCa interval; the bias counts a resample equal to the estimate as half below it."""
    defined, jack = boot[np.isfinite(boot)], jackknife[np.isfinite(jackknife)]
    below = (np.sum(defined < value) + 0.5 * np.sum(defined == value)) / defined.size
    z0 = norm.ppf(np.clip(below, 1 / (2 * defined.size), 1 - 1 / (2 * defined.size)))
    spread = jack.mean() - jack
    denominator = 6 * np.sum(spread**2) ** 1.5
    a = np.sum(spread**3) / denominator if denominator > 0 else 0.0
    z = norm.ppf([(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    alphas = norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    return percentile(defined, np.clip(alphas, 0, 1))


def widened(interval: tuple[float, float], value: float) -> tuple[float, float]:
    return min(interval[0], value), max(interval[1], value)


RULES = ("percentile", "bca", "percentile+estimate", "bca+estimate")


def intervals(value: float, boot: np.ndarray, jackknife: np.ndarray) -> dict[str, tuple[float, float]]:
    p, b = percentile(boot), bca(value, boot, jackknife)
    return {"percentile": p, "bca": b, "percentile+estimate": widened(p, value), "bca+estimate": widened(b, value)}


def leave_one_out_means(table: np.ndarray) -> np.ndarray:
    """(rows, lines): each line's mean without each row."""
    n = table.shape[1]
    return ((table.sum(axis=1)[None, :] - table.T) / (n - 1))


def truth_case(rng: np.random.Generator, checkpoints: int, rows: int, resamples: int, spread: float = 1.0, continuous: bool = False) -> dict:
    """Kendall tau-b of the checkpoints' scores against their share of known facts: task accuracy
    (knows it and keeps the format), or with `continuous` a likelihood-like score (the gold
    answer's probability, noisy per row); `spread` sets how far apart the checkpoints are."""
    ability = spread * np.sort(rng.normal(0, 1, checkpoints)) + rng.normal(0, 0.4 * spread, checkpoints)
    share = rng.uniform(0.05, 0.6, checkpoints)  # of what it knows, the share a checkpoint shows in the score
    difficulty = rng.normal(0, 1.2, rows)
    p_known = expit(ability[:, None] - difficulty[None, :])
    known = (rng.random((checkpoints, rows)) < p_known).astype(float)
    if continuous:  # the gold answer's probability: what it knows, scaled, with noise of mean 1 on each row
        scores = np.clip(p_known * share[:, None] * rng.uniform(0.5, 1.5, (checkpoints, rows)), 0, 1)
    else:  # task accuracy: knows it and keeps the format
        scores = known * (rng.random((checkpoints, rows)) < share[:, None])
    # the truth: the same statistic of the expected values, over the population of rows
    population = rng.normal(0, 1.2, 20000)
    expected_known = expit(ability[:, None] - population[None, :]).mean(axis=1)
    truth = float(kendall_tau_b(expected_known * share, expected_known))
    value = float(kendall_tau_b(scores.mean(axis=1), known.mean(axis=1)))
    draws = rng.integers(0, rows, size=(resamples, rows))
    boot = kendall_tau_b(scores[:, draws].mean(axis=2).T, known[:, draws].mean(axis=2).T)
    jack = kendall_tau_b(leave_one_out_means(scores), leave_one_out_means(known))
    return {"truth": truth, "value": value, "boot": boot, "jack": jack}


def decision_case(rng: np.random.Generator, recipes: int, rows: int, resamples: int) -> dict:
    """Decision accuracy of one budget's scores against a target that orders the recipes."""
    ability = rng.normal(0, 0.6, recipes)
    difficulty = rng.normal(0, 1.2, rows)
    p_score = expit(ability[:, None] - difficulty[None, :] - 1.0)
    target_ability = 1.5 * ability + rng.normal(0, 0.3, recipes)  # the target orders most pairs as the scores' expectations do
    p_target = expit(target_ability[:, None] - difficulty[None, :])
    scores = (rng.random((recipes, rows)) < p_score).astype(float)
    target = (rng.random((recipes, rows)) < p_target).astype(float)
    population = rng.normal(0, 1.2, 20000)
    truth = decision_accuracy(expit(ability[:, None] - population - 1.0).mean(axis=1), expit(target_ability[:, None] - population).mean(axis=1))
    value = decision_accuracy(scores.mean(axis=1), target.mean(axis=1))
    draws = rng.integers(0, rows, size=(resamples, rows))
    s_boot, t_boot = scores[:, draws].mean(axis=2), target[:, draws].mean(axis=2)
    boot = np.array([decision_accuracy(s_boot[:, b], t_boot[:, b]) for b in range(resamples)], dtype=float)
    s_jack, t_jack = leave_one_out_means(scores), leave_one_out_means(target)
    jack = np.array([decision_accuracy(s_jack[i], t_jack[i]) for i in range(rows)], dtype=float)
    return {"truth": truth, "value": value, "boot": boot, "jack": jack}


def mean_decision_case(rng: np.random.Generator, recipes: int, rows: int, resamples: int, budgets: int = 3, difference: bool = False) -> dict:
    """The mean decision accuracy over `budgets` budgets of a predictor (each recipe scored by its
    checkpoint at the budget, learning as it trains) against a target; with `difference`, that
    of one predictor minus another's (a noisier reading of the same checkpoints)."""
    ability = rng.normal(0, 0.6, recipes)
    growth = np.linspace(0.4, 1.0, budgets)  # each checkpoint's share of the recipe's final ability
    target_ability = 1.5 * ability + rng.normal(0, 0.3, recipes)
    difficulty = rng.normal(0, 1.2, rows)
    population = rng.normal(0, 1.2, 20000)

    def outcomes(scale: float, shift: float, d: np.ndarray) -> np.ndarray:  # (budgets, recipes, rows) of probabilities
        return expit(scale * (growth[:, None, None] * ability[None, :, None]) - d[None, None, :] - shift)

    readings = [(1.0, 1.0), (0.5, 2.0)] if difference else [(1.0, 1.0)]
    p_target = expit(target_ability[:, None] - difficulty[None, :])
    target = (rng.random(p_target.shape) < p_target).astype(float)
    expected_target = expit(target_ability[:, None] - population[None, :]).mean(axis=1)
    tables = [(rng.random((budgets, recipes, rows)) < outcomes(scale, shift, difficulty)).astype(float) for scale, shift in readings]
    expected = [outcomes(scale, shift, population).mean(axis=2) for scale, shift in readings]  # (budgets, recipes)

    def mean_accuracy(scores: np.ndarray, goal: np.ndarray) -> float:  # scores (budgets, recipes)
        return float(np.nanmean([decision_accuracy(scores[k], goal) if decision_accuracy(scores[k], goal) is not None else np.nan
                                 for k in range(budgets)]))

    def statistic(means: list[np.ndarray], goal: np.ndarray) -> float:
        values = [mean_accuracy(m, goal) for m in means]
        return values[0] - values[1] if difference else values[0]

    truth = statistic(expected, expected_target)
    value = statistic([t.mean(axis=2) for t in tables], target.mean(axis=1))
    draws = rng.integers(0, rows, size=(resamples, rows))
    boot = np.array([statistic([t[:, :, d].mean(axis=2) for t in tables], target[:, d].mean(axis=1)) for d in draws])
    keep = lambda i: np.arange(rows) != i  # noqa: E731
    jack = np.array([statistic([t[:, :, keep(i)].mean(axis=2) for t in tables], target[:, keep(i)].mean(axis=1)) for i in range(rows)])
    return {"truth": truth, "value": value, "boot": boot, "jack": jack}


def score(cases: list[dict]) -> dict[str, dict]:
    found = {}
    for rule in RULES:
        covered = excluded = 0
        widths = []
        for case in cases:
            low, high = intervals(case["value"], case["boot"], case["jack"])[rule]
            covered += low <= case["truth"] <= high
            excluded += not (low <= case["value"] <= high)
            widths.append(high - low)
        found[rule] = {"coverage": round(covered / len(cases), 3), "excludes_estimate": round(excluded / len(cases), 3),
                       "mean_width": round(float(np.mean(widths)), 3)}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulations", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    scenarios = {
        "truth tau, 10 checkpoints x 24 rows": lambda: truth_case(rng, 10, 24, args.resamples),
        "truth tau, 30 checkpoints x 160 rows": lambda: truth_case(rng, 30, 160, args.resamples),
        "truth tau, 30 close checkpoints x 24 rows": lambda: truth_case(rng, 30, 24, args.resamples, spread=0.3),
        "truth tau, continuous score, 30 close checkpoints x 24 rows": lambda: truth_case(rng, 30, 24, args.resamples, spread=0.3, continuous=True),
        "decision accuracy, 6 recipes x 24 rows": lambda: decision_case(rng, 6, 24, args.resamples),
        "decision accuracy, 6 recipes x 160 rows": lambda: decision_case(rng, 6, 160, args.resamples),
        "mean decision accuracy over 3 budgets, 6 recipes x 24 rows": lambda: mean_decision_case(rng, 6, 24, args.resamples),
        "mean decision accuracy over 3 budgets, 6 recipes x 160 rows": lambda: mean_decision_case(rng, 6, 160, args.resamples),
        "difference of two predictors' mean decision accuracy, 6 recipes x 160 rows":
            lambda: mean_decision_case(rng, 6, 160, args.resamples, difference=True),
    }
    results = {}
    for name, make in scenarios.items():
        cases = [case for case in (make() for _ in range(args.simulations))
                 if case["truth"] is not None and case["value"] is not None and np.isfinite(case["truth"]) and np.isfinite(case["value"])]
        results[name] = score(cases)
        print(f"{name} ({len(cases)} simulations):")
        for rule, figures in results[name].items():
            print(f"  {rule:<22} coverage {figures['coverage']:.3f}  excludes its estimate {figures['excludes_estimate']:.3f}  "
                  f"mean width {figures['mean_width']:.3f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
