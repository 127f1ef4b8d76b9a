"""Experiment trackers: an output folder logged to Weights & Biases (`--wandb PROJECT`) or MLflow
(`--mlflow URI`) once a command has run, one tracker run per command.

What a run holds, as lm-evaluation-harness's loggers log it:

* each finished cell's metrics with their 95% intervals and rows, keyed by the cell's folder:
  `<model>/<task>/<method>[-chat]/task_accuracy`, `..._ci_low`, `..._ci_high`, `.../n`;
* the comparison as tables: `comparison/cells` (every cell's metrics and flags) and
  `comparison/paired` (the paired differences of comparison.json);
* each tuning curve as step series: `<model>/<task>/prompt[-chat]/val_loss` (and train_loss and the
  validation metrics) against the tuning step;
* the report page, the comparison, ranking and analysis files, and every cell's results.json and
  tuning curve as artifacts, at their paths in the folder.

The trackers' packages are optional extras (`softeval[wandb]`, `softeval[mlflow]`), imported only
here and only when asked for; no torch.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import time
import warnings
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from softeval.analysis import PAIRED_METRICS, cell_flags, cell_key, cell_label, finished_cells
from softeval.errors import SoftevalError
from softeval.scoring import GOLD_METRICS, METRICS, EvalResult
from softeval.tuning.chart import CHART_FILES

LOGGED = (*METRICS, *GOLD_METRICS)  # a cell's metrics, then the gold answer's likelihood (where it has them)

log = logging.getLogger("softeval")

# the option, the module to import and the extra that installs it, per tracker
TRACKERS = {"wandb": ("--wandb", "wandb", "wandb"), "mlflow": ("--mlflow", "mlflow", "mlflow")}
# files of the folder itself that go into the artifacts where they exist
FOLDER_FILES = ("index.html", "comparison.json", "comparison.md", "ranking.json", "ranking.md", "analysis.json", "analysis.md",
                "models.json", "series.json")
# the folders of tuned prompts and adapters, whose curve.json and curve.svg are logged
TUNED_FOLDERS = ("prompt", "prompt-chat", "adapter", "adapter-chat")
MLFLOW_EXPERIMENT = "softeval"  # unless $MLFLOW_EXPERIMENT_NAME names another
MLFLOW_BATCH = 1000  # the most metrics a tracking server takes in one request
PARAM_CHARS = 500  # the longest parameter value every MLflow version stores


@dataclass
class Table:
    columns: list[str]
    rows: list[list]

    def as_columns(self) -> dict[str, list]:
        return {name: [row[i] for row in self.rows] for i, name in enumerate(self.columns)}


@dataclass
class Logged:
    """What a tracker run holds of a folder, read once for every tracker."""

    folder: Path
    config: dict[str, str]
    metrics: dict[str, float]  # each cell's metrics, intervals and rows, by prefixed key
    curves: dict[str, list[tuple[int, dict[str, float]]]]  # by prefix: (step, values) of each validation
    tables: dict[str, Table]
    files: list[tuple[Path, str]]  # a file and its folder within the folder ("" at the top)


# --- checking and logging --------------------------------------------------------------------------


def check_trackers(*, wandb: str | None = None, mlflow: str | None = None) -> None:
    """Each tracker asked for is installed, and an MLflow store can be opened: told before a study
    runs, not after it."""
    if wandb:
        _import("wandb")
    if mlflow:
        _guarded("mlflow", mlflow, lambda: _mlflow_experiment(_mlflow_client(mlflow), create=False), after="nothing has run yet")


def log_to_trackers(output: str | Path, *, wandb: str | None = None, mlflow: str | None = None, failure: str | None = None) -> None:
    """Log the finished cells of `output`, its comparison, tuning curves and report page to a W&B
    project and an MLflow tracking URI (each where given), one run each. `failure`: why the
    command ended with failed cells; the run is marked failed and says so."""
    if not (wandb or mlflow):
        return
    logged = read_folder(Path(output))
    if not logged.metrics:
        log.warning("nothing logged to the trackers: %s holds no finished cells", output)
        return
    errors = []
    for tracker, where, log_run in (("wandb", wandb, log_to_wandb), ("mlflow", mlflow, log_to_mlflow)):
        if where:  # one tracker that fails leaves the other to log
            try:
                _guarded(tracker, where, log_run, logged, where, failure)
            except SoftevalError as exc:
                errors.append(exc)
    for error in errors[1:]:
        log.error("%s", error)
    if errors:
        raise errors[0]


def _import(tracker: str):
    option, module, extra = TRACKERS[tracker]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise SoftevalError(f"{option} needs {module}; install it with: pip install 'softeval[{extra}]'") from None


AFTER_STUDY = "the results on disk are kept, and rerunning the same command logs them (finished cells are skipped)"


def _guarded(tracker: str, where: str, call, *args, after: str = AFTER_STUDY) -> None:
    """`call(*args)`, with a tracker's own errors (a store that cannot be opened, a server that cannot be
    reached, a missing login) told in one line, with what stands `after` them."""
    option = TRACKERS[tracker][0]
    try:
        call(*args)
    except SoftevalError:
        raise
    except Exception as exc:  # the trackers raise their own types, and those of the HTTP clients under them
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:600]
        raise SoftevalError(f"{option} {where} failed ({type(exc).__name__}: {reason}); {after}") from exc


# --- what is logged ------------------------------------------------------------------------------


def read_folder(folder: Path) -> Logged:
    """The metrics, curves, tables and files of a folder's finished cells."""
    cells = finished_cells(folder)
    return Logged(
        folder=folder,
        config=run_config(folder, cells),
        metrics={key: value for cell in cells for key, value in cell_metrics(cell).items()},
        curves=tuning_curves(folder),
        tables={"comparison/cells": cells_table(cells), "comparison/paired": paired_table(folder)},
        files=artifact_files(folder, cells),
    )


