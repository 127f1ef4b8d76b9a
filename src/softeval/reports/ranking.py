"""The ranking's files and tables: `rank_study` computes the analysis (`softeval.analysis.ranking`)
and writes ranking.json and ranking.md; `update_ranking` keeps them in step with a folder's cells.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rich.table import Table

from softeval._io import write_json_atomic, write_text_atomic
from softeval.analysis import MIN_FAMILIES, Reference, families, ranking_analysis
from softeval.errors import SoftevalError
from softeval.reports.comparison import format_estimate

log = logging.getLogger("softeval")


def rank_study(folder: Path, reference: Reference | None = None, *, n_resamples: int = 2000, seed: int = 0) -> dict:
    """The ranking analysis of an output folder; writes ranking.json and ranking.md there."""
    analysis = ranking_analysis(folder, reference, n_resamples=n_resamples, seed=seed)
    write_json_atomic(Path(folder) / "ranking.json", analysis)
    write_text_atomic(Path(folder) / "ranking.md", ranking_markdown(analysis))
    return analysis


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
