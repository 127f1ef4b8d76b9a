"""The report page: OUTPUT/index.html, one self-contained file built from every finished cell.

It works opened from disk, offline: the styles and the script are inline, the charts are SVG
drawn by matplotlib (so the page needs no chart library, and a chart is the same figure the
library draws elsewhere; a tuning's chart is the curve.svg drawn when the tuning ended), and
the samples travel as one JSON block that a small script filters and pages through (a table of
10,000 rows is rendered a page at a time). Text that a model wrote is always inserted as text,
never as markup.

A pre-training program's folder holds thousands of cells, so the page stays bounded: each task
opens with its view per recipe and method over the checkpoints, long tables (cells, models,
paired comparisons, findings) show a page of rows at a time, a bar chart is drawn only where its
models fit, and the samples and tuning charts embedded are capped, the last checkpoints' first
(the page says how many it holds and where the rest are).
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from importlib.metadata import version
from importlib.resources import files
from pathlib import Path

from jinja2 import Environment, select_autoescape

from softeval._charts import inline_svg, pyplot
from softeval._io import write_text_atomic
from softeval.analysis import (
    CLAIMS,
    Finding,
    cell_flags,
    cell_key,
    cell_label,
    finished_cells,
    paired_comparisons,
    study_findings,
    tuned_agreement,
)
from softeval.errors import SoftevalError
from softeval.reports.comparison import GOLD_SHORT, SHORT, cost, gold_columns, gold_value
from softeval.reports.findings import estimate_text, holm_text, p_text, where
from softeval.scoring import GOLD_MEANINGS, MEANINGS, METRICS, MODELS_FILE, SERIES_FILE, EvalResult
from softeval.tuning.chart import CHART_METRICS, curve_chart, saved_chart

PAGE = "index.html"
MAX_SAMPLE_ROWS = 20_000  # samples embedded in the page, at most: the cells' samples.jsonl hold all
MAX_CURVES = 24  # tuning charts embedded, at most
MAX_BAR_MODELS = 24  # a task's bar chart groups this many models at most: beyond, its series' curves show them


def write_page(folder: str | Path) -> Path:
    """Render OUTPUT/index.html from the results on disk; returns its path."""
    folder = Path(folder)
    results = finished_cells(folder)
    environment = Environment(autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True)
    template = environment.from_string(files("softeval.reports").joinpath("templates/report.html.j2").read_text(encoding="utf-8"))
    html = template.render(**page_context(folder, results))
    path = folder / PAGE
    write_text_atomic(path, html)
    return path


def page_context(folder: Path, results: list[EvalResult]) -> dict:
    ranking_path = folder / "ranking.json"
    ranking = json.loads(ranking_path.read_text(encoding="utf-8")) if ranking_path.is_file() else None
    agreement = tuned_agreement({cell_key(r): r for r in results})
    paired = paired_comparisons(results)
    series = declared_series(folder)
    earlier = {point["model"] for s in series.values() for point in s["checkpoints"][:-1]}  # left out first where the page is full
    samples, samples_note = samples_json(results, earlier)
    curves, curves_note = tuning_curves(folder, earlier)
    return {
        "title": f"softeval report: {folder.resolve().name}",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "softeval_version": version("softeval"),
        "header": run_header(folder, results),
        "tasks": [task_overview(task, [r for r in results if r.config["task"] == task], series) for task in dict.fromkeys(r.config["task"] for r in results)],
        "metric_names": [SHORT[m] for m in METRICS],
        "metric_meanings": [MEANINGS[m] for m in METRICS],
        **summary_and_findings(folder, study_findings(folder, results, paired, agreement)),
        "paired": paired,
        "curves": curves,
        "curves_note": curves_note,
        "ranking": ranking_view(ranking) if ranking else None,
        "agreement": agreement_view(agreement, results) if agreement else None,
        "series": series_view(folder),
        "samples_json": samples,
        "samples_note": samples_note,
    }


def declared_series(folder: Path) -> dict[str, dict]:
    """The folder's series.json (each recipe's checkpoints), or none where it has none or it
    cannot be read (the analysis says why)."""
    from softeval.analysis.series import read_series

    if not (folder / SERIES_FILE).is_file():
        return {}
    try:
        return read_series(folder)
    except (OSError, ValueError, SoftevalError):
        return {}


# --- findings -------------------------------------------------------------------------------------


def findings_view(findings: list[Finding]) -> list[dict]:
    """Findings as the page's tables show them: claim, where, estimate, verdict."""
    return [
        {"claim": CLAIMS[f.claim], "where": where(f), "estimate": estimate_text(f), "verdict": f.verdict,
         "css": f.verdict.replace(" ", "-"), "reason": f.reason, "statistic": f.statistic, "p": p_text(f.p_value), "holm": holm_text(f)}
        for f in findings
    ]


