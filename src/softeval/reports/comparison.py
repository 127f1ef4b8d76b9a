"""A folder's comparison: `comparison.md` and `comparison.json` (the findings first, then each
task's cells with intervals and flags, paired differences, answer rules and tuning curves) and the
tables the terminal prints.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from softeval._io import write_json_atomic, write_text_atomic
from softeval.analysis import (
    PAIRED_METRICS,
    cell_flags,
    cell_key,
    cell_label,
    finished_cells,
    paired_comparisons,
    tuned_agreement,
)
from softeval.models import model_name
from softeval.scoring import (
    COLLAPSE_MARGIN,
    COLLAPSE_MIN_ANSWERS,
    COLLAPSE_SHARE,
    CUT_SHARE,
    GOLD_MEANINGS,
    GOLD_METRICS,
    LOWER_IS_BETTER,
    MEANINGS,
    METRICS,
    EvalResult,
    Metric,
)
from softeval.tuning.chart import CHART_FILES

SHORT = {
    "format_following": "format",
    "task_accuracy": "task acc",
    "conditional_accuracy": "cond acc",
    "lenient_accuracy": "lenient acc",
    "knowledge": "knowledge",
}


GOLD_SHORT = {
    "gold_logprob": "gold log-prob",
    "gold_bpb": "gold bpb (lower better)",
    "gold_prob": "gold prob",
    "prompt_knowledge": "knowledge in prompt",
    "cloze_gold_prob": "cloze gold prob",
    "cloze_gold_bpb": "cloze bpb (lower better)",
}


def gold_columns(results: list[EvalResult]) -> list[str]:
    """The continuous metrics (see `scoring.likelihood`) any of the cells holds, in their order."""
    return [name for name in GOLD_METRICS if any(name in r.metrics for r in results)]


def gold_value(name: str, m: Metric | None) -> tuple[str, str]:
    """A continuous metric as (value, interval bounds "a, b") text: probabilities and shares in %,
    bits per byte and log-probabilities as they are."""
    if m is None or m.value is None:
        return "n/a", ""
    scale, form = (1, "{:.3f}") if name in LOWER_IS_BETTER else (1, "{:.2f}") if name == "gold_logprob" else (100, "{:.1f}")
    ci = f"{form.format(scale * m.ci_low)}, {form.format(scale * m.ci_high)}" if m.ci_low is not None and m.ci_high is not None else ""
    return form.format(scale * m.value), ci


def gold_table(results: list[EvalResult]) -> list[str]:
    """Markdown lines: each cell's continuous metrics with their intervals, where any cell has them."""
    names = gold_columns(results)
    if not names:
        return []
    lines = ["| model | method | " + " | ".join(GOLD_SHORT[n] for n in names) + " |", "|" + "---|" * (len(names) + 2)]
    for r in results:
        shown = [gold_value(n, r.metrics.get(n)) for n in names]
        lines.append("| " + " | ".join([model_name(r.config["model"]), cell_label(r.config), *(v + (f" [{ci}]" if ci else "") for v, ci in shown)]) + " |")
    return lines


def format_metric(m: Metric) -> str:
    if m.value is None:
        return "n/a"
    ci = f" [{100 * m.ci_low:.1f}, {100 * m.ci_high:.1f}]" if m.ci_low is not None and m.ci_high is not None else ""
    return f"{100 * m.value:.1f}{ci}"


def rows(results: list, among: list | None = None) -> list[list[str]]:
    flagged = cell_flags(results, among)
    return [
        [model_name(r.config["model"]), r.config["task"], cell_label(r.config), str(len(r.samples))]
        + [format_metric(r.metrics[name]) for name in METRICS]
        + ["; ".join(flagged[id(r)])]
        for r in results
    ]


def metrics_table(results: list, title: str = "softeval results (%, 95% CI)", among: list | None = None) -> Table:
    """A terminal table of `results`, flagged as the folder's cells `among` which they sit."""
    table = Table(title=title)
    for header in ["model", "task", "method", "n", *(SHORT[m] for m in METRICS), "flags"]:
        # names wrap onto more lines rather than being cut: a long lm-eval task name stays whole
        table.add_column(header, justify="left" if header in ("model", "task", "method", "flags") else "right", overflow="fold")
    for row in rows(results, among):
        table.add_row(*row)
    return table


