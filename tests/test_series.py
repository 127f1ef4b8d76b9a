"""Checkpoint series: decision accuracy against hand-computed tables, and the analysis of synthetic
series with known curves, a crossing, noise and an outlier."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from softeval.analysis.series import budgets, decision_accuracy, decisions, earliest_decision, recipe_noise, signal_to_noise
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
    assert signal_to_noise([0.6, 0.7], [0.05, 0.15]) == pytest.approx(1.0)
    assert signal_to_noise([0.6], [0.1]) is None


def test_a_study_of_two_recipes_is_analysed_end_to_end(tmp_path, tokenizer_dirs):
    """Two training runs of three checkpoints each (tiny llamas, each checkpoint other random
    weights): the study evaluates every checkpoint, and `softeval analyze` states decision accuracy
    per method and budget, the earliest decision, noise and outliers, in files and on the terminal."""
    import json

    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from typer.testing import CliRunner

    from conftest import STUDY_ROWS, TUNING, tiny_config, write_user_task
    from softeval.cli import app

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])
    tokenizer.chat_template = None
    for r, run in enumerate(("run-a", "run-b")):
        for step in (100, 200, 300):
            torch.manual_seed(1000 * r + step)
            folder = tmp_path / run / f"checkpoint-{step}"
            AutoModelForCausalLM.from_config(tiny_config("llama", len(tokenizer), tokenizer)).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
    task = write_user_task(tmp_path, STUDY_ROWS)
    series = [{"name": run, "checkpoints": str(tmp_path / run), "tokens_per_step": 1e6} for run in ("run-a", "run-b")]
    study = {"series": series, "tasks": [str(task)], "methods": ["zero-shot", "few-shot", "soft-prompt"], "k": 2, "limit": 12, "tuning": TUNING}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(app, ["study", str(tmp_path / "study.yaml"), "--output", str(out)])
    assert result.exit_code == 0, result.output
    recorded = json.loads((out / "series.json").read_text())
    assert [p["model"] for p in recorded["run-a"]] == ["run-a@checkpoint-100", "run-a@checkpoint-200", "run-a@checkpoint-300"]
    assert [p["tokens"] for p in recorded["run-b"]] == [1e8, 2e8, 3e8]
    assert (out / "analysis.json").is_file()  # the study analysed its series itself

    result = runner.invoke(app, ["analyze", str(out)])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis.json").read_text())
    found = analysis["tasks"]["capitals"]
    assert set(found["decisions"]) == {"zero-shot", "few-shot", "soft-prompt"} and found["axis"] == "tokens"
    # decision accuracy at each budget, as computed here from the cells' samples
    samples = {}
    for run in ("run-a", "run-b"):
        for step in (100, 200, 300):
            lines = (out / f"{run}@checkpoint-{step}" / "capitals" / "soft-prompt" / "samples.jsonl").read_text().splitlines()
            samples[run, step] = np.mean([json.loads(line)["task_correct"] for line in lines])
    target = [samples["run-a", 300], samples["run-b", 300]]
    expected = [decision_accuracy([samples["run-a", s], samples["run-b", s]], target) for s in (100, 200, 300)]
    assert [b["decision_accuracy"]["value"] for b in found["decisions"]["soft-prompt"]] == expected
    assert [b["budget"] for b in found["decisions"]["soft-prompt"]] == [1e8, 2e8, 3e8]
    assert "| **decides from** |" in result.output and (out / "analysis_capitals.png").is_file()


def test_the_example_series_study_loads():
    from pathlib import Path

    from softeval.study import load_study

    study = load_study(Path(__file__).resolve().parents[1] / "examples" / "pythia-series.yaml")
    assert len(study.series) == 4 and len(study.models) == 32
    assert study.series[0].points()[-1] == {"model": "pythia-70m@step143000", "spec": "EleutherAI/pythia-70m@step143000",
                                            "step": 143000, "tokens": 143000 * 2097152}


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
    assert seen == {"target_method": "few-shot", "target_metric": "knowledge", "threshold": 0.9}
