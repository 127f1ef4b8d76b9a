"""Reporting: metric tables for the terminal, and the comparison of every finished cell of an
output folder (comparison.md and comparison.json), with paired differences between methods."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from rich.table import Table

from softeval._io import write_json_atomic, write_text_atomic
from softeval.errors import SoftevalError
from softeval.metrics import COLLAPSE_MARGIN, COLLAPSE_MIN_ANSWERS, COLLAPSE_SHARE, CUT_SHARE, MEANINGS, METRICS, ROW_METRICS, Metric
from softeval.models import model_name
from softeval.results import EvalResult
from softeval.settings import METHODS
from softeval.stats import method_agreement, paired_difference

log = logging.getLogger("softeval")

# (method, baseline): the differences the comparison shows, where both cells exist
PAIRS = (("soft-prompt", "zero-shot"), ("soft-prompt", "few-shot"), ("soft-prompt", "lora"), ("lora", "few-shot"))
# the metrics compared row by row: per-row outcomes, so a paired bootstrap applies
PAIRED_METRICS = {m: ROW_METRICS[m] for m in ("task_accuracy", "knowledge", "format_following")}

SHORT = {
    "format_following": "format",
    "task_accuracy": "task acc",
    "conditional_accuracy": "cond acc",
    "lenient_accuracy": "lenient acc",
    "knowledge": "knowledge",
}


def cell_label(config: dict) -> str:
    return config["method"] + ("-chat" if config.get("chat") else "")


def format_metric(m: Metric) -> str:
    if m.value is None:
        return "n/a"
    ci = f" [{100 * m.ci_low:.1f}, {100 * m.ci_high:.1f}]" if m.ci_low is not None and m.ci_high is not None else ""
    return f"{100 * m.value:.1f}{ci}"


def cell_flags(results: list, among: list | None = None) -> dict[int, list[str]]:
    """Why each cell's score may mean little, by the cell's `id`: its diagnostics' flags (at
    chance, collapsed) and, where the cells of its task `among` the folder's (default: these)
    read different versions of the task's spec or data, its version (their scores do not
    compare, whatever a table puts side by side); where they were judged by different versions of
    the parsers, the parsers' version."""
    versions: dict[str, list] = {}
    parsers: dict[str, set] = {}
    for r in results + (among or []):
        known = versions.setdefault(r.config["task"], [])
        if evaluated_on(r) not in known:
            known.append(evaluated_on(r))
        parsers.setdefault(r.config["task"], set()).add(r.versions.get("parsers"))
    flagged = {}
    for r in results:
        flagged[id(r)] = list(r.diagnostics.flags) if r.diagnostics else []
        n_versions = len(versions[r.config["task"]])
        if n_versions > 1:
            spec, _, data = (str(part or "?")[:8] for part in evaluated_on(r))
            flagged[id(r)].append(f"task version {spec}/{data}, one of {n_versions} here: rerun older cells with --force")
        n_parsers = len(parsers[r.config["task"]])
        if n_parsers > 1:  # a rerun of the cell's command judges it again without generating
            flagged[id(r)].append(f"judged by parsers {r.versions.get('parsers') or 'unrecorded'}, one of {n_parsers} here: rerun its command")
    return flagged


def rows(results: list, among: list | None = None) -> list[list[str]]:
    flagged = cell_flags(results, among)
    return [
        [r.config["model"], r.config["task"], cell_label(r.config), str(len(r.samples))]
        + [format_metric(r.metrics[name]) for name in METRICS]
        + ["; ".join(flagged[id(r)])]
        for r in results
    ]


def metrics_table(results: list, title: str = "softeval results (%, 95% CI)", among: list | None = None) -> Table:
    """A terminal table of `results`, flagged as the folder's cells `among` which they sit."""
    table = Table(title=title)
    for header in ["model", "task", "method", "n", *(SHORT[m] for m in METRICS), "flags"]:
        table.add_column(header, justify="left" if header in ("model", "task", "method", "flags") else "right")
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
        cells = [r.config["model"], cell_label(r.config), distribution, common, percent(d.chance), percent(d.majority_share),
                 percent(d.most_common_accuracy), percent(d.empty_share), percent(d.ambiguous_share), percent(d.conflict_share)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# unreadable results files already told of (path and time written): the comparison, the ranking
# and the page each read every cell, and one warning is enough
_unreadable_told: set[tuple[Path, int]] = set()


def finished_cells(folder: Path) -> list[EvalResult]:
    """Every finished cell under `folder` (OUTPUT/<model>/<task>/<cell>/results.json), ordered
    by task, model, method and chat mode; a cell that cannot be read is left out with a warning."""
    results = []
    for path in sorted(Path(folder).glob("*/*/*/results.json")):
        try:
            results.append(EvalResult.load(path.parent))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            seen = (path.resolve(), path.stat().st_mtime_ns)
            if seen not in _unreadable_told:
                _unreadable_told.add(seen)
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:100]
                log.warning("left out of the comparison: %s cannot be read (%s); rerun the command that made it to evaluate it again",
                            path.parent, reason)
    rank = {m: i for i, m in enumerate(METHODS)}
    return sorted(results, key=lambda r: (r.config["task"], r.config["model"], rank.get(r.config["method"], 99), bool(r.config.get("chat"))))


def tuning_curves(folder: Path) -> dict[str, str]:
    """Curve plots of tuned prompts and adapters, by cell name, as paths relative to `folder`."""
    curves = {}
    for path in sorted(Path(folder).glob("*/*/*/curve.png")):
        model, task, kind = path.parent.relative_to(folder).parts
        curves[f"{model} / {task} / {kind}"] = str(path.relative_to(folder))
    return curves