def summary_and_findings(folder: Path, findings: list[Finding]) -> dict:
    """The page's opening: the summary of the series analysis and the ranking, then the
    findings folded (the study's and series' own, per-cell counts, those that hold or fail, the
    undetermined ones grouped by why, in sections a reader opens)."""
    from softeval.reports.findings import VERDICTS, folded
    from softeval.reports.summary import ranking_rows, summary_view

    path = folder / "analysis.json"
    analysis = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    found = folded(findings)
    from softeval.reports.summary import estimate_text as summary_estimate

    ranking = [row | {"estimate": summary_estimate(row["estimate"])} for row in ranking_rows(findings)]
    return {
        "summary": {"tasks": summary_view(analysis) if analysis and analysis.get("tasks") else [], "ranking": ranking},
        "findings": {"broad": findings_view(found["broad"]), "verdicts": VERDICTS,
                     "counts": [{"claim": CLAIMS[claim], "n": [n[v] for v in VERDICTS]} for claim, n in found["counts"].items()],
                     "decided": findings_view(found["decided"]),
                     "undetermined": [{"kind": kind, "findings": findings_view(group)} for kind, group in found["undetermined"].items()],
                     "not_applicable": sorted({f"{CLAIMS[f.claim]} ({f.reason})" for f in found["not_applicable"]})},
    }


# --- header ---------------------------------------------------------------------------------------


def run_header(folder: Path, results: list[EvalResult]) -> dict:
    """Models with their identity, tasks with their data hash, the settings, package versions
    and the time each stage took over all cells."""
    roles = json.loads((folder / MODELS_FILE).read_text(encoding="utf-8")) if (folder / MODELS_FILE).is_file() else {}
    models, tasks, versions = {}, {}, {}
    stages: dict[str, float] = {}
    for r in results:
        name = cell_key(r)[0]
        identity = r.model
        source = (identity.get("gguf_sha256") or identity.get("weights_sha256") or identity.get("commit") or identity.get("folder")
                  or identity.get("hub_id") or identity.get("gguf") or "")
        models[name] = {
            "name": name,
            "spec": identity.get("spec", r.config["model"]),
            "type": identity.get("model_type", ""),
            "parameters": f"{identity['n_parameters'] / 1e6:.0f}M" if identity.get("n_parameters") else "",
            "source": _short(source),
            "config": _short(identity.get("config_sha256", "")),
            "role": " ".join(filter(None, [roles.get(name, {}).get("family"), roles.get(name, {}).get("role")])),
        }
        data = r.data
        seen = tasks.get(r.config["task"], {})  # every version of spec and data the task's cells read
        tasks[r.config["task"]] = {
            "name": r.config["task"],
            "split": data.get("split", ""),
            "rows": data.get("rows", ""),
            "filtered_out": data.get("filtered_out", 0),
            "data": _with_version(seen.get("data", ""), _short(data.get("sha256") or data.get("source", ""))),
            "spec": _with_version(seen.get("spec", ""), _short(data.get("spec_sha256", ""))),
        }
        for stage, seconds in r.timings.items():
            stages[f"evaluate: {stage}"] = stages.get(f"evaluate: {stage}", 0.0) + seconds
        if r.tuning and r.tuning.get("tuning_seconds"):
            stages[f"tune: {r.config['method']}"] = stages.get(f"tune: {r.config['method']}", 0.0) + r.tuning["tuning_seconds"]
        for package, v in r.versions.items():
            versions.setdefault(package, set()).add(v)
    settings = {}
    for key in ("limit", "seed", "k", "batch_size", "max_new_tokens"):
        values = sorted({str(r.config.get(key)) for r in results if key != "k" or r.config["method"] == "few-shot"})
        if values:
            settings[key] = ", ".join(values)
    steps = sorted({str(r.tuning["steps"]) for r in results if r.tuning and r.tuning.get("steps")})
    if steps:
        settings["tuning steps"] = ", ".join(steps)
    return {
        "models": list(models.values()),
        "tasks": list(tasks.values()),
        "settings": settings,
        "versions": {p: ", ".join(sorted(v)) for p, v in sorted(versions.items())},
        "stages": {k: f"{v:.1f} s" for k, v in sorted(stages.items())},
    }


