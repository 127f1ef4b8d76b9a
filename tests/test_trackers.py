"""Experiment trackers: a tiny study run through the command line with --wandb (an offline run) and
--mlflow (a file store), read back from what each tracker wrote and compared with the cells on disk."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROWS, write_study, write_user_task
from softeval.analysis import cell_key, finished_cells
from softeval.cli import app
from softeval.errors import SoftevalError
from softeval.reports.trackers import cell_prefix

runner = CliRunner()
PROJECT = "softeval-test"


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def tracker_env(env: pytest.MonkeyPatch, tmp: Path) -> str:
    """Both trackers offline and inside `tmp`; returns the MLflow store's URI."""
    import wandb

    wandb.teardown()  # W&B reads its settings from the environment once a process: each test's are read afresh
    env.setenv("WANDB_MODE", "offline")
    env.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        (tmp / name.lower()).mkdir(exist_ok=True)
        env.setenv(name, str(tmp / name.lower()))
    env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store for those who ask for it
    for name in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_URI", "WANDB_ENTITY", "WANDB_PROJECT"):
        env.delenv(name, raising=False)
    return (tmp / "mlruns").as_uri()


@pytest.fixture(scope="module")
def tracked(family_dirs, tmp_path_factory) -> tuple[Path, str]:
    """A base and a post-trained model, zero-shot and soft-prompt (tuned here), logged to both
    trackers by one `softeval study`; the output folder and the MLflow URI."""
    tmp = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as env:
        uri = tracker_env(env, tmp)
        study = write_study(tmp, {"alpha": family_dirs["alpha"]}, ["zero-shot", "soft-prompt"], chat=False, reference={"chat": False})
        result = run("study", study, "--output", tmp / "out", "--wandb", PROJECT, "--mlflow", uri)
    assert result.exit_code == 0, result.output
    return tmp / "out", uri


def expected_metrics(out: Path) -> dict[str, float]:
    """Each finished cell's metrics, intervals and rows, keyed as the trackers are told to log them."""
    expected = {}
    for cell in finished_cells(out):
        prefix = cell_prefix(cell)
        expected[f"{prefix}/n"] = len(cell.samples)
        for name, metric in cell.metrics.items():
            expected |= {f"{prefix}/{name}{suffix}": value for suffix, value in
                         (("", metric.value), ("_ci_low", metric.ci_low), ("_ci_high", metric.ci_high)) if value is not None}
    return expected


def curves(out: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, validation loss) of each tuned prompt, by its folder."""
    return {"/".join(path.parent.relative_to(out).parts): [(p["step"], p["val_loss"]) for p in json.loads(path.read_text())]
            for path in out.glob("*/*/*/curve.json")}


# --- reading an offline W&B run back ----------------------------------------------------------------

BLOCK, HEADER = 32768, 7  # the .wandb file: a 7-byte header, then LevelDB-log records in 32 KiB blocks


def wandb_records(path: Path):
    """The records of an offline run's .wandb file (W&B ships no reader for it in Python)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a record header is padding
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)  # after a 4-byte checksum
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_run(root: Path) -> dict:
    """History rows, artifacts (type -> file paths), config and exit code of the one offline run under `root`."""
    (path,) = root.glob("wandb/offline-run-*/run-*.wandb")
    found = {"history": [], "artifacts": {}, "config": {}, "exit_code": None, "files": path.parent / "files"}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for item in record.history.item:
                keys = [item.key] if item.key else list(item.nested_key)
                nested = row
                for key in keys[:-1]:
                    nested = nested.setdefault(key, {})
                nested[keys[-1]] = json.loads(item.value_json)
            found["history"].append(row)
        elif kind == "artifact":
            found["artifacts"][record.artifact.type] = {entry.path for entry in record.artifact.manifest.contents}
        elif kind in ("run", "config"):  # the config given to wandb.init comes with the run record
            found["config"] |= {item.key: json.loads(item.value_json) for item in getattr(record, kind).config.update}
        elif kind == "exit":
            found["exit_code"] = record.exit.exit_code
    return found


def test_wandb_run_holds_the_cells_curves_table_and_report(tracked):
    out, _ = tracked
    logged = wandb_run(out.parent / "wandb_dir")
    assert logged["exit_code"] == 0
    assert logged["config"]["cells"] == "4" and logged["config"]["methods"] == "zero-shot, soft-prompt"
    expected = expected_metrics(out)
    assert len(expected) > 4 * 10  # four cells, each with metrics and intervals
    cells_row = next(row for row in logged["history"] if any(key.endswith("/task_accuracy") for key in row))
    assert {key: cells_row[key] for key in expected} == expected
    # each curve against its own step metric, at its tuning steps
    tuned = curves(out)
    assert len(tuned) == 2
    for prefix, points in tuned.items():
        logged_points = [(row[f"{prefix}/step"], row[f"{prefix}/val_loss"]) for row in logged["history"] if f"{prefix}/step" in row]
        assert logged_points == points and [step for step, _ in points] == [0, 2]
    # the comparison as a table: a row per cell, with the intervals
    table_file = next(row["comparison/cells"] for row in logged["history"] if "comparison/cells" in row)
    table = json.loads((logged["files"] / table_file["path"]).read_text())
    assert "task_accuracy_ci_low" in table["columns"] and len(table["data"]) == 4
    by_cell = {(r[0], r[2]): dict(zip(table["columns"], r)) for r in table["data"]}
    for cell in finished_cells(out):
        model, _, method, _ = cell_key(cell)
        row = by_cell[(model, method)]
        assert (row["task_accuracy"], row["task_accuracy_ci_high"]) == (cell.metrics["task_accuracy"].value, cell.metrics["task_accuracy"].ci_high)
    files = logged["artifacts"]["softeval-report"]
    assert {"index.html", "comparison.json", "comparison.md"} <= files
    assert {str(p.relative_to(out)) for p in out.glob("*/*/*/results.json")} <= files
    assert {str(p.relative_to(out)) for p in out.glob("*/*/prompt/curve.*")} <= files and not any(f.endswith(".jsonl") for f in files)