def metric_key(*parts: str) -> str:
    """A key both trackers take: MLflow allows letters, digits and `_-. :/` only."""
    return re.sub(r"[^\w\-. :/]", "_", "/".join(parts))


def cell_prefix(cell: EvalResult) -> str:
    """The cell's folder within the output folder: <model>/<task>/<method>[-chat]."""
    model, task, _, _ = cell_key(cell)
    return metric_key(model, task, cell_label(cell.config))


def cell_metrics(cell: EvalResult) -> dict[str, float]:
    """A cell's metrics with their 95% intervals, and its rows; undefined values are left out."""
    prefix = cell_prefix(cell)
    logged: dict[str, float] = {f"{prefix}/n": len(cell.samples)}
    for name in LOGGED:
        metric = cell.metrics.get(name)
        if metric is None:
            continue
        for suffix, value in (("", metric.value), ("_ci_low", metric.ci_low), ("_ci_high", metric.ci_high)):
            if value is not None:
                logged[f"{prefix}/{name}{suffix}"] = value
    return logged


def tuning_curves(folder: Path) -> dict[str, list[tuple[int, dict[str, float]]]]:
    """Each tuned prompt's or adapter's curve.json as (step, numeric values) points, by the tuned
    folder's path; the per-row outcomes stay out."""
    curves = {}
    for path in curve_files(folder):
        try:
            points = json.loads(path.read_text(encoding="utf-8"))
            curves[metric_key(*path.parent.relative_to(folder).parts)] = [(int(p["step"]), _numbers(p)) for p in points]
        except (OSError, ValueError, TypeError, KeyError) as exc:  # a damaged curve leaves the rest to log
            log.warning("tuning curve %s not logged: %s", path, exc)
    return curves


