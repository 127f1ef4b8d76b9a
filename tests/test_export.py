"""Exports: a study's finished cells as Every Eval Ever logs (checked against the schema files of
every-eval-ever 0.3.0) and as lm-evaluation-harness results (read back by lm-eval's own code), every
metric and interval carried over as the cells hold them."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import STUDY_ROWS, write_study, write_user_task
from softeval import cli
from softeval.analysis import cell_label, finished_cells
from softeval.cli import app
from softeval.scoring import GOLD_METRICS, LOWER_IS_BETTER, METRICS, ROW_METRICS

runner = CliRunner()
EEE_WHEEL = "every-eval-ever==0.3.0"
# the capitals rows asked open-ended: knowledge is then the lenient parser's verdict
OPEN_ENDED = {
    "name": "capitals_open",
    "answer_format": "short_answer",
    "fields": {"question": "q", "answer": "[a, b][gold]", "aliases": "[[a, b][gold]]"},
    "template": "Question: {{ question }}\nAnswer:",
    "cloze_template": None,
    "target": " {{ answer }}",
}


@pytest.fixture(scope="module")
def study_out(family_dirs, tmp_path_factory) -> Path:
    """A study's output folder: one family's base and post-trained model (the latter also with its
    chat template), zero-shot and soft prompt, on a multiple-choice and an open-ended task."""
    tmp = tmp_path_factory.mktemp("export-study")
    study = write_study(tmp, {"alpha": family_dirs["alpha"]}, ["zero-shot", "soft-prompt"], limit=8)
    (tmp / "open").mkdir()
    settings = yaml.safe_load(study.read_text())
    settings["tasks"].append(str(write_user_task(tmp / "open", STUDY_ROWS, **OPEN_ENDED)))
    study.write_text(yaml.safe_dump(settings))
    out = tmp / "out"
    result = runner.invoke(app, ["study", str(study), "--output", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="session")
def eee_schemas(request, tmp_path_factory) -> dict:
    """every-eval-ever 0.3.0's aggregate and instance-level JSON schemas, from its wheel: the
    package needs Python 3.12, so pip downloads the wheel (once, into pytest's cache where there is
    one), nothing is installed."""
    pytest.importorskip("jsonschema")
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    folder = cache.mkdir("every-eval-ever-0.3.0") if cache is not None else tmp_path_factory.mktemp("every-eval-ever")
    wheels = sorted(folder.glob("every_eval_ever-0.3.0-*.whl"))
    if not wheels:
        pip = [sys.executable, "-m", "pip", "download", EEE_WHEEL, "--no-deps", "--python-version", "3.12", "--only-binary=:all:", "-d", str(folder)]
        done = subprocess.run(pip, check=False, capture_output=True, text=True, timeout=600)
        wheels = sorted(folder.glob("every_eval_ever-0.3.0-*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"pip cannot get the {EEE_WHEEL} wheel, whose schema files the check reads: {reason}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        return {name: json.loads(wheel.read(f"every_eval_ever/schemas/{name}.schema.json")) for name in ("eval", "instance_level_eval")}


def cells_by_name(out: Path) -> dict[str, object]:
    """The folder's finished cells by <model>/<task>/<method>[-chat], as the exports name them."""
    return {f"{Path(r.config['model']).name}/{r.config['task']}/{cell_label(r.config)}": r for r in finished_cells(out)}


def lm_eval_filter(result, metric: str) -> str:
    """The filter of a metric's lm-eval key: the parser it reads, or how knowledge was scored (the
    capitals spec scores options per character; the open-ended task's knowledge is the lenient verdict)."""
    if metric == "knowledge":
        return "acc_norm" if result.config["task"] == "capitals" else "lenient"
    return "lenient" if metric == "lenient_accuracy" else "strict"


# --- Every Eval Ever -------------------------------------------------------------------------------


