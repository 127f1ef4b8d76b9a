"""Checkpoint series: decision accuracy against hand-computed tables, and the analysis of synthetic
series with known curves, a crossing, noise and an outlier."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from softeval.analysis.series import budgets, decision_accuracy, decisions, earliest_decision, recipe_noise, spread_over_noise
from softeval.errors import SoftevalError

ROWS = 400


def outcomes(*accuracies: float, seed: int = 0) -> np.ndarray:
    """(checkpoints, ROWS) of 0/1 outcomes with exactly these accuracies, rows shuffled."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(np.arange(ROWS) < round(a * ROWS)).astype(float) for a in accuracies])


@pytest.mark.parametrize(
    ("scores", "target", "expected"),
    [
        ([0.3, 0.5, 0.4], [0.2, 0.6, 0.5], 1.0),  # every pair ordered alike
        ([0.5, 0.3, 0.4], [0.2, 0.6, 0.5], 0.0),  # every pair reversed
        ([0.3, 0.5, 0.6], [0.2, 0.6, 0.5], 2 / 3),  # (1, 2) reversed
        ([0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], 0.0),
        ([0.1, 0.2, 0.3, 0.4], [0.1, 0.3, 0.2, 0.4], 5 / 6),
        ([0.7], [0.1], None),  # one recipe: no pair
        ([0.5, 0.5], [0.6, 0.4], 0.5),  # a tie in the scores counts half, whichever recipe comes first
        ([0.5, 0.5], [0.4, 0.6], 0.5),
        ([0.3, 0.2, 0.4], [0.2, 0.2, 0.5], 1.0),  # the pair the target ties is left out
        ([0.3, 0.5], [0.4, 0.4], None),
    ],
)
def test_decision_accuracy_is_the_share_of_pairs_ordered_as_the_target(scores, target, expected):
    assert decision_accuracy(scores, target) == (pytest.approx(expected) if expected is not None else None)


def test_a_budget_takes_each_recipes_latest_checkpoint_within_it():
    assert budgets([[1, 2, 4], [1, 3]]) == [(1, [0, 0]), (2, [1, 0]), (3, [1, 1]), (4, [2, 1])]
    assert budgets([[2, 4], [1, 3]]) == [(2, [0, 0]), (3, [0, 1]), (4, [1, 1])]  # budget 1: recipe 0 has nothing yet


def test_crossing_curves_decide_once_the_later_leader_leads():
    """Recipe A leads early, B overtakes it at the third checkpoint and is the better recipe."""
    series = [outcomes(0.50, 0.55, 0.60, 0.62, seed=1), outcomes(0.30, 0.50, 0.75, 0.80, seed=2)]
    target = np.stack([series[0][-1], series[1][-1]])
    found = decisions(series, [[1, 2, 3, 4], [1, 2, 3, 4]], target, n_resamples=500)
    assert [b.decision_accuracy.value for b in found] == [0.0, 0.0, 1.0, 1.0]
    assert earliest_decision(found) == 3
    early, late = found[1].decision_accuracy, found[2].decision_accuracy
    assert early.ci_low == 0.0 and late.ci_high == 1.0 and late.ci_low == 1.0  # 0.55 vs 0.50 on 400 rows may flip; 0.75 vs 0.62 does not
    assert early.ci_high == 1.0
    assert earliest_decision(found, threshold=1.1) is None


def test_a_lead_within_the_noise_decides_by_its_estimate_but_is_shown_only_once_the_interval_clears():
    series = [outcomes(0.50, 0.50, 0.50, 0.50, seed=3), outcomes(0.30, 0.52, 0.54, 0.75, seed=4)]
    target = np.stack([series[0][-1], series[1][-1]])
    found = decisions(series, [[1, 2, 3, 4], [1, 2, 3, 4]], target, n_resamples=500)
    assert [b.decision_accuracy.value for b in found] == [0.0, 1.0, 1.0, 1.0]
    assert [b.decision_accuracy.ci_low for b in found] == [0.0, 0.0, 0.0, 1.0]  # 2 and 4 points ahead on 400 rows: within the noise
    assert earliest_decision(found) == 2 and earliest_decision(found, bound="ci_low") == 4


def test_noise_monotonicity_and_an_outlier_checkpoint():
    steady = recipe_noise(outcomes(0.30, 0.40, 0.50, 0.60, 0.70), [1, 2, 3, 4, 5])
    assert steady.outliers == [] and steady.monotonicity == pytest.approx(1.0)
    assert steady.noise == pytest.approx(np.std([0.5, 0.6, 0.7], ddof=1))
    broken = recipe_noise(outcomes(0.30, 0.40, 0.90, 0.60, 0.70), [1, 2, 3, 4, 5])  # a wrongly uploaded checkpoint
    assert broken.outliers == [2]
    unevenly = recipe_noise(outcomes(0.30, 0.32, 0.70), [1, 2, 10])  # on the line through its neighbours, by tokens
    assert unevenly.outliers == []
    saturating = recipe_noise(outcomes(0.30, 0.40, 0.48, 0.53, 0.56, 0.58), [1, 2, 4, 8, 16, 32])  # doubling steps
    assert saturating.outliers == []
    flat = [recipe_noise(np.stack([np.random.default_rng(seed + k).random(ROWS) < 0.5 for k in range(6)]).astype(float), [1, 2, 3, 4, 5, 6],
                         n_resamples=300).outliers for seed in range(0, 200, 10)]
    assert sum(map(bool, flat)) <= 2  # noise alone: rarely an outlier (at most 5% of series, by the correction)
    assert spread_over_noise([0.6, 0.7], [0.05, 0.15]) == pytest.approx(1.0)
    assert spread_over_noise([0.6], [0.1]) is None


