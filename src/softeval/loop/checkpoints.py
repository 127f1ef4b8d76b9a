"""One checkpoint's evaluation, wherever its model comes from (the live model inside a training
loop, or a checkpoint folder that `watch` saw land): what `InLoop` and `watch` share.

    units (set x task x method) -> each unit's cells (study.cells.run_unit) -> the checkpoint
    filed into its recipe's series -> analysis, comparison, page refreshed -> trackers at the
    training step -> a line in OUTPUT/evaluations.jsonl and on the terminal

A unit is one method of one task in one set: the full set in OUTPUT, the fast set (where there
is one) in OUTPUT/fast. A cell that fails keeps why in its folder (failure.json) and the other
cells go on; `raise_errors` raises instead.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from softeval._io import write_json_atomic
from softeval.errors import SoftevalError
from softeval.loop.filing import check_series_settings, file_checkpoint, record_evaluation, refresh_reports
from softeval.loop.settings import FAST_FOLDER, LoopSettings
from softeval.models import checkpoint_step
from softeval.progress import console
from softeval.study.folders import CellReport, cell_folder, tuned_folder
from softeval.study.settings import Settings
from softeval.tasks import TaskSpec, load_task, resolve_data_dir

log = logging.getLogger("softeval")

FAILURE_FILE = "failure.json"  # in a cell's folder: why its last evaluation failed


@dataclass
class Unit:
    """One method of one task, in one set (full or fast): the smallest share a rank takes."""

    output: Path
    settings: Settings
    spec: TaskSpec
    method: str
    fast: bool


@dataclass
class Evaluation:
    """What one checkpoint's evaluation did: its cells, what failed, and what it cost."""

    recipe: str
    model: str  # the checkpoint's name in the output folder: recipe@step-N, run@checkpoint-N
    step: int
    tokens: float | None
    cells: list[CellReport] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # beyond a cell's own: a rank that did not report, a model that cannot be read
    seconds: float = 0.0  # wall time of the whole evaluation (inside a loop: the time training waited, on this rank)
    flops: float | None = None  # estimated (see cost.py), over every rank's share
    report_seconds: float = 0.0  # of `seconds`: the analysis, comparison and page written afterwards
    scores: dict[str, float] = field(default_factory=dict)  # "<task>/<method>/<metric>" (fast cells under "fast/")

    @property
    def failed(self) -> list[CellReport]:
        return [cell for cell in self.cells if cell.status == "failed"]

    def record(self) -> dict:
        """The line OUTPUT/evaluations.jsonl holds of it."""
        return {
            "recipe": self.recipe, "model": self.model, "step": self.step, "tokens": self.tokens,
            "seconds": round(self.seconds, 3), "report_seconds": round(self.report_seconds, 3), "flops": self.flops,
            "cells": {str(cell.folder): cell.status for cell in self.cells},
            "failures": self.failures + [f"{cell.folder}: {cell.message}" for cell in self.failed],
            "scores": self.scores,
        }


