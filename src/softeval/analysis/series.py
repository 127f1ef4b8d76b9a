"""Checkpoint series: which pre-training recipe is better, and from how many tokens can one tell?

A recipe is a series of checkpoints of one training run, each evaluated like any model. At a
token budget, each recipe is scored by its latest checkpoint within the budget. Decision accuracy
(DataDecide's definition) is the share of recipe pairs that those scores order as a target orders
them: the mean over pairs i < j of [s_i > s_j] == [t_i > t_j]. Its interval resamples benchmark
rows, the same draw for every recipe, checkpoint and the target (see `stats.py`). The earliest
budget a method decides from is the first from which its decision accuracy stays at or above a
threshold; the budget it is shown from, the first from which the interval's lower bound does.
Per recipe, the series' noise is the spread (standard deviation) of its last checkpoints'
scores, its monotonicity the Kendall tau of score against step, and a checkpoint is an outlier
when its neighbours' trend, interpolated at its tokens, lies outside its own interval.

Inputs are outcome tables: for a recipe, `(checkpoints, rows)` of 0/1 outcomes of one method and
metric on the rows every cell evaluated; the target is `(recipes, rows)`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

import numpy as np
from pydantic import BaseModel
from scipy.stats import kendalltau

from softeval.analysis.comparisons import cell_flags, cell_key, common_rows, derived, finished_cells, outcome_table, undermining
from softeval.analysis.decisions import compare_decisions, decision_accuracies, decision_difference
from softeval.analysis.stats import (
    CONFIDENCE,
    Estimate,
    kendall_tau_b,
    paired_difference,
    quantile_interval,
    resampled_means,
    resampled_p_value,
    scipy_point,
)
from softeval.errors import SoftevalError
from softeval.scoring import GOLD_METRICS, LOWER_IS_BETTER, SERIES_FILE, TRUTH_FILE
from softeval.tuning import METHODS

NOISE_CHECKPOINTS = 3  # a series' noise: the spread of its last this many checkpoints
TRUE_KNOWLEDGE_TAU = 0.5  # a method's scores order checkpoints by true knowledge where Kendall tau-b is above this
DECISION_THRESHOLD = 0.8  # a method decides from the budget its decision accuracy stays at or above this


class Budget(BaseModel):
    """A token (or step) budget: each recipe's checkpoint within it, and how well the scores there
    order the recipes as the target does."""

    budget: float
    checkpoints: list[int]  # per recipe, the index of its latest checkpoint within the budget
    decision_accuracy: Estimate


class RecipeNoise(BaseModel):
    noise: float | None  # standard deviation of the last NOISE_CHECKPOINTS scores
    monotonicity: float | None  # Kendall tau of score against checkpoint order
    outliers: list[int]  # indices of checkpoints that break their neighbours' trend


def decision_accuracy(scores: Sequence[float], target: Sequence[float]) -> float | None:
    """The share of recipe pairs i < j that the scores order as the target does, [s_i > s_j] ==
    [t_i > t_j]. Ties would make that depend on which recipe is named first, so a pair the
    target ties is left out, and a pair the scores tie counts half (a coin would order it); None
    where no pair is left."""
    agreements = []
    for i, j in combinations(range(len(scores)), 2):
        wanted = np.sign(target[i] - target[j])
        if wanted == 0:
            continue
        given = np.sign(scores[i] - scores[j])
        agreements.append(0.5 if given == 0 else float(given == wanted))
    return sum(agreements) / len(agreements) if agreements else None


def budgets(tokens: Sequence[Sequence[float]]) -> list[tuple[float, list[int]]]:
    """Every budget at which each recipe has a checkpoint: the recipes' checkpoint token counts, in
    order, each with the index of every recipe's latest checkpoint within it."""
    found = []
    for budget in sorted({t for series in tokens for t in series}):
        latest = [max((k for k, t in enumerate(series) if t <= budget), default=None) for series in tokens]
        if None not in latest:
            found.append((budget, latest))
    return found


