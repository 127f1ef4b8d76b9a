"""A tuning's chart: its losses and validation metrics against steps, drawn once as curve.svg
beside curve.json when the tuning ends. The report page inlines that file rather than drawing
every tuning's chart again each time it is written."""

from __future__ import annotations

import math
from pathlib import Path

from softeval._charts import inline_svg, pyplot
from softeval._io import write_text_atomic

CHART_FILE = "curve.svg"
# the chart files a tuned folder may hold: folders tuned by earlier versions hold a curve.png
CHART_FILES = (CHART_FILE, "curve.png")
CHART_METRICS = ("format_following", "task_accuracy", "knowledge")


def curve_chart(points: list[dict], title: str) -> str:
    """Two panels as inline SVG: train and validation loss, and the validation metrics in percent."""
    plt = pyplot()
    steps = [p["step"] for p in points]
    value = lambda p, k: math.nan if p.get(k) is None else p[k]  # noqa: E731
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
    for key in ("train_loss", "val_loss"):
        left.plot(steps, [value(p, key) for p in points], marker="o", markersize=3, label=key.replace("_", " "))
    left.set(xlabel="step", title="loss")
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)  # steps are whole numbers
    left.legend(fontsize=8)
    for key in CHART_METRICS:
        right.plot(steps, [100 * value(p, key) for p in points], marker="o", markersize=3, label=key.replace("_", " "))
    right.set(xlabel="step", ylim=(0, 100), title="validation (%)")
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    # fixed margins: a study draws one chart per tuning, and measuring the text (tight_layout) costs more than drawing it
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.16, top=0.82, wspace=0.15)
    return inline_svg(fig)


def write_curve_chart(points: list[dict], folder: Path, title: str) -> None:
    write_text_atomic(Path(folder) / CHART_FILE, curve_chart(points, title))


def saved_chart(folder: Path) -> str | None:
    """The chart drawn when the folder's tuning ended, or None where there is none or curve.json
    was written after it (a chart from an older curve)."""
    chart, curve = Path(folder) / CHART_FILE, Path(folder) / "curve.json"
    try:
        if chart.stat().st_mtime_ns < curve.stat().st_mtime_ns:
            return None
        return chart.read_text(encoding="utf-8")
    except OSError:
        return None