def paired_comparisons(results: list[EvalResult], *, seed: int = 0) -> list[dict]:
    """For each model, task and chat mode, each method minus a baseline on the rows both were
    evaluated on, with paired bootstrap 95% intervals."""
    cells = {(r.model.get("spec", r.config["model"]), r.config["task"], bool(r.config.get("chat")), r.config["method"]): r for r in results}
    comparisons = []
    for (model, task, chat, method), result in cells.items():
        for first, baseline in PAIRS:
            other = cells.get((model, task, chat, baseline))
            if method != first or other is None:
                continue
            if evaluated_on(result) != evaluated_on(other):
                log.warning("no paired comparison of %s and %s on %s: other versions of the task or its data", method, baseline, task)
                continue
            a = {s.index: s for s in result.samples}
            b = {s.index: s for s in other.samples}
            rows = sorted(a.keys() & b.keys())
            if len(rows) < 2:
                continue
            entry = {"model": cell_key(result)[0], "task": task, "chat": chat, "method": method, "baseline": baseline, "n": len(rows)}
            for metric, field in PAIRED_METRICS.items():
                x = np.array([getattr(a[i], field) for i in rows], dtype=float)
                y = np.array([getattr(b[i], field) for i in rows], dtype=float)
                entry[metric] = paired_difference(x, y, seed=seed).model_dump()
            comparisons.append(entry)
    return comparisons


def cell_key(result: EvalResult) -> tuple[str, str, str, bool]:
    """(model name, task, method, chat) of a cell."""
    config = result.config
    return model_name(config["model"]), config["task"], config["method"], bool(config.get("chat"))


def evaluated_on(result: EvalResult) -> tuple:
    """The task spec and evaluation data a cell read. A row index means the same question only
    between cells that agree on both: cells are paired row by row only then."""
    data = result.data
    return data.get("spec_sha256"), data.get("split"), data.get("sha256") or data.get("source")


def common_rows(results: list[EvalResult]) -> list[int]:
    """The rows every one of the cells evaluated, so all are compared on the same rows; an error
    when the cells read different versions of the task or its data."""
    if len({evaluated_on(r) for r in results}) > 1:
        task = results[0].config["task"]
        raise SoftevalError(
            f"the cells of task {task} were evaluated on different versions of its spec or data; "
            "rerun the older cells (softeval ... --force) so they compare the same questions"
        )
    return sorted(set.intersection(*({s.index for s in r.samples} for r in results)))


def outcome_table(results: list[EvalResult], rows: list[int], field: str) -> np.ndarray:
    """(cells, rows) per-row outcomes (`field` of each sample), columns in `rows` order."""
    table = []
    for result in results:
        by_index = {s.index: s for s in result.samples}
        table.append([float(getattr(by_index[i], field)) for i in rows])
    return np.array(table)


def tuned_agreement(cells: dict, *, n_resamples: int = 2000, seed: int = 0) -> dict | None:
    """Soft prompt against LoRA task accuracy across every (model, task, chat mode) that has both
    (`cells` keyed by `cell_key`): Pearson r and Kendall tau-b with intervals; None below 3 cells."""
    both = [(model, task, chat) for (model, task, method, chat) in cells if method == "soft-prompt" and (model, task, "lora", chat) in cells]
    if len(both) < 3:
        return None
    x, y, tasks = [], [], []
    for task in dict.fromkeys(t for _, t, _ in both):
        keys = [k for k in both if k[1] == task]
        try:
            rows = common_rows([cells[(m, task, method, c)] for m, _, c in keys for method in ("soft-prompt", "lora")])
        except SoftevalError as exc:
            log.warning("soft prompt vs LoRA leaves out %s: %s", task, exc)
            continue
        if len(rows) < 2:
            continue
        for model, _, chat in keys:
            x.append(outcome_table([cells[(model, task, "soft-prompt", chat)]], rows, "task_correct")[0])
            y.append(outcome_table([cells[(model, task, "lora", chat)]], rows, "task_correct")[0])
            tasks.append(task)
    if len(x) < 3:
        return None
    agreement = method_agreement(x, y, tasks, n_resamples=n_resamples, seed=seed)
    return agreement.model_dump() | {"metric": "task_accuracy", "cells": [list(k) for k in both if k[1] in tasks]}


def _difference(d: dict) -> str:
    if d["value"] is None:
        return "n/a"
    ci = f" [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]" if d["ci_low"] is not None else ""
    return f"{'**' if d['excludes_zero'] else ''}{100 * d['value']:+.1f}{'**' if d['excludes_zero'] else ''}{ci}"


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
    return f"{t['trainable_parameters']:,}{seconds}"


def write_comparison(folder: Path) -> list[EvalResult]:
    """comparison.md and comparison.json over every finished cell in `folder`, whichever command
    wrote it: a second command into the same folder adds its cells. Returns the cells."""
    folder = Path(folder)
    results = finished_cells(folder)
    curves = tuning_curves(folder)
    comparisons = paired_comparisons(results)
    agreement = tuned_agreement({cell_key(r): r for r in results})
    from softeval.findings import findings_markdown, study_findings  # it builds on this module's comparisons

    findings = study_findings(folder, results, comparisons, agreement)
    header = ["model", "method", "n", *METRICS, "tuning cost", "flags"]
    lines = [
        "# softeval comparison",
        "",
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
    ]
    for task in dict.fromkeys(r.config["task"] for r in results):
        in_task = [r for r in results if r.config["task"] == task]
        lines += [f"### {task}", "", *answer_rules(in_task), "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r, row in zip(in_task, rows(in_task)):
            lines.append("| " + " | ".join([row[0], *row[2:-1], cost(r), row[-1]]) + " |")
        lines += ["", *diagnostics_table(in_task), ""]
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
