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

from softeval.analysis.comparisons import cell_key, common_rows, finished_cells, outcome_table, tuned_agreement
from softeval.analysis.settings import Reference
from softeval.analysis.stats import compare_predictors
from softeval.errors import SoftevalError
from softeval.scoring import MODELS_FILE, ROW_METRICS
from softeval.tuning import METHODS

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


def ranking_analysis(folder: Path, reference: Reference | None = None, *, n_resamples: int = 2000, seed: int = 0) -> dict:
    """The ranking analysis of an output folder (`softeval.reports.ranking.rank_study` writes it)."""
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
    return analysis