def _numbers(point: dict) -> dict[str, float]:
    return {metric_key(k): float(v) for k, v in point.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def cells_table(cells: list[EvalResult]) -> Table:
    """One row a cell: where it is, its rows, each metric with its interval, and its flags."""
    columns = ["model", "task", "method", "chat", "n"] + [f"{m}{s}" for m in LOGGED for s in ("", "_ci_low", "_ci_high")] + ["flags"]
    flags = cell_flags(cells)
    rows = []
    for cell in cells:
        model, task, method, chat = cell_key(cell)
        values = [getattr(cell.metrics[m], a) if m in cell.metrics else None for m in LOGGED for a in ("value", "ci_low", "ci_high")]
        rows.append([model, task, method, chat, len(cell.samples), *values, "; ".join(flags[id(cell)])])
    return Table(columns, rows)


def paired_table(folder: Path) -> Table:
    """The paired differences comparison.json holds (in proportions, as the cells' metrics)."""
    columns = ["model", "task", "method", "baseline", "chat", "n"] + [f"{m}{s}" for m in PAIRED_METRICS for s in ("", "_ci_low", "_ci_high")]
    path = folder / "comparison.json"
    paired = json.loads(path.read_text(encoding="utf-8")).get("paired", []) if path.is_file() else []
    rows = [[p["model"], p["task"], p["method"], p["baseline"], p["chat"], p["n"],
             *(p[m][a] for m in PAIRED_METRICS for a in ("value", "ci_low", "ci_high"))] for p in paired]
    return Table(columns, rows)


def run_config(folder: Path, cells: list[EvalResult]) -> dict[str, str]:
    """What the run covers, as the tracker's config (W&B) or parameters (MLflow)."""
    keys = [cell_key(c) for c in cells]
    try:
        softeval_version = version("softeval")
    except PackageNotFoundError:
        softeval_version = "unknown"
    return {
        "output": str(folder.resolve()),
        "models": ", ".join(dict.fromkeys(k[0] for k in keys)),
        "tasks": ", ".join(dict.fromkeys(k[1] for k in keys)),
        "methods": ", ".join(dict.fromkeys(cell_label(c.config) for c in cells)),
        "cells": str(len(cells)),
        "softeval": softeval_version,
    }


def curve_files(folder: Path) -> list[Path]:
    """The curve.json of each tuned prompt and adapter in the folder."""
    return [path for path in sorted(folder.glob("*/*/*/curve.json")) if path.parent.name in TUNED_FOLDERS]


def artifact_files(folder: Path, cells: list[EvalResult]) -> list[tuple[Path, str]]:
    """The report page, the folder's result files, each finished cell's results.json and each
    tuning curve (samples.jsonl stays out: it grows with the rows and holds every prompt), each
    with the folder it sits in (relative to `folder`)."""
    found = [folder / name for name in FOLDER_FILES]
    found += [_results_file(folder, cell) for cell in cells]
    found += [path.with_name(name) for path in curve_files(folder) for name in ("curve.json", *CHART_FILES)]
    found = [path for path in found if path.is_file()]
    return [(path, "" if path.parent == folder else path.parent.relative_to(folder).as_posix()) for path in found]


def _results_file(folder: Path, cell: EvalResult) -> Path:
    model, task, _, _ = cell_key(cell)
    return folder / model / task / cell_label(cell.config) / "results.json"


def run_name(folder: Path) -> str:
    return folder.resolve().name or "softeval"


# --- Weights & Biases ------------------------------------------------------------------------------


def log_to_wandb(logged: Logged, project: str, failure: str | None = None) -> None:
    """One W&B run: the cells' metrics as one logged step (and so the run's summary), each curve
    against its own step metric (curves all start at step 0, and a W&B run's step only grows),
    the tables, and an artifact of the folder's files. $WANDB_ENTITY, $WANDB_MODE, $WANDB_DIR apply."""
    wandb = _import("wandb")
    # console off: the run starts after the study, so the capture would hold nothing of it
    run = wandb.init(project=project, name=run_name(logged.folder), job_type="softeval", config=logged.config,
                     settings=wandb.Settings(console="off"))
    where = f"run {run.id}" + ("" if run.offline else f", {run.url}")  # read before the run finishes
    try:
        run.log(logged.metrics)
        for prefix, points in logged.curves.items():
            run.define_metric(f"{prefix}/step")
            run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")
            for step, values in points:
                run.log({f"{prefix}/step": step, **{f"{prefix}/{k}": v for k, v in values.items()}})
        run.log({name: wandb.Table(columns=table.columns, data=table.rows) for name, table in logged.tables.items() if table.rows})
        run.log_artifact(_wandb_artifact(wandb, logged))
        if failure:
            run.summary["softeval/failure"] = failure
    finally:
        run.finish(exit_code=1 if failure else 0)
    log.info("logged %s cells to W&B project %s (%s)", logged.config["cells"], project, where)


def _wandb_artifact(wandb, logged: Logged):
    name = re.sub(r"[^\w.-]", "-", f"softeval-{run_name(logged.folder)}")
    artifact = wandb.Artifact(name, type="softeval-report", description=f"report page and results of {logged.config['output']}")
    for path, where in logged.files:
        artifact.add_file(str(path), name=f"{where}/{path.name}" if where else path.name)
    return artifact


# --- MLflow --------------------------------------------------------------------------------------


def log_to_mlflow(logged: Logged, uri: str, failure: str | None = None) -> None:
    """One MLflow run in the experiment $MLFLOW_EXPERIMENT_NAME (default "softeval"): the cells'
    metrics at step 0, each curve's values at their tuning steps, the folder as parameters, the
    tables as MLflow tables and the files as artifacts at their paths in the folder."""
    from mlflow.entities import Metric, Param

    client = _mlflow_client(uri)
    run = client.create_run(_mlflow_experiment(client), run_name=run_name(logged.folder), tags={"softeval.output": logged.config["output"]})
    run_id = run.info.run_id
    try:
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, 0) for key, value in logged.metrics.items()]
        metrics += [Metric(f"{prefix}/{key}", value, now, step) for prefix, points in logged.curves.items()
                    for step, values in points for key, value in values.items()]
        params = [Param(key, value[:PARAM_CHARS]) for key, value in logged.config.items()]
        client.log_batch(run_id, params=params)
        for start in range(0, len(metrics), MLFLOW_BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + MLFLOW_BATCH])
        _mlflow_tables(client, run_id, logged.tables)
        for path, where in logged.files:
            client.log_artifact(run_id, str(path), artifact_path=where or None)
        if failure:
            client.set_tag(run_id, "softeval.failure", failure[:5000])
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FAILED" if failure else "FINISHED")
    log.info("logged %s cells to MLflow at %s (run %s)", logged.config["cells"], uri, run_id)