def test_a_tiny_pretraining_run_is_analysed_end_to_end(tmp_path, mirror, monkeypatch):
    """Two recipes really pre-trained (tiny llamas, seeded, on TriviaQA or ARC-Easy text of the
    benchmark mirror, a checkpoint every 40 steps), each with its reference model: the study
    evaluates every checkpoint on ARC-Easy, and `softeval analyze` orders the recipes by their
    references and states decision accuracy per method and budget, the earliest decision, noise
    and outliers, in files and on the terminal."""
    import json
    import shutil

    import yaml
    from typer.testing import CliRunner

    from conftest import REPO, TUNING
    from softeval.cli import app

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from tiny_pretraining import pretrain

    for recipe in ("qa", "science"):
        pretrain(recipe, mirror, tmp_path, steps=120, every=40, batch=8, length=32, seed=0, hidden=32, n_texts=2000)
    # each recipe's reference is the other's final model: the references order the recipes
    # opposite to their last checkpoints, so a target read from the wrong cells is seen
    shutil.copytree(tmp_path / "science" / "checkpoint-120", tmp_path / "qa-final")
    shutil.copytree(tmp_path / "qa" / "checkpoint-120", tmp_path / "science-final")
    series = [{"name": r, "checkpoints": str(tmp_path / r), "tokens_per_step": 8 * 32, "reference": str(tmp_path / f"{r}-final")}
              for r in ("qa", "science")]
    study = {"series": series, "tasks": ["arc_easy"], "methods": ["zero-shot", "few-shot", "soft-prompt"], "k": 2, "limit": 40,
             "tuning": TUNING, "reference": {"method": "zero-shot", "chat": False}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(app, ["study", str(tmp_path / "study.yaml"), "--data-dir", str(mirror), "--output", str(out)])
    assert result.exit_code == 0, result.output
    recorded = json.loads((out / "series.json").read_text())
    assert [p["model"] for p in recorded["qa"]["checkpoints"]] == ["qa@checkpoint-40", "qa@checkpoint-80", "qa@checkpoint-120"]
    assert [p["tokens"] for p in recorded["science"]["checkpoints"]] == [40 * 256, 80 * 256, 120 * 256]
    assert recorded["qa"]["reference"] == {"model": "qa-final", "method": "zero-shot", "chat": False}
    assert (out / "analysis.json").is_file()  # the study analysed its series itself

    # models this small and this briefly trained write no letters: the recipes are compared on knowledge
    result = runner.invoke(app, ["analyze", str(out), "--target-metric", "knowledge"])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["target"]["kind"] == "reference" and not analysis["target"]["chosen"]
    found = analysis["tasks"]["arc_easy"]
    assert set(found["decisions"]) == {"zero-shot", "few-shot", "soft-prompt"} and found["axis"] == "tokens"

    def knowledge(model: str, method: str) -> float:
        lines = (out / model / "arc_easy" / method / "samples.jsonl").read_text().splitlines()
        return np.mean([json.loads(line)["knowledge_correct"] for line in lines])

    # decision accuracy at each budget, as computed here from the cells' samples, against the references
    target = [knowledge("qa-final", "zero-shot"), knowledge("science-final", "zero-shot")]
    assert list(found["target_scores"].values()) == pytest.approx(target) and target[0] != target[1]
    for method in ("zero-shot", "soft-prompt"):
        expected = [decision_accuracy([knowledge(f"qa@checkpoint-{s}", method), knowledge(f"science@checkpoint-{s}", method)], target)
                    for s in (40, 80, 120)]
        assert [b["decision_accuracy"]["value"] for b in found["decisions"][method]] == expected
    assert found["decisions"]["zero-shot"][-1]["decision_accuracy"]["value"] == 0.0  # the references order the recipes the other way

    # every method read through every metric predicts, bits per byte negated: here computed from the samples
    def mean_of(model: str, method: str, field: str) -> float:
        lines = (out / model / "arc_easy" / method / "samples.jsonl").read_text().splitlines()
        return np.mean([json.loads(line)[field] for line in lines])

    predictors = found["predictors"]
    assert {"soft-prompt / task_accuracy", "zero-shot / gold_prob", "few-shot / cloze_gold_bpb"} <= set(predictors["results"])
    for name, field, sign in (("zero-shot / cloze_gold_bpb", "cloze_gold_bpb", -1), ("soft-prompt / gold_prob", "gold_prob", 1)):
        method = name.split(" / ")[0]
        expected = [decision_accuracy([sign * mean_of(f"{r}@checkpoint-{s}", method, field) for r in ("qa", "science")], target) for s in (40, 80, 120)]
        assert [b["value"] for b in predictors["results"][name]["decision_accuracy"]] == expected
    proxy = predictors["differences"][0]
    assert proxy["first"] == "soft-prompt / task_accuracy" and proxy["best_continuous"]
    assert "gold" in proxy["second"] and "minus" in (out / "analysis.md").read_text()
    assert [b["budget"] for b in found["decisions"]["soft-prompt"]] == [40 * 256, 80 * 256, 120 * 256]
    assert "| **decides from** |" in result.output and "post-trained reference model's knowledge" in result.output
    assert (out / "analysis_arc_easy.png").is_file()
    assert f"wrote {out / 'analysis.md'}" in result.output and f"wrote {out / 'analysis_arc_easy.png'}" in result.output
    last = runner.invoke(app, ["analyze", str(out), "--target", "last", "--target-method", "zero-shot", "--target-metric", "knowledge"])
    assert last.exit_code == 0, last.output
    zero_shot = json.loads((out / "analysis.json").read_text())["tasks"]["arc_easy"]["decisions"]["zero-shot"]
    assert zero_shot[-1]["decision_accuracy"]["value"] == 1.0  # the target's own scores order themselves


def test_the_example_series_study_loads():
    from pathlib import Path

    from softeval.study import load_study

    study = load_study(Path(__file__).resolve().parents[1] / "examples" / "pythia-series.yaml")
    assert len(study.series) == 4 and len(study.models) == 32
    assert study.series[0].points()[-1] == {"model": "pythia-70m@step143000", "spec": "EleutherAI/pythia-70m@step143000",
                                            "step": 143000, "tokens": 143000 * 2097152}
    olmo = load_study(Path(__file__).resolve().parents[1] / "examples" / "olmo2-series.yaml")
    assert [p["tokens"] for p in olmo.series[1].points()][:2] == [5e9, 9e9]
    references = [(m.model, m.role) for m in olmo.models if m.role == "post-trained"]
    assert references == [("allenai/OLMo-2-0425-1B-Instruct", "post-trained"), ("allenai/OLMo-2-1124-7B-Instruct", "post-trained")]


def test_a_warm_start_tunes_from_the_previous_checkpoints_prompt(tmp_path, tiny_model_dirs):
    import json
    import shutil

    import yaml
    from typer.testing import CliRunner

    from conftest import STUDY_ROWS, TUNING, write_user_task
    from softeval.cli import app
    from softeval.models import load_model
    from softeval.tasks import load_task
    from softeval.tuning import TuneConfig, load_soft_prompt
    from softeval.tuning.tuner import Tuner

    for step in (1, 2):
        shutil.copytree(tiny_model_dirs["llama"], tmp_path / "run" / f"step-{step}")
    task = write_user_task(tmp_path, STUDY_ROWS)
    study = {"series": [{"name": "run", "checkpoints": str(tmp_path / "run")}], "warm_start": True, "tasks": [str(task)],
             "methods": ["soft-prompt"], "limit": 6, "tuning": TUNING}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", str(tmp_path / "study.yaml"), "--output", str(out)])
    assert result.exit_code == 0, result.output
    first = load_soft_prompt(out / "run@step-1" / "capitals" / "prompt")
    second = load_soft_prompt(out / "run@step-2" / "capitals" / "prompt")
    assert first.metadata["produced"] == {"by": "tune"}  # the first checkpoint starts cold
    assert second.metadata["produced"] == {"by": "tune", "warm_start": {"from": "run@step-1", "sha256": first.sha256}}
    assert json.loads((out / "run@step-2" / "capitals" / "soft-prompt" / "results.json").read_text())["tuning"]["steps"] == TUNING["steps"]
    # the tuner starts from those very vectors
    lm = load_model(str(tmp_path / "run" / "step-2"), device="cpu")
    with Tuner(lm, load_task(task), TuneConfig(**TUNING), start=first) as tuner:
        assert torch.equal(tuner.prompt.detach(), first.vectors)
    wide = type(first)(torch.zeros(3, lm.hidden_size), {}, tmp_path / "wide.safetensors")
    with pytest.raises(SoftevalError, match=r"a warm start from .*wide.safetensors needs 2 vectors"):
        Tuner(lm, load_task(task), TuneConfig(**TUNING), start=wide)
    with pytest.raises(ValueError, match="warm_start tunes each checkpoint of a series"):
        from softeval.study import Study

        Study(models=[{"model": "x/y"}], tasks=["arc_easy"], warm_start=True)


def test_a_later_command_keeps_the_analysis_settings_chosen(tmp_path, monkeypatch):
    import json

    from softeval.reports import series as reports_series

    (tmp_path / "series.json").write_text("{}")
    (tmp_path / "analysis.json").write_text(json.dumps({"target": {"method": "few-shot", "metric": "knowledge"}, "threshold": 0.9}))
    seen = {}
    monkeypatch.setattr(reports_series, "analyze", lambda folder, **settings: seen.update(settings) or {"tasks": {}})
    reports_series.update_analysis(tmp_path)
    assert seen == {"target": None, "target_method": "few-shot", "target_metric": "knowledge", "threshold": 0.9}
    chosen = {"kind": "last", "chosen": True, "method": "few-shot", "metric": "knowledge"}
    (tmp_path / "analysis.json").write_text(json.dumps({"target": chosen, "threshold": 0.9}))
    reports_series.update_analysis(tmp_path)
    assert seen["target"] == "last"  # chosen by the user: kept; else chosen again as references are declared


def test_a_reference_target_needs_every_recipe_to_declare_one(tmp_path):
    import json

    from softeval.analysis import series_analysis
    from softeval.study import Study

    point = {"model": "a@step1", "spec": "a@step1", "step": 1, "tokens": None}
    (tmp_path / "series.json").write_text(json.dumps({"a": [point], "b": {"checkpoints": [point], "reference": None}}))  # old and new layout
    with pytest.raises(SoftevalError, match=r"^series 'a' declares no reference model; add reference: to its series in the study file, or use --target last$"):
        series_analysis(tmp_path, target="reference")
    with pytest.raises(ValueError, match="a series' reference is evaluated with its chat template: set chat: true"):
        Study(series=[{"name": "a", "model": "org/a", "revisions": ["step1"], "reference": "org/a-instruct"}], tasks=["arc_easy"])
    with pytest.raises(ValueError, match="a series' reference is evaluated zero-shot, which methods does not hold"):
        Study(series=[{"name": "a", "model": "org/a", "revisions": ["step1"], "reference": "org/a-instruct"}], tasks=["arc_easy"], chat=True,
              methods=["soft-prompt"])
    study = Study(series=[{"name": "a", "model": "org/a", "revisions": ["step1"], "reference": "org/a-instruct"}], tasks=["arc_easy"], chat=True)
    assert [(m.model, m.role) for m in study.models] == [("org/a@step1", "base"), ("org/a-instruct", "post-trained")]


def _rewrite_weights_in_place(folder) -> None:
    """Retrain into the same checkpoint folder: new weights, same file name, size and config."""
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    size = file.stat().st_size
    tensors = {name: tensor + 0.05 for name, tensor in load_file(file).items()}
    save_file(tensors, file, metadata={"format": "pt"})
    assert file.stat().st_size == size


def test_a_checkpoint_rewritten_in_place_is_computed_again_and_the_others_kept(tmp_path, tiny_model_dirs, caplog, monkeypatch):
    import json
    import os
    import shutil

    import yaml
    from typer.testing import CliRunner

    from conftest import STUDY_ROWS, TUNING, write_user_task
    from softeval.cli import app

    monkeypatch.setenv("SOFTEVAL_HASH_CACHE", str(tmp_path / "hashes.json"))
    for step in (10, 20):
        shutil.copytree(tiny_model_dirs["llama"], tmp_path / "run" / f"checkpoint-{step}")
    task = write_user_task(tmp_path, STUDY_ROWS)
    study = {"series": [{"name": "run", "checkpoints": str(tmp_path / "run")}], "tasks": [str(task)],
             "methods": ["zero-shot", "soft-prompt"], "limit": 6, "tuning": TUNING}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    command = ["study", str(tmp_path / "study.yaml"), "--output", str(out)]
    assert CliRunner().invoke(app, command).exit_code == 0
    files = {(name, cell): out / name / "capitals" / cell / "results.json" for name in ("run@checkpoint-10", "run@checkpoint-20")
             for cell in ("zero-shot", "soft-prompt")}
    prompts = {name: out / name / "capitals" / "prompt" / "soft_prompt.safetensors" for name in ("run@checkpoint-10", "run@checkpoint-20")}
    before = {key: path.stat().st_mtime_ns for key, path in {**files, **prompts}.items()}
    recorded = json.loads(files[("run@checkpoint-20", "zero-shot")].read_text())["identity"]["model"].get("weights_sha256")

    os.utime(tmp_path / "run" / "checkpoint-20" / "model.safetensors", ns=(1, 1))  # an old mtime: cached, not racy
    assert CliRunner().invoke(app, command).exit_code == 0  # unchanged: everything kept, the hashes now cached
    assert all(path.stat().st_mtime_ns == before[key] for key, path in {**files, **prompts}.items())

    _rewrite_weights_in_place(tmp_path / "run" / "checkpoint-20")
    caplog.clear()
    with caplog.at_level("INFO", logger="softeval"):
        result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    for (name, cell), path in files.items():
        changed = path.stat().st_mtime_ns != before[(name, cell)]
        assert changed == (name == "run@checkpoint-20"), (name, cell)
    assert prompts["run@checkpoint-20"].stat().st_mtime_ns != before["run@checkpoint-20"]  # its prompt is tuned again
    assert prompts["run@checkpoint-10"].stat().st_mtime_ns == before["run@checkpoint-10"]
    now = json.loads(files[("run@checkpoint-20", "zero-shot")].read_text())["identity"]["model"].get("weights_sha256")
    assert now != recorded
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "weights" in r.getMessage()]
    assert recorded and said == [f"the weights of run@checkpoint-20 ({tmp_path / 'run' / 'checkpoint-20'}) changed since its cells were computed "
                    f"(sha256 {recorded[:12]} -> {now[:12]}); its cells and prompts are computed again"]
    assert not [r for r in caplog.records if r.levelno >= 20 and "again" in r.getMessage() and r.getMessage() not in said]  # one line, not one per cell

    # the old prompt, given for the new weights, is refused as of other weights
    from softeval.models import load_model
    from softeval.tasks import load_task
    from softeval.tuning import load_soft_prompt

    stale = load_soft_prompt(prompts["run@checkpoint-20"])
    stale.metadata["model"]["weights_sha256"] = recorded
    with pytest.raises(SoftevalError, match=r"was tuned for other weights of model .*checkpoint-20', whose weight files have changed since; tune one"):
        stale.check(load_model(str(tmp_path / "run" / "checkpoint-20"), device="cpu", lazy=True), load_task(task), chat=False)