def _with_version(listed: str, version: str) -> str:
    """`listed` (versions joined by ", ") with `version` added when it is new."""
    return ", ".join(dict.fromkeys([*filter(None, listed.split(", ")), version]))


def _short(text: str) -> str:
    """A hash cut to 12 characters; a path or id as it is."""
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


# --- overview -------------------------------------------------------------------------------------


def task_overview(task: str, results: list[EvalResult], series: dict[str, dict]) -> dict:
    rows = []
    flagged = cell_flags(results)
    for r in results:
        rows.append({
            "model": cell_key(r)[0],
            "method": cell_label(r.config),
            "n": len(r.samples),
            "metrics": [_metric(r.metrics[m]) for m in METRICS],
            "flags": flagged[id(r)],
            "cost": cost(r),
        })
    names = gold_columns(results)
    gold = {
        "names": [GOLD_SHORT[n] for n in names],
        "meanings": [GOLD_MEANINGS[n] for n in names],
        "rows": [{"model": cell_key(r)[0], "method": cell_label(r.config),
                  "values": [_gold(n, r.metrics.get(n)) for n in names]} for r in results],
    }
    models = len({cell_key(r)[0] for r in results})
    chart = metric_chart(task, results, flagged) if models <= MAX_BAR_MODELS else None
    return {"name": task, "rows": rows, "gold": gold if names else None, "chart": chart, "recipes": recipe_view(series, results, flagged),
            "chart_note": None if chart else f"{models} models are more than one bar chart shows ({MAX_BAR_MODELS}): the table above and "
                                             "the checkpoints section's curves show them"}


def recipe_view(series: dict[str, dict], results: list[EvalResult], flagged: dict[int, list[str]]) -> list[dict]:
    """Per recipe of `series` and method: its checkpoints' cells among a task's `results`, the
    first and the last checkpoint's task accuracy, and the last one's knowledge and format-following."""
    cells = {(cell_key(r)[0], cell_label(r.config)): r for r in results}
    rows = []
    for name, s in series.items():
        models = [point["model"] for point in s["checkpoints"]]
        for method in dict.fromkeys(cell_label(r.config) for r in results):
            found = [cells[(m, method)] for m in models if (m, method) in cells]
            if not found:
                continue
            first, last = found[0], found[-1]
            rows.append({"recipe": name, "method": method, "cells": f"{len(found)} of {len(models)}",
                         "first": _metric(first.metrics["task_accuracy"]), "last": _metric(last.metrics["task_accuracy"]),
                         "knowledge": _metric(last.metrics["knowledge"]), "format": _metric(last.metrics["format_following"]),
                         "flagged": sum(bool(flagged[id(c)]) for c in found)})
    return rows


def _gold(name: str, m) -> dict:
    value, bounds = gold_value(name, m)
    return {"value": value, "ci": f"[{bounds}]" if bounds else ""}


