"""Ranking prediction: do base models' scores under a method predict how their post-trained
versions rank? And do soft prompts and LoRA agree across cells?

Families come from OUTPUT/models.json (a study file declares each model's family and role). For
every method and metric, the base models' scores are compared with the post-trained models'
reference scores (by default task accuracy, zero-shot with the chat template) by Kendall tau-b and
Spearman rho; intervals resample benchmark rows jointly across models and methods (see `stats.py`),
so every model and method is scored on the same rows of each task.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rich.table import Table

from softeval._io import write_json_atomic, write_text_atomic
from softeval.errors import SoftevalError
from softeval.metrics import ROW_METRICS
from softeval.report import cell_key, common_rows, finished_cells, format_estimate, outcome_table, tuned_agreement
from softeval.stats import compare_predictors
from softeval.results import MODELS_FILE
from softeval.settings import METHODS, Reference

log = logging.getLogger("softeval")

MIN_FAMILIES = 3  # fewer families give no ranking worth a correlation
RANKED_METRICS = ROW_METRICS  # conditional accuracy is a ratio of two of them: not ranked


def families(folder: Path) -> dict[str, dict[str, str]]:
    """{family: {"base": model name, "post-trained": model name}} for the complete pairs in
    OUTPUT/models.json, in the order the models were declared."""
    path = Path(folder) / MODELS_FILE
    if not path.is_file():
        return {}
    pairs: dict[str, dict[str, str]] = {}
    for name, entry in json.loads(path.read_text(encoding="utf-8")).items():
        if entry.get("family") and entry.get("role"):
            pairs.setdefault(entry["family"], {})[entry["role"]] = name
    return {family: roles for family, roles in pairs.items() if len(roles) == 2}


def update_ranking(folder: Path, reference: Reference | None = None) -> dict | None:
    """Redo the ranking of a folder whose models form enough families, so it always reflects
    every finished cell; `reference` None keeps the reference of the folder's last ranking.
    Returns the analysis, or None where there is no ranking to make."""
    folder = Path(folder)
    if len(families(folder)) < MIN_FAMILIES:
        return None
    if reference is None and (folder / "ranking.json").is_file():
        reference = Reference(**json.loads((folder / "ranking.json").read_text(encoding="utf-8"))["reference"])
    try:
        return rank_study(folder, reference)
    except SoftevalError as exc:  # cells missing or stale: no ranking rather than an outdated one
        log.warning("no ranking: %s", exc)
        for name in ("ranking.json", "ranking.md"):
            (folder / name).unlink(missing_ok=True)
        return None


def rank_study(folder: Path, reference: Reference | None = None, *, n_resamples: int = 2000, seed: int = 0) -> dict:
    """The ranking analysis of an output folder; writes ranking.json and ranking.md there."""
    folder, reference = Path(folder), reference or Reference()
    if not folder.is_dir():
        raise SoftevalError(f"no results folder at {folder}; give the --output folder of softeval study or run")
    pairs = families(folder)
    if len(pairs) < MIN_FAMILIES:
        raise SoftevalError(
            f"ranking needs a base and a post-trained model in at least {MIN_FAMILIES} families; {folder / MODELS_FILE} "
            f"has {len(pairs)}; declare family and role for each model in a study file"
        )
    cells = {cell_key(r): r for r in finished_cells(folder)}
    base = [roles["base"] for roles in pairs.values()]
    post = [roles["post-trained"] for roles in pairs.values()]
    reference_cells = {m: (reference.method, reference.chat) for m in post}
    tasks = sorted({task for (model, task, *_rest) in cells if all((m, task, *reference_cells[m]) in cells for m in post)})
    methods = [m for m in METHODS if tasks and all((b, t, m, False) in cells for b in base for t in tasks)]
    if not tasks or not methods:
        raise SoftevalError(
            f"no task in {folder} has the reference cells ({reference.method}{' with chat' if reference.chat else ''}) of every "
            "post-trained model and one method's cells of every base model; run the study's missing cells first"
        )
    analysis = {
        "families": pairs,
        "reference": reference.model_dump(),
        "tasks": tasks,
        "by_metric": {},
    }
    # the rows every ranked cell of a task evaluated: every model and method is scored on them
    rows = {t: common_rows([cells[(b, t, m, False)] for b in base for m in methods] + [cells[(p, t, *reference_cells[p])] for p in post]) for t in tasks}
    if any(len(r) < 2 for r in rows.values()):
        raise SoftevalError("the cells to rank share fewer than 2 evaluated rows of a task; run them with the same --limit and --seed")
    for metric, field in RANKED_METRICS.items():
        predictors = {m: [outcome_table([cells[(b, t, m, False)] for b in base], rows[t], field) for t in tasks] for m in methods}
        ref = [outcome_table([cells[(p, t, *reference_cells[p])] for p in post], rows[t], RANKED_METRICS[reference.metric]) for t in tasks]
        comparison = compare_predictors(predictors, ref, n_resamples=n_resamples, seed=seed)
        analysis["by_metric"][metric] = comparison.model_dump() | {"rows": {t: len(r) for t, r in rows.items()}}
    analysis["soft_prompt_vs_lora"] = tuned_agreement(cells, n_resamples=n_resamples, seed=seed)
    write_json_atomic(folder / "ranking.json", analysis)
    write_text_atomic(folder / "ranking.md", ranking_markdown(analysis))
    return analysis


def ranking_rows(analysis: dict) -> list[list[str]]:
    """One row per metric and method: tau-b and rho with intervals, and the gap to the best method."""
    lines = []
    for metric, comparison in analysis["by_metric"].items():
        for method, agreement in comparison["methods"].items():
            best = comparison["best"] == method
            gap = "best" if best else format_estimate(comparison["tau_difference"].get(method), signed=True)
            lines.append([metric, method, format_estimate(agreement["tau_b"]), format_estimate(agreement["spearman"]), gap])
    return lines


def ranking_table(analysis: dict) -> Table:
    reference = analysis["reference"]
    title = (
        f"ranking of {len(analysis['families'])} families against post-trained {reference['metric']} "
        f"({reference['method']}{', chat' if reference['chat'] else ''}); 95% CI"
    )
    table = Table(title=title)
    for header in ["base metric", "method", "Kendall tau-b", "Spearman rho", "tau(best) - tau"]:
        table.add_column(header)
    for row in ranking_rows(analysis):
        table.add_row(*row)
    return table


def ranking_markdown(analysis: dict) -> str:
    reference = analysis["reference"]
    pairs = ", ".join(f"{family} ({roles['base']} -> {roles['post-trained']})" for family, roles in analysis["families"].items())
    lines = [
        "# softeval ranking",
        "",
        f"Families: {pairs}.",
        f"Reference: post-trained {reference['metric']}, {reference['method']}{' with the chat template' if reference['chat'] else ''}.",
        f"Tasks: {', '.join(analysis['tasks'])}. A model's score is the mean over tasks of its accuracy on the rows every",
        "ranked cell evaluated; 95% intervals resample those rows jointly across models and methods.",
        "",
        "| base metric | method | Kendall tau-b | Spearman rho | tau(best) - tau |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in ranking_rows(analysis)),
        "",
    ]
    agreement = analysis.get("soft_prompt_vs_lora")
    if agreement:
        lines += [
            f"Soft prompt vs LoRA task accuracy over {agreement['n_cells']} cells: Pearson r {format_estimate(agreement['pearson'])}, "
            f"Kendall tau-b {format_estimate(agreement['tau_b'])}.",
            "",
        ]
    return "\n".join(lines)