def _write_cell(out, model: str, method: str, correct: list[int], knows: list[int], chat: bool = False) -> None:
    """A finished cell of task `quiz` whose rows have these task and knowledge outcomes."""
    from softeval.scoring import METRICS, EvalResult, Metric
    from softeval.scoring.metrics import Sample

    samples = [
        Sample(index=i, source=f"q{i}", prompt="Q?", n_demos=0, truncated=False, raw_completion="x", completion="x", stop_reason="stop",
               gold="A", strict_answer="A" if c else None, strict_failure=None if c else "no letter", lenient_answer=None,
               lenient_status="answer", lenient_note=None, format_ok=bool(c), task_correct=bool(c), lenient_correct=bool(k),
               knowledge_correct=bool(k))
        for i, (c, k) in enumerate(zip(correct, knows))
    ]
    none = Metric(value=None, ci_low=None, ci_high=None)
    config = {"model": model, "task": "quiz", "method": method, "chat": chat, "k": 0, "seed": 0}
    EvalResult(config=config, metrics=dict.fromkeys(METRICS, none), samples=samples,
               model={}, data={"spec_sha256": "s", "split": "test", "sha256": "d", "rows": len(samples)}, timings={},
               n_truncated=0).save(out)


def _tied_folder(out):
    """Two recipes of three checkpoints whose task accuracy is 0 everywhere (no answer keeps the
    format), so every target ties on it, and whose knowledge orders them: a knows more than b."""
    import json

    series = {}
    for name, known in (("a", [2, 4, 6]), ("b", [1, 2, 3])):
        points = [{"model": f"{name}@step-{s}", "spec": f"runs/{name}/step-{s}", "step": s, "tokens": s * 1e6} for s in (1, 2, 3)]
        for point, k in zip(points, known):
            for method in ("zero-shot", "soft-prompt"):
                _write_cell(out, point["model"], method, [0] * 8, [1] * k + [0] * (8 - k))
        _write_cell(out, f"{name}-ref", "zero-shot", [0] * 8, [1] * known[-1] + [0] * (8 - known[-1]))
        series[name] = {"checkpoints": points, "reference": {"model": f"{name}-ref", "method": "zero-shot", "chat": False}}
    (out / "series.json").write_text(json.dumps(series))


