"""A folder's series analysis as files: OUTPUT/analysis.json (everything `series_analysis`
computes), analysis.md (decision accuracy per method and budget, the earliest decision, each
recipe's noise, monotonicity and outlier checkpoints, the format gap) and a chart per task of each
recipe's score against tokens (or steps) with its 95% interval."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from softeval._charts import inline_svg
from softeval._io import write_json_atomic, write_text_atomic
from softeval.analysis import series_analysis
from softeval.analysis.series import NOISE_CHECKPOINTS, budget_text
from softeval.errors import SoftevalError
from softeval.reports.comparison import points_text
from softeval.reports.summary import summary_markdown
from softeval.scoring import SERIES_FILE

log = logging.getLogger("softeval")


def analyze(folder: Path, **settings) -> dict:
    """Analyse the folder's series and write analysis.json, analysis.md and the charts."""
    folder = Path(folder)
    analysis = series_analysis(folder, **settings)
    if analysis["target"].get("method_why"):
        log.info("series analysis: %s (--target-method chooses another)", analysis["target"]["method_why"])
    for task, found in analysis["tasks"].items():
        _plot(found, task, analysis["target"]["metric"], chart_path(folder, task))
    write_json_atomic(folder / "analysis.json", analysis)
    write_text_atomic(folder / "analysis.md", analysis_markdown(analysis))
    return analysis


def chart_path(folder: Path, task: str) -> Path:
    return Path(folder) / f"analysis_{task}.png"


def analysis_files(folder: Path, analysis: dict) -> list[Path]:
    """The files an analysis wrote, as the commands name them: analysis.md first, then the charts."""
    return [Path(folder) / "analysis.md"] + [chart_path(folder, task) for task in analysis["tasks"]]


def update_analysis(folder: Path) -> dict | None:
    """Redo the series analysis of a folder that holds series, as every command into it does,
    with the settings of its last analysis (target and threshold), else the defaults."""
    if not (Path(folder) / SERIES_FILE).is_file():
        return None
    settings = {}
    if (Path(folder) / "analysis.json").is_file():
        last = json.loads((Path(folder) / "analysis.json").read_text(encoding="utf-8"))
        target = last["target"]
        settings = {"target": target.get("kind") if target.get("chosen") else None, "target_metric": target["metric"], "threshold": last["threshold"]}
        # a method the analysis fell back to is chosen afresh: the soft prompt's cells may have come since
        settings |= {"target_method": target["method"]} if target.get("method") and target.get("method_chosen", True) else {}
    try:
        return analyze(folder, **settings)
    except SoftevalError as exc:  # cells still missing: no analysis rather than an outdated one
        log.info("no series analysis yet: %s", exc)
    except Exception as exc:  # noqa: BLE001 - the study's cells are done: an analysis never fails them
        log.warning("the series analysis failed (%s: %s); run softeval --debug analyze %s to see why", type(exc).__name__, exc, folder)
    for name in ("analysis.json", "analysis.md"):
        (Path(folder) / name).unlink(missing_ok=True)
    return None


def _estimate(e: dict | None) -> str:
    if not e or e.get("value") is None:
        return "n/a"
    interval = f" [{e['ci_low']:.2f}, {e['ci_high']:.2f}]" if e.get("ci_low") is not None else ""
    return f"{e['value']:.2f}{interval}"





def target_text(analysis: dict) -> str:
    """What orders the recipes, in words."""
    target = analysis["target"]
    if target.get("kind") == "reference":
        first = next(iter(analysis["references"].values()))
        how = f"{first['method']}{' with its chat template' if first['chat'] else ''}"
        return f"each recipe's post-trained reference model's {target['metric']} ({how})"
    why = f"; not the references: {target['why']}" if target.get("why") else ""
    fallen = f"; {target['method_why']}" if target.get("method_why") else ""
    return (f"each recipe's last checkpoint's {target['method']} {target['metric']} (that method orders the last budget "
            f"perfectly by construction: compare methods on the budgets before it{why}{fallen})")


def decision_rows(found: dict) -> list[list[str]]:
    """A task's decision accuracy per budget (rows) and method (columns), and its earliest decisions
    last: by the estimate, and by the interval's lower bound (absent from older analyses)."""
    axis, methods = found["axis"], list(found["decisions"])
    rows = []
    for k, budget in enumerate(b["budget"] for b in found["decisions"][methods[0]]):
        rows.append([budget_text(budget, axis)] + [_estimate(found["decisions"][m][k]["decision_accuracy"]) for m in methods])
    rows.append(["decides from"] + [budget_text(found["earliest"][m], axis) for m in methods])
    if "earliest_shown" in found:
        rows.append(["shown from (interval)"] + [budget_text(found["earliest_shown"][m], axis) for m in methods])
    return rows


