"""Reporting: metric tables for the terminal and markdown/JSON summaries of several cells."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from softeval._io import write_json_atomic, write_text_atomic
from softeval.metrics import COLLAPSE_MIN_ANSWERS, COLLAPSE_SHARE, METRICS, Metric

SHORT = {
    "format_following": "format",
    "task_accuracy": "task acc",
    "conditional_accuracy": "cond acc",
    "lenient_accuracy": "lenient acc",
    "knowledge": "knowledge",
}


def cell_label(config: dict) -> str:
    return config["method"] + (" +chat" if config.get("chat") else "")


def format_metric(m: Metric) -> str:
    if m.value is None:
        return "n/a"
    ci = f" [{100 * m.ci_low:.1f}, {100 * m.ci_high:.1f}]" if m.ci_low is not None and m.ci_high is not None else ""
    return f"{100 * m.value:.1f}{ci}"


def flags(result) -> str:
    """Why a cell's score may mean little (at chance, collapsed answers), or empty."""
    return "; ".join(result.diagnostics.flags) if result.diagnostics else ""


def rows(results: list) -> list[list[str]]:
    return [
        [r.config["model"], r.config["task"], cell_label(r.config), str(len(r.samples))]
        + [format_metric(r.metrics[name]) for name in METRICS]
        + [flags(r)]
        for r in results
    ]


def metrics_table(results: list, title: str = "softeval results (%, 95% CI)") -> Table:
    table = Table(title=title)
    for header in ["model", "task", "method", "n", *(SHORT[m] for m in METRICS), "flags"]:
        table.add_column(header, justify="left" if header in ("model", "task", "method", "flags") else "right")
    for row in rows(results):
        table.add_row(*row)
    return table


def diagnostics_table(results: list) -> list[str]:
    """Markdown lines: per cell, the strict-answer distribution against chance, and the shares of
    empty, ambiguous and self-contradicting answers."""
    percent = lambda x: "n/a" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    header = ["model", "method", "strict answers", "most common", "chance", "always most common", "empty", "ambiguous", "conflict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        d = r.diagnostics
        if d is None:
            continue
        distribution = ", ".join(f"{k} {v}" for k, v in (d.answer_distribution or {}).items()) or "-"
        common = f"{d.most_common_answer} ({percent(d.most_common_share)})" if d.most_common_answer else "-"
        cells = [r.config["model"], cell_label(r.config), distribution, common, percent(d.chance),
                 percent(d.most_common_accuracy), percent(d.empty_share), percent(d.ambiguous_share), percent(d.conflict_share)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_comparison(results: list, folder: Path, curves: dict[str, str] | None = None) -> None:
    """comparison.md (tables per task, links to tuning curves) and comparison.json (the numbers)."""
    header = ["model", "method", "n", *METRICS, "flags"]
    lines = [
        "# softeval comparison",
        "",
        "Values in %, with 95% bootstrap confidence intervals in brackets. Flags: *at chance* (task",
        "accuracy not above the chance level by its interval), *collapsed* (one option is over",
        f"{100 * COLLAPSE_SHARE:.0f}% of the strict answers, of {COLLAPSE_MIN_ANSWERS} or more).",
        "",
    ]
    for task in dict.fromkeys(r.config["task"] for r in results):
        lines += [f"## {task}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r, row in zip(results, rows(results)):
            if r.config["task"] == task:
                lines.append("| " + " | ".join([row[0], *row[2:]]) + " |")
        lines += ["", *diagnostics_table([r for r in results if r.config["task"] == task]), ""]
    if curves:
        lines += ["## Tuning curves", ""]
        lines += [f"### {name}\n\n![{name}]({path})\n" for name, path in curves.items()]
    write_text_atomic(folder / "comparison.md", "\n".join(lines) + "\n")
    cells = [
        {
            **r.config,
            "n": len(r.samples),
            "metrics": {k: m.model_dump() for k, m in r.metrics.items()},
            "diagnostics": r.diagnostics.model_dump() if r.diagnostics else None,
        }
        for r in results
    ]
    write_json_atomic(folder / "comparison.json", {"cells": cells, "curves": curves or {}})