def decisions(
    outcomes: Sequence[np.ndarray], tokens: Sequence[Sequence[float]], target: np.ndarray, *, n_resamples: int = 1000, seed: int = 0
) -> list[Budget]:
    """Decision accuracy at every budget, with its interval. `outcomes[r]` is recipe r's
    (checkpoints, rows) table; `target` the (recipes, rows) table the order should match."""
    target_means, target_boot = target.mean(axis=1), resampled_means(target, n_resamples, seed)  # (recipes,), (recipes, resamples)
    result = []
    for budget, latest in budgets(tokens):
        chosen = np.stack([outcomes[r][k] for r, k in enumerate(latest)])  # (recipes, rows)
        value = decision_accuracy(chosen.mean(axis=1), target_means)
        resampled = decision_accuracies(resampled_means(chosen, n_resamples, seed), target_boot)  # (resamples,), nan where undefined
        result.append(Budget(budget=budget, checkpoints=latest, decision_accuracy=quantile_interval(value, resampled)))
    return result


def earliest_decision(found: Sequence[Budget], threshold: float = DECISION_THRESHOLD, *, bound: str = "value") -> float | None:
    """The first budget from which decision accuracy stays at or above `threshold`; None if the
    last budget is below it. `bound="ci_low"` asks it of the interval's lower bound: the budget
    from which the rows show the decision, not only its estimate."""
    earliest = None
    for budget in reversed(found):
        value = getattr(budget.decision_accuracy, bound)
        if value is None or value < threshold:
            break
        earliest = budget.budget
    return earliest


def recipe_noise(outcomes: np.ndarray, tokens: Sequence[float], *, n_resamples: int = 1000, seed: int = 0) -> RecipeNoise:
    """A recipe's noise, monotonicity and outlier checkpoints, from its (checkpoints, rows) table."""
    scores = outcomes.mean(axis=1)
    last = scores[-NOISE_CHECKPOINTS:]
    noise = float(np.std(last, ddof=1)) if len(last) >= 2 else None
    monotonicity = None
    if len(scores) >= 2 and np.ptp(scores) > 0:
        monotonicity = float(kendalltau(np.arange(len(scores)), scores).statistic)
    return RecipeNoise(noise=noise, monotonicity=monotonicity, outliers=outliers(outcomes, tokens, n_resamples=n_resamples, seed=seed))


def outliers(outcomes: np.ndarray, tokens: Sequence[float], *, n_resamples: int = 1000, seed: int = 0) -> list[int]:
    """Checkpoints (not the first or last) that spike above or dip below both neighbours by more
    than the rows' noise allows: the difference between a checkpoint's score and the line through
    its neighbours' (in log tokens where all are positive: checkpoints are often spaced by
    doubling) has a bootstrap interval, the same row draws for all three, that excludes 0 at a
    level corrected for the number of checkpoints tested (Bonferroni). A wrongly uploaded
    checkpoint shows so. An outlier would make its neighbours look like outliers too, so the
    worst one is flagged and left out of its neighbours' trend, and so on."""
    scores = outcomes.mean(axis=1)
    boot = resampled_means(outcomes, n_resamples, seed)  # (checkpoints, resamples)
    where = np.log(np.asarray(tokens, dtype=float)) if all(t > 0 for t in tokens) else np.asarray(tokens, dtype=float)
    alpha = (1 - CONFIDENCE) / max(1, len(scores) - 2)
    kept, found = list(range(len(scores))), []
    while True:
        worst, worst_size = None, 0.0
        for before, k, after in zip(kept, kept[1:], kept[2:]):
            spike = np.sign(scores[k] - scores[before]) == np.sign(scores[k] - scores[after]) != 0
            share = (where[k] - where[before]) / (where[after] - where[before]) if where[after] != where[before] else 0.5
            gap = boot[k] - (boot[before] + share * (boot[after] - boot[before]))
            low, high = np.quantile(gap, [alpha / 2, 1 - alpha / 2])
            size = abs(float(gap.mean())) / (float(gap.std()) or 1.0)
            if spike and (low > 0 or high < 0) and size > worst_size:
                worst, worst_size = k, size
        if worst is None:
            return sorted(found)
        found.append(worst)
        kept.remove(worst)