def test_an_analysis_says_why_it_cannot_decide_and_which_target_would(tmp_path):
    from softeval.reports.series import analysis_markdown, analyze

    _tied_folder(tmp_path)
    analysis = analyze(tmp_path)  # task accuracy, against the references: 0.00 and 0.00
    found = analysis["tasks"]["quiz"]
    assert all(b["decision_accuracy"]["value"] is None for m in found["decisions"].values() for b in m)
    assert found["notes"] == [
        "Decision accuracy is n/a at every budget: the target's task_accuracy ties every pair of recipes (a 0.00, b 0.00); "
        "the folder's cells would order them with --target-metric knowledge (a 0.75, b 0.38).",
        "zero-shot: monotonicity is n/a for a, b: task_accuracy does not change across checkpoints.",
        "zero-shot: spread over noise is n/a: the recipes' last 3 checkpoints do not vary (noise 0).",
        "soft-prompt: monotonicity is n/a for a, b: task_accuracy does not change across checkpoints.",
        "soft-prompt: spread over noise is n/a: the recipes' last 3 checkpoints do not vary (noise 0).",
    ]
    text = (tmp_path / "analysis.md").read_text()
    assert "Why a figure is n/a or means little, or a method never decides:" in text and found["notes"][0] in text

    decided = analyze(tmp_path, target_metric="knowledge")["tasks"]["quiz"]
    assert decided["decisions"]["zero-shot"][-1]["decision_accuracy"]["value"] == 1.0
    assert not any("ties every pair" in note for note in decided["notes"])

    # the last checkpoints' knowledge as the target ties, and the references' knowledge would order them
    for k in (2, 3):
        _write_cell(tmp_path, f"a@step-{k}", "zero-shot", [0] * 8, [1] * 3 + [0] * 5)
    last = analyze(tmp_path, target="last", target_method="zero-shot", target_metric="knowledge")["tasks"]["quiz"]
    assert last["notes"][0] == ("Decision accuracy is n/a at every budget: the target's knowledge ties every pair of recipes (a 0.38, b 0.38); "
                                "the folder's cells would order them with --target reference (a 0.75, b 0.38).")
    assert "## quiz" in analysis_markdown(analyze(tmp_path))