class CheckpointEvaluator:
    """Evaluates checkpoints of recipes into `output` with `settings`; `source` ("in-loop",
    "watch") is recorded with each series. Everything that can be checked before any model is
    seen is checked here."""

    def __init__(self, settings: LoopSettings, output: Path, data_dir, *, source: str, raise_errors: bool = False, progress: bool = False,
                 quiet: bool = False, wandb: str | None = None, mlflow: str | None = None, refresh_every: float | None = None):
        self.settings, self.output, self.source = settings, Path(output), source
        self.refresh_every = settings.refresh_every if refresh_every is None else refresh_every
        self._refreshed: dict[Path, float] = {}  # each folder's last refresh (monotonic seconds)
        self._behind: set[Path] = set()  # folders filed into since their last refresh
        self.data_dir = check_data_dir(data_dir)
        self.raise_errors, self.progress, self.quiet = raise_errors, progress, quiet
        self.wandb, self.mlflow = wandb, mlflow
        self.specs = check_grid(settings, self.output, self.data_dir)
        if wandb or mlflow:
            from softeval.reports import check_trackers

            check_trackers(wandb=wandb, mlflow=mlflow)
        self._trackers: dict[str, object] = {}  # by recipe: softeval's own tracker runs, kept open

    def check_recipe(self, recipe: str) -> None:
        """The folder can take this recipe's checkpoints (see filing.check_series_settings)."""
        for folder, settings in self.folders():
            check_series_settings(folder, recipe, self.filed_settings(settings, folder), self.source)

    def folders(self) -> list[tuple[Path, Settings]]:
        """The full set's folder and settings, and the fast set's where there is one."""
        folders = [(self.output, self.settings.full_settings())]
        if self.settings.fast is not None:
            folders.append((self.output / FAST_FOLDER, self.settings.fast_settings()))
        return folders

    def filed_settings(self, settings: Settings, folder: Path) -> dict:
        """What a series records of the settings its cells were evaluated with: each task by its
        name and spec (however its path was written; an edited spec is another setting)."""
        recorded = settings.model_dump(mode="json")
        recorded["tasks"] = {self.specs[task].name: self.specs[task].sha256() for task in settings.tasks}
        if folder != self.output and self.settings.fast is not None:
            recorded["fast_steps"] = self.settings.fast.steps
        return recorded

    def units(self, full: bool) -> list[Unit]:
        """Every (set, task, method) of an evaluation, in a fixed order (ranks share them by
        position): the fast set's always, the full set's where `full`."""
        units = []
        for folder, settings in self.folders():
            fast = folder != self.output
            if fast or full:
                units += [Unit(folder, settings, self.specs[task], method, fast) for task in settings.tasks for method in settings.methods]
        return units

    # --- a checkpoint's cells ------------------------------------------------------------------

    def run(self, lm, units: list[Unit], recipe: str, step: int) -> list[CellReport]:
        """Each unit's cells on a loaded model (`lm.name` is the checkpoint's name)."""
        return [cell for unit in units for cell in self._run_unit(lm, unit, recipe, step)]

    def _run_unit(self, lm, unit: Unit, recipe: str, step: int) -> list[CellReport]:
        from softeval.study.cells import run_unit

        warm_from = warm_source(unit.output, recipe, unit.spec.name, step) if unit.method == "soft-prompt" and self.settings.warm_start else None
        settings = unit.settings.model_copy(update={"methods": [unit.method]})
        if warm_from is not None and unit.fast and self.settings.fast.steps:  # fewer steps from a warm start
            settings = settings.model_copy(update={"tuning": settings.tuning.model_copy(update={"steps": self.settings.fast.steps})})
        folder = cell_folder(unit.output, lm.name, unit.spec.name, unit.method, False)
        try:
            reports = run_unit(lm, unit.spec, settings, role="base", output=unit.output, soft=None, data_dir=self.data_dir, force=False,
                               progress=self.progress, warm_from=warm_from)
        except Exception as exc:  # noqa: BLE001 - a failure stays in its cell; the other cells go on
            if self.raise_errors:
                raise
            log.error("%s failed: %s", folder, one_line(exc))
            reports = [CellReport(folder, "failed", one_line(exc))]
        for cell in reports:
            _record_failure(cell, step)
        failed = next((cell for cell in reports if cell.status == "failed"), None)
        if failed is not None and self.raise_errors:
            raise SoftevalError(f"{failed.folder} failed: {failed.message}")
        return reports

    # --- after the cells --------------------------------------------------------------------------

    def file(self, evaluation: Evaluation, spec: str) -> None:
        """The checkpoint (`spec`: how it was loaded) into its series in each set it has cells in,
        the reports refreshed, the scores read back."""
        landed = {cell.folder.parents[2] for cell in evaluation.cells if cell.status != "failed"}
        for folder, settings in self.folders():
            if folder in landed:
                point = {"model": evaluation.model, "spec": spec, "step": evaluation.step, "tokens": evaluation.tokens}
                file_checkpoint(folder, evaluation.recipe, point, self.filed_settings(settings, folder), self.source)
                self._behind.add(folder)
                if time.monotonic() - self._refreshed.get(folder, -math.inf) >= self.refresh_every:
                    evaluation.report_seconds += self.refresh(folder)
        evaluation.scores = scores_of(evaluation.cells, self.output / FAST_FOLDER)

    def refresh(self, folder: Path) -> float:
        """The folder's analysis, comparison and page, written now; returns the seconds it took."""
        seconds = refresh_reports(folder)
        self._refreshed[folder] = time.monotonic()
        self._behind.discard(folder)
        return seconds

    def finish(self, evaluation: Evaluation) -> None:
        """Once its time is known: the trackers, OUTPUT/evaluations.jsonl and the terminal line."""
        if self.wandb or self.mlflow:
            self._log_to_trackers(evaluation)
        record_evaluation(self.output, evaluation.record())
        self._tell(evaluation)

    def _log_to_trackers(self, evaluation: Evaluation) -> None:
        from softeval.reports.trackers import StepTracker

        tracker = self._trackers.setdefault(evaluation.recipe, StepTracker(run_name=evaluation.recipe, wandb=self.wandb, mlflow=self.mlflow))
        try:
            tracker.log(evaluation.step, evaluation.tokens, evaluation.scores | cost_metrics(evaluation))
        except SoftevalError as exc:  # the scores are on disk; a tracker that cannot be reached stops nothing
            if self.raise_errors:
                raise
            evaluation.failures.append(str(exc))
            log.error("%s", exc)

    def _tell(self, evaluation: Evaluation) -> None:
        from softeval.loop.cost import flops_text

        if self.quiet:
            return
        done = sum(cell.status != "failed" for cell in evaluation.cells)
        failed = len(evaluation.failed) + len(evaluation.failures)
        tokens = f", {evaluation.tokens:,.0f} tokens" if evaluation.tokens is not None else ""
        failures = f", {failed} failed (see {self.output / 'evaluations.jsonl'})" if failed else ""
        console.print(f"softeval: {evaluation.model}{tokens}: {done} cells in {evaluation.seconds:.1f} s "
                      f"(≈ {flops_text(evaluation.flops)}; reports {evaluation.report_seconds:.1f} s){failures}", highlight=False, markup=False)

    def close(self) -> None:
        """Write the reports that are behind their cells, and finish softeval's own tracker runs
        (a training run's own tracker run is left to it)."""
        for folder in sorted(self._behind):
            self.refresh(folder)
        for tracker in self._trackers.values():
            tracker.finish()
        self._trackers = {}


