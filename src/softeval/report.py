"""Reporting: metric tables for the terminal and markdown/JSON summaries of several cells."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from softeval._io import write_json_atomic, write_text_atomic
from softeval.metrics import METRICS, Metric

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


def rows(results: list) -> list[list[str]]:
    return [
        [r.config["model"], r.config["task"], cell_label(r.config), str(len(r.samples))]
        + [format_metric(r.metrics[name]) for name in METRICS]
        for r in results
    ]


def metrics_table(results: list, title: str = "softeval results (%, 95% CI)") -> Table:
    table = Table(title=title)
    for header in ["model", "task", "method", "n", *(SHORT[m] for m in METRICS)]:
        table.add_column(header, justify="left" if header in ("model", "task", "method") else "right")
    for row in rows(results):
        table.add_row(*row)
    return table


def write_comparison(results: list, folder: Path, curves: dict[str, str] | None = None) -> None:
    """comparison.md (tables per task, links to tuning curves) and comparison.json (the numbers)."""
    header = ["model", "method", "n", *METRICS]
    lines = ["# softeval comparison", "", "Values in %, with 95% bootstrap confidence intervals in brackets.", ""]
    for task in dict.fromkeys(r.config["task"] for r in results):
        lines += [f"## {task}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r, row in zip(results, rows(results)):
            if r.config["task"] == task:
                lines.append("| " + " | ".join([row[0], *row[2:]]) + " |")
        lines.append("")
    if curves:
        lines += ["## Tuning curves", ""]
        lines += [f"### {name}\n\n![{name}]({path})\n" for name, path in curves.items()]
    write_text_atomic(folder / "comparison.md", "\n".join(lines) + "\n")
    cells = [
        {**r.config, "n": len(r.samples), "metrics": {k: m.model_dump() for k, m in r.metrics.items()}} for r in results
    ]
    write_json_atomic(folder / "comparison.json", {"cells": cells, "curves": curves or {}})