def test_the_analysis_chart_plots_the_metric_it_decides_on(tmp_path):
    import matplotlib.pyplot as plt

    from softeval.reports.series import analyze, curves_figure

    _tied_folder(tmp_path)
    found = analyze(tmp_path, target_metric="knowledge")["tasks"]["quiz"]
    fig = curves_figure(found, "quiz", "knowledge")
    try:
        ax = fig.axes[0]
        assert ax.get_ylabel() == "knowledge" and fig.get_suptitle() == "quiz"
        plotted = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
        assert plotted == {"a": [0.25, 0.5, 0.75], "b": [0.125, 0.25, 0.375]}  # knowledge first, not task accuracy (0 throughout)
        # a panel per method and metric, the decided-on metric in the first row
        assert len(fig.axes) == 2 * 3 and [a.get_ylabel() for a in fig.axes[::2]] == ["knowledge", "task accuracy", "format following"]
        # the legend lies beside the panels, over none of their data
        fig.canvas.draw()
        (legend,) = fig.legends
        assert not any(legend.get_window_extent().overlaps(a.get_window_extent()) for a in fig.axes)
        # each recipe one colour in every panel, its band faint enough for the other's to show
        colours = {line.get_label(): line.get_color() for a in fig.axes for line in a.get_lines()}
        assert len(colours) == 2 and all(line.get_color() == colours[line.get_label()] for a in fig.axes for line in a.get_lines())
        assert all(band.get_alpha() <= 0.1 for a in fig.axes for band in a.collections)
    finally:
        plt.close(fig)
    assert (tmp_path / "analysis_quiz.png").is_file()