def test_eee_logs_follow_the_schema_and_carry_every_metric_and_interval(study_out, eee_schemas):
    from jsonschema import Draft7Validator

    result = runner.invoke(app, ["export", str(study_out), "--format", "eee"])
    export = study_out / "export" / "eee"
    assert result.exit_code == 0, result.output
    assert result.output.startswith("wrote 24 files to ")  # a log and its samples per cell, into FOLDER/export/eee by default
    aggregate, instance = Draft7Validator(eee_schemas["eval"]), Draft7Validator(eee_schemas["instance_level_eval"])
    cells = cells_by_name(study_out)
    logs = sorted(export.glob("data/*/*/*/*.json"))
    assert len(logs) == len(cells) == 12  # (base, post-trained, post-trained with chat) x 2 methods x 2 tasks
    seen = set()
    for path in logs:
        log = json.loads(path.read_text())
        assert not list(aggregate.iter_errors(log)), [e.message for e in aggregate.iter_errors(log)][:3]
        # the datastore's layout: data/<task>/<developer>/<model>/<uuid4>.json
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.json", path.name)
        name = log["source_metadata"]["additional_details"]["cell"]
        seen.add(name)
        cell = cells[name]
        assert path.relative_to(export).parts[:4] == ("data", cell.config["task"], "local", Path(cell.config["model"]).name)
        check_eee_results(log, cell)
        check_eee_method(log, cell)
        check_eee_samples(export, log, cell, instance)
    assert seen == set(cells)
    again = runner.invoke(app, ["export", str(study_out), "--format", "eee"])
    assert again.exit_code == 0 and sorted(export.glob("data/*/*/*/*.json")) == logs  # a cell keeps its file


def check_eee_results(log: dict, cell) -> None:
    """Each defined metric a result of its own with its exact value and interval; an undefined one said."""
    results = {r["evaluation_result_id"]: r for r in log["evaluation_results"]}
    undefined = [m for m in METRICS if cell.metrics[m].value is None]
    gold = {m for m in GOLD_METRICS if m in cell.metrics and cell.metrics[m].value is not None}
    assert gold >= {"gold_bpb", "gold_logprob"}  # every cell scores its gold answer
    assert set(results) == set(METRICS) - set(undefined) | gold
    for metric in gold:
        config = results.pop(metric)["metric_config"]
        assert config["lower_is_better"] == (metric in LOWER_IS_BETTER) and config["metric_id"] == f"softeval.{metric}"
    assert log["source_metadata"]["additional_details"].get("undefined_metrics") == (", ".join(undefined) or None)
    for metric, entry in results.items():
        value = cell.metrics[metric]
        details = entry["score_details"]
        assert entry["evaluation_name"] == cell.config["task"]
        assert entry["metric_config"]["metric_id"] == f"softeval.{metric}"
        assert details["score"] == value.value
        uncertainty = details["uncertainty"]
        counted = sum(s.format_ok for s in cell.samples) if metric == "conditional_accuracy" else len(cell.samples)
        assert uncertainty["num_samples"] == counted and uncertainty["num_bootstrap_samples"] == 1000
        interval = uncertainty["confidence_interval"]
        assert (interval["lower"], interval["upper"], interval["confidence_level"]) == (value.ci_low, value.ci_high, 0.95)
    # strict apart from lenient, format apart from knowledge
    parameters = {m: r["metric_config"]["metric_parameters"] for m, r in results.items()}
    assert parameters["task_accuracy"] == parameters["format_following"] == {"parser": "strict"}
    assert parameters["lenient_accuracy"] == {"parser": "lenient"}
    knowledge = {"acc_norm": {"scoring": "option_loglikelihood", "normalization": "characters"}, "lenient": {"scoring": "lenient_parser"}}
    assert parameters["knowledge"] == knowledge[lm_eval_filter(cell, "knowledge")]
    for metric, entry in results.items():
        assert entry["metric_config"]["additional_details"]["lm_eval_key"] == f"{metric},{lm_eval_filter(cell, metric)}"