def _metric(m) -> dict:
    if m.value is None:
        return {"value": "n/a", "ci": ""}
    ci = f"[{100 * m.ci_low:.1f}, {100 * m.ci_high:.1f}]" if m.ci_low is not None and m.ci_high is not None else ""
    return {"value": f"{100 * m.value:.1f}", "ci": ci}


def metric_chart(task: str, results: list[EvalResult], flagged: dict[int, list[str]]) -> str:
    """Grouped bars, one group per model and one bar per method, for each chart metric, with
    95% interval whiskers; hatched bars are flagged cells (`flagged`, from `cell_flags`)."""
    plt = pyplot()
    models = list(dict.fromkeys(cell_key(r)[0] for r in results))
    methods = list(dict.fromkeys(cell_label(r.config) for r in results))
    cells = {(cell_key(r)[0], cell_label(r.config)): r for r in results}
    width = 0.8 / max(len(methods), 1)
    fig, axes = plt.subplots(1, len(CHART_METRICS), figsize=(4.2 * len(CHART_METRICS), 3.4), sharey=True)
    colours = plt.get_cmap("tab10").colors
    for ax, metric in zip(axes, CHART_METRICS):
        for j, method in enumerate(methods):
            xs, values, errors, hatches = [], [], [[], []], []
            for i, model in enumerate(models):
                r = cells.get((model, method))
                m = r.metrics[metric] if r else None
                if m is None or m.value is None:
                    continue
                xs.append(i + (j - (len(methods) - 1) / 2) * width)
                values.append(100 * m.value)
                low = m.value if m.ci_low is None else m.ci_low
                high = m.value if m.ci_high is None else m.ci_high
                errors[0].append(100 * (m.value - low))
                errors[1].append(100 * (high - m.value))
                hatches.append("//" if flagged[id(r)] else "")
            bars = ax.bar(xs, values, width * 0.92, yerr=errors, capsize=2, color=colours[j % len(colours)], label=method,
                          error_kw={"elinewidth": 0.8, "ecolor": "#333"})
            for bar, hatch in zip(bars, hatches):
                bar.set_hatch(hatch)
        ax.set_title(metric.replace("_", " "), fontsize=10)
        ax.set_xticks(range(len(models)), models, fontsize=8, rotation=30 if len(models) > 2 else 0, ha="right" if len(models) > 2 else "center")
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("% of rows (95% CI)")
    from matplotlib.patches import Patch

    # plain swatches: a hatched first bar would make its method look flagged everywhere
    handles = [Patch(facecolor=colours[j % len(colours)], label=method) for j, method in enumerate(methods)]
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(methods), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))  # room for the legend below the charts
    return inline_svg(fig)


# --- tuning curves and ranking --------------------------------------------------------------------


def tuning_curves(folder: Path, earlier: set[str] = frozenset()) -> tuple[list[dict], str | None]:
    """One chart per tuned prompt or adapter (losses, and the validation metrics, against steps):
    the one drawn when its tuning ended, else drawn now from curve.json. Each is an image, so an
    SVG file from the folder cannot run script in the page, and the browser draws it when it is
    scrolled into view. At most MAX_CURVES, those of `earlier` checkpoints last; and a note that
    says where the others are, where some are left out."""
    curves = []
    found = sorted(folder.glob("*/*/*/curve.json"), key=lambda path: (path.parent.parent.parent.name in earlier, str(path)))
    for path in found[:MAX_CURVES]:
        model, task, kind = path.parent.relative_to(folder).parts
        name = f"{model} / {task} / {kind}"
        chart = saved_chart(path.parent) or _drawn_curve(path, name)
        curves.append({"name": name, "src": "data:image/svg+xml;base64," + base64.b64encode(chart.encode("utf-8")).decode("ascii")})
    note = None
    if len(found) > MAX_CURVES:
        note = (f"{MAX_CURVES} of the {len(found)} tuning curves are shown (the series' last checkpoints and the other models first); "
                "every one is drawn beside its prompt, OUTPUT/<model>/<task>/<prompt or adapter>/curve.svg")
    return curves, note