# --- checks before any model is seen --------------------------------------------------------------


def check_recipe_name(recipe: str, who: str) -> str:
    """A recipe names folders (`recipe@step-N`): no path separators, no '@'."""
    if not isinstance(recipe, str) or not recipe.strip() or any(c in recipe for c in "/\\@") or recipe.startswith("."):
        raise SoftevalError(f"{who}: recipe {recipe!r} cannot name a folder; give a name without '/', '\\', '@' or a leading '.'")
    return recipe


def check_data_dir(data_dir: str | Path | None) -> Path | None:
    """A data folder that is given must be there: else rows would be looked for on the hub."""
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise SoftevalError(f"data folder not found: {data_dir}; give the benchmark mirror's root folder (or none, for the hub)")
    return resolve_data_dir(data_dir)


def check_grid(settings: LoopSettings, output: Path, data_dir: Path | None) -> dict[str, TaskSpec]:
    """The tasks load, every split the methods read is read and rendered, the output folder can
    be written: as a study checks them before any model loads. Returns each task's spec."""
    from softeval.study.preflight import check_before_work
    from softeval.study.runner import distinct_tasks

    specs = {task: load_task(task) for task in settings.tasks}
    distinct_tasks(list(specs.values()))
    tuning = bool({"soft-prompt", "lora"} & set(settings.methods))
    check_before_work([], list(specs.values()), settings.methods, k=settings.k, tuning=tuning, outputs=[output], data_dir=data_dir,
                      limit=settings.limit)
    return specs