def check_eee_method(log: dict, cell) -> None:
    """The method, the chat mode and the soft prompt's sha256 in every result's generation details."""
    for entry in log["evaluation_results"]:
        details = entry["generation_config"]["additional_details"]
        assert details["method"] == cell.config["method"] and details["chat"] == json.dumps(cell.config["chat"])
        if cell.config["method"] == "soft-prompt":
            assert details["soft_prompt_sha256"] == cell.config["soft_prompt"]["sha256"] == cell.identity["tuned_sha256"]
            assert json.loads(details["tuning"]) == cell.tuning
        else:
            assert "soft_prompt_sha256" not in details
    assert cell.config["method"] in log["evaluation_id"]


def check_eee_samples(export: Path, log: dict, cell, validator) -> None:
    """The samples file the log names: its checksum and rows, each row valid and counted once per
    result it counts in, their scores averaging to the result's."""
    detail = log["detailed_evaluation_results"]
    path = export / detail["file_path"]
    data = path.read_bytes()
    assert detail["checksum"] == hashlib.sha256(data).hexdigest()
    rows = [json.loads(line) for line in data.decode().splitlines()]
    assert detail["total_rows"] == len(rows)
    scores = defaultdict(list)
    for row in rows:
        assert not list(validator.iter_errors(row)), [e.message for e in validator.iter_errors(row)][:3]
        assert (row["evaluation_id"], row["model_id"]) == (log["evaluation_id"], log["model_info"]["id"])
        scores[row["evaluation_result_id"]].append(row["evaluation"]["score"])
    for metric in scores:
        value = cell.metrics[metric].value
        if metric in GOLD_METRICS:  # a likelihood: each row's value, averaging to the cell's
            assert len(scores[metric]) == len(cell.samples) and sum(scores[metric]) / len(cell.samples) == pytest.approx(value, abs=1e-5)
            continue
        counted = [s for s in cell.samples if metric != "conditional_accuracy" or s.format_ok]
        assert len(scores[metric]) == len(counted)
        assert sum(scores[metric]) / len(counted) == pytest.approx(value, abs=1e-6)
    assert set(scores) == {r["evaluation_result_id"] for r in log["evaluation_results"]}
    first = next(row for row in rows if row["evaluation_result_id"] == "lenient_accuracy")
    sample = next(s for s in cell.samples if str(s.index) == first["sample_id"])
    assert first["input"]["formatted"] == sample.prompt and first["output"]["raw"] == [sample.completion]
    assert first["answer_attribution"][0]["extracted_value"] == (sample.lenient_answer or "")


# --- lm-evaluation-harness -------------------------------------------------------------------------


def test_lm_eval_results_read_back_by_lm_eval_equal_the_cells(study_out, tmp_path):
    lm_eval_utils = pytest.importorskip("lm_eval.utils")
    out = tmp_path / "lm-eval"
    result = runner.invoke(app, ["export", str(study_out), "--format", "lm-eval", "--output", str(out)])
    assert result.exit_code == 0, result.output
    files = [str(p) for p in sorted(out.rglob("*")) if p.is_file()]
    by_model = defaultdict(list)
    for name in lm_eval_utils.get_results_filenames(files):
        by_model[Path(name).parent].append(name)
    cells = list(cells_by_name(study_out).values())
    # one results file per model, method and chat mode, holding both tasks
    assert len(by_model) == len({(r.config["model"], cell_label(r.config)) for r in cells}) == 6
    checked = 0
    for folder, names in by_model.items():
        latest = lm_eval_utils.get_latest_filename(names)
        saved = json.loads(Path(latest).read_text())
        assert folder.name == saved["model_name_sanitized"] == lm_eval_utils.sanitize_model_name(saved["model_name"])
        args = saved["config"]["model_args"]
        mine = [r for r in cells if (r.config["model"], r.config["method"], r.config["chat"]) == (args["pretrained"], args["method"], args["chat"])]
        assert sorted(saved["results"]) == sorted(r.config["task"] for r in mine) == ["capitals", "capitals_open"]
        table = lm_eval_utils.make_table(saved)
        for cell in mine:
            check_lm_eval_task(saved, cell, table)
            samples = [f for f in lm_eval_utils.get_sample_results_filenames(files)
                       if Path(f).parent == folder and lm_eval_utils.get_file_task_name(Path(f).name) == cell.config["task"]]
            # the same time stamp as the results file (lm-eval strips only a samples file's extension)
            assert len(samples) == 1 and lm_eval_utils.get_file_datetime(Path(samples[0]).name) == lm_eval_utils.get_file_datetime(Path(latest).stem)
            check_lm_eval_samples(Path(samples[0]), cell)
            checked += 1
    assert checked == len(cells) == 12


