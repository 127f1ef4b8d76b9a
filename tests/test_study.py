"""Studies: the LoRA baseline, study files, the resumable grid, the comparison of every finished
cell on disk, paired differences, the ranking analysis and Ray, on tiny models end to end."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau
from typer.testing import CliRunner

from conftest import ROWS, cells_of, write_study, write_user_task
from softeval.cli import app
from softeval.errors import SoftevalError
from softeval.models import load_model
from softeval.scoring import EvalResult
from softeval.study import load_study
from softeval.tuning import TuneConfig, lora_applied, tune
from softeval.tuning.tuner import Tuner

runner = CliRunner()


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result


def _task(tmp_path):
    from softeval.tasks import load_task

    return load_task(write_user_task(tmp_path, ROWS * 10))


def _logits(lm, text="Question: Capital of France?\nAnswer:"):
    with torch.no_grad():
        return lm.model(torch.tensor([lm.encode(text)])).logits


# --- LoRA -----------------------------------------------------------------------------------------


def test_lora_adapter_is_a_peft_adapter_and_leaves_the_model_as_it_was(tmp_path, tiny_model_dirs):
    from peft import PeftModel

    lm = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    before = _logits(lm)
    config = TuneConfig(method="lora", steps=3, lr=0.05, eval_every=3, val_size=4, batch_size=2)
    adapter = tune(lm, _task(tmp_path), config, output=tmp_path / "adapter", progress=False)
    assert torch.equal(_logits(lm), before)  # the LoRA layers are gone again
    assert not any(p.requires_grad for p in lm.model.parameters())

    # rank 8 on q, k, v, o of 2 layers: r x (in + out) per projection (k and v project to 2 heads of 16)
    hidden, kv = 64, 32
    expected = 2 * 8 * ((hidden + hidden) + (hidden + kv) * 2 + (hidden + hidden))
    assert adapter.n_parameters == adapter.metadata["trainable_parameters"] == expected
    assert adapter.metadata["tuning_seconds"] > 0 and adapter.metadata["config"]["method"] == "lora"
    assert any(w.abs().sum() > 0 for k, w in adapter.weights.items() if "lora_B" in k)  # tuning moved B off zero

    with lora_applied(lm, adapter.peft_config(), adapter.weights):
        ours = _logits(lm)
    assert not torch.allclose(ours, before)
    fresh = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    peft_model = PeftModel.from_pretrained(fresh.model, tmp_path / "adapter")
    with torch.no_grad():
        theirs = peft_model(torch.tensor([lm.encode("Question: Capital of France?\nAnswer:")])).logits
    torch.testing.assert_close(ours, theirs)


def test_lora_tuning_resumes_to_the_same_adapter(tmp_path, tiny_llama, monkeypatch):
    spec = _task(tmp_path)
    config = TuneConfig(method="lora", steps=4, lr=0.05, eval_every=2, val_size=4, batch_size=2)
    whole = tune(tiny_llama, spec, config, output=tmp_path / "whole", progress=False)

    original = Tuner.step

    def crashing(self, step):
        if step == 3:
            raise KeyboardInterrupt
        return original(self, step)

    monkeypatch.setattr(Tuner, "step", crashing)
    with pytest.raises(KeyboardInterrupt):
        tune(tiny_llama, spec, config, output=tmp_path / "split", progress=False)
    monkeypatch.setattr(Tuner, "step", original)
    assert not (tmp_path / "split" / "adapter_model.safetensors").exists()
    resumed = tune(tiny_llama, spec, config, output=tmp_path / "split", resume=True, progress=False)
    assert resumed.sha256 == whole.sha256
    assert json.loads((tmp_path / "split" / "curve.json").read_text()) == json.loads((tmp_path / "whole" / "curve.json").read_text())


# --- study files ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models: [a]\ntasks: [t]\nmethods: [zero-shot, prefix]\n", "methods: unknown method 'prefix'; choose from: zero-shot, few-shot, soft-prompt, lora"),
        ("models: [{model: a, role: instruct}]\ntasks: [t]\n", "models.0.role: Input should be 'base' or 'post-trained'"),
        ("models: [a]\ntasks: [t]\ntuning: {steps: 0}\n", "tuning.steps: Input should be greater than 0"),
        ("models: [a]\ntasks: [t]\nlimt: 5\n", "unknown key 'limt' (did you mean 'limit'?); fix the study file"),
        ("models: [a]\ntasks: [t]\nsteps: 3\n", "'steps' is a tuning setting; put it under tuning"),
        ("models: [a]\ntasks: [t]\ntuning: {init_text: capitals}\n", "tuning.init_text is read by init: text only"),
        ("models: [a]\ntasks: [t]\nmethod: lora\n", "unknown key 'method' (did you mean 'methods'?)"),
        ("models: []\ntasks: [t]\n", "models: give at least one model (or a series of checkpoints); fix the study file"),
        ("models: [a\n", "is not valid YAML"),
        ("models: [a]\ntasks: [t]\ntuning: {chat: true}\n", "tuning: 'chat' is not a tuning setting here"),
        ("models: [a]\ntasks: [t]\ntuning: {stepz: 3}\n", "unknown key 'tuning.stepz' (did you mean 'steps'?)"),
        ("models: [a]\ntasks: [t]\nreference: {method: zeroshot}\n", "reference.method: unknown method 'zeroshot'"),
        ("models: [a]\ntasks: [t]\nreference: {metric: conditional_accuracy}\n", "metric 'conditional_accuracy' cannot be ranked"),
        ("models: [a]\ntasks: [t]\nresources: {gpus: 1}\n", "unknown resource 'gpus'; use num_cpus, num_gpus, memory"),
        ("models: [org1/llama, org2/llama]\ntasks: [t]\n", "would share the results folder 'llama'"),
        ("models: [{model: a, family: f, role: base}, {model: b, family: f, role: base}]\ntasks: [t]\nchat: true\n", "family 'f' has two base models"),
        ("models: [{model: a, family: f, role: base}]\ntasks: [t]\nchat: true\n", "family 'f' has no post-trained model"),
        ("models: [{model: a, family: f}]\ntasks: [t]\n", "model 'a' has a family but no role; give it role: base or role: post-trained"),
        ("models: [{model: a, family: f, role: base}, {model: b, family: f, role: post-trained}]\ntasks: [t]\n", "set chat: true"),
    ],
)
def test_study_file_mistakes_are_one_line(tmp_path, text, expected):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    with pytest.raises(SoftevalError) as error:
        load_study(path)
    assert expected in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith(f"study file {path}")


def outcomes(out: Path, model: str, cell: str, field: str = "task_correct") -> dict[int, float]:
    """Per-row outcomes of one cell, read from its samples.jsonl."""
    lines = (out / model / "capitals" / cell / "samples.jsonl").read_text().splitlines()
    return {s["index"]: float(s[field]) for s in map(json.loads, lines)}


def test_study_runs_ranks_skips_finished_cells_and_adds_commands(tmp_path, family_dirs):
    out = tmp_path / "out"
    # knowledge (option log-likelihoods) differs between random models; their task accuracy may not
    study = write_study(tmp_path, family_dirs, ["zero-shot", "few-shot", "soft-prompt", "lora"], reference={"metric": "knowledge"})
    first = run("study", study, "--output", out)
    assert first.exit_code == 0, first.output

    # the grid: base models plain only, post-trained ones with and without the chat template
    cells = cells_of(out)
    base, post = [f"{f}-base0" for f in family_dirs], [f"{f}-post-trained0" for f in family_dirs]
    expected = {(m, "capitals", method) for m in base for method in ("zero-shot", "few-shot", "soft-prompt", "lora")}
    expected |= {(m, "capitals", method + chat) for m in post for method in ("zero-shot", "few-shot", "soft-prompt", "lora") for chat in ("", "-chat")}
    assert set(cells) == expected
    lora_cell = cells[(base[0], "capitals", "lora")]
    assert lora_cell["tuning"]["trainable_parameters"] > 10 * cells[(base[0], "capitals", "soft-prompt")]["tuning"]["trainable_parameters"]
    assert (out / base[0] / "capitals" / "adapter" / "adapter_config.json").exists()

    # the ranking equals tau-b computed here from the samples: base scores against post-trained chat zero-shot
    ranking = json.loads((out / "ranking.json").read_text())
    assert ranking["families"] == {f: {"base": b, "post-trained": p} for f, b, p in zip(family_dirs, base, post)}
    reference = [np.mean(list(outcomes(out, p, "zero-shot-chat", "knowledge_correct").values())) for p in post]
    defined = 0
    for metric, field in (("knowledge", "knowledge_correct"), ("task_accuracy", "task_correct")):
        for method in ("zero-shot", "few-shot", "soft-prompt", "lora"):
            scores = [np.mean(list(outcomes(out, b, method, field).values())) for b in base]
            tau = ranking["by_metric"][metric]["methods"][method]["tau_b"]["value"]
            want = kendalltau(scores, reference, variant="b").statistic
            assert (tau is None and np.isnan(want)) or tau == pytest.approx(want)
            defined += tau is not None
    assert defined >= 2  # not a comparison of undefined values only
    assert "Kendall tau-b" in first.output and (out / "ranking.md").exists()

    # paired differences equal the mean per-row difference
    comparison = json.loads((out / "comparison.json").read_text())
    pair = next(p for p in comparison["paired"] if p["model"].endswith(base[1]) and p["method"] == "soft-prompt" and p["baseline"] == "few-shot")
    for metric, field in (("task_accuracy", "task_correct"), ("knowledge", "knowledge_correct"), ("format_following", "format_ok")):
        a, b = outcomes(out, base[1], "soft-prompt", field), outcomes(out, base[1], "few-shot", field)
        assert pair[metric]["value"] == pytest.approx(np.mean([a[i] - b[i] for i in a]))
    assert pair["n"] == 12 and pair["task_accuracy"]["ci_low"] <= pair["task_accuracy"]["value"] <= pair["task_accuracy"]["ci_high"]
    assert comparison["soft_prompt_vs_lora"]["n_cells"] == 9

    # a rerun skips every finished cell: nothing is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.safetensors")} | {p: p.stat().st_mtime_ns for p in out.rglob("results.json")}
    again = run("study", study, "--output", out)
    assert again.exit_code == 0, again.output
    assert "36 of 36 cells were finished already" in again.output
    assert all(p.stat().st_mtime_ns == stamp for p, stamp in stamps.items())

    # another command into the same folder adds its cells; --force redoes its own
    (tmp_path / "more").mkdir()
    extra = write_user_task(tmp_path / "more", ROWS * 5, name="capitals_again")
    added = run("eval", "--model", family_dirs["alpha"]["base"], "--task", extra, "--limit", 4, "--output", out)
    assert added.exit_code == 0, added.output
    comparison = json.loads((out / "comparison.json").read_text())
    assert {c["task"] for c in comparison["cells"]} == {"capitals", "capitals_again"} and len(comparison["cells"]) == 37
    forced = run("eval", "--model", family_dirs["alpha"]["base"], "--task", extra, "--limit", 4, "--output", out, "--force")
    assert forced.exit_code == 0 and "finished already" not in forced.output
    # the family and role a study declared survive a later command that declares none
    assert json.loads((out / "models.json").read_text())[base[0]]["role"] == "base"


def test_ranking_needs_three_families(tmp_path, family_dirs):
    out = tmp_path / "out"
    two = {f: family_dirs[f] for f in ("alpha", "beta")}
    study = write_study(tmp_path, two, ["zero-shot"])
    assert run("study", study, "--output", out).exit_code == 0
    result = run("rank", out)
    assert "ranking needs a base and a post-trained model in at least 3 families" in str(result.exception)


def test_ray_runs_the_same_cells_as_a_serial_run(tmp_path, family_dirs):
    pytest.importorskip("ray")
    import torch

    two = {"alpha": family_dirs["alpha"]}
    study = write_study(tmp_path, two, ["zero-shot", "soft-prompt"], chat=False, reference={"chat": False})
    serial, distributed = tmp_path / "serial", tmp_path / "ray"
    # a unit on Ray computes on the threads of its CPUs (one, by default); so does the serial run
    # here, since sums split between more threads round differently
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run("study", study, "--output", serial).exit_code == 0
    finally:
        torch.set_num_threads(threads)
    result = run("study", study, "--output", distributed, "--ray", "local")
    assert result.exit_code == 0, result.output
    here, there = cells_of(serial), cells_of(distributed)
    assert set(here) == set(there) and len(here) == 4
    for key in here:
        assert here[key]["metrics"] == there[key]["metrics"] and here[key]["identity"] == there[key]["identity"]
    assert json.loads((distributed / "comparison.json").read_text())["cells"]
    # a rerun on Ray skips every finished cell
    again = run("study", study, "--output", distributed, "--ray", "local")
    assert again.exit_code == 0 and "4 of 4 cells were finished already" in again.output


# --- what must not happen -------------------------------------------------------------------------


def test_a_failed_lora_run_leaves_the_model_as_it_was(tmp_path, tiny_model_dirs, monkeypatch):
    lm = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    before = _logits(lm)
    original = Tuner.step

    def failing(self, step):
        if step == 1:
            raise SoftevalError("loss became nan at step 1")
        return original(self, step)

    monkeypatch.setattr(Tuner, "step", failing)
    with pytest.raises(SoftevalError):
        tune(lm, _task(tmp_path), TuneConfig(method="lora", steps=3, lr=0.05, val_size=4), output=tmp_path / "a", progress=False)
    assert torch.equal(_logits(lm), before)
    assert not any("lora" in name for name, _ in lm.model.named_modules())


def test_adapter_weights_that_do_not_fit_are_refused(tmp_path, tiny_llama):
    from softeval.study import evaluate
    from softeval.tuning import load_adapter

    spec = _task(tmp_path)
    adapter = tune(tiny_llama, spec, TuneConfig(method="lora", steps=1, val_size=4), output=tmp_path / "a", progress=False)
    dropped = next(iter(adapter.weights))
    broken = load_adapter(tmp_path / "a")
    del broken.weights[dropped]
    with pytest.raises(SoftevalError, match="LoRA adapter weights do not fit the model .1 missing"):
        evaluate(tiny_llama, spec, "lora", adapter=broken, limit=2, progress=False)
    assert not any("lora" in name for name, _ in tiny_llama.model.named_modules())


def test_eval_takes_the_chat_mode_of_a_given_prompt(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    model, out = tiny_model_dirs["llama"], tmp_path / "out"
    tuned = run("tune", "--model", model, "--task", task, "--steps", 1, "--val-size", 4, "--length", 2, "--chat", "--output", tmp_path / "p")
    assert tuned.exit_code == 0, tuned.output
    plain = run("eval", "--model", model, "--task", task, "--method", "soft-prompt", "--prompt", tmp_path / "p", "--output", out)
    assert "was tuned with the chat template; add --chat to evaluate it" in str(plain.exception) and not out.exists()
    chat = run("eval", "--model", model, "--task", task, "--method", "zero-shot,soft-prompt", "--chat", "--prompt", tmp_path / "p",
               "--limit", 4, "--output", out)
    assert chat.exit_code == 0, chat.output
    assert {p[-1] for p in cells_of(out)} == {"zero-shot", "zero-shot-chat", "soft-prompt-chat"}


def test_cells_of_another_task_version_are_not_paired(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 5)
    model, out = tiny_model_dirs["llama"], tmp_path / "out"
    assert run("eval", "--model", model, "--task", task, "--output", out).exit_code == 0
    data = tmp_path / "test.jsonl"
    data.write_text(data.read_text().replace("Capital of France?", "Capital of Spain?"))  # row 0 is another question now
    assert run("eval", "--model", model, "--task", task, "--method", "few-shot", "--k", 2, "--output", out).exit_code == 0
    comparison = json.loads((out / "comparison.json").read_text())
    assert len(comparison["cells"]) == 2 and comparison["paired"] == []
    assert run("eval", "--model", model, "--task", task, "--output", out).exit_code == 0  # zero-shot redone on the new data
    assert [(p["method"], p["baseline"]) for p in json.loads((out / "comparison.json").read_text())["paired"]] == []  # no soft prompt here
    same = {c["data"]["sha256"] for c in cells_of(out).values()}
    assert len(same) == 1


@pytest.mark.parametrize("ray", [False, True])
def test_a_declared_base_model_runs_without_chat(tmp_path, family_dirs, ray):
    if ray:
        pytest.importorskip("ray")
    post = family_dirs["alpha"]["post-trained"]  # its tokenizer has a chat template
    study = tmp_path / "study.yaml"
    task = write_user_task(tmp_path, ROWS * 5)
    study.write_text(yaml_dump({
        "models": [{"model": str(post), "family": "f", "role": "base"}, {"model": str(family_dirs["beta"]["post-trained"]), "family": "f", "role": "post-trained"}],
        "tasks": [str(task)], "methods": ["zero-shot"], "chat": True, "limit": 4,
    }))
    result = run("study", study, "--output", tmp_path / "out", *(["--ray", "local"] if ray else []))
    assert result.exit_code == 0, result.output
    assert {p[::2] for p in cells_of(tmp_path / "out")} == {(post.name, "zero-shot"), ("beta-post-trained0", "zero-shot"), ("beta-post-trained0", "zero-shot-chat")}


def yaml_dump(data) -> str:
    import yaml

    return yaml.safe_dump(data)


def broken_model(tmp_path, tiny_model_dirs) -> Path:
    """A folder that passes the checks before work (it has a config.json) but cannot load."""
    import shutil

    folder = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dirs["llama"], folder)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    return folder


@pytest.mark.parametrize("ray", [False, True])
def test_a_failing_unit_is_reported_and_the_others_finish(tmp_path, tiny_model_dirs, ray, caplog):
    if ray:
        pytest.importorskip("ray")
    task = write_user_task(tmp_path, ROWS * 5)
    out = tmp_path / "out"
    args = ["run", "--model", broken_model(tmp_path, tiny_model_dirs), "--model", tiny_model_dirs["llama"], "--task", task,
            "--method", "zero-shot", "--limit", 4, "--output", out, *(["--ray", "local"] if ray else [])]
    result = run(*args)
    assert isinstance(result.exception, SoftevalError)
    # the weights load with the first cell that needs them: that cell is the one that fails
    failed = out / "broken-model" / "capitals" / "zero-shot"
    assert set(cells_of(out)) == {(tiny_model_dirs["llama"].name, "capitals", "zero-shot")}
    assert json.loads((out / "comparison.json").read_text())["cells"]
    if ray:  # a worker's log is its own: the last line says why
        assert f"{failed} failed: cannot load model" in str(result.exception)
    else:  # where other cells go on, a failure is told as it happens, and the last line sums up without saying it again
        (told,) = [r for r in caplog.records if r.levelname == "ERROR" and "cannot load model" in r.getMessage()]
        assert str(result.exception) == f"1 of 2 cells failed, each told above (the first: {failed}); the other cells finished and are kept by a rerun"


def test_options_are_named_as_the_user_wrote_them(tmp_path, tiny_model_dirs):
    result = run("run", "--model", tiny_model_dirs["llama"], "--task", "arc_easy", "--method", "zero-shot,prefix", "--output", tmp_path / "o")
    assert str(result.exception) == "--method: unknown method 'prefix'; choose from: zero-shot, few-shot, soft-prompt, lora"
    result = run("rank", tmp_path, "--reference-metric", "acc")
    assert str(result.exception).startswith("--reference-metric: metric 'acc' cannot be ranked")


def test_report_rewrites_the_page_from_the_results_on_disk(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 5)
    out = tmp_path / "out"
    assert run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--limit", 4, "--output", out).exit_code == 0
    page = out / "index.html"
    written = page.read_text()
    page.unlink()
    result = run("report", out)
    assert result.exit_code == 0 and f"report: {page}" in result.output
    undated = lambda text: re.sub(r"Written \S+ by", "", text)  # noqa: E731
    assert undated(page.read_text()) == undated(written)  # the same page, but for the time it was written
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no finished cells" in str(run("report", empty).exception)
    assert "no results folder at" in str(run("report", tmp_path / "missing").exception)


def test_a_cell_that_cannot_be_read_is_left_out_with_one_warning(tmp_path, tiny_model_dirs, caplog):
    task = write_user_task(tmp_path, ROWS * 5)
    out = tmp_path / "out"
    assert run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--method", "zero-shot,few-shot", "--k", 1, "--limit", 4, "--output", out).exit_code == 0
    cut = next(out.glob("*/capitals/few-shot/results.json"))
    cut.write_text(cut.read_text()[:50])  # cut short, as by a copy that failed
    assert run("report", out).exit_code == 0
    told = [r.getMessage() for r in caplog.records if "left out of the comparison" in r.getMessage()]
    assert len(told) == 1 and told[0].startswith(f"left out of the comparison: {cut.parent} cannot be read (")
    assert told[0].endswith("); rerun the command that made it to evaluate it again")
    assert [c["method"] for c in json.loads((out / "comparison.json").read_text())["cells"]] == ["zero-shot"]


def test_a_limit_is_recorded_as_the_rows_it_keeps_and_a_replaced_cell_says_why(tmp_path, tiny_model_dirs, caplog):
    task = write_user_task(tmp_path, ROWS * 3)  # 6 rows
    out = tmp_path / "out"
    evaluate_with = lambda *limit: run("eval", "--model", tiny_model_dirs["llama"], "--task", task, *limit, "--output", out)  # noqa: E731
    assert evaluate_with("--limit", 4).exit_code == 0
    assert evaluate_with("--limit", 5).exit_code == 0
    assert "zero-shot again; changed since it finished: limit 4 -> 5" in caplog.text
    assert evaluate_with("--limit", 50).exit_code == 0
    assert "--limit 50 is above the 6 rows of task capitals's test split: evaluating all of them" in caplog.text
    results = json.loads(next(out.glob("*/capitals/zero-shot/results.json")).read_text())
    assert results["config"]["limit"] is None and results["identity"]["limit"] is None and results["diagnostics"]["n"] == 6
    whole = evaluate_with()  # the whole split is the cell a limit above it made
    assert whole.exit_code == 0 and "1 of 1 cells were finished already" in whole.output


def test_a_limit_that_keeps_every_filtered_row_is_no_limit(tmp_path, tiny_model_dirs, caplog):
    task = write_user_task(tmp_path, ROWS * 3, filter="gold == 0")  # 3 of 6 rows kept
    out = tmp_path / "out"
    evaluate_with = lambda *limit: run("eval", "--model", tiny_model_dirs["llama"], "--task", task, *limit, "--output", out)  # noqa: E731
    assert evaluate_with("--limit", 3).exit_code == 0
    assert "is above" not in caplog.text
    assert json.loads(next(out.glob("*/capitals/zero-shot/results.json")).read_text())["identity"]["limit"] is None
    assert "1 of 1 cells were finished already" in evaluate_with().output
    assert evaluate_with("--limit", 4).exit_code == 0
    assert "--limit 4 is above the 3 rows its filter keeps of task capitals's test split" in caplog.text


def test_demonstrations_that_all_give_one_answer_are_said(tmp_path, tiny_llama, caplog):
    from softeval import evaluate, load_task

    same = load_task(write_user_task(tmp_path, [ROWS[0]] * 6))  # every gold answer is A
    evaluate(tiny_llama, same, "few-shot", k=3, limit=2, progress=False)
    assert "the 3 demonstrations of capitals all answer A: few-shot answers may copy that letter" in caplog.text
    caplog.clear()
    (tmp_path / "mixed").mkdir()
    evaluate(tiny_llama, load_task(write_user_task(tmp_path / "mixed", ROWS * 3)), "few-shot", k=3, limit=2, progress=False)
    assert "demonstrations" not in caplog.text


def test_one_task_given_twice_runs_once_and_two_tasks_of_one_name_are_refused(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 3)
    out = tmp_path / "out"
    twice = run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--task", tmp_path / "." / task.name, "--limit", 2, "--output", out)
    assert twice.exit_code == 0, twice.output
    assert len(json.loads((out / "comparison.json").read_text())["cells"]) == 1
    (tmp_path / "other").mkdir()
    other = write_user_task(tmp_path / "other", ROWS, max_new_tokens=2)
    clash = run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--task", other, "--output", tmp_path / "clash")
    assert str(clash.exception).startswith(f"two tasks are named 'capitals' ({task.resolve()} and {other.resolve()})")
    assert not (tmp_path / "clash").exists()


def test_ray_alone_means_a_local_cluster():
    from softeval.cli import with_ray_default

    assert with_ray_default(["study", "s.yaml", "--ray"]) == ["study", "s.yaml", "--ray", "local"]
    assert with_ray_default(["run", "--ray", "--force"]) == ["run", "--ray", "local", "--force"]
    assert with_ray_default(["run", "--ray", "ray://head:10001"]) == ["run", "--ray", "ray://head:10001"]


def test_a_reused_cell_is_judged_again_by_the_current_parsers(tmp_path, tiny_model_dirs, caplog):
    task = write_user_task(tmp_path, ROWS * 3)
    out = tmp_path / "out"
    evaluate = lambda: run("eval", "--model", tiny_model_dirs["llama"], "--task", task, "--limit", 4, "--output", out)  # noqa: E731
    assert evaluate().exit_code == 0
    folder = next(out.glob("*/capitals/zero-shot"))
    samples_path, results_path = folder / "samples.jsonl", folder / "results.json"
    judged, results = samples_path.read_text(), json.loads(results_path.read_text())
    # as a version whose parser read the first completion otherwise would have left it
    rows = [json.loads(line) for line in judged.splitlines()]
    rows[0] |= {"strict_answer": rows[0]["gold"], "strict_failure": None, "format_ok": True, "task_correct": not rows[0]["task_correct"]}
    samples_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stale = results | {"metrics": results["metrics"] | {"task_accuracy": {"value": 0.99, "ci_low": 0.9, "ci_high": 1.0}}}
    results_path.write_text(json.dumps(stale))

    again = evaluate()
    assert again.exit_code == 0 and "1 of 1 cells were finished already" in again.output
    assert "1 completions are judged otherwise by this version's parsers; its scores are updated" in caplog.text
    assert samples_path.read_text() == judged  # judged from its completions as the first run did
    rejudged = json.loads(results_path.read_text())
    assert rejudged["metrics"] == results["metrics"] and rejudged["diagnostics"] == results["diagnostics"]
    assert rejudged["created"] == results["created"] and rejudged["versions"]["parsers"] == results["versions"]["parsers"]


def test_judging_again_notes_a_completion_that_opened_with_a_stop_string(tmp_path, tiny_llama):
    from softeval import evaluate, load_task
    from softeval.scoring import score_sample
    from softeval.study.evaluation import rejudge

    spec = load_task(write_user_task(tmp_path, ROWS))
    result = evaluate(tiny_llama, spec, "zero-shot", progress=False)
    first = result.samples[0]
    example = next(e for e in load_examples_of(spec) if e.index == first.index)
    # as an older version judged it: the cut text alone, an "empty completion"
    old = first.model_copy(update={"completion": "\n", "raw_completion": "\nQuestion:", "stop_reason": "stop",
                                   **score_sample(spec.format, example, "\n", None).model_dump(exclude={"option_loglikelihoods", "knowledge_answer", "knowledge_correct"})})
    assert old.strict_failure == "empty completion"
    result.samples = [old, *result.samples[1:]]
    result.versions["parsers"] = "older"
    folder = result.save(tmp_path / "cell")
    assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) == 1
    again = EvalResult.load(folder).samples[0]
    assert again.strict_failure == again.lenient_note == "a stop string came before any answer: 'Question:'"
    assert (again.format_ok, again.task_correct) == (False, False)


def test_judging_again_applies_the_installed_parsers_to_a_number_cell(tmp_path, tiny_llama):
    from softeval import evaluate, load_task
    from softeval.scoring import parsers_version, score_sample
    from softeval.study.evaluation import rejudge

    rows = [{"q": f"What is {i} + {i}?", "n": 2 * i} for i in range(1, 5)]
    spec = load_task(write_user_task(tmp_path, rows, answer_format="number", fields={"question": "q", "answer": "n", "solution": "'#### ' ~ n"},
                                     template="Question: {{ question }}\nAnswer:", target=" #### {{ answer }}", max_new_tokens=6))
    result = evaluate(tiny_llama, spec, "zero-shot", progress=False)
    # as an older version judged a completion cut at the token limit: its last number, the gold 2
    first = next(s for s in result.samples if s.gold == "2")
    example = next(e for e in load_examples_of(spec) if e.index == first.index)
    cut = " 1 + 1 = 2 and then 2"
    old = first.model_copy(update={"completion": cut, "stop_reason": "length", **score_sample(spec.format, example, cut, None).model_dump()})
    assert old.lenient_correct
    result.samples = [old if s is first else s for s in result.samples]
    result.versions["parsers"] = "older"
    folder = result.save(tmp_path / "cell")

    assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) == 1
    judged = EvalResult.load(folder)
    again = next(s for s in judged.samples if s.index == first.index)
    assert again.lenient_answer is None and not again.lenient_correct and "token limit" in again.lenient_note
    assert judged.diagnostics.cut_share >= 0.25 and judged.versions["parsers"] == parsers_version()
    assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) is None  # nothing left to change
    # a sample log cut short is told as such: the cell is then evaluated again
    (folder / "samples.jsonl").write_text((folder / "samples.jsonl").read_text()[:50])
    with pytest.raises(SoftevalError, match="its results cannot be read"):
        rejudge(folder, spec, data_dir=None, limit=None, seed=0)


def load_examples_of(spec):
    from softeval import load_examples

    return load_examples(spec, spec.dataset.eval_split, None)


def test_cells_of_one_task_judged_by_other_parsers_are_flagged(tmp_path, tiny_model_dirs):
    from softeval.analysis import cell_flags

    task = write_user_task(tmp_path, ROWS * 2)
    out = tmp_path / "out"
    for model in ("llama", "gemma3"):
        assert run("eval", "--model", tiny_model_dirs[model], "--task", task, "--limit", 2, "--output", out).exit_code == 0
    cells = [EvalResult.load(p.parent) for p in sorted(out.glob("*/capitals/zero-shot/results.json"))]
    judged_by = lambda flags: [f for f in flags if f.startswith("judged by parsers")]  # noqa: E731
    assert not any(judged_by(f) for f in cell_flags(cells).values())
    cells[0].versions["parsers"] = "older"
    flags = cell_flags(cells)
    assert all(judged_by(flags[id(c)]) == [f"judged by parsers {c.versions['parsers']}, one of 2 here: rerun its command"] for c in cells)


def test_a_cell_of_the_older_interval_rule_is_recomputed_once_from_its_samples_saying_so(tmp_path, tiny_llama, caplog):
    import logging

    from softeval import evaluate, load_task
    from softeval.scoring import INTERVALS
    from softeval.study.evaluation import rejudge

    spec = load_task(write_user_task(tmp_path, ROWS * 6))
    result = evaluate(tiny_llama, spec, "zero-shot", progress=False)
    assert result.versions["intervals"] == INTERVALS
    folder = result.save(tmp_path / "out")
    assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) is None  # this version's rule: nothing to do
    # as the rule before wrote it: each upper bound one resample higher, and no record of the rule
    older = result.metrics["knowledge"].model_copy(update={"ci_high": min(1.0, result.metrics["knowledge"].ci_high + 1 / 12)})
    result.metrics["knowledge"] = older
    del result.versions["intervals"]
    result.write(folder)
    with caplog.at_level(logging.INFO, logger="softeval"):
        assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) == 0  # no completion is judged otherwise
    assert [r for r in caplog.records if "its intervals are computed again from its samples" in r.getMessage()]
    again = EvalResult.load(folder)
    assert again.metrics == evaluate(tiny_llama, spec, "zero-shot", progress=False).metrics and again.versions["intervals"] == INTERVALS
    assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) is None  # once


def test_a_rerun_of_finished_cells_does_not_load_the_weights(tmp_path, tiny_model_dirs, monkeypatch, caplog):
    import shutil

    from transformers import AutoModelForCausalLM

    folder = tmp_path / "tiny"
    shutil.copytree(tiny_model_dirs["llama"], folder)
    task = write_user_task(tmp_path, ROWS * 3)
    out = tmp_path / "out"
    evaluate_with = lambda methods: run("run", "--model", folder, "--task", task, "--method", methods, "--limit", 3, "--output", out)  # noqa: E731
    assert evaluate_with("zero-shot").exit_code == 0

    def no_weights(*args, **kwargs):
        raise OSError("the weights were read")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_weights)  # a rerun that read them would fail
    rerun = evaluate_with("zero-shot")
    assert rerun.exit_code == 0 and "1 of 1 cells were finished already" in rerun.output
    more = evaluate_with("zero-shot,few-shot")  # a cell to compute: now the weights load
    assert more.exit_code == 1 and str(more.exception).startswith("1 of 2 cells failed, each told above")
    assert [r for r in caplog.records if "the weights were read" in r.getMessage()]


def test_a_command_reads_each_split_once(tmp_path, family_dirs, monkeypatch):
    """The checks before any work, the cells' identities, the tuning and every evaluation take
    the rows of one read of each file."""
    import softeval.tasks.data as data

    reads = Counter()
    read_file = data._read_file
    monkeypatch.setattr(data, "_read_file", lambda path: reads.update([path.name]) or read_file(path))
    family = next(iter(family_dirs))
    study = write_study(tmp_path, {family: family_dirs[family]}, ["zero-shot", "few-shot", "soft-prompt"])
    result = run("study", study, "--output", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert reads == {"test.jsonl": 1, "train.jsonl": 1}


@pytest.mark.parametrize("every", [0.0, 3600.0])
def test_the_comparison_is_rebuilt_between_models_once_its_interval_has_passed(tmp_path, family_dirs, monkeypatch, every):
    """While a study runs, the comparison is rebuilt after a model once COMPARISON_EVERY_S have
    passed since the last rebuild (it reads every finished cell, so not after every model of a
    long series), and always at the end."""
    import softeval.study.runner as runner_module

    monkeypatch.setattr(runner_module, "COMPARISON_EVERY_S", every)
    seen = []  # what comparison.json holds as each model loads
    load = runner_module.load_model

    def loading(spec, **options):
        path = tmp_path / "out" / "comparison.json"
        seen.append(len(json.loads(path.read_text())["cells"]) if path.is_file() else 0)
        return load(spec, **options)

    monkeypatch.setattr(runner_module, "load_model", loading)
    study = write_study(tmp_path, {"alpha": family_dirs["alpha"]}, ["zero-shot"])  # a base model, then a post-trained one (plain, chat)
    assert run("study", study, "--output", tmp_path / "out").exit_code == 0
    assert seen == ([0, 1] if every == 0 else [0, 0])
    assert len(json.loads((tmp_path / "out" / "comparison.json").read_text())["cells"]) == 3