def check_tokenizer(tokenizer, specs: list[TaskSpec], settings: LoopSettings, data_dir: Path | None) -> None:
    """The tokenizer encodes every task's instruction, questions and answers to tokens, and has a
    chat template where the settings ask for one."""
    from softeval.tasks import load_examples, tuning_target

    if not callable(tokenizer) or not hasattr(tokenizer, "decode"):
        raise SoftevalError(f"the tokenizer is a {type(tokenizer).__name__}, not a transformers tokenizer; "
                            "give the one the model trains with (AutoTokenizer.from_pretrained(...))")
    if settings.chat and not getattr(tokenizer, "chat_template", None):
        raise SoftevalError("chat is set, and the tokenizer has no chat template; drop chat (a model in pre-training is a base model)")
    for spec in specs:
        examples = load_examples(spec, spec.dataset.eval_split, data_dir, limit=3, seed=settings.seed)
        texts = [spec.instruction or ""] + [spec.render("template", e) for e in examples] + [tuning_target(spec, e) for e in examples]
        for text in filter(str.strip, texts):
            try:
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            except Exception as exc:  # noqa: BLE001 - tokenizers fail in many ways
                raise SoftevalError(f"the tokenizer cannot encode task {spec.name}'s text ({one_line(exc)}); give the tokenizer the model trains with") from exc
            if not ids:
                raise SoftevalError(f"the tokenizer encodes task {spec.name}'s text {text[:40]!r} to no tokens; give the tokenizer the model trains with")


# --- helpers --------------------------------------------------------------------------------------


def warm_source(output: Path, recipe: str, task: str, step: int) -> str | None:
    """The recipe's latest checkpoint before `step` in `output` whose soft prompt for `task` was
    tuned: found on disk, so a restarted run, or another rank, finds it too."""
    found = []
    for folder in glob.glob(glob.escape(str(Path(output) / f"{recipe}@")) + "*"):
        name = Path(folder).name
        earlier = checkpoint_step(name.split("@", 1)[1])
        prompt = tuned_folder(output, name, task, "soft-prompt", False) / "soft_prompt.safetensors"
        if earlier is not None and earlier < step and prompt.is_file():
            found.append((earlier, name))
    return max(found)[1] if found else None


def _record_failure(cell: CellReport, step: int) -> None:
    """A failed cell keeps why in its folder (failure.json); a cell that finished drops an old one."""
    path = cell.folder / FAILURE_FILE
    if cell.status == "failed":
        write_json_atomic(path, {"error": cell.message, "step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    else:
        path.unlink(missing_ok=True)


def scores_of(cells: list[CellReport], fast_folder: Path) -> dict[str, float]:
    """Each finished cell's metrics, as "<task>/<method>/<metric>" (fast cells under "fast/")."""
    from softeval.scoring import METRICS

    scores = {}
    for cell in cells:
        path = cell.folder / "results.json"
        if cell.status == "failed" or not path.is_file():
            continue
        metrics = json.loads(path.read_text(encoding="utf-8"))["metrics"]
        prefix = (f"{FAST_FOLDER}/" if cell.folder.parents[2] == fast_folder else "") + f"{cell.folder.parent.name}/{cell.folder.name}"
        scores |= {f"{prefix}/{name}": metrics[name]["value"] for name in METRICS if name in metrics and metrics[name]["value"] is not None}
    return scores


def cost_metrics(evaluation: Evaluation) -> dict[str, float]:
    cost = {"cost/seconds": evaluation.seconds, "cost/report_seconds": evaluation.report_seconds}
    return cost | ({"cost/flops": evaluation.flops} if evaluation.flops is not None else {})


def one_line(exc: BaseException) -> str:
    """An error as one line: a softeval error as it is written, another with its type."""
    text = str(exc).strip().splitlines()
    if isinstance(exc, SoftevalError):
        return text[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
