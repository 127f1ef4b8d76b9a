"""Checkpoints evaluated while a run trains, filed as a post-hoc study files them: each one a model
of the folder (`recipe@step-N` in the loop, `run@checkpoint-N` for `softeval watch`), a point of
its recipe's series in OUTPUT/series.json (model, step, tokens) and a base model in models.json,
so `softeval analyze`, the report page and the exports read the folder exactly like a study's.

Each recipe's series also records the settings its cells were evaluated with: cells of other
rows or other tuning do not compare, so a folder whose series were evaluated otherwise is
refused before training starts. Every evaluation appends a line to OUTPUT/evaluations.jsonl:
which checkpoint, its cells, what failed, and what it cost.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from softeval._io import write_json_atomic
from softeval.errors import SoftevalError
from softeval.scoring import MODELS_FILE, SERIES_FILE
from softeval.study.locks import claimed

log = logging.getLogger("softeval")

EVALUATIONS_FILE = "evaluations.jsonl"


def read_series_file(output: Path) -> dict:
    path = Path(output) / SERIES_FILE
    if not path.is_file():
        return {}
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SoftevalError(f"{path} cannot be read ({exc}); move it away or choose another output folder") from exc
    return recorded if isinstance(recorded, dict) else {}


def check_series_settings(output: Path, recipe: str, settings: dict, source: str) -> None:
    """The folder can take `recipe`'s checkpoints: its series, where it has one already, was filed
    the same way (`source`: "in-loop" or "watch") with the same cell settings (a run that restarts
    goes on with it), and every other series of the folder was evaluated with the same settings."""
    for name, series in read_series_file(output).items():
        recorded = series.get("evaluated_with") if isinstance(series, dict) else None
        if recorded is None:
            if name == recipe:
                raise SoftevalError(f"{output} holds a series '{recipe}' of a study's checkpoints; give the recipe another name, "
                                    "or choose another output folder")
            continue
        if name == recipe and recorded.get("source") != source:
            raise SoftevalError(f"{output} holds a series '{recipe}' filed by {recorded.get('source')}; give the recipe another name, "
                                "or choose another output folder")
        differs = next((key for key in sorted(set(settings) | set(recorded.get("settings", {})))
                        if settings.get(key) != recorded.get("settings", {}).get(key)), None)
        if differs is not None:
            raise SoftevalError(f"{output} holds series '{name}', evaluated with another {differs} ({_shown(recorded['settings'].get(differs))} "
                                f"there, {_shown(settings.get(differs))} here): their cells would not compare; use the same settings, "
                                "or another output folder")


def _shown(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)[:80]


def file_checkpoint(output: Path, recipe: str, point: dict, settings: dict, source: str) -> None:
    """Add a checkpoint (`point`: model, spec, step, tokens) to its recipe's series and to the
    folder's models as a base model, replacing an earlier point of the same step (a run that
    restarted from an earlier checkpoint evaluates the steps after it again)."""
    output = Path(output)
    with claimed(output, output / SERIES_FILE):  # recipes trained side by side share the folder
        known = read_series_file(output)
        series = known.get(recipe) or {"checkpoints": [], "reference": None}
        kept = [p for p in series["checkpoints"] if p["step"] != point["step"] and p["model"] != point["model"]]
        series["checkpoints"] = sorted([*kept, point], key=lambda p: p["step"])
        series["evaluated_with"] = {"source": source, "settings": settings}
        known[recipe] = series
        write_json_atomic(output / SERIES_FILE, known)
        models_path = output / MODELS_FILE
        models = json.loads(models_path.read_text(encoding="utf-8")) if models_path.is_file() else {}
        models[point["model"]] = {"model": point["spec"], "family": None, "role": "base"}
        write_json_atomic(models_path, models)


def file_reference(output: Path, recipe: str, reference: dict) -> None:
    """Name a recipe's post-trained model (`reference`: its model name in the folder, and the
    method and chat mode its cells were evaluated with): the analysis then orders the recipes by
    it, as a study's series with a reference."""
    output = Path(output)
    with claimed(output, output / SERIES_FILE):
        known = read_series_file(output)
        if recipe not in known:
            raise SoftevalError(f"{output} holds no series '{recipe}' yet; evaluate its checkpoints before naming its reference")
        known[recipe]["reference"] = reference
        write_json_atomic(output / SERIES_FILE, known)


def record_evaluation(output: Path, record: dict) -> None:
    """One line of OUTPUT/evaluations.jsonl: a checkpoint's evaluation, its cells and its cost."""
    path = Path(output) / EVALUATIONS_FILE
    with claimed(Path(output), path):
        with path.open("a", encoding="utf-8") as file:  # appended whole: a line is written in one call
            file.write(json.dumps(record, sort_keys=True) + "\n")


def read_evaluations(output: Path) -> list[dict]:
    """Every evaluation recorded in OUTPUT/evaluations.jsonl, oldest first (a line cut short by
    a crash is left out)."""
    path = Path(output) / EVALUATIONS_FILE
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def refresh_reports(output: Path, *, wandb: str | None = None, mlflow: str | None = None) -> float:
    """The folder's analysis (with two recipes or more), comparison and report page, after a
    checkpoint's cells landed; returns the seconds it took. A failure here is logged: the cells
    are on disk, and the next refresh (or `softeval report`) writes the reports from them."""
    from softeval.reports import update_analysis, write_comparison, write_page

    started = time.perf_counter()
    try:
        with claimed(Path(output), Path(output) / "comparison.md"):
            update_analysis(output)
            write_comparison(output)
            write_page(output)
    except Exception as exc:  # noqa: BLE001 - the reports never stop the training they describe
        log.error("the reports of %s were not refreshed (%s: %s); softeval report %s writes them from the cells", output,
                  type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "", output)
    return time.perf_counter() - started