def test_a_chart_of_many_recipes_and_checkpoints_keeps_each_recipe_apart_and_draws_no_more_points_than_pixels():
    """25 recipes of 500 checkpoints each: every recipe a (colour, line style) of its own, each
    curve thinned to MAX_CURVE_POINTS points that keep its first and last, no markers, and the
    title says the curves were thinned."""
    import matplotlib.pyplot as plt

    from softeval.reports.series import MAX_CURVE_POINTS, curves_figure

    n = 500
    names = [f"r{i}" for i in range(25)]
    curve = lambda i: [{"value": i / 100 + k / 10_000, "ci_low": None, "ci_high": None} for k in range(n)]  # noqa: E731
    found = {"axis": "step", "x": {name: list(range(10, 10 * n + 1, 10)) for name in names},
             "curves": {"zero-shot": {"task_accuracy": {name: curve(i) for i, name in enumerate(names)}}}}
    fig = curves_figure(found, "quiz", "task_accuracy")
    try:
        lines = fig.axes[0].get_lines()
        assert len({(line.get_color(), line.get_linestyle()) for line in lines}) == len(names) == len(lines)
        for i, line in enumerate(lines):
            xs, ys = list(line.get_xdata()), list(line.get_ydata())
            assert len(xs) == MAX_CURVE_POINTS and (xs[0], xs[-1]) == (10, 10 * n) and line.get_marker() in (None, "None", "")
            assert ys == [curve(i)[x // 10 - 1]["value"] for x in xs]  # the points drawn are the curve's own
        assert fig.get_suptitle() == f"quiz (curves of {n} checkpoints drawn at {MAX_CURVE_POINTS} points each)"
    finally:
        plt.close(fig)


def test_an_analysis_names_the_task_it_could_not_analyse_and_why(tmp_path):
    import shutil

    from softeval.analysis import series_analysis

    _tied_folder(tmp_path)
    shutil.rmtree(tmp_path / "b-ref")
    with pytest.raises(SoftevalError, match=r"quiz: the reference b-ref has no finished cell on it; run the study's cells first"):
        series_analysis(tmp_path)
    # no method finished on every checkpoint (cells failed overnight): said, not a crash
    shutil.rmtree(tmp_path / "a@step-1" / "quiz" / "zero-shot")
    shutil.rmtree(tmp_path / "b@step-2" / "quiz" / "soft-prompt")
    with pytest.raises(SoftevalError, match=r"quiz: no method has a finished cell on every checkpoint \(zero-shot lacks a@step-1, soft-prompt lacks b@step-2\)"):
        series_analysis(tmp_path, target="last")
    _write_cell(tmp_path, "a@step-1", "zero-shot", [0] * 8, [1] * 8)  # zero-shot is whole again: analysed on it
    analysis = series_analysis(tmp_path, target="last", target_method="zero-shot")
    assert analysis["tasks"]["quiz"]["rows"] == 8 and list(analysis["tasks"]["quiz"]["decisions"]) == ["zero-shot"]


def test_a_checkpoint_named_as_softeval_names_it_is_its_folder(tmp_path, tiny_model_dirs):
    """`run@checkpoint-N`, the name softeval prints, is the checkpoint's folder as --model, and
    the results table names checkpoints by that name too."""
    import shutil

    from typer.testing import CliRunner

    from conftest import STUDY_ROWS, write_user_task
    from softeval.cli import app
    from softeval.models import local_checkpoint, model_kind, model_name

    for step in (10, 20):
        shutil.copytree(tiny_model_dirs["llama"], tmp_path / "run" / f"checkpoint-{step}")
    named = str(tmp_path / "run@checkpoint-20")
    assert local_checkpoint(named) == str(tmp_path / "run" / "checkpoint-20") and model_kind(named) == "folder"
    assert model_name(named) == model_name(local_checkpoint(named)) == "run@checkpoint-20"
    assert local_checkpoint("EleutherAI/pythia-70m@step3000") == "EleutherAI/pythia-70m@step3000"  # a hub revision stays one
    assert local_checkpoint(named + "/") == str(tmp_path / "run" / "checkpoint-20") and model_name(named + "/") == "run@checkpoint-20"
    # a model folder named like a hub id (a local clone) is no run folder: its '@' stays a revision
    shutil.copytree(tiny_model_dirs["llama"], tmp_path / "org" / "clone")
    assert local_checkpoint(str(tmp_path / "org" / "clone@step3000")) == str(tmp_path / "org" / "clone@step3000")
    task = write_user_task(tmp_path, STUDY_ROWS)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "--model", named, "--task", str(task), "--limit", "4", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "run@checkpoint-20" / "capitals" / "zero-shot" / "results.json").is_file()
    from softeval.analysis import finished_cells
    from softeval.reports.comparison import rows

    assert [row[0] for row in rows(finished_cells(out))] == ["run@checkpoint-20"]  # the terminal's and comparison.md's tables
    # the same checkpoint by its folder is the same cell: kept
    again = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "run" / "checkpoint-20"), "--task", str(task), "--limit", "4",
                                     "--output", str(out)])
    assert again.exit_code == 0 and "1 of 1 cells were finished already" in again.output