def check_lm_eval_task(saved: dict, cell, table: str) -> None:
    """`metric,filter` the cell's value, `metric_stderr,filter` its interval's half-width / 1.96,
    the exact interval beside them."""
    task = cell.config["task"]
    entry = saved["results"][task]
    for metric in METRICS:
        value, key = cell.metrics[metric], lm_eval_filter(cell, metric)
        assert entry[f"{metric},{key}"] == value.value
        expected = "N/A" if value.ci_low is None else pytest.approx((value.ci_high - value.ci_low) / 2 / 1.96, abs=1e-6)
        assert entry[f"{metric}_stderr,{key}"] == expected
        assert saved["softeval"]["intervals"][task][f"{metric},{key}"] == value.model_dump()
        assert re.search(rf"\|{metric}\s*\|", table)  # lm-eval's own table lists it
    assert saved["n-shot"][task] == cell.config["k"] and saved["n-samples"][task]["effective"] == len(cell.samples)
    assert saved["higher_is_better"][task]["task_accuracy"] is True and saved["configs"][task]["num_fewshot"] == cell.config["k"]
    # the soft prompt is the task's own: in its config, not in the model's arguments
    metadata = saved["configs"][task]["metadata"]
    assert metadata["method"] == cell.config["method"] and metadata.get("soft_prompt_sha256") == (cell.config["soft_prompt"] or {}).get("sha256")