def test_mlflow_run_holds_the_cells_curves_table_and_report(tracked, tmp_path):
    from mlflow.tracking import MlflowClient

    out, uri = tracked
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=uri)
        (run_info,) = client.search_runs([client.get_experiment_by_name("softeval").experiment_id])
        run_id = run_info.info.run_id
        assert run_info.info.status == "FINISHED" and run_info.info.run_name == "out"
        expected = expected_metrics(out)
        assert {key: run_info.data.metrics[key] for key in expected} == expected
        assert run_info.data.params["methods"] == "zero-shot, soft-prompt"
        for prefix, points in curves(out).items():
            history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, f"{prefix}/val_loss"))
            assert history == points
        top = {a.path for a in client.list_artifacts(run_id)}
        assert {"index.html", "comparison.json", "comparison.md", "comparison"} <= top
        assert {a.path for a in client.list_artifacts(run_id, "comparison")} >= {"comparison/cells.json", "comparison/paired.json"}
        cell = next(p.parent.relative_to(out) for p in out.glob("*/*/zero-shot/results.json"))
        assert [a.path for a in client.list_artifacts(run_id, cell.as_posix())] == [f"{cell.as_posix()}/results.json"]
        table = json.loads(Path(client.download_artifacts(run_id, "comparison/cells.json", str(tmp_path))).read_text())
    assert len(table["data"]) == 4 and "knowledge_ci_high" in table["columns"]


def broken_model(tmp_path: Path, tiny_model_dirs) -> Path:
    """A folder that passes the checks before work (it has a config.json) but cannot load."""
    folder = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dirs["llama"], folder)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    return folder


def test_a_study_with_failed_cells_logs_the_finished_ones_as_a_failed_run(tmp_path, tiny_model_dirs, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = tracker_env(monkeypatch, tmp_path)
    task, out = write_user_task(tmp_path, ROWS * 5), tmp_path / "out"
    result = run("run", "--model", broken_model(tmp_path, tiny_model_dirs), "--model", tiny_model_dirs["llama"], "--task", task,
                 "--method", "zero-shot", "--limit", 4, "--output", out, "--wandb", PROJECT, "--mlflow", uri)
    assert isinstance(result.exception, SoftevalError) and str(result.exception).startswith("1 of 2 cells failed, each told above")
    expected = expected_metrics(out)
    assert expected and all(key.startswith(f"{tiny_model_dirs['llama'].name}/capitals/zero-shot/") for key in expected)
    client = MlflowClient(tracking_uri=uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("softeval").experiment_id])
    assert logged.info.status == "FAILED" and "cannot load model" in logged.data.tags["softeval.failure"]
    assert {key: logged.data.metrics[key] for key in expected} == expected
    offline = wandb_run(tmp_path / "wandb_dir")
    assert offline["exit_code"] == 1 and {key: offline["history"][0][key] for key in expected} == expected


@pytest.mark.parametrize("option, module", [("--wandb", "wandb"), ("--mlflow", "mlflow")])
def test_a_missing_tracker_is_told_before_the_study_runs(tmp_path, tiny_model_dirs, monkeypatch, option, module):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed: importing it fails
    out = tmp_path / "out"
    result = run("eval", "--model", tiny_model_dirs["llama"], "--task", write_user_task(tmp_path, ROWS), "--output", out, option, "x")
    assert isinstance(result.exception, SoftevalError)
    assert str(result.exception) == f"{option} needs {module}; install it with: pip install 'softeval[{module}]'"
    assert not out.exists()


def test_a_tracking_store_that_cannot_be_opened_is_told_before_the_study_runs(tmp_path, tiny_model_dirs):
    out = tmp_path / "out"
    result = run("eval", "--model", tiny_model_dirs["llama"], "--task", write_user_task(tmp_path, ROWS), "--output", out, "--mlflow", "nowhere://x")
    assert isinstance(result.exception, SoftevalError)
    assert str(result.exception).startswith("--mlflow nowhere://x failed (") and str(result.exception).endswith("; nothing has run yet")
    assert not out.exists()