def budget_count(found: dict) -> int:
    """How many budget rows `decision_rows` starts with (the earliest decisions follow)."""
    return len(next(iter(found["decisions"].values())))


def noise_rows(analysis: dict, found: dict) -> list[list[str]]:
    """Per method and recipe: noise, monotonicity and outlier checkpoints."""
    rows = []
    for method, recipes in found["recipes"].items():
        for name, r in recipes.items():
            flagged = ", ".join(analysis["series"][name][k]["model"] for k in r["outliers"]) or "-"
            noise = "n/a" if r["noise"] is None else f"{r['noise']:.3f}"
            mono = "n/a" if r["monotonicity"] is None else f"{r['monotonicity']:+.2f}"
            rows.append([method, name, noise, mono, flagged])
    return rows


def spread_text(found: dict) -> str:
    spread = found["spread_over_noise"]
    return "Spread over noise (the spread of final scores over their mean noise): " + ", ".join(
        f"{m} {'n/a' if v is None else f'{v:.2f}'}" for m, v in spread.items()) + "."


def truth_metrics(found: dict) -> list[str]:
    """The metrics the agreement with true knowledge was computed on."""
    return list(next(iter(found["truth"]["agreement"].values())))


def truth_rows(found: dict) -> list[list[str]]:
    """Per method, Kendall tau-b of the checkpoints' scores against their true knowledge, per metric."""
    return [[method] + [_estimate(metrics[m]) for m in truth_metrics(found)] for method, metrics in found["truth"]["agreement"].items()]


def truth_text(found: dict) -> str:
    truth = found["truth"]
    return (f"Kendall tau-b of the checkpoints' scores against their true knowledge (the share of test facts each knows in its "
            f"pre-training format), over {truth['checkpoints']} checkpoints and {truth['rows']} rows, 95% row-bootstrap intervals "
            "(bits per byte negated, so a positive tau always means agreement):")


PREDICTORS_TEXT = ("Every predictor, a method read through one metric, ordered by its mean decision accuracy over the budgets "
                   "(95% intervals resample rows, one draw for every predictor, checkpoint and the target); bits per byte "
                   "are lower-is-better and count negated. \"mean of last 3\" scores a checkpoint by the mean of the last 3 "
                   "checkpoints up to it. Signal to noise as Heineman et al. define it: (max - min) of the final scores over "
                   "their mean, over the mean relative spread (std / mean) of each recipe's last 3 checkpoints (the raw ones, "
                   "for an averaged variant too); not the absolute ratio of the noise table above.")


def predictor_header(found: dict) -> list[str]:
    axis = found["axis"]
    return ["predictor", *(budget_text(b, axis) for b in found["predictors"]["budgets"]), "mean", "decides from", "signal to noise (relative)"]


def predictor_rows(found: dict) -> list[list[str]]:
    """Per predictor (best mean first): decision accuracy per budget, its mean, the earliest
    decision and the signal-to-noise ratio."""
    predictors, budgets = found["predictors"], found["predictors"]["budgets"]
    rows = []
    for name in predictors["ranked"]:
        p = predictors["results"][name]
        earliest = None if p["earliest"] is None else budgets[p["earliest"]]
        snr = "n/a" if p["signal_to_noise"] is None else f"{p['signal_to_noise']:.2f}"
        rows.append([name, *(_estimate(b) for b in p["decision_accuracy"]), _estimate(p["mean"]), budget_text(earliest, found["axis"]), snr])
    return rows


# an analysis.json written by an older softeval lacks what newer reports read from it
OLDER_ANALYSIS = "no verdict in this analysis.json (written by an older softeval): run softeval analyze again"


def difference_lines(found: dict) -> list[str]:
    """The soft prompt's task accuracy minus the best continuous proxy (and the best predictor),
    in decision accuracy: the mean over budgets and each budget, with paired intervals (not
    adjusted for the other candidates), and the verdict against every candidate (see
    `analysis.decisions.decision_difference`)."""
    lines = []
    for d in found["predictors"]["differences"]:
        which = (f"the best continuous proxy of {d['among']}" if d["best_continuous"] else f"the best of {d['among']} other predictors") + \
            " by mean decision accuracy"
        signed = lambda e: "n/a" if e["value"] is None else f"{e['value']:+.2f}" + (f" [{e['ci_low']:+.2f}, {e['ci_high']:+.2f}]" if e["ci_low"] is not None else "")  # noqa: E731
        decider = d.get("decided_by")
        verdict = {"better": f"decides better than each of the {d['among']}",
                   "worse": f"decides worse than {decider} ({signed(d['against'][decider]) if decider else 'n/a'}, Holm over the {d['among']})",
                   "no difference shown": "no difference shown"}.get(d.get("verdict"), OLDER_ANALYSIS)
        lines.append(f"{d['first']} minus {d['second']} ({which}): mean decision accuracy {signed(d['mean'])}, {verdict}; "
                     "per budget " + ", ".join(signed(e) for e in d["per_budget"]))
    return lines