def spread_over_noise(final_scores: Sequence[float], noises: Sequence[float | None]) -> float | None:
    """The spread of the recipes' final scores (largest minus smallest) over their mean noise (in
    the scores' own units: not Heineman et al.'s signal to noise, `decisions.signal_to_noise`,
    which divides relative spreads)."""
    known = [n for n in noises if n is not None]
    if len(final_scores) < 2 or not known or np.mean(known) == 0:
        return None
    return float((max(final_scores) - min(final_scores)) / np.mean(known))


# --- a folder's series ------------------------------------------------------------------------------

CURVE_METRICS = {"task_accuracy": "task_correct", "knowledge": "knowledge_correct", "format_following": "format_ok"}
# what a method's scores are read through when it predicts the better recipe: its accuracies and
# the gold answer's likelihood (continuous; bits per byte negated, so higher is better everywhere)
PREDICTOR_METRICS = {"task_accuracy": "task_correct", "knowledge": "knowledge_correct"} | {
    m: GOLD_METRICS[m] for m in ("prompt_knowledge", "gold_prob", "cloze_gold_prob", "gold_bpb", "cloze_gold_bpb")}
CONTINUOUS = ("gold_prob", "cloze_gold_prob", "gold_bpb", "cloze_gold_bpb")


def oriented_table(results: list, rows: list[int], metric: str) -> np.ndarray | None:
    """(cells, rows) values of a predictor metric, negated where lower is better; None where a
    cell lacks it on some row (a cell evaluated before the metric existed, or a task without it)."""
    field = PREDICTOR_METRICS[metric]
    if not all(result.rows.has(field, rows) for result in results):
        return None
    table = outcome_table(results, rows, field)
    return -table if metric in LOWER_IS_BETTER else table


def read_series(folder: Path) -> dict[str, dict]:
    """OUTPUT/series.json: per recipe, its checkpoints (model, step, tokens) and its reference (the
    post-trained model's name and the method and chat mode it is evaluated with), or None."""
    path = Path(folder) / SERIES_FILE
    if not path.is_file():
        raise SoftevalError(f"{path} not found; run a study that declares series: (pre-training recipes) into {folder} first")
    recorded = json.loads(path.read_text(encoding="utf-8"))
    # a folder written before references were recorded holds each recipe's checkpoints alone
    return {name: {"checkpoints": s, "reference": None} if isinstance(s, list) else s for name, s in recorded.items()}


TARGETS = ("reference", "last")