def test_agreement_with_true_knowledge_is_kendall_tau_b_over_checkpoints(tmp_path):
    """With a ground truth in the folder, the analysis gives per method and metric Kendall tau-b
    of the checkpoints' scores against their shares of known facts, on the same rows; a row
    bootstrap interval around it; and the findings state it per method."""
    import json

    from scipy.stats import kendalltau

    from softeval.analysis import finished_cells
    from softeval.reports import write_comparison
    from softeval.reports.series import analyze

    _tied_folder(tmp_path)
    known = {"a@step-1": [1, 0, 0, 0, 0, 0, 0, 0], "a@step-2": [1, 1, 1, 0, 0, 0, 0, 0], "a@step-3": [1, 1, 1, 1, 1, 1, 0, 0],
             "b@step-1": [0, 0, 0, 0, 0, 0, 0, 1], "b@step-2": [1, 1, 0, 0, 0, 0, 0, 0], "b@step-3": [1, 1, 1, 1, 0, 0, 0, 0]}
    (tmp_path / "ground_truth.json").write_text(json.dumps({"tasks": ["quiz"], "models": known}))
    truth = analyze(tmp_path, target_metric="knowledge")["tasks"]["quiz"]["truth"]
    assert truth["checkpoints"] == 6 and truth["rows"] == 8
    names = list(known)
    shares = [sum(known[n]) / 8 for n in names]
    cells = {(r.config["model"], r.config["method"]): r for r in finished_cells(tmp_path)}
    scores = [sum(s.knowledge_correct for s in cells[(n, "zero-shot")].samples) / 8 for n in names]
    tau = truth["agreement"]["zero-shot"]["knowledge"]
    assert tau["value"] == pytest.approx(kendalltau(scores, shares).statistic)
    assert tau["ci_low"] <= tau["value"] <= tau["ci_high"]
    assert truth["agreement"]["zero-shot"]["task_accuracy"]["value"] is None  # task accuracy is 0 throughout: no order

    write_comparison(tmp_path)
    findings = [f for f in json.loads((tmp_path / "comparison.json").read_text())["findings"] if f["claim"] == "true_knowledge"]
    assert {(f["method"], f["task"], f["verdict"]) for f in findings} == {("zero-shot", "quiz", "undetermined"), ("soft-prompt", "quiz", "undetermined")}
    assert "Kendall tau-b of the checkpoints' scores against their true knowledge" in (tmp_path / "analysis.md").read_text()

    # a ground truth that lacks a checkpoint: the agreement is over the others, and the notes say so
    del known["b@step-2"]
    (tmp_path / "ground_truth.json").write_text(json.dumps({"tasks": ["quiz"], "models": known}))
    found = analyze(tmp_path, target_metric="knowledge")["tasks"]["quiz"]
    assert found["truth"]["checkpoints"] == 5 and found["truth"]["missing"] == ["b@step-2"]
    assert "ground_truth.json has no entry for 1 checkpoint (b@step-2): the agreement with true knowledge is over the other 5." in found["notes"]


def test_a_flagged_target_is_named_in_the_notes_where_the_flag_applies_to_its_metric(tmp_path):
    import json

    from softeval.reports.series import analyze

    _tied_folder(tmp_path)
    assert analyze(tmp_path, target_metric="knowledge")["tasks"]["quiz"]["target_flags"] == {}
    # b's reference answered no question in the format, so its task accuracy says nothing of what it knows
    path = tmp_path / "b-ref" / "quiz" / "zero-shot" / "results.json"
    saved = json.loads(path.read_text())
    saved["diagnostics"] = {"n": 8, "empty_share": 0.0, "ambiguous_share": 0.0, "conflict_share": 0.0, "no_strict_answers": True}
    path.write_text(json.dumps(saved))
    found = analyze(tmp_path, target_metric="task_accuracy")["tasks"]["quiz"]
    assert found["target_flags"] == {"b-ref": ["no strict answers"]}
    assert found["notes"][0].startswith("The target's cells are flagged (b-ref: no strict answers): the order it gives the recipes may be noise")
    assert found["notes"][0] in (tmp_path / "analysis.md").read_text()
    # its knowledge reads the options' likelihoods, which a failed format does not touch ...
    assert analyze(tmp_path, target_metric="knowledge")["tasks"]["quiz"]["target_flags"] == {}
    # ... and is undermined where the likelihoods all pick one option
    saved["diagnostics"] |= {"knowledge_collapsed": True, "knowledge_distribution": {"A": 8}}
    path.write_text(json.dumps(saved))
    assert analyze(tmp_path, target_metric="knowledge")["tasks"]["quiz"]["target_flags"] == {"b-ref": ["knowledge collapsed: A 100%"]}


def test_the_format_gap_names_each_checkpoint_and_its_unit():
    from softeval.reports.series import FORMAT_GAP_TEXT, format_gap_lines

    found = {"axis": "tokens", "x": {"a": [1e6, 2.5e6]},
             "format_gap": {"zero-shot": {"a": [{"value": 0.25, "ci_low": 0.1, "ci_high": 0.4}, {"value": None, "ci_low": None, "ci_high": None}]}}}
    assert format_gap_lines(found) == ["soft-prompt minus zero-shot, a: 1M tokens +25.0 [+10.0, +40.0], 2.5M tokens n/a"]
    assert "percentage points" in FORMAT_GAP_TEXT


def test_an_analysis_written_by_an_older_softeval_is_reported_and_asks_to_be_run_again(tmp_path):
    """analysis.json from before the early-decision verdict (it held `excludes_zero`): the page, the
    markdown and the findings read it without a crash, and say to analyse again."""
    import json

    from softeval.analysis import findings as F
    from softeval.reports.series import OLDER_ANALYSIS, difference_lines

    older = {"first": "soft-prompt / task_accuracy", "second": "zero-shot / gold_prob", "among": 3, "best_continuous": True,
             "per_budget": [{"value": 0.1, "ci_low": 0.0, "ci_high": 0.2}], "mean": {"value": 0.1, "ci_low": 0.0, "ci_high": 0.2},
             "excludes_zero": False, "p_value": 0.2}
    found = {"rows": 8, "predictors": {"budgets": [1], "differences": [older]}}
    assert OLDER_ANALYSIS in difference_lines(found)[0]
    (tmp_path / "analysis.json").write_text(json.dumps({"target": {"kind": "reference"}, "series": {}, "tasks": {"quiz": found}}))
    [finding] = F._decision_findings(tmp_path, {})
    assert finding.verdict == "undetermined" and "run softeval analyze again" in finding.reason