# what a decision accuracy's interval is, and is not (the coverage simulation in docs/studies.md#intervals)
DECISION_INTERVALS = ("A decision accuracy's interval is the spread of its estimate over resampled rows, not 95% coverage of the value "
                      "more rows would give: noise pulls a decision accuracy towards 0.5, and at these sizes the estimate lies below "
                      "that value by more than the resamples spread (docs/studies.md, Intervals).")
FORMAT_GAP_TEXT = "Format gap in task accuracy per checkpoint (the soft prompt minus the baseline, in percentage points, 95% intervals):"
NOISE_HEADER = ["method", "recipe", f"noise (sd of the last {NOISE_CHECKPOINTS} checkpoints)", "monotonicity (Kendall tau of score and step)",
                "outlier checkpoints"]


def format_gap_lines(found: dict) -> list[str]:
    """Per baseline and recipe, the soft prompt's task accuracy gain at each checkpoint, named by
    its place on the budget axis."""
    return [f"soft-prompt minus {other}, {name}: " + ", ".join(f"{budget_text(x, found['axis'])} {points_text(g)}" for x, g in zip(found["x"][name], per_checkpoint))
            for other, gaps in found["format_gap"].items() for name, per_checkpoint in gaps.items()]


def analysis_markdown(analysis: dict) -> str:
    lines = [
        "# softeval series analysis",
        "",
        f"Recipes: {', '.join(f'{n} ({len(p)} checkpoints)' for n, p in analysis['series'].items())}. Target: {target_text(analysis)}. "
        "Decision accuracy: the share of recipe pairs a budget's scores order as the target does (95% intervals resample "
        f"benchmark rows); a method decides from the first budget from which it stays at or above {analysis['threshold']:g}, "
        "and is shown to decide from the first budget from which its interval's lower bound does. " + DECISION_INTERVALS,
    ]
    lines += ["", *summary_markdown(analysis)]
    for task, found in analysis["tasks"].items():
        methods = list(found["decisions"])
        lines += ["", f"## {task} ({found['rows']} rows)", "", f"### {task}: decision accuracy", "",
                  "| budget | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
        rows, n_budgets = decision_rows(found), budget_count(found)
        lines += ["| " + " | ".join(row) + " |" for row in rows[:n_budgets]]
        lines += [f"| **{row[0]}** | " + " | ".join(row[1:]) + " |" for row in rows[n_budgets:]]
        lines += ["", f"### {task}: noise", "", "| " + " | ".join(NOISE_HEADER) + " |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in noise_rows(analysis, found)]
        lines += ["", spread_text(found)]
        if found.get("predictors"):
            header = predictor_header(found)
            lines += ["", f"### {task}: predictors", "", PREDICTORS_TEXT, "", "| " + " | ".join(header) + " |", "|---|" + "---|" * (len(header) - 1)]
            lines += ["| " + " | ".join(row) + " |" for row in predictor_rows(found)]
            lines += [""] + [f"* {line}" for line in difference_lines(found)] if found["predictors"]["differences"] else []
        if found.get("truth"):
            metrics = truth_metrics(found)
            lines += ["", f"### {task}: true knowledge", "", truth_text(found), "", "| method | " + " | ".join(metrics) + " |",
                      "|---|" + "---|" * len(metrics)]
            lines += ["| " + " | ".join(row) + " |" for row in truth_rows(found)]
        if found.get("notes"):
            lines += ["", "Why a figure is n/a or means little, or a method never decides:", ""] + [f"* {note}" for note in found["notes"]]
        if found["format_gap"]:
            lines += ["", FORMAT_GAP_TEXT, ""] + [f"* {line}" for line in format_gap_lines(found)]
    for task, why in analysis.get("skipped", {}).items():
        lines += ["", f"## {task}: not analysed", "", f"{why}."]
    return "\n".join(lines) + "\n"


CURVE_ORDER = ("task_accuracy", "knowledge", "format_following")
# a panel is about 290 pixels wide: a curve of more checkpoints than this is thinned to this many
# points (first and last kept), and markers are drawn only where points stay apart
MAX_CURVE_POINTS = 240
MAX_MARKED_POINTS = 40
LINE_STYLES = ("-", "--", ":", "-.")  # beyond 20 recipes, colours repeat with another style


def recipe_styles(recipes: list[str]) -> dict[str, dict]:
    """Each recipe's colour and line style, distinct for up to 80 recipes: tab10's colours up to
    10 recipes, tab20's up to 20, then tab20's again in the next line style."""
    import matplotlib

    palette = matplotlib.colormaps["tab10" if len(recipes) <= 10 else "tab20"]
    return {name: {"color": palette(i % palette.N), "linestyle": LINE_STYLES[i // palette.N % len(LINE_STYLES)]}
            for i, name in enumerate(recipes)}


def thinned(n_points: int) -> list[int]:
    """The indices of a curve's points that are drawn: all, or MAX_CURVE_POINTS evenly spread."""
    if n_points <= MAX_CURVE_POINTS:
        return list(range(n_points))
    return sorted({round(k * (n_points - 1) / (MAX_CURVE_POINTS - 1)) for k in range(MAX_CURVE_POINTS)})


def curves_figure(found: dict, task: str, metric: str):
    """Each recipe's scores against the budget axis: one panel per method (columns) and metric
    (rows, the one the analysis decides on first), each recipe one colour and style throughout,
    its 95% band light enough that the others show through, and the legend outside every panel.
    Curves of more checkpoints than a panel has pixels are thinned, and the figure says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    methods = list(found["curves"])
    metrics = [metric] + [m for m in CURVE_ORDER if m != metric and m in found["curves"][methods[0]]]
    recipes = list(found["x"])
    styles = recipe_styles(recipes)
    drawn = {name: thinned(len(xs)) for name, xs in found["x"].items()}
    fig, axes = plt.subplots(len(metrics), len(methods), figsize=(3.2 * len(methods) + 1.6, 2.4 * len(metrics)), sharex=True, sharey="row",
                             squeeze=False, layout="constrained")
    for row, shown in enumerate(metrics):
        for ax, method in zip(axes[row], methods):
            bands = []  # every recipe's band in one collection: one artist per panel, not one per recipe
            for name, curve in found["curves"][method][shown].items():
                xs = [found["x"][name][k] for k in drawn[name]]
                points = [curve[k] for k in drawn[name]]
                marker = "o" if len(points) <= MAX_MARKED_POINTS else None
                ax.plot(xs, [c["value"] for c in points], marker=marker, markersize=3, linewidth=1.2, label=name, **styles[name])
                low = [c["value"] if c["ci_low"] is None else c["ci_low"] for c in points]
                high = [c["value"] if c["ci_high"] is None else c["ci_high"] for c in points]
                bands.append(list(zip(xs, low)) + list(zip(reversed(xs), reversed(high))))
            colours = [styles[name]["color"] for name in found["curves"][method][shown]]
            ax.add_collection(PolyCollection(bands, facecolors=colours, alpha=0.08, linewidths=0), autolim=True)
            ax.autoscale_view()
            if found["axis"] == "tokens":
                ax.set_xscale("log")  # checkpoints are often spaced by doubling
                # ticks at 1, 2 and 5 of each power of ten, labelled as budgets are ("200K"): the
                # default labels every minor tick of a short span, and they overlap
                ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: budget_text(value, "tokens").removesuffix(" tokens")))
                ax.xaxis.set_minor_locator(NullLocator())  # no minor marks: a refresh after each checkpoint redraws them all
            if row == 0:
                ax.set_title(method)
            if row == len(metrics) - 1:
                ax.set_xlabel(found["axis"])
        axes[row][0].set_ylabel(shown.replace("_", " "))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", title="recipe", fontsize="small")  # beside the panels, never over their data
    longest = max((len(xs) for xs in found["x"].values()), default=0)
    title = task if longest <= MAX_CURVE_POINTS else f"{task} (curves of {longest} checkpoints drawn at {MAX_CURVE_POINTS} points each)"
    fig.suptitle(title, fontsize="medium")
    return fig


# the SVG of the curves last drawn per task, by what they show: the page of the folder just
# analysed shows the same figure, drawn once (a refresh after each checkpoint draws each task's anew)
_drawn: dict[str, tuple[str, str]] = {}


def _plot(found: dict, task: str, metric: str, path: Path) -> None:
    """The task's curves as analysis_<task>.png, kept as SVG for the page too."""
    import matplotlib.pyplot as plt

    fig = curves_figure(found, task, metric)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
        fig.set_layout_engine("none")  # laid out for the PNG: the SVG keeps that layout
        _drawn[task] = (_shown(found, task, metric), inline_svg(fig))
    finally:
        plt.close(fig)


def curves_svg(found: dict, task: str, metric: str) -> str:
    """The task's curves as inline SVG: as the analysis drew them, where it drew these, else drawn now."""
    shown = _shown(found, task, metric)
    if task in _drawn and _drawn[task][0] == shown:
        return _drawn[task][1]
    return inline_svg(curves_figure(found, task, metric))


def _shown(found: dict, task: str, metric: str) -> str:
    """What a curves figure shows, as one string: two figures of equal strings are the same."""
    return json.dumps([task, metric, found["x"], found["axis"], found["curves"]], sort_keys=True)