def budget_text(value: float | None, axis: str) -> str:
    """A budget as a reader reads it: 369K tokens, step 500; "never" for none."""
    if value is None:
        return "never"
    if axis != "tokens":
        return f"{axis} {value:g}"
    scale, unit = next(((s, u) for s, u in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")) if value >= s), (1, ""))
    return f"{value / scale:.3g}{unit} tokens"


def target_phrase(analysis: dict) -> str:
    """The target of an analysis in a few words, as findings name it."""
    target = analysis.get("target") or {}
    metric = target.get("metric", "task_accuracy")
    if target.get("kind") == "reference":
        first = next((ref for ref in (analysis.get("references") or {}).values() if ref), None)
        how = f"{first['method']}{' chat' if first.get('chat') else ''} " if first else ""
        return f"the references' {how}{metric}"
    return f"the last checkpoints' {target.get('method', 'soft-prompt')} {metric}"


def series_analysis(
    folder: Path, *, target: str | None = None, target_method: str | None = None, target_metric: str = "task_accuracy",
    threshold: float = DECISION_THRESHOLD, n_resamples: int = 1000, seed: int = 0,
) -> dict:
    """Every analysis of the recipes in OUTPUT/series.json, per task, over the folder's finished
    cells (plain mode; the methods every checkpoint of every recipe has): each recipe's curves,
    decision accuracy per method and budget against the target, the earliest decision per method,
    each recipe's noise, monotonicity and outliers, and the format gap per checkpoint.

    The target orders the recipes: "reference" is their declared post-trained models' score,
    evaluated as the study recorded; "last" their last checkpoints' `target_method` score. By
    default, the references where every recipe declares one, else the last checkpoints; and the
    target's method is the soft prompt, else the first of few-shot, zero-shot and LoRA that every
    checkpoint has cells of."""
    if target not in (None, *TARGETS):
        raise SoftevalError(f"unknown target '{target}'; choose reference (the recipes' post-trained models) or last (their last checkpoints)")
    folder = Path(folder)
    recorded = read_series(folder)
    if len(recorded) < 2:
        held = f" ({', '.join(recorded)})" if recorded else ""
        raise SoftevalError(f"{folder / SERIES_FILE} holds {len(recorded)} series{held}; comparing recipes needs at least 2: evaluate another "
                            "run's checkpoints into the folder (--model RUN_FOLDER, or series: in a study file)")
    references = {name: s["reference"] for name, s in recorded.items()}
    chosen = target is not None  # else re-chosen by each analysis, as references are declared
    target = target or ("reference" if all(references.values()) else "last")
    if target == "reference" and not all(references.values()):
        missing = next(name for name, ref in references.items() if not ref)
        raise SoftevalError(f"series '{missing}' declares no reference model; add reference: to its series in the study file, or use --target last")
    series = {name: s["checkpoints"] for name, s in recorded.items()}
    cells = {cell_key(r): r for r in finished_cells(folder)}
    method_chosen = target_method is not None
    # the last checkpoints' method: chosen, or the soft prompt's, else the first method present
    target_method, why = (target_method, None) if method_chosen or target == "reference" else default_target_method(series, cells)
    target_method = target_method or "soft-prompt"
    settings = {"kind": target, "chosen": chosen, "metric": target_metric, "method": target_method, "method_chosen": method_chosen}
    if why:
        settings["method_why"] = why
    if target == "reference":
        settings |= {"method": None, "models": {name: ref["model"] for name, ref in references.items()}}
    elif not chosen:  # why not the references
        lacking = [name for name, ref in references.items() if not ref]
        settings["why"] = f"series {', '.join(repr(n) for n in lacking)} declare{'s' if len(lacking) == 1 else ''} no reference model"
    analysis = {"target": settings, "threshold": threshold, "series": series, "references": references, "tasks": {}, "skipped": {}}
    truth = read_truth(folder)
    for task in sorted({key[1] for key in cells}):
        found = _task_analysis(series, references, target == "reference", cells, task, target_method, target_metric, threshold, n_resamples, seed)
        if isinstance(found, str):  # why the task has no analysis
            analysis["skipped"][task] = found
            continue
        if truth is not None and task in truth["tasks"]:
            found["truth"] = truth_agreement(series, cells, task, list(found["decisions"]), truth, n_resamples=n_resamples, seed=seed)
            if found["truth"]["missing"]:
                missing = found["truth"]["missing"]
                found["notes"].append(f"{TRUTH_FILE} has no entry for {len(missing)} checkpoint{'s' if len(missing) > 1 else ''} "
                                      f"({', '.join(missing)}): the agreement with true knowledge is over the other {found['truth']['checkpoints']}.")
        analysis["tasks"][task] = found
    if not analysis["tasks"]:
        wanted = "reference cells" if target == "reference" else f"{target_method} cells of every checkpoint"
        reasons = "; ".join(f"{task}: {why}" for task, why in analysis["skipped"].items())
        raise SoftevalError(f"no task in {folder} has the {wanted} of every series ({reasons or 'no finished cells'}); run the study's cells first")
    return analysis


TARGET_METHODS = ("soft-prompt", "few-shot", "zero-shot", "lora")  # the last checkpoints' target method, first present first


def default_target_method(series: dict, cells: dict) -> tuple[str, str | None]:
    """The target method where none is chosen: the soft prompt, else the first method that every
    checkpoint of every recipe has a finished cell of on some task; and why, where it is not the
    soft prompt."""
    tasks = sorted({key[1] for key in cells})
    covers = lambda method: any(all((p["model"], task, method, False) in cells for points in series.values() for p in points)  # noqa: E731
                                for task in tasks)
    method = next((m for m in TARGET_METHODS if covers(m)), TARGET_METHODS[0])
    if method == TARGET_METHODS[0]:
        return method, None
    return method, f"no task has soft-prompt cells of every checkpoint, so the target is the last checkpoints' {method} score"


def _task_analysis(series: dict, references: dict, by_reference: bool, cells: dict, task: str, target_method: str, target_metric: str,
                   threshold: float, n_resamples: int, seed: int) -> dict | str:
    """A task's analysis, or why it has none."""
    has = lambda method: all((p["model"], task, method, False) in cells for points in series.values() for p in points)  # noqa: E731
    methods = [m for m in METHODS if has(m)]
    if not methods:
        lacking = {m: next(p["model"] for points in series.values() for p in points if (p["model"], task, m, False) not in cells) for m in METHODS
                   if any(k[1:] == (task, m, False) for k in cells)}
        shown = ", ".join(f"{method} lacks {model}" for method, model in lacking.items())
        return f"no method has a finished cell on every checkpoint ({shown or 'none has any'})"
    if not by_reference:
        if target_method not in methods:
            return f"the target's method, {target_method}, has no finished cell on every last checkpoint; run it, or choose --target-method"
        target_cells = _last_cells(series, cells, task, target_method)
    else:
        keys = _reference_keys(references, task)
        missing = [key[0] for key in keys.values() if key not in cells]
        if missing:
            return f"the reference {missing[0]} has no finished cell on it; run the study's cells first"
        target_cells = {n: cells[key] for n, key in keys.items()}
    flagged = cell_flags(list(target_cells.values()), among=list(cells.values()))
    target_flags = {cell_key(c)[0]: undermining(flagged[id(c)], target_metric) for c in target_cells.values()}
    checkpoint_cells = [cells[(p["model"], task, m, False)] for points in series.values() for p in points for m in methods]
    rows = common_rows(checkpoint_cells + list(target_cells.values()))
    if len(rows) < 2:
        return f"fewer than 2 rows ({len(rows)}) were evaluated by every cell compared"
    names = list(series)
    axis = "tokens" if all(p["tokens"] is not None for points in series.values() for p in points) else "step"
    if axis == "step" and any(p["step"] is None for points in series.values() for p in points):
        axis = "checkpoint"
    x = [[p["tokens"] if axis == "tokens" else p["step"] if axis == "step" else k for k, p in enumerate(series[n])] for n in names]

    def table(name: str, method: str, metric: str) -> np.ndarray:
        return outcome_table([cells[(p["model"], task, method, False)] for p in series[name]], rows, CURVE_METRICS[metric])

    target = np.stack([outcome_table([target_cells[n]], rows, CURVE_METRICS[target_metric])[0] for n in names])
    found = {"rows": len(rows), "axis": axis, "x": dict(zip(names, x)), "target_scores": dict(zip(names, target.mean(axis=1).tolist())),
             "target_flags": {model: flags for model, flags in target_flags.items() if flags},
             "curves": {}, "decisions": {}, "earliest": {}, "earliest_shown": {}, "recipes": {}, "spread_over_noise": {}, "format_gap": {}}
    inputs = (np.asarray(rows).tobytes(), n_resamples, seed)  # what a cell's figures depend on besides its files

    def curve(name: str, method: str, metric: str) -> list[dict]:
        field, points = CURVE_METRICS[metric], []
        for p in series[name]:  # each checkpoint's point computed once, kept by its cell's files
            cell = cells[(p["model"], task, method, False)]
            points.append(derived([cell], ("curve", field, *inputs), lambda cell=cell: _point(outcome_table([cell], rows, field), n_resamples, seed)))
        return points

    def gap(pair: list) -> dict:  # the soft prompt's task accuracy minus the other method's, on the same rows
        soft, baseline = outcome_table(pair, rows, CURVE_METRICS["task_accuracy"])
        return paired_difference(soft, baseline, n_resamples=n_resamples, seed=seed).model_dump()

    def format_gap(name: str, other: str) -> list[dict]:
        pairs = [[cells[(p["model"], task, "soft-prompt", False)], cells[(p["model"], task, other, False)]] for p in series[name]]
        return [derived(pair, ("format_gap", *inputs), lambda pair=pair: gap(pair)) for pair in pairs]

    for method in methods:
        found["curves"][method] = {metric: {n: curve(n, method, metric) for n in names} for metric in CURVE_METRICS}
        scored = [table(n, method, target_metric) for n in names]
        budgets_found = decisions(scored, x, target, n_resamples=n_resamples, seed=seed)
        found["decisions"][method] = [b.model_dump() for b in budgets_found]
        found["earliest"][method] = earliest_decision(budgets_found, threshold)
        found["earliest_shown"][method] = earliest_decision(budgets_found, threshold, bound="ci_low")
        noises = {n: recipe_noise(t, xs, n_resamples=n_resamples, seed=seed) for n, t, xs in zip(names, scored, x)}
        found["recipes"][method] = {n: r.model_dump() for n, r in noises.items()}
        found["spread_over_noise"][method] = spread_over_noise([t[-1].mean() for t in scored], [r.noise for r in noises.values()])
    common = budgets(x)
    if common:
        found["predictors"] = _predictors(series, cells, task, methods, rows, [latest for _, latest in common], target, threshold, n_resamples, seed)
        found["predictors"]["budgets"] = [budget for budget, _ in common]
    found["notes"] = _notes(found, target_cells, rows, target_metric, threshold, first_budget=min(min(xs) for xs in x),
                            first_common=common[0][0] if common else None,
                            other_target=_other_target(series, references, by_reference, cells, task, methods))
    for other in ("zero-shot", "few-shot"):
        if "soft-prompt" in methods and other in methods:
            found["format_gap"][other] = {n: format_gap(n, other) for n in names}
    return found


def _predictors(series: dict, cells: dict, task: str, methods: list[str], rows: list[int], checkpoints: list[list[int]], target: np.ndarray,
                threshold: float, n_resamples: int, seed: int) -> dict:
    """Every (method, metric) predictor the cells hold, compared (see `decisions`), and the
    soft prompt's task accuracy against the best continuous proxy and the best predictor."""
    predictors = {}
    for method in methods:
        for metric in PREDICTOR_METRICS:
            tables = [oriented_table([cells[(p["model"], task, method, False)] for p in points], rows, metric) for points in series.values()]
            if all(t is not None for t in tables):
                predictors[f"{method} / {metric}"] = tables
    compared = compare_decisions(predictors, checkpoints, target, threshold=threshold, n_resamples=n_resamples, seed=seed)
    mean = lambda name: compared["predictors"][name]["mean"]["value"]  # noqa: E731
    ranked = sorted(compared["predictors"], key=lambda name: 1 if mean(name) is None else -mean(name))  # best first, n/a last
    soft = "soft-prompt / task_accuracy"
    differences = []
    defined = [name for name in ranked if mean(name) is not None]
    if soft in defined:
        # raw against raw: the soft prompt's own checkpoint-averaged variant is a predictor apart
        raw = [name for name in defined if name != soft and "(mean of last" not in name]
        proxies = [name for name in raw if name.split(" / ")[1] in CONTINUOUS]
        for among, is_proxy in ((proxies, True), (raw, False)):
            difference = decision_difference(compared, soft, among)
            if difference is not None:
                differences.append(difference | {"best_continuous": is_proxy})
    return {"results": compared["predictors"], "ranked": ranked, "differences": differences}


def read_truth(folder: Path) -> dict | None:
    """OUTPUT/ground_truth.json, where the study declared one: each model's known test facts (1 or
    0 per test row of the tasks it names)."""
    path = Path(folder) / TRUTH_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def truth_agreement(series: dict, cells: dict, task: str, methods: list[str], truth: dict, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """How well each method's scores order the checkpoints by what they truly know: per method and
    metric, Kendall tau-b between the checkpoints' scores and their shares of known facts, over
    every checkpoint the truth covers, on the rows every such cell evaluated; the interval
    resamples rows, the same draw for the scores and the truth."""
    points = [p["model"] for ps in series.values() for p in ps if p["model"] in truth["models"]]
    missing = [p["model"] for ps in series.values() for p in ps if p["model"] not in truth["models"]]
    keyed = {m: [cells[(p, task, m, False)] for p in points] for m in methods}
    rows = common_rows([c for group in keyed.values() for c in group])
    known = np.array([[truth["models"][p][i] for i in rows] for p in points], dtype=float)
    known_boot = resampled_means(known, n_resamples, seed)  # (checkpoints, resamples)
    tables = {}
    for method, group in keyed.items():
        for metric in dict.fromkeys([*CURVE_METRICS, *PREDICTOR_METRICS]):
            table = outcome_table(group, rows, CURVE_METRICS[metric]) if metric in CURVE_METRICS else oriented_table(group, rows, metric)
            if table is not None:
                tables[(method, metric)] = table
    # every predictor's resampled tau in one call: with hundreds of checkpoints, it sorts them once per resample
    boots = np.stack([resampled_means(table, n_resamples, seed).T for table in tables.values()]) if tables else np.empty((0, n_resamples, len(points)))
    resampled_taus = kendall_tau_b(boots, np.broadcast_to(known_boot.T, boots.shape))  # (predictors, resamples); nan where either side is constant
    agreement = {method: {} for method in keyed}
    for ((method, metric), table), resampled in zip(tables.items(), resampled_taus):
        value = scipy_point(kendalltau, table.mean(axis=1), known.mean(axis=1), variant="b")  # None where either side is constant
        agreement[method][metric] = quantile_interval(value, resampled).model_dump() | {"p_value": resampled_p_value(value, resampled, TRUE_KNOWLEDGE_TAU)}
    return {"checkpoints": len(points), "rows": len(rows), "known": dict(zip(points, known.mean(axis=1).tolist())), "agreement": agreement,
            "missing": missing}


def _other_target(series: dict, references: dict, by_reference: bool, cells: dict, task: str, methods: list[str]) -> dict | None:
    """The target of the other kind, where the folder has its cells: the last checkpoints'
    soft-prompt (else first method's) cells for a reference target; the references' cells, where
    every recipe declares one, for a "last" target."""
    if by_reference:
        method = "soft-prompt" if "soft-prompt" in methods else methods[0]
        return {"option": f"--target last --target-method {method}", "cells": _last_cells(series, cells, task, method)}
    keys = _reference_keys(references, task)
    if len(keys) < len(series) or any(key not in cells for key in keys.values()):
        return None
    return {"option": "--target reference", "cells": {n: cells[key] for n, key in keys.items()}}


def _last_cells(series: dict, cells: dict, task: str, method: str) -> dict:
    """Each recipe's last checkpoint's cell of `method` (plain mode)."""
    return {n: cells[(points[-1]["model"], task, method, False)] for n, points in series.items()}


def _reference_keys(references: dict, task: str) -> dict:
    """The cell key of each declared reference's target cell, as the study evaluates it."""
    return {n: (ref["model"], task, ref["method"], ref["chat"]) for n, ref in references.items() if ref}


def _separates(scores: Sequence[float]) -> bool:
    """Whether scores order at least one pair of recipes (not all equal)."""
    return len(set(scores)) > 1


def flagged_text(flags: dict[str, list[str]]) -> str:
    """Flagged cells as text: each model with its flags."""
    return "; ".join(f"{model}: {', '.join(marks)}" for model, marks in flags.items())


def _notes(found: dict, target_cells: dict, rows: list[int], metric: str, threshold: float, *, first_budget: float,
           first_common: float | None, other_target: dict | None) -> list[str]:
    """Why a figure of the task's analysis is n/a, means little (a flagged target) or a method never
    decides, and what in the folder would decide: one sentence each, for analysis.md and the
    report page."""
    notes = []
    if found["target_flags"]:
        notes.append(f"The target's cells are flagged ({flagged_text(found['target_flags'])}): the order it gives the recipes may be noise, so decision accuracy "
                     "against it means little, and the early-decision finding is undetermined.")
    target = found["target_scores"]
    shown = lambda scores: ", ".join(f"{n} {v:.2f}" for n, v in scores.items())  # noqa: E731
    means = lambda by_recipe, m: {n: float(outcome_table([c], rows, CURVE_METRICS[m])[0].mean()) for n, c in by_recipe.items()}  # noqa: E731
    pairs = list(combinations(target.values(), 2))
    tied = sum(a == b for a, b in pairs)
    if tied == len(pairs):
        suggestions = []
        for other in CURVE_METRICS:
            scores = means(target_cells, other)
            if other != metric and _separates(list(scores.values())):
                suggestions.append(f"--target-metric {other} ({shown(scores)})")
        if other_target is not None:
            scores = means(other_target["cells"], metric)
            if _separates(list(scores.values())):
                suggestions.append(f"{other_target['option']} ({shown(scores)})")
        fix = f"; the folder's cells would order them with {' or '.join(suggestions)}" if suggestions else \
            "; no other target in the folder orders them either: evaluate more rows, or later checkpoints"
        notes.append(f"Decision accuracy is n/a at every budget: the target's {metric} ties every pair of recipes ({shown(target)}){fix}.")
    elif tied:
        notes.append(f"The target ties {tied} of {len(pairs)} recipe pairs ({shown(target)}): decision accuracy counts the other {len(pairs) - tied}.")
    if first_common is not None and first_common > first_budget:
        notes.append(f"Budgets below {first_common:g} are left out: not every recipe has a checkpoint within them.")
    for method, budgets_found in found["decisions"].items():
        last = budgets_found[-1]["decision_accuracy"]["value"] if budgets_found else None
        if found["earliest"][method] is None and last is not None:
            notes.append(f"{method} decides from no budget: its decision accuracy at the last budget is {last:.2f}, below the threshold {threshold:g}.")
        recipes = found["recipes"][method]
        single = [name for name, r in recipes.items() if r["noise"] is None]
        flat = [name for name, r in recipes.items() if r["monotonicity"] is None and name not in single]
        if single:
            notes.append(f"{method}: noise and monotonicity are n/a for {', '.join(single)}: fewer than 2 checkpoints.")
        if flat:
            notes.append(f"{method}: monotonicity is n/a for {', '.join(flat)}: {metric} does not change across checkpoints.")
        if found["spread_over_noise"][method] is None:
            why = "no recipe has 2 checkpoints" if len(single) == len(recipes) else f"the recipes' last {NOISE_CHECKPOINTS} checkpoints do not vary (noise 0)"
            notes.append(f"{method}: spread over noise is n/a: {why}.")
    return notes


def _point(table: np.ndarray, n_resamples: int, seed: int) -> dict:
    """A checkpoint's score, from its (1, rows) table, with its 95% interval (rows resampled)."""
    return quantile_interval(float(table[0].mean()), resampled_means(table, n_resamples, seed)[0]).model_dump()
