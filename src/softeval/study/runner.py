"""A study: every (model, task, method, chat mode) cell of a grid, tuning soft prompts and LoRA
adapters where a method needs one, then a comparison of every finished cell in the output folder.

    OUTPUT/models.json                        family and role (base, post-trained) of each model
    OUTPUT/<model>/<task>/prompt[-chat]/      soft prompt, curve.json, curve.svg (tuned once, reused)
    OUTPUT/<model>/<task>/adapter[-chat]/     LoRA adapter in PEFT format, curve.json, curve.svg
    OUTPUT/<model>/<task>/<method>[-chat]/    results.json, samples.jsonl (one cell)
    OUTPUT/comparison.md, comparison.json     every finished cell on disk, with paired comparisons

`softeval eval`, `softeval run` and `softeval study` all run through `run_study`; they differ in
where a soft prompt comes from (`prompt`: none, a given file, or tuned here) and in how the grid is
written down (flags or a study file). A cell whose results.json records the identity the cell
would have now is finished and skipped (judged again by the installed parsers), so a rerun of an
interrupted study does only what is left; a model's weights load only for a cell that is not.
The settings (`Study`, `load_study`) are in `settings.py`, the folders in `folders.py`, one
model's cells on one task, tuning and skipping included, in `cells.py`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from softeval._io import write_json_atomic
from softeval.errors import CellsFailed, SoftevalError
from softeval.models import load_model, model_name
from softeval.scoring import MODELS_FILE, SERIES_FILE, TRUTH_FILE
from softeval.study.folders import CellReport, check_cell_folders
from softeval.study.preflight import check_before_work
from softeval.study.settings import ModelEntry, Study
from softeval.tasks import TaskSpec, load_task

if TYPE_CHECKING:
    from softeval.tuning import SoftPrompt

# The machinery (torch, transformers) is imported once the study's checks have passed
# (`cells.py`, the tuning package): a mistake in a command is told in a second.

log = logging.getLogger("softeval")

# While a study runs, its comparison is rebuilt after a model's cells once this many seconds have
# passed since the last rebuild (and always at the end). A rebuild reads every finished cell in
# the folder, so rebuilding after every model grew with the square of the cells: a testbed study
# of 36 tiny models spent 29 s of its 183 in them. A model that takes minutes still gets its
# comparison right after it.
COMPARISON_EVERY_S = 60.0


# --- where cells live -------------------------------------------------------------------------


# --- running a study -------------------------------------------------------------------------


def run_study(
    study: Study,
    *,
    output: str | Path,
    prompt: str | Path | None = None,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    ray: str | None = None,
    progress: bool = True,
) -> list[CellReport]:
    """Run every unfinished cell of `study` into `output`, then rebuild the comparison and the
    report page (index.html) there from every finished cell.

    A soft prompt comes from `prompt` when given (a file or folder `softeval tune` wrote) and is
    tuned (or reused) otherwise; LoRA adapters are always tuned or reused. `force` redoes finished
    cells and tuning. `ray` runs each (model, task) unit as a Ray task: "local" starts a local
    cluster, anything else is the address of a running one."""
    output = Path(output)
    specs = distinct_tasks([load_task(t) for t in study.tasks])
    tuning = "lora" in study.methods or ("soft-prompt" in study.methods and prompt is None)
    # every check that needs no model comes first: a mistake costs seconds, not a study
    check_before_work([m.model for m in study.models], specs, study.methods, k=study.k, tuning=tuning, outputs=[output], data_dir=data_dir,
                      limit=study.limit, prompt=prompt if "soft-prompt" in study.methods else None)
    check_cell_folders(output, study, specs)
    from softeval.reports import update_analysis, update_ranking, write_comparison, write_page
    from softeval.study.cells import free_evaluated_revision, run_unit
    from softeval.tuning import load_soft_prompt

    soft = load_soft_prompt(prompt) if prompt is not None and "soft-prompt" in study.methods else None
    if soft is not None:
        check_given_prompt(soft, study, specs)
    # a failure is logged as it happens where other cells go on; the error that ends the command
    # names the first one, so a single cell's failure is told once
    tell = _planned_cells(study, specs, soft) > 1
    run = dict(output=output, soft=soft, data_dir=data_dir, force=force, tell_failures=tell)
    if ray is not None:
        from softeval.study.distributed import run_on_ray

        if study.warm_start and "soft-prompt" in study.methods:
            raise SoftevalError("warm_start tunes a series' checkpoints one after another, from the one before: run it without --ray")
        reports = run_on_ray(study, specs, ray, cache_dir=cache_dir, **run)
    else:
        reports = []
        compared = time.monotonic()
        for entry in study.models:
            lm = None  # the last model is freed before the next one loads, not after
            try:  # its weights load with the first cell that is not finished yet
                lm = load_model(entry.model, cache_dir=cache_dir, lazy=True)
            except SoftevalError as exc:  # reported with the failed cells; the other models go on
                if tell:
                    log.error("%s", exc)
                reports += [CellReport(output / model_name(entry.model) / spec.name, "failed", str(exc)) for spec in specs]
                continue
            warm_from = study.previous_checkpoint(lm.name) if study.warm_start else None
            done = [r for spec in specs for r in run_unit(lm, spec, study, role=entry.role, progress=progress, warm_from=warm_from, **run)]
            reports += done
            if study.free_weights and all(r.status != "failed" for r in done):
                free_evaluated_revision(done)
            if _any_finished(reports) and time.monotonic() - compared >= COMPARISON_EVERY_S:
                write_comparison(output)  # the comparison is never far behind
                compared = time.monotonic()
    if _any_finished(reports):  # else nothing changed, and the folder is left as it was
        record_models(output, study.models)
        record_series(output, study)
        record_ground_truth(output, study)
        update_ranking(output, study.reference)
        update_analysis(output)
        write_comparison(output)  # its findings read the ranking and the series analysis
        write_page(output)
    failed = [r for r in reports if r.status == "failed"]
    if failed:
        kept = "; the other cells finished and are kept by a rerun" if _any_finished(reports) else ""
        if tell and ray is None:  # each failure was logged here as it happened: the last line sums them up, once
            raise CellsFailed(f"{len(failed)} of {len(reports)} cells failed, each told above (the first: {failed[0].folder}){kept}",
                              [(str(r.folder), r.message) for r in failed])
        rest = f" (and {len(failed) - 1} more, listed above)" if len(failed) > 1 else ""
        raise SoftevalError(f"{failed[0].folder} failed: {failed[0].message}{rest}{kept}")
    return reports


def check_given_prompt(soft: SoftPrompt, study: Study, specs: list[TaskSpec]) -> None:
    """What can be told of a given soft prompt before a model loads: it serves one model and one
    task, the task and chat mode it was tuned for (the model itself is checked once it has loaded)."""
    from softeval.tuning import check_task_made_for

    if len(study.models) > 1:
        raise SoftevalError(f"{soft.name} was tuned for one model; evaluate it with one --model")
    if len(specs) > 1:
        raise SoftevalError(f"{soft.name} was tuned for one task; evaluate it with one --task")
    chat = bool(soft.metadata.get("chat"))
    if chat and not study.chat:
        raise SoftevalError(f"{soft.name} was tuned with the chat template; add --chat to evaluate it")
    check_task_made_for(soft.name, soft.metadata, specs[0], chat)


def _planned_cells(study: Study, specs: list[TaskSpec], soft: SoftPrompt | None) -> int:
    """Cells a study may run: each method in each chat mode, for each model and task (a given
    soft prompt serves one mode; a model declared base runs plain only)."""
    cells = 0
    for entry in study.models:
        modes = 2 if study.chat and entry.role != "base" else 1
        cells += sum(1 if method == "soft-prompt" and soft is not None else modes for method in study.methods)
    return cells * len(specs)


def _any_finished(reports: list[CellReport]) -> bool:
    """Whether a cell of this command finished, now or in an earlier command (skipped)."""
    return any(r.status != "failed" for r in reports)


def distinct_tasks(specs: list[TaskSpec]) -> list[TaskSpec]:
    """The tasks once each: one spec given twice (a name and its file, two spellings of a path)
    runs once; two different specs of one name would share a results folder, so are refused."""
    seen: dict[str, TaskSpec] = {}
    for spec in specs:
        first = seen.setdefault(spec.name, spec)
        if (first.source_file, first.sha256()) != (spec.source_file, spec.sha256()):
            raise SoftevalError(f"two tasks are named '{spec.name}' ({first.source_file or spec.name} and {spec.source_file or spec.name}); give each task its own name")
    return list(seen.values())


def record_series(output: Path, study: Study) -> None:
    """Add the study's series (each recipe's checkpoints, with their steps and tokens, and how its
    reference is evaluated) to OUTPUT/series.json, keeping those of earlier commands: `softeval
    analyze` reads it."""
    if not study.series:
        return
    from softeval.analysis import Reference, read_series

    known = read_series(output) if (output / SERIES_FILE).is_file() else {}
    evaluated = study.reference or Reference()
    for series in study.series:
        reference = None
        if series.reference is not None:
            reference = {"model": model_name(series.reference), "method": evaluated.method, "chat": evaluated.chat}
        known[series.name] = {"checkpoints": series.points(), "reference": reference}
    write_json_atomic(output / SERIES_FILE, known)


def record_ground_truth(output: Path, study: Study) -> None:
    """Copy the study's ground truth (each checkpoint's known test facts) to OUTPUT/ground_truth.json,
    where `softeval analyze` reads it."""
    if study.ground_truth is None:
        return
    try:
        truth = json.loads(Path(study.ground_truth).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SoftevalError(f"ground truth {study.ground_truth} cannot be read ({exc}); give the ground_truth.json that softeval testbed wrote") from exc
    write_json_atomic(output / TRUTH_FILE, truth)


def record_models(output: Path, models: list[ModelEntry]) -> None:
    """Add the study's models (family, role) to OUTPUT/models.json, keeping those of earlier
    commands into the same folder: the ranking reads it."""
    path = output / MODELS_FILE
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for entry in models:
        name = model_name(entry.model)
        previous = known.get(name, {})
        known[name] = {
            "model": entry.model,
            # a later command without families (softeval run) keeps what a study file declared
            "family": entry.family or previous.get("family"),
            "role": entry.role or previous.get("role"),
        }
    write_json_atomic(path, known)