# tuning charts drawn from curve.json (no curve.svg drawn after it), by the file's path, size and
# time: a page refreshed after each checkpoint draws each once
_curves_drawn: dict[tuple, str] = {}


def _drawn_curve(path: Path, name: str) -> str:
    stat = path.stat()
    key = (path.resolve(), stat.st_size, stat.st_mtime_ns, name)
    if key not in _curves_drawn:
        _curves_drawn[key] = curve_chart(json.loads(path.read_text(encoding="utf-8")), name)
    return _curves_drawn[key]


def ranking_view(ranking: dict) -> dict:
    """The ranking table, and per method a chart of each family's base-model rank against its
    post-trained model's reference rank (on the diagonal where the method predicts perfectly)."""
    from softeval.reports.ranking import ranking_rows

    comparison = ranking["by_metric"][ranking["reference"]["metric"]]
    families = list(ranking["families"])
    return {
        "reference": ranking["reference"],
        "families": ranking["families"],
        "tasks": ranking["tasks"],
        "rows": ranking_rows(ranking),
        "chart": rank_chart(families, comparison),
    }


def rank_chart(families: list[str], comparison: dict) -> str:
    from scipy.stats import rankdata

    plt = pyplot()
    methods = comparison["methods"]
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.2), squeeze=False)
    for ax, (method, agreement) in zip(axes[0], methods.items()):
        base = rankdata([-s for s in agreement["predictor_scores"]])
        reference = rankdata([-s for s in agreement["reference_scores"]])
        ax.plot([1, len(families)], [1, len(families)], color="#bbb", linewidth=1)
        ax.scatter(base, reference, zorder=3)
        for family, x, y in zip(families, base, reference):
            ax.annotate(family, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        tau = agreement["tau_b"]
        label = "n/a" if tau["value"] is None else f"{tau['value']:.2f}" + (f" [{tau['ci_low']:.2f}, {tau['ci_high']:.2f}]" if tau["ci_low"] is not None else "")
        ax.set(title=f"{method}\ntau-b {label}", xlabel="base-model rank", ylabel="post-trained rank")
        ax.title.set_fontsize(9)
        ax.invert_xaxis()
        ax.invert_yaxis()
    fig.tight_layout()
    return inline_svg(fig)


def series_view(folder: Path) -> dict | None:
    """The folder's series analysis (OUTPUT/analysis.json), where there is one: per task, decision
    accuracy per budget and method, the earliest decisions, the curves, noise and outliers."""
    from softeval.analysis.summary import anchor
    from softeval.reports.series import (
        DECISION_INTERVALS,
        FORMAT_GAP_TEXT,
        NOISE_HEADER,
        PREDICTORS_TEXT,
        budget_count,
        curves_svg,
        decision_rows,
        difference_lines,
        format_gap_lines,
        noise_rows,
        predictor_header,
        predictor_rows,
        spread_text,
        target_text,
        truth_metrics,
        truth_rows,
        truth_text,
    )

    path = folder / "analysis.json"
    if not path.is_file():
        return None
    analysis = json.loads(path.read_text(encoding="utf-8"))
    tasks = [
        {"name": task, "rows": found["rows"], "methods": list(found["decisions"]), "decisions": decision_rows(found), "budgets": budget_count(found),
         "noise": noise_rows(analysis, found), "noise_header": NOISE_HEADER, "spread": spread_text(found),
         "format_gap": format_gap_lines(found), "format_gap_text": FORMAT_GAP_TEXT,
         "chart": curves_svg(found, task, analysis["target"]["metric"]), "notes": found.get("notes", []),
         "predictors": {"text": PREDICTORS_TEXT, "header": predictor_header(found), "rows": predictor_rows(found),
                        "differences": difference_lines(found)} if found.get("predictors") else None,
         "truth": {"text": truth_text(found), "metrics": truth_metrics(found), "rows": truth_rows(found)} if found.get("truth") else None,
         # the summary's links lead here
         "anchors": {"decisions": anchor(task, "decision accuracy"), "predictors": anchor(task, "predictors"), "truth": anchor(task, "true knowledge")}}
        for task, found in analysis["tasks"].items()
    ]
    recipes = ", ".join(f"{name} ({len(points)} checkpoints)" for name, points in analysis["series"].items())
    return {"recipes": recipes, "target": target_text(analysis), "threshold": analysis["threshold"], "tasks": tasks, "decision_intervals": DECISION_INTERVALS,
            "skipped": list(analysis.get("skipped", {}).items())}


def agreement_view(agreement: dict, results: list[EvalResult]) -> dict:
    """Soft prompt against LoRA task accuracy, one point per cell that has both."""
    plt = pyplot()
    cells = {cell_key(r): r for r in results}
    xs, ys, names = [], [], []
    for model, task, chat in agreement["cells"]:
        xs.append(100 * (cells[(model, task, "soft-prompt", chat)].metrics["task_accuracy"].value or 0))
        ys.append(100 * (cells[(model, task, "lora", chat)].metrics["task_accuracy"].value or 0))
        names.append(f"{model} / {task}" + (" (chat)" if chat else ""))
    fig, ax = plt.subplots(figsize=(4.2, 4))
    ax.plot([0, 100], [0, 100], color="#bbb", linewidth=1)
    ax.scatter(xs, ys, zorder=3)
    if len(names) <= 8:  # more labels than that would cover the points
        for name, x, y in zip(names, xs, ys):
            ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="soft-prompt task accuracy (%)", ylabel="LoRA task accuracy (%)", xlim=(0, 100), ylim=(0, 100))
    fig.tight_layout()
    return {"summary": agreement, "chart": inline_svg(fig)}