def diagnostics_table(results: list) -> list[str]:
    """Markdown lines: per cell, the strict-answer distribution against chance, and the shares of
    empty, ambiguous and self-contradicting answers."""
    percent = lambda x: "n/a" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    header = ["model", "method", "strict answers", "most common (share of strict answers)", "chance", "majority gold", "always most common",
              "empty", "ambiguous", "conflict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        d = r.diagnostics
        if d is None:
            continue
        distribution = ", ".join(f"{k} {v}" for k, v in (d.answer_distribution or {}).items()) or "-"
        common = f"{d.most_common_answer} ({percent(d.most_common_share)})" if d.most_common_answer else "-"
        cells = [model_name(r.config["model"]), cell_label(r.config), distribution, common, percent(d.chance), percent(d.majority_share),
                 percent(d.most_common_accuracy), percent(d.empty_share), percent(d.ambiguous_share), percent(d.conflict_share)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _difference(d: dict) -> str:
    return points_text(d, bold=d["excludes_zero"])


def points_text(d: dict, *, bold: bool = False) -> str:
    """A difference of shares in percentage points with its interval; `bold` marks the value
    (markdown)."""
    if d["value"] is None:
        return "n/a"
    ci = f" [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]" if d["ci_low"] is not None else ""
    mark = "**" if bold else ""
    return f"{mark}{100 * d['value']:+.1f}{mark}{ci}"


def comparisons_table(comparisons: list[dict], task: str) -> list[str]:
    """Markdown lines: paired differences of one task; bold where the interval excludes 0."""
    header = ["model", "difference", "n", *PAIRED_METRICS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in comparisons:
        if c["task"] == task:
            name = f"{c['method']} - {c['baseline']}" + (" (chat)" if c["chat"] else "")
            lines.append("| " + " | ".join([c["model"], name, str(c["n"]), *(_difference(c[m]) for m in PAIRED_METRICS)]) + " |")
    return lines if len(lines) > 2 else []


def answer_rules(results: list[EvalResult]) -> list[str]:
    """Markdown lines: the word limit each short-answer cell's strict parser used, and why."""
    used = {(r.config["max_answer_words"], r.config.get("max_answer_words_from", "")) for r in results if "max_answer_words" in r.config}
    if not used:
        return []
    rules = "; ".join(f"at most {words} words ({source})" for words, source in sorted(used))
    return [f"Strict short answers: {rules}.", ""]


def format_estimate(e: dict | None, signed: bool = False) -> str:
    """A statistic with its 95% interval, "n/a" where it is undefined."""
    if not e or e["value"] is None:
        return "n/a"
    form = "{:+.2f}" if signed else "{:.2f}"
    ci = f" [{form.format(e['ci_low'])}, {form.format(e['ci_high'])}]" if e["ci_low"] is not None else ""
    return form.format(e["value"]) + ci


def cost(result: EvalResult) -> str:
    """Trainable parameters and tuning time of a tuned cell."""
    t = result.tuning
    if not t:
        return "-"
    seconds = f", {t['tuning_seconds']:.0f} s" if t.get("tuning_seconds") is not None else ""
    # adaptive tuning departs from the fixed-steps protocol: said beside the score it gave
    stopped = t.get("stopped_early")
    early = f", stopped at step {stopped['step']} of {stopped['of_steps']} (patience {stopped['patience']})" if stopped else ""
    return f"{t['trainable_parameters']:,}{seconds}{early}"


def write_comparison(folder: Path) -> list[EvalResult]:
    """comparison.md and comparison.json over every finished cell in `folder`, whichever command
    wrote it: a second command into the same folder adds its cells. Returns the cells."""
    folder = Path(folder)
    results = finished_cells(folder)
    curves = tuning_curves(folder)
    comparisons = paired_comparisons(results)
    agreement = tuned_agreement({cell_key(r): r for r in results})
    from softeval.analysis import study_findings
    from softeval.reports.findings import findings_markdown
    from softeval.reports.summary import summary_markdown

    findings = study_findings(folder, results, comparisons, agreement)
    header = ["model", "method", "n", *METRICS, "tuning cost", "flags"]
    analysis = json.loads((folder / "analysis.json").read_text(encoding="utf-8")) if (folder / "analysis.json").is_file() else None
    lines = [
        "# softeval comparison",
        "",
        *summary_markdown(analysis, link_to="analysis.md", findings=findings),
        *findings_markdown(findings),
        "## Cells",
        "",
        "Values in %, with 95% bootstrap confidence intervals in brackets. Flags: *no strict answers* (no",
        "completion followed the format, so accuracy says nothing of knowledge), *at chance* (task",
        "accuracy not above the chance level, or the share of the most frequent gold answer if higher,",
        f"by its interval), *collapsed* (one option is over {100 * COLLAPSE_SHARE:.0f}% of the strict answers, of",
        f"{COLLAPSE_MIN_ANSWERS} or more, and {100 * COLLAPSE_MARGIN:.0f} points over its share of the gold answers), *knowledge",
        "collapsed* (the option log-likelihoods pick one option that often: knowledge then measures a",
        "preference for one option, not what the model knows), *cut at the token",
        f"limit* (numbers or math: {100 * CUT_SHARE:.0f}% or more of the completions stopped at the token limit",
        "without a strict answer), *judged by parsers* (the cells of a task were judged by different",
        "versions of the parsers: rerunning a cell's command judges it again), *task version*",
        "(the cells of a task read different versions of its spec or data, and only cells of one",
        "version compare; the version is the spec's and the data's hash), *mostly empty* (half the",
        "completions or more are empty; a post-trained model run without its chat template often ends",
        "at once), *tuned on its evaluation rows* (the spec allowed tuning on them). Tuning cost:",
        "trainable parameters and tuning seconds. Paired differences are in percentage points on the",
        "rows both cells evaluated, with paired bootstrap intervals; **bold** where the interval excludes 0.",
        "",
        *(f"* `{metric}`: {MEANINGS[metric]}" for metric in METRICS),
        "",
        "The likelihood of the gold answer, under each cell's own conditioning (soft prompt,",
        "demonstrations or chat template); probabilities in %, bits per byte lower is better:",
        "",
        *(f"* `{metric}`: {GOLD_MEANINGS[metric]}" for metric in GOLD_METRICS),
        "",
    ]
    for task in dict.fromkeys(r.config["task"] for r in results):
        in_task = [r for r in results if r.config["task"] == task]
        lines += [f"### {task}", "", *answer_rules(in_task), "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r, row in zip(in_task, rows(in_task)):
            lines.append("| " + " | ".join([row[0], *row[2:-1], cost(r), row[-1]]) + " |")
        lines += ["", *diagnostics_table(in_task), ""]
        gold = gold_table(in_task)
        if gold:
            lines += [f"#### {task}: likelihood of the gold answer", "", *gold, ""]
        paired = comparisons_table(comparisons, task)
        if paired:
            lines += [f"#### {task}: paired differences", "", *paired, ""]
    if curves:
        lines += ["## Tuning curves", ""]
        lines += [f"### {name}\n\n![{name}]({path})\n" for name, path in curves.items()]
    cells = [
        {
            **r.config,
            "n": len(r.samples),
            "metrics": {k: m.model_dump() for k, m in r.metrics.items()},
            "diagnostics": r.diagnostics.model_dump() if r.diagnostics else None,
            "tuning": r.tuning,
        }
        for r in results
    ]
    if agreement:
        lines += [
            "## Soft prompt vs LoRA",
            "",
            f"Task accuracy over {agreement['n_cells']} cells: Pearson r {format_estimate(agreement['pearson'])}, "
            f"Kendall tau-b {format_estimate(agreement['tau_b'])} (95% intervals resample rows jointly).",
            "",
        ]
    write_text_atomic(folder / "comparison.md", "\n".join(lines) + "\n")
    write_json_atomic(folder / "comparison.json", {
        "findings": [f.model_dump() for f in findings],
        "cells": cells,
        "paired": comparisons,
        "soft_prompt_vs_lora": agreement,
        "curves": curves,
    })
    return results


def tuning_curves(folder: Path) -> dict[str, str]:
    """Curve plots of tuned prompts and adapters, by cell name, as paths relative to `folder`."""
    curves = {}
    for curve in sorted(Path(folder).glob("*/*/*/curve.json")):
        charts = [path for path in (curve.with_name(name) for name in CHART_FILES) if path.is_file()]
        if charts:
            model, task, kind = curve.parent.relative_to(folder).parts
            curves[f"{model} / {task} / {kind}"] = str(charts[0].relative_to(folder))
    return curves