def check_lm_eval_samples(path: Path, cell) -> None:
    """Per row one line per filter; each metric's per-row values average to the cell's value."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    values = defaultdict(list)
    for line in lines:
        assert {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash", "prompt_hash", "target_hash"} <= set(line)
        assert line["prompt_hash"] == hashlib.sha256(line["arguments"]["gen_args_0"]["arg_0"].encode()).hexdigest()
        for metric in line["metrics"]:
            values[metric].append(line[metric])
    assert {line["doc_id"] for line in lines} == {s.index for s in cell.samples}
    for metric in METRICS:
        if cell.metrics[metric].value is None:
            assert not values[metric]
            continue
        counted = [s for s in cell.samples if metric in ROW_METRICS or s.format_ok]
        assert len(values[metric]) == len(counted)
        assert sum(values[metric]) / len(counted) == pytest.approx(cell.metrics[metric].value, abs=1e-6)


# --- the command line ------------------------------------------------------------------------------


def user_sees(monkeypatch, capsys, *args) -> str:
    """What `softeval ARGS` prints on stderr: one line, exit code 2."""
    monkeypatch.setattr("sys.argv", ["softeval", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_export_mistakes_are_one_line(monkeypatch, capsys, tmp_path, study_out):
    empty = tmp_path / "empty"
    empty.mkdir()
    said = user_sees(monkeypatch, capsys, "export", study_out, "--format", "csv")
    assert said == "error: --format: unknown format 'csv'; choose one of: eee, lm-eval"
    said = user_sees(monkeypatch, capsys, "export", tmp_path / "missing", "--format", "eee")
    assert said == f"error: no results folder at {tmp_path / 'missing'}; give the --output folder of softeval eval, run or study"
    said = user_sees(monkeypatch, capsys, "export", empty, "--format", "lm-eval")
    assert said == f"error: {empty} holds no finished cells (OUTPUT/<model>/<task>/<method>/results.json); run softeval eval, run or study into it"
    assert user_sees(monkeypatch, capsys, "export", study_out).startswith("error: Missing option '--format'")
    assert not (empty / "export").exists()


def test_export_answers_a_mistake_at_once_and_reads_results_without_torch(study_out, tmp_path):
    # a mistake is answered before scipy loads (seconds); an export reads results, it loads no model
    heavy = "sorted(m for m in ('torch', 'transformers', 'scipy', 'lm_eval') if m in sys.modules)"
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from softeval.cli import app\n"
        f"bad = CliRunner().invoke(app, ['export', {str(study_out)!r}, '--format', 'csv'])\n"
        "assert 'unknown format' in str(bad.exception), bad.output\n"
        f"print({heavy})\n"
        "from softeval.reports import export_folder\n"
        "for fmt in ('eee', 'lm-eval'):\n"
        f"    assert export_folder({str(study_out)!r}, fmt, {str(tmp_path)!r} + '/' + fmt)\n"
        f"print({heavy})\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["[]", "['scipy']"]


def test_a_series_checkpoint_exports_its_recipe_step_and_tokens(tmp_path, tiny_model_dirs, eee_schemas):
    """A series can be rebuilt from either export: each checkpoint's cells name its recipe,
    checkpoint, step and tokens; a model outside the series names none."""
    import shutil

    from jsonschema import Draft7Validator

    for step in (100, 200):
        shutil.copytree(tiny_model_dirs["llama"], tmp_path / "run" / f"checkpoint-{step}")
    task = write_user_task(tmp_path, STUDY_ROWS)
    study = {"series": [{"name": "recipe", "checkpoints": str(tmp_path / "run"), "tokens_per_step": 4096}], "models": [str(tiny_model_dirs["gemma3"])],
             "tasks": [str(task)], "methods": ["zero-shot"], "limit": 4}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    assert runner.invoke(app, ["study", str(tmp_path / "study.yaml"), "--output", str(out)]).exit_code == 0
    for fmt in ("lm-eval", "eee"):
        result = runner.invoke(app, ["export", str(out), "--format", fmt])
        assert result.exit_code == 0, result.output

    expected = {f"run@checkpoint-{s}": {"recipe": "recipe", "checkpoint": f"checkpoint-{s}", "step": s, "tokens": s * 4096.0} for s in (100, 200)}
    found = {}
    for path in (out / "export" / "lm-eval").glob("*/results_*.json"):
        saved = json.loads(path.read_text())
        args = saved["config"]["model_args"]
        found[saved["model_name"].split(":")[0]] = {k: args[k] for k in ("recipe", "checkpoint", "step", "tokens") if k in args}
        assert saved["softeval"]["series"] == (found[saved["model_name"].split(":")[0]] or None)
        assert saved["configs"]["capitals"]["doc_to_text"] == yaml.safe_load(task.read_text())["template"]
    assert found == expected | {tiny_model_dirs["gemma3"].name: {}}

    validator = Draft7Validator(eee_schemas["eval"])
    seen = {}
    for path in (out / "export" / "eee" / "data").rglob("*.json"):
        log = json.loads(path.read_text())
        assert not list(validator.iter_errors(log))
        details = log["model_info"]["additional_details"]
        generation = log["evaluation_results"][0]["generation_config"]["additional_details"]
        recorded = {k: json.loads(details[k]) if k in ("step", "tokens") else details[k] for k in ("recipe", "checkpoint", "step", "tokens") if k in details}
        assert {k: generation[k] for k in details.keys() & {"recipe", "checkpoint", "step", "tokens"}} == {k: details[k] for k in recorded}
        seen[log["model_info"]["name"]] = recorded
    assert seen == expected | {tiny_model_dirs["gemma3"].name: {}}