def test_training_runs_given_on_the_command_line_are_series_analysed_without_a_study_file(tmp_path, family_dirs, monkeypatch):
    """`softeval eval --model RUN_FOLDER` records the run as a series, and `softeval analyze`
    reads it; with no soft-prompt cell the target falls to the first method present, saying so."""
    import json
    import shutil

    from typer.testing import CliRunner

    from conftest import STUDY_ROWS, write_user_task
    from softeval.cli import app

    monkeypatch.setenv("SOFTEVAL_HASH_CACHE", str(tmp_path / "hashes.json"))
    for run, family in (("alpha-run", "alpha"), ("beta-run", "beta")):
        for step, role in ((10, "base"), (20, "post-trained")):  # two different weights per run
            shutil.copytree(family_dirs[family][role], tmp_path / run / f"checkpoint-{step}")
    task = write_user_task(tmp_path, STUDY_ROWS)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "alpha-run"), "--model", str(tmp_path / "beta-run" / "checkpoint-*"), "--task", str(task),
                                      "--method", "zero-shot,few-shot", "--k", "2", "--limit", "8", "--output", str(out)])
    assert result.exit_code == 0, result.output
    series = json.loads((out / "series.json").read_text())
    assert {name: [p["step"] for p in s["checkpoints"]] for name, s in series.items()} == {"alpha-run": [10, 20], "beta-run": [10, 20]}
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["target"]["method"] == "few-shot" and not analysis["target"]["method_chosen"]
    result = CliRunner().invoke(app, ["analyze", str(out)])
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())  # as wrapped to the terminal's width
    assert "no task has soft-prompt cells of every checkpoint, so the target is the last checkpoints' few-shot score" in printed
    # a model declared on the command line keeps its role
    result = CliRunner().invoke(app, ["eval", "--model", str(family_dirs["alpha"]["post-trained"]), "--role", "base", "--task", str(task),
                                      "--limit", "4", "--output", str(tmp_path / "declared")])
    assert result.exit_code == 0, result.output
    cell = json.loads(next((tmp_path / "declared").glob("*/capitals/zero-shot/results.json")).read_text())
    assert (cell["config"]["role"], cell["config"]["role_from"]) == ("base", "study")
    assert json.loads((tmp_path / "declared" / "models.json").read_text())[family_dirs["alpha"]["post-trained"].name]["role"] == "base"


def test_a_summary_says_when_a_figure_rests_on_ties(tmp_path):
    from softeval.analysis.summary import tied_text
    from softeval.reports.series import analyze

    scores = {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0, "e": 0.0, "f": 0.4}
    assert tied_text(scores, "the soft prompt's last checkpoints") == "5 of 6 recipes tied at 0.00 in the soft prompt's last checkpoints"
    assert tied_text({"a": 0.1, "b": 0.2, "c": 0.2, "d": 0.5, "e": 0.6}, "the target") is None  # two of five: no statistic rests on them
    _tied_folder(tmp_path)  # every target's task accuracy is 0
    assert "method_why" not in analyze(tmp_path, target_metric="task_accuracy")["target"]  # the references: no method falls back
    assert "Resting on ties: 2 of 2 recipes tied at 0.00 in the target" in (tmp_path / "analysis.md").read_text()


def _summary_analysis(kind: str = "reference", target_flags: dict | None = None, verdict: str = "worse") -> dict:
    """An analysis of one task whose soft prompt decides worse than a proxy other than the best one."""
    estimate = lambda v, lo, hi: {"value": v, "ci_low": lo, "ci_high": hi}  # noqa: E731
    results = {name: {"mean": estimate(mean, mean - 0.1, mean + 0.1), "decision_accuracy": [estimate(mean, mean - 0.1, mean + 0.1)], "earliest": 0}
               for name, mean in (("soft-prompt / task_accuracy", 0.9), ("zero-shot / gold_prob", 0.8), ("few-shot / gold_bpb", 0.7))}
    proxy = {"first": "soft-prompt / task_accuracy", "second": "zero-shot / gold_prob", "among": 2, "best_continuous": True,
             "mean": estimate(-0.1, -0.3, 0.05), "verdict": verdict, "decided_by": "few-shot / gold_bpb" if verdict == "worse" else None,
             "against": {"zero-shot / gold_prob": estimate(-0.1, -0.3, 0.05), "few-shot / gold_bpb": estimate(-0.2, -0.3, -0.1)}}
    found = {"rows": 24, "axis": "tokens", "target_scores": {"a": 0.5, "b": 0.25}, "target_flags": target_flags or {}, "curves": {},
             "predictors": {"results": results, "ranked": list(results), "differences": [proxy], "budgets": [1e6]}}
    return {"target": {"kind": kind, "metric": "task_accuracy", "method": "soft-prompt"}, "references": {"a": {"method": "zero-shot", "chat": True}},
            "tasks": {"quiz": found}}


def test_the_summary_reads_verdicts_as_the_findings_do():
    from softeval.analysis.summary import task_summary

    rows = {row["question"]: row for row in task_summary(_summary_analysis(), "quiz")["rows"]}
    # decides worse: against the proxy the verdict rests on, with that comparison's own interval
    worse = rows["soft prompt vs the best continuous proxy"]
    assert worse["answer"] == "decides worse (few-shot / gold_bpb)" and worse["estimate"]["ci_high"] == -0.1
    # against the last checkpoints' own soft-prompt score, the soft prompt grades itself: undetermined,
    # and it is left out of "decides first"
    last = {row["question"]: row for row in task_summary(_summary_analysis(kind="last"), "quiz")["rows"]}
    assert last["soft prompt vs the best continuous proxy"]["answer"].startswith("undetermined")
    assert last["decides first (mean decision accuracy)"]["answer"] == "zero-shot / gold_prob"
    assert "left out" in last["decides first (mean decision accuracy)"]["note"]
    flagged = task_summary(_summary_analysis(target_flags={"b-ref": ["at chance (25%)"]}), "quiz")
    assert "undetermined" in flagged["lead"] and "the target's cells are flagged (b-ref: at chance (25%))" in flagged["lead"]
