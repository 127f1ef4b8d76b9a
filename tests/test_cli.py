"""The command line end to end on a tiny model and a user task: files, errors, nothing half-written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from conftest import ROWS, write_user_task
from softeval.cli import app
from softeval.errors import SoftevalError
from softeval.tuning import load_soft_prompt

runner = CliRunner()


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result


def test_eval_writes_results_and_samples(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 3)
    out = tmp_path / "out"
    result = run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--method", "zero-shot", "--method", "few-shot", "--k", 2, "--output", out)
    assert result.exit_code == 0, result.output
    name = tiny_model_dirs["llama"].name
    for method in ("zero-shot", "few-shot"):
        folder = out / name / "capitals" / method
        results = json.loads((folder / "results.json").read_text())
        samples = [json.loads(l) for l in (folder / "samples.jsonl").read_text().splitlines()]
        assert results["n_examples"] == len(samples) == 6
        assert results["config"]["method"] == method and results["config"]["k"] == (2 if method == "few-shot" else 0)
        assert set(results["metrics"]) == {"format_following", "task_accuracy", "conditional_accuracy", "lenient_accuracy", "knowledge",
                                           # the gold answer's likelihood, in the prompt's and (multiple choice) the cloze context
                                           "gold_logprob", "gold_bpb", "gold_prob", "prompt_knowledge", "cloze_gold_prob", "cloze_gold_bpb"}
        assert results["data"]["sha256"] and results["versions"]["transformers"]
        for s in samples:
            assert {"prompt", "raw_completion", "completion", "strict_answer", "strict_failure", "lenient_answer",
                    "lenient_status", "gold", "option_loglikelihoods"} <= set(s)
            assert (s["strict_answer"] is None) == (s["strict_failure"] is not None)
        ff = sum(s["format_ok"] for s in samples) / len(samples)
        assert results["metrics"]["format_following"]["value"] == round(ff, 6)
        diagnostics = results["diagnostics"]
        assert diagnostics["chance"] == 0.5 and sum(diagnostics["answer_distribution"].values()) == 6
    comparison = (out / "comparison.md").read_text()
    assert "| capitals |" not in comparison and "## capitals" in comparison
    assert "* `conditional_accuracy`: task accuracy / format-following" in comparison  # every metric is explained
    # the diagnostics table gives each level the at-chance flag may name: chance and the majority gold answer
    lines = comparison.splitlines()
    at = next(i for i, line in enumerate(lines) if "| chance |" in line)
    header, row = lines[at].split(" | "), next(line for line in lines[at:] if line.startswith(f"| {name} | zero-shot | ")).split(" | ")
    majority = diagnostics["majority_share"]
    assert row[header.index("chance")] == "50%" and row[header.index("majority gold")] == f"{100 * majority:.0f}%"


def test_cells_of_different_task_versions_are_flagged_side_by_side(tmp_path, tiny_model_dirs):
    """zero-shot, then few-shot after the spec changed: both rows stay in the comparison, each
    flagged with its version, and the page lists both spec hashes."""
    task = write_user_task(tmp_path, ROWS * 3)
    out = tmp_path / "out"
    model = tiny_model_dirs["llama"]
    assert run("eval", "--model", model, "--task", task, "--output", out).exit_code == 0
    task.write_text(task.read_text() + "instruction: Answer with a letter.\n")
    result = run("eval", "--model", model, "--task", task, "--method", "few-shot", "--k", 2, "--output", out)
    assert result.exit_code == 0, result.output
    assert "task version" in result.output  # the terminal table shows this command's cell against the folder's
    comparison = json.loads((out / "comparison.json").read_text())
    assert len(comparison["cells"]) == 2
    spec_hashes = {json.loads((out / model.name / "capitals" / m / "results.json").read_text())["data"]["spec_sha256"] for m in ("zero-shot", "few-shot")}
    assert len(spec_hashes) == 2
    rows = [line for line in (out / "comparison.md").read_text().splitlines() if line.startswith(f"| {model.name} |") and "-shot |" in line]
    flagged = [line for line in rows if "one of 2 here: rerun older cells with --force" in line]
    assert len(flagged) == 2 and {h[:8] for h in spec_hashes} == {line.split("task version ")[1][:8] for line in flagged}
    page = (out / "index.html").read_text()
    assert all(h[:12] in page for h in spec_hashes)


def test_unknown_task_fails_before_anything_is_written(tmp_path, tiny_model_dirs):
    out = tmp_path / "out"
    result = run("eval", "--model", tiny_model_dirs["llama"], "--task", "no_such_task", "--output", out)
    assert isinstance(result.exception, SoftevalError) and "known tasks" in str(result.exception)
    assert not out.exists()


def test_bad_row_leaves_no_result_files(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, [ROWS[0], {**ROWS[1], "gold": 7}])
    out = tmp_path / "out"
    result = run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--output", out)
    assert "out of range" in str(result.exception)
    assert not list(out.rglob("*.json*"))


def test_a_model_that_fails_to_load_leaves_the_folder_as_it_was(tmp_path):
    """The file passes the checks made before any model loads (it exists, it ends in .gguf), but
    is no GGUF: no cell finished, so there is no comparison, page or model list to write, and
    no other cells to speak of."""
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file")
    task = write_user_task(tmp_path, ROWS)
    out = tmp_path / "out"
    result = run("eval", "--model", fake, "--task", task, "--output", out)
    assert isinstance(result.exception, SoftevalError), result.output
    assert str(result.exception).startswith(f"{out / 'fake' / 'capitals'} failed: ") and "other cells" not in str(result.exception)
    assert not out.exists() or not [path for path in out.rglob("*") if path.is_file()]


def test_unknown_model_lists_aliases(tmp_path):
    result = run("eval", "--model", "no-such-model", "--task", "arc_easy", "--output", tmp_path)
    assert "smollm2-135m-instruct" in str(result.exception) and "gemma-3-270m" in str(result.exception)


def test_main_prints_one_line_error(tmp_path, capsys, monkeypatch):
    import pytest

    from softeval import cli

    monkeypatch.setattr("sys.argv", ["softeval", "eval", "--model", "x.gguf", "--task", "arc_easy", "--output", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "GGUF file not found" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("through", ["option", "environment"])
def test_tasks_and_models_listings(mirror, monkeypatch, through):
    if through == "environment":
        monkeypatch.setenv("SOFTEVAL_DATA_DIR", str(mirror))
    tasks = run("tasks", *(["--data-dir", mirror] if through == "option" else []))
    assert tasks.exit_code == 0 and "gsm8k" in tasks.output and "1319" in tasks.output
    # the mirror holds no MATH rows: its splits say so rather than showing no size
    math_row = next(line for line in tasks.output.splitlines() if "hendrycks_math" in line)
    assert "test (not found)" in math_row and "train (not found)" in math_row
    models = run("models")
    assert models.exit_code == 0 and "gemma-3-270m" in models.output


def test_tune_then_evaluate_the_soft_prompt(tmp_path, tiny_model_dirs, caplog):
    task = write_user_task(tmp_path, ROWS * 10)
    model = tiny_model_dirs["llama"]
    tuned = run("tune", "--model", model, "--task", task, "--steps", 4, "--eval-every", 2, "--length", 3, "--val-size", 4, "--output", tmp_path / "tuned")
    assert tuned.exit_code == 0, tuned.output
    assert {"soft_prompt.safetensors", "curve.json", "curve.svg", "checkpoint.safetensors"} <= {p.name for p in (tmp_path / "tuned").iterdir()}
    curve = json.loads((tmp_path / "tuned" / "curve.json").read_text())
    assert [p["step"] for p in curve] == [0, 2, 4] and {"train_loss", "val_loss", "format_following", "knowledge"} <= set(curve[0])
    out = tmp_path / "out"
    result = run("eval", "--model", model, "--task", task, "--method", "soft-prompt", "--prompt", tmp_path / "tuned", "--output", out)
    assert result.exit_code == 0, result.output
    results = json.loads((out / model.name / "capitals" / "soft-prompt" / "results.json").read_text())
    assert results["config"]["soft_prompt_length"] == 3
    used = results["config"]["soft_prompt"]
    assert used["path"] == str((tmp_path / "tuned" / "soft_prompt.safetensors").resolve())
    assert used["sha256"] == load_soft_prompt(tmp_path / "tuned").sha256 and used["task"]["name"] == "capitals"
    # a prompt tuned without the chat template is evaluated only in that mode, even with --chat
    chat = run("eval", "--model", model, "--task", task, "--method", "soft-prompt", "--chat", "--prompt", tmp_path / "tuned", "--output", out)
    assert chat.exit_code == 0 and not (out / model.name / "capitals" / "soft-prompt-chat").exists()
    assert "soft_prompt.safetensors was tuned without the chat template: no soft-prompt cell with --chat (tune one with --chat)" in caplog.text


def test_soft_prompt_method_without_a_prompt(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS)
    result = run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--method", "soft-prompt", "--output", tmp_path / "o")
    assert "needs a tuned prompt" in str(result.exception)


def test_run_tunes_evaluates_and_compares(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "report"
    args = ["run", "--model", tiny_model_dirs["llama"], "--task", task, "--method", "zero-shot,soft-prompt", "--chat",
            "--steps", 2, "--eval-every", 1, "--val-size", 4, "--length", 2, "--output", out]
    result = run(*args)
    assert result.exit_code == 0, result.output
    name = tiny_model_dirs["llama"].name
    cells = json.loads((out / "comparison.json").read_text())["cells"]
    # a post-trained model runs with and without its chat template
    assert {(c["method"], c["chat"]) for c in cells} == {("zero-shot", False), ("soft-prompt", False), ("zero-shot", True), ("soft-prompt", True)}
    for folder in ("prompt", "prompt-chat"):
        assert (out / name / "capitals" / folder / "curve.svg").exists()
    report = (out / "comparison.md").read_text()
    assert "## capitals" in report and "prompt-chat/curve.svg" in report
    assert "| strict answers | most common (share of strict answers) | chance | majority gold |" in report  # the answer diagnostics per cell
    assert all(c["diagnostics"]["chance"] == 0.5 for c in cells)
    stamp = (out / name / "capitals" / "prompt" / "soft_prompt.safetensors").stat().st_mtime_ns
    assert run(*args).exit_code == 0  # a second run reuses the tuned prompts
    assert (out / name / "capitals" / "prompt" / "soft_prompt.safetensors").stat().st_mtime_ns == stamp


def test_tune_sweep_records_every_trial(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "tuned"
    result = run("tune", "--model", tiny_model_dirs["llama"], "--task", task, "--steps", 2, "--eval-every", 2, "--val-size", 4,
                 "--length", 2, "--sweep", "--sweep-steps", 1, "--export-peft", tmp_path / "adapter", "--output", out)
    assert result.exit_code == 0, result.output
    record = json.loads((out / "sweep.json").read_text())
    assert len(record["trials"]) == 6 and {t["init"] for t in record["trials"]} == {"vocab", "text"}
    chosen = json.loads((out / "curve.json").read_text())
    assert chosen[-1]["step"] == 2
    assert (tmp_path / "adapter" / "adapter_config.json").exists()


def test_run_retunes_when_anything_a_prompt_depends_on_changes(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "report"
    prompt = out / tiny_model_dirs["llama"].name / "capitals" / "prompt" / "soft_prompt.safetensors"
    base = ["run", "--model", tiny_model_dirs["llama"], "--task", task, "--method", "soft-prompt",
            "--steps", 2, "--eval-every", 2, "--val-size", 4, "--length", 2, "--output", out]

    def produced(*extra):
        assert run(*base, *extra).exit_code == 0
        return load_soft_prompt(prompt).metadata["produced"], prompt.stat().st_mtime_ns

    plain, stamp = produced()
    assert plain == {"by": "tune"}
    swept, swept_stamp = produced("--sweep", "--sweep-steps", 1)  # a plain prompt does not serve a sweep
    assert swept["by"] == "sweep" and swept["sweep_steps"] == 1 and swept_stamp != stamp
    assert produced("--sweep", "--sweep-steps", 1)[1] == swept_stamp  # the same sweep is reused
    assert produced("--sweep", "--sweep-steps", 2)[1] != swept_stamp  # other sweep steps: tuned again
    _, stamp = produced()
    task.write_text(task.read_text().replace("Answer:", "The answer:"))  # the task's template changed
    _, retuned = produced()
    assert retuned != stamp


def test_help_and_a_mistake_are_answered_without_the_heavy_libraries(tmp_path):
    # torch, transformers and scipy take seconds to import: --help and a mistake must not wait for them
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from softeval.cli import app\n"
        "runner = CliRunner()\n"
        "assert runner.invoke(app, ['--help']).exit_code == 0\n"
        f"for command in ('eval', 'tune'):\n"
        f"    bad = runner.invoke(app, [command, '--model', 'nope', '--task', 'arc_easy', '--output', {str(tmp_path)!r}])\n"
        "    assert 'unknown model' in str(bad.exception), bad.output\n"
        f"bad = runner.invoke(app, ['eval', '--model', 'smollm2-135m-instruct', '--task', 'arc_easy', '--method', 'soft-prompt',\n"
        f"                          '--prompt', {str(tmp_path / 'missing')!r}, '--output', {str(tmp_path)!r}])\n"
        "assert 'soft prompt not found' in str(bad.exception), bad.output\n"
        f"bad = runner.invoke(app, ['report', {str(tmp_path / 'nowhere')!r}])\n"
        "assert 'no results folder' in str(bad.exception), bad.output\n"
        f"bad = runner.invoke(app, ['study', {str(tmp_path / 'none.yaml')!r}, '--output', {str(tmp_path)!r}])\n"
        "assert 'study file not found' in str(bad.exception), bad.output\n"
        "print(sorted(m for m in ('torch', 'transformers', 'scipy', 'datasets', 'matplotlib') if m in sys.modules))\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "[]"


def test_the_public_api_names_its_functions_not_their_modules():
    import types

    import softeval
    import softeval.study.evaluation  # noqa: F401 - imported as a module first, as the command line does
    import softeval.tuning.tuner  # noqa: F401

    assert set(softeval.__all__) == set(softeval._EXPORTS)
    for name in softeval.__all__:
        assert not isinstance(getattr(softeval, name), types.ModuleType), name
    assert softeval.evaluate.__name__ == "evaluate" and softeval.tune.__name__ == "tune"


def test_on_off_options_show_as_flags_in_help():
    """A flag takes no value, and --help does not suggest one (`softeval --debug true models`)."""
    shown = runner.invoke(app, ["--help"], terminal_width=120).output + runner.invoke(app, ["run", "--help"], terminal_width=120).output
    assert "--debug" in shown and "--sweep" in shown and "--no-chat" in shown
    assert "<bool>" not in shown and "BOOLEAN" not in shown
    assert "<int" in shown  # options that take a value still name its type
    assert runner.invoke(app, ["--debug", "models"]).exit_code == 0


def test_intervals_read_a_comma_b_everywhere_and_names_wrap_in_the_terminal():
    """A gold answer's log-probability interval of two negative bounds is written [a, b], not
    'a-b' run together; a long task name wraps in the terminal's table instead of being cut."""
    from rich.console import Console

    from softeval.reports.comparison import gold_table, metrics_table
    from softeval.reports.page import _gold, _metric
    from softeval.scoring import METRICS, EvalResult, Metric

    negative = Metric(value=-31.5, ci_low=-59.86, ci_high=-18.21)
    assert _gold("gold_logprob", negative) == {"value": "-31.50", "ci": "[-59.86, -18.21]"}
    assert _metric(Metric(value=0.5, ci_low=0.25, ci_high=0.75)) == {"value": "50.0", "ci": "[25.0, 75.0]"}
    name = "lm-eval-mmlu_high_school_government_and_politics-option_text"
    cell = EvalResult(config={"model": "m", "task": name, "method": "zero-shot", "chat": False}, samples=[], model={}, data={}, timings={},
                      n_truncated=0, metrics={m: Metric(value=0.5, ci_low=0.4, ci_high=0.6) for m in METRICS} | {"gold_logprob": negative})
    assert "| m | zero-shot | -31.50 [-59.86, -18.21] |" in gold_table([cell])
    console = Console(width=100, record=True)
    console.print(metrics_table([cell]))
    column = [line.split("│")[2].strip() for line in console.export_text().splitlines() if line.count("│") > 3]
    assert "".join(column) == name  # the name, wrapped over lines, whole


def test_a_result_saved_into_an_output_folder_is_where_report_reads_it(tmp_path, tiny_llama):
    from softeval import evaluate, load_task

    spec = load_task(write_user_task(tmp_path, ROWS * 3))
    for method in ("zero-shot", "few-shot"):  # two cells into one folder: neither replaces the other
        saved = evaluate(tiny_llama, spec, method, k=1, progress=False).save(tmp_path / "out")
        assert saved == tmp_path / "out" / tiny_llama.name / "capitals" / method
    result = run("report", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "| zero-shot |" in (tmp_path / "out" / "comparison.md").read_text() and "| few-shot |" in (tmp_path / "out" / "comparison.md").read_text()