# --- samples --------------------------------------------------------------------------------------


def outcome(sample) -> str:
    """correct, wrong (in the format but not right), ambiguous (several answers), conflict (one
    option's letter with another's text; the diagnostics table counts both apart) or format failure (no
    answer the strict parser accepts)."""
    if sample.task_correct:
        return "correct"
    if sample.lenient_status in ("ambiguous", "conflict"):
        return sample.lenient_status
    return "wrong" if sample.format_ok else "format failure"


def samples_json(results: list[EvalResult], earlier: set[str] = frozenset()) -> tuple[str, str | None]:
    """The samples of the cells as compact JSON, safe inside a <script> element, and a note where
    some cells' are left out: whole cells, up to MAX_SAMPLE_ROWS rows, the series' `earlier`
    checkpoints last (each cell read from its samples.jsonl in turn, none held after)."""
    cells, rows = [], []
    ordered = sorted(results, key=lambda r: cell_key(r)[0] in earlier)  # stable: the folder's order within each group
    total = sum(len(r.samples) for r in results)
    kept = 0
    for r in ordered:
        if kept and kept + len(r.samples) > MAX_SAMPLE_ROWS:
            break
        kept += len(r.samples)
        c = len(cells)
        model, task, _, _ = cell_key(r)
        cells.append({"model": model, "task": task, "method": cell_label(r.config)})
        for s in r.samples:
            rows.append([
                c, s.index, outcome(s), s.prompt, s.raw_completion, s.completion, s.strict_answer, s.strict_failure,
                s.lenient_answer, s.lenient_status, s.gold, s.choices,
                None if s.option_loglikelihoods is None else [None if x is None else round(x, 3) for x in s.option_loglikelihoods],
            ])
    text = json.dumps({"cells": cells, "rows": rows}, ensure_ascii=False, separators=(",", ":"))
    note = None
    if len(cells) < len(results):
        note = (f"This page holds the samples of {len(cells)} of the {len(results)} cells ({len(rows):,} of {total:,} rows: the series' last "
                "checkpoints and the other models first); every cell's are in OUTPUT/<model>/<task>/<method>/samples.jsonl")
    # "</" would end the script element early; "<!--" would open a comment inside it
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--"), note