def _mlflow_client(uri: str):
    _import("mlflow")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _mlflow_experiment(client, create: bool = True) -> str | None:
    """The id of the experiment runs go to, made on first use."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or MLFLOW_EXPERIMENT
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    return client.create_experiment(name) if create else None


def _mlflow_tables(client, run_id: str, tables: dict[str, Table]) -> None:
    for name, table in tables.items():
        if not table.rows:
            continue
        with warnings.catch_warnings():
            # MLflow's own pandas call warns under pandas 3 (select_dtypes and 'str'); not ours to fix
            warnings.filterwarnings("ignore", message=".*select_dtypes.*")
            client.log_table(run_id, data=table.as_columns(), artifact_file=f"{name}.json")


# --- metrics at the training step (evaluation while training) -------------------------------------


STEP_PREFIX = "softeval"  # in-loop metrics: softeval/<task>/<method>/<metric>, against softeval/step


class StepTracker:
    """Scores of checkpoints evaluated while a model trains, logged against the training step
    (and the tokens seen): into the training's own tracker run where one is active (the W&B run
    `wandb.run` that transformers' Trainer opens, MLflow's active run), else into a run of
    softeval's own, opened at the first checkpoint and kept open until `finish`."""

    def __init__(self, *, run_name: str, wandb: str | None = None, mlflow: str | None = None):
        self.run_name, self.wandb_project, self.mlflow_uri = run_name, wandb, mlflow
        self._wandb_run, self._wandb_own = None, False
        self._mlflow, self._mlflow_own = None, False  # (client, run id)

    def log(self, step: int, tokens: float | None, metrics: dict[str, float]) -> None:
        values = {f"{STEP_PREFIX}/{metric_key(key)}": float(v) for key, v in metrics.items() if v is not None and math.isfinite(v)}
        if tokens is not None:
            values[f"{STEP_PREFIX}/tokens"] = float(tokens)
        for tracker, where, log_step in (("wandb", self.wandb_project, self._log_wandb), ("mlflow", self.mlflow_uri, self._log_mlflow)):
            if where:
                _guarded(tracker, where, log_step, step, values, after="the cells are on disk, and training goes on")

    def _log_wandb(self, step: int, values: dict[str, float]) -> None:
        wandb = _import("wandb")
        if self._wandb_run is None:
            self._wandb_own = wandb.run is None
            self._wandb_run = wandb.run or wandb.init(project=self.wandb_project, name=self.run_name, job_type="softeval-in-loop",
                                                      settings=wandb.Settings(console="off"))
            self._wandb_run.define_metric(f"{STEP_PREFIX}/step")
            self._wandb_run.define_metric(f"{STEP_PREFIX}/*", step_metric=f"{STEP_PREFIX}/step")
        # no step=: the training's run counts its own steps, and softeval/step is the x-axis of these
        self._wandb_run.log({f"{STEP_PREFIX}/step": step, **values})

    def _log_mlflow(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        if self._mlflow is None:
            mlflow = _import("mlflow")
            active = mlflow.active_run()
            if active is not None:  # the training's run, on the tracking server it logs to
                from mlflow.tracking import MlflowClient

                self._mlflow = (MlflowClient(tracking_uri=mlflow.get_tracking_uri()), active.info.run_id)
            else:
                client = _mlflow_client(self.mlflow_uri)
                run = client.create_run(_mlflow_experiment(client), run_name=self.run_name, tags={"softeval.in_loop": "true"})
                self._mlflow, self._mlflow_own = (client, run.info.run_id), True
        client, run_id = self._mlflow
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        for start in range(0, len(metrics), MLFLOW_BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + MLFLOW_BATCH])

    def finish(self) -> None:
        """End the runs softeval opened; a training's own run is left to it."""
        if self._wandb_run is not None and self._wandb_own:
            self._wandb_run.finish()
        if self._mlflow is not None and self._mlflow_own:
            client, run_id = self._mlflow
            client.set_terminated(run_id, status="FINISHED")
        self._wandb_run = self._mlflow = None
