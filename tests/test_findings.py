"""The findings: constructed curves, paired differences, rankings and agreements whose verdict is
known, every verdict of every claim; and a tiny-model study end to end."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import STUDY_ROWS, write_study
from softeval.analysis import findings as F
from softeval.analysis.comparisons import undermining
from softeval.cli import app

WHERE = {"model": "m", "task": "t", "chat": False}


def curve(steps: list[int], format_rows: list[list[int]], knowledge_rows: list[list[int]] | None = None) -> list[dict]:
    """A tuning curve of per-row outcomes at each validation step."""
    knowledge_rows = knowledge_rows or [[1] * len(format_rows[0])] * len(steps)
    return [{"step": s, "rows": {"format_following": f, "knowledge": k, "task_accuracy": f}} for s, f, k in zip(steps, format_rows, knowledge_rows)]


def switching(n: int, at: dict[int, int], steps: list[int]) -> list[list[int]]:
    """Rows of format outcomes: `at[row]` is the step from which row `row` follows the format."""
    return [[int(s >= at.get(r, 0)) for r in range(n)] for s in steps]


STEPS = [0, 10, 20, 30, 40]


def test_saturation_holds_where_format_following_plateaus_early():
    rows = switching(20, {r: 10 for r in range(20)}, STEPS)
    finding = F._saturation(curve(STEPS, rows), 8, WHERE, [])
    assert (finding.verdict, finding.value, finding.ci_low, finding.ci_high) == ("holds", 10, 10, 10)
    assert finding.p_value == 0.0  # every resample saturates at step 10: none beyond the budget, no spread for a tail


def test_saturation_does_not_hold_where_the_plateau_comes_after_the_budget():
    steps = [0, 50, 100, 150, 200]
    rows = switching(20, {r: 150 for r in range(20)}, steps)
    finding = F._saturation(curve(steps, rows), 8, WHERE, [])
    assert finding.verdict == "does not hold" and finding.ci_low == 150
    # with batch 32 the budget is 20 steps
    assert F._saturation(curve(STEPS, switching(20, {r: 40 for r in range(20)}, STEPS)), 32, WHERE, []).verdict == "does not hold"


def test_saturation_does_not_hold_at_a_low_plateau_after_the_budget():
    steps = [0, 40, 80]
    rows = [[int(r < 2) for r in range(20)] for _ in steps]  # 10% follow the format throughout
    finding = F._saturation(curve(steps, rows), 8, WHERE, [])
    assert finding.verdict == "does not hold" and "ends at 10%" in finding.reason
    # a run shorter than the budget may yet rise: it cannot say
    finding = F._saturation(curve(STEPS, [[int(r < 2) for r in range(20)] for _ in STEPS]), 8, WHERE, [])
    assert finding.verdict == "undetermined" and "short of the budget of 80 steps" in finding.reason


def test_a_plateau_reached_only_at_the_last_step_of_a_run_as_long_as_the_budget_is_no_saturation():
    """At its last step any curve is within 95% of its own final value: reaching the plateau only
    there says the curve may still be rising, however long the run."""
    steps = [0, 20, 40, 60, 80]  # the budget at batch 8: 80 steps
    late = switching(20, {r: 80 if r < 14 else 10_000 for r in range(20)}, steps)  # 70% at step 80, 0% before
    finding = F._saturation(curve(steps, late), 8, WHERE, [])
    assert (finding.value, finding.verdict) == (80, "undetermined") and "still be rising at the run's last step (80)" in finding.reason
    early = switching(20, {r: 40 if r < 14 else 10_000 for r in range(20)}, steps)  # 70% from step 40: a plateau seen
    assert F._saturation(curve(steps, early), 8, WHERE, []).verdict == "holds"
    assert finding.p_value is None  # undetermined by the rule, not by the interval: no test to report
    # in a run longer than the budget, a plateau reached only at its last step comes after the budget
    longer = [0, 50, 100, 150, 200]
    after = F._saturation(curve(longer, switching(20, {r: 200 if r < 14 else 10_000 for r in range(20)}, longer)), 8, WHERE, [])
    assert (after.value, after.verdict) == (200, "does not hold")


def test_saturation_holds_only_where_the_final_format_following_is_surely_above_half():
    rows = switching(20, {r: 10 for r in range(11)} | {r: 10_000 for r in range(11, 20)}, STEPS)  # 55% from step 10
    finding = F._saturation(curve(STEPS, rows), 8, WHERE, [])
    assert finding.value == 10 and finding.verdict == "undetermined" and "interval includes 50%" in finding.reason
    rows = switching(20, {r: 10 for r in range(16)} | {r: 10_000 for r in range(16, 20)}, STEPS)  # 80% from step 10
    assert F._saturation(curve(STEPS, rows), 8, WHERE, []).verdict == "holds"


def test_saturation_is_undetermined_while_still_rising_or_where_the_interval_spans_the_budget():
    rising = switching(20, {r: 10 * (r % 5) for r in range(20)}, STEPS)  # 20% more rows each step, 80% at the end
    rising[-1] = [int(r < 16) for r in range(20)]
    finding = F._saturation(curve(STEPS, rising), 8, WHERE, [])
    assert finding.verdict == "undetermined" and "still be rising" in finding.reason
    # 19 rows follow from step 40, one from step 120: at 95% of the plateau the step is 40, or 120
    # where a resample draws the late row twice
    steps = [0, 40, 80, 120]
    rows = switching(20, {r: 40 for r in range(19)} | {19: 120}, steps)
    finding = F._saturation(curve(steps, rows), 8, WHERE, [])
    assert finding.value == 40 and finding.ci_high == 120
    assert finding.verdict == "undetermined" and "spans the budget" in finding.reason


def test_saturation_on_a_flagged_cell_or_without_a_batch_size_is_undetermined():
    rows = switching(20, {r: 10 for r in range(20)}, STEPS)
    assert F._saturation(curve(STEPS, rows), 8, WHERE, ["collapsed: A 90%"]).verdict == "undetermined"
    assert F._saturation(curve(STEPS, rows), None, WHERE, []).verdict == "undetermined"


@pytest.mark.parametrize(
    ("points", "problem"),
    [(None, "no readable tuning curve"), ([{"step": 0, "format_following": 0.5}], "no per-row outcomes"),
     (curve([0], [[1] * 20]), "a single validation step"), (curve([0, 10], [[1] * 4, [1] * 4]), "4 validation rows"),
     (curve([0, 10], [[1] * 20, [1] * 12]), "curve.json is damaged"), (curve([10, 0], [[1] * 20] * 2), "curve.json is damaged"),
     ([{"step": 0, "rows": 3}, {"step": 1, "rows": 3}], "curve.json is damaged")],
)
def test_curves_that_cannot_decide_say_why(points, problem):
    assert problem in F._curve_problem(points)


@pytest.mark.parametrize("text", ["{not json", '{"step": 0}', "[1, 2]"])
def test_an_unreadable_curve_file_is_no_curve(tmp_path, text):
    folder = tmp_path / "m" / "t" / "prompt"
    folder.mkdir(parents=True)
    (folder / "curve.json").write_text(text)
    result = SimpleNamespace(config={"model": "m", "task": "t", "method": "soft-prompt", "chat": False, "soft_prompt": None})
    assert F._curve(tmp_path, result) is None and "damaged curve.json" in F._curve_problem(None)


def test_knowledge_flat_every_verdict():
    same = curve([0, 40], [[1] * 40] * 2, [[int(r % 2 == 0) for r in range(40)]] * 2)
    assert F._knowledge_flat(same, WHERE, []).verdict == "holds"
    assert F._knowledge_flat(same, WHERE, []).p_value == 0.0  # two one-sided tests: every resample is 0, none beyond +-5 points
    risen = curve([0, 40], [[1] * 40] * 2, [[int(r < 8) for r in range(40)], [int(r < 32) for r in range(40)]])
    finding = F._knowledge_flat(risen, WHERE, [])
    assert finding.verdict == "does not hold" and finding.value == pytest.approx(0.6)
    noisy = curve([0, 40], [[1] * 40] * 2, [[int(r < 20) for r in range(40)], [int(4 <= r < 24) or int(r < 2) for r in range(40)]])
    assert F._knowledge_flat(noisy, WHERE, []).verdict == "undetermined" and F._knowledge_flat(noisy, WHERE, []).p_value > 0.05
    assert F._knowledge_flat(same, WHERE, ["at chance (25%)"]).verdict == "undetermined"
    # known by no row, or by every row, at both steps: it could move one way only
    for level, move in ((0, "rise"), (1, "fall")):
        at_bound = F._knowledge_flat(curve([0, 40], [[1] * 40] * 2, [[level] * 40] * 2), WHERE, [])
        assert at_bound.verdict == "undetermined" and f"it could only {move}" in at_bound.reason and at_bound.p_value is None
    # a clear equivalence keeps a p-value below the resamples' floor (2 / 2001), so Holm over many findings can confirm it
    wobbly = curve([0, 40], [[1] * 400] * 2, [[int(r % 2 == 0) for r in range(400)], [int(r % 2 == 0) != (r < 4) for r in range(400)]])
    flat = F._knowledge_flat(wobbly, WHERE, [])
    assert flat.verdict == "holds" and 0 < flat.p_value < 2 / 2001


def comparison(model: str, method: str, baseline: str, low: float | None, high: float | None, *, chat: bool = False) -> dict:
    d = {"value": None if low is None else (low + high) / 2, "ci_low": low, "ci_high": high, "excludes_zero": False, "n": 50}
    return {"model": model, "task": "t", "chat": chat, "method": method, "baseline": baseline, "n": 50,
            "task_accuracy": d, "format_following": d, "knowledge": d}


@pytest.mark.parametrize(("low", "high", "verdict"), [(0.05, 0.2, "holds"), (-0.2, -0.01, "does not hold"), (-0.1, 0.0, "does not hold"),
                                                      (-0.05, 0.1, "undetermined"), (None, None, "undetermined")])
def test_soft_prompt_above_a_baseline(low, high, verdict):
    found = F._paired_findings([comparison("base", "soft-prompt", "zero-shot", low, high)], {"base": "base"}, set(), {})
    assert [(f.claim, f.verdict) for f in found if f.model] == [("above_zero_shot", verdict)]


def test_an_undetermined_paired_finding_says_which_rows_would_decide():
    from softeval.analysis.stats import paired_difference, paired_power

    rng = np.random.default_rng(3)
    a, b = (rng.random(60) < 0.55).astype(float), (rng.random(60) < 0.5).astype(float)
    d = paired_difference(a, b).model_dump()
    assert d["ci_low"] < 0 < d["ci_high"] and d["value"] > 0
    compared = {"model": "base", "task": "t", "chat": False, "method": "soft-prompt", "baseline": "zero-shot", "n": 60, "task_accuracy": d}
    (found,) = [f for f in F._paired_findings([compared], {"base": "base"}, set(), {}) if f.model]
    detectable, needed = paired_power(a - b)
    assert found.verdict == "undetermined" and found.p_value == d["p_value"] > 0.05
    assert f"at 60 rows it detects {100 * detectable:.1f} points or more (80% power)" in found.reason
    assert f"about {needed:,} rows would detect the observed {100 * d['value']:+.1f}" in found.reason


def test_holm_turns_a_marginal_verdict_undetermined():
    findings = [F.Finding(claim="above_zero_shot", verdict="holds", reason="", p_value=p) for p in (0.001, 0.03, 0.04)]
    against = F.Finding(claim="above_few_shot", verdict="does not hold", reason="", p_value=0.5)
    adjusted = F.with_holm(findings + [F.Finding(claim="saturation", verdict="holds", reason=""), against])
    assert [f.p_holm for f in adjusted] == pytest.approx([0.004, 0.09, 0.09, None, 0.5])
    # Holm guards the claims' "holds"; a "does not hold" stays as it is
    assert [f.holm_verdict for f in adjusted] == ["holds", "undetermined", "undetermined", None, "does not hold"]


def test_a_finding_on_a_guessed_role_is_undetermined():
    found = F._paired_findings([comparison("m", "soft-prompt", "zero-shot", 0.1, 0.3)], {"m": "post-trained"}, {"m"}, {})
    (finding,) = [f for f in found if f.claim == "post_trained_format"]
    assert finding.verdict == "undetermined" and "role is guessed from its chat template" in finding.reason


def test_roles_come_from_the_study_then_the_cells_then_a_guess(tmp_path):
    def cell(model: str, **config) -> SimpleNamespace:  # the config is all a role is read from
        return SimpleNamespace(config={"model": model, "task": "t", "method": "zero-shot", "chat": False, **config})

    (tmp_path / "models.json").write_text(json.dumps({"qwen": {"model": "qwen", "role": "base"}}))
    cells = [cell("qwen", post_trained=True), cell("gemma", post_trained=False, role="base", role_from="registry"),
             cell("user", post_trained=True), cell("old")]
    roles, guessed = F._roles(tmp_path, cells)
    assert roles == {"qwen": "base", "gemma": "base", "user": "post-trained", "old": None} and guessed == {"user"}


def test_paired_findings_rest_on_unflagged_cells_and_say_what_is_missing():
    flags = {("base", "t", "zero-shot", False): ["at chance (25%)"]}
    found = F._paired_findings([comparison("base", "soft-prompt", "zero-shot", 0.1, 0.3)], {"base": "base"}, set(), flags)
    above = next(f for f in found if f.claim == "above_zero_shot")
    assert above.verdict == "undetermined" and "at chance" in above.reason
    by_claim = {f.claim: f for f in found}
    assert by_claim["above_few_shot"].verdict == "not applicable" and "few-shot cells" in by_claim["above_few_shot"].reason
    assert by_claim["post_trained_format"].verdict == "not applicable" and by_claim["post_trained_format"].reason == "no post-trained model"
    found = F._paired_findings([], {"post": "post-trained"}, set(), {})
    assert next(f for f in found if f.claim == "above_zero_shot").reason.startswith("no base model")


def test_post_trained_format_uses_the_chat_cells_where_there_are_some():
    found = F._paired_findings(
        [comparison("post", "soft-prompt", "zero-shot", -0.1, 0.05), comparison("post", "soft-prompt", "zero-shot", 0.2, 0.5, chat=True)],
        {"post": "post-trained"}, set(), {},
    )
    (finding,) = [f for f in found if f.claim == "post_trained_format"]
    assert finding.chat and finding.verdict == "holds" and "format following" in finding.statistic


def write_ranking(folder, low: float, high: float, *, families: int = 3) -> None:
    models = {}
    for i in range(families):
        models[f"b{i}"] = {"model": f"b{i}", "family": f"f{i}", "role": "base"}
        models[f"p{i}"] = {"model": f"p{i}", "family": f"f{i}", "role": "post-trained"}
    (folder / "models.json").write_text(json.dumps(models))
    tau = {"value": (low + high) / 2, "ci_low": low, "ci_high": high}
    ranking = {
        "families": {f"f{i}": {"base": f"b{i}", "post-trained": f"p{i}"} for i in range(families)},
        "reference": {"method": "zero-shot", "chat": True, "metric": "task_accuracy"}, "tasks": ["t"],
        "by_metric": {"task_accuracy": {"tau_pairwise": {"soft-prompt - zero-shot": tau, "soft-prompt - few-shot": tau}}},
    }
    (folder / "ranking.json").write_text(json.dumps(ranking))


@pytest.mark.parametrize(("low", "high", "verdict"), [(0.1, 0.6, "holds"), (-0.8, -0.2, "does not hold"), (-0.4, 0.6, "undetermined")])
def test_ranking_findings(tmp_path, low, high, verdict):
    write_ranking(tmp_path, low, high)
    found = F._ranking_findings(tmp_path, {}, {})
    assert [(f.claim, f.verdict) for f in found] == [("ranking_vs_zero_shot", verdict), ("ranking_vs_few_shot", verdict)]
    assert "against the post-trained models' zero-shot chat task_accuracy" in found[0].statistic


def test_ranking_findings_on_flagged_cells_or_too_few_families(tmp_path):
    write_ranking(tmp_path, 0.1, 0.6)
    key = ("b0", "t", "soft-prompt", False)
    found = F._ranking_findings(tmp_path, {key: object()}, {key: ["collapsed: A 80%"]})
    assert {f.verdict for f in found} == {"undetermined"}
    write_ranking(tmp_path, 0.1, 0.6, families=2)
    found = F._ranking_findings(tmp_path, {}, {})
    assert {f.verdict for f in found} == {"not applicable"} and "2 families" in found[0].reason


def test_a_ranking_claim_rests_only_on_the_methods_it_compares(tmp_path):
    write_ranking(tmp_path, 0.1, 0.6)
    key = ("b0", "t", "few-shot", False)
    found = F._ranking_findings(tmp_path, {key: object()}, {key: ["at chance (50%)"]})
    assert [(f.claim, f.verdict) for f in found] == [("ranking_vs_zero_shot", "holds"), ("ranking_vs_few_shot", "undetermined")]


def test_a_ranking_of_an_older_softeval_says_to_rank_again(tmp_path):
    write_ranking(tmp_path, 0.1, 0.6)
    ranking = json.loads((tmp_path / "ranking.json").read_text())
    del ranking["by_metric"]["task_accuracy"]["tau_pairwise"]
    (tmp_path / "ranking.json").write_text(json.dumps(ranking))
    found = F._ranking_findings(tmp_path, {}, {})
    assert {f.verdict for f in found} == {"not applicable"} and "written by an older softeval: run softeval rank again" in found[0].reason
    (tmp_path / "ranking.json").write_text("{")
    assert "cannot be read" in F._ranking_findings(tmp_path, {}, {})[0].reason


def test_cells_judged_by_other_parsers_undermine_a_finding():
    assert undermining(["judged by parsers 1234abcd, one of 2 here: rerun its command", "ceiling"]) == [
        "judged by parsers 1234abcd, one of 2 here: rerun its command"]


def agreement(low: float, high: float) -> dict:
    r = {"value": (low + high) / 2, "ci_low": low, "ci_high": high}
    return {"pearson": r, "tau_b": r, "n_cells": 4, "cells": [["m", "t", False]]}


@pytest.mark.parametrize(("low", "high", "verdict"), [(0.6, 0.95, "holds"), (-0.5, 0.3, "does not hold"), (0.2, 0.9, "undetermined")])
def test_soft_prompt_and_lora_line_up(low, high, verdict):
    assert F._lora_finding(agreement(low, high), {}, {}).verdict == verdict


def test_soft_prompt_and_lora_without_cells_or_on_flagged_cells():
    assert F._lora_finding(None, {}, {}).verdict == "not applicable"
    flags = {("m", "t", "lora", False): ["no strict answers"]}
    assert F._lora_finding(agreement(0.6, 0.95), flags, {}).verdict == "undetermined"


def test_a_pooled_line_up_needs_each_role_to_line_up_too():
    """Base models low under both methods and post-trained models high under both line up when
    pooled, whatever either group does alone."""
    apart = F._lora_finding(agreement(0.6, 0.95), {}, {"base": agreement(0.1, 0.4), "post-trained": agreement(0.6, 0.9)})
    assert apart.verdict == "undetermined" and "within base models it does not" in apart.reason
    assert "within base models r 0.25 [0.10, 0.40] over 4; within post-trained models r 0.75 [0.60, 0.90] over 4" in apart.statistic
    both = F._lora_finding(agreement(0.6, 0.95), {}, {"base": agreement(0.55, 0.9), "post-trained": agreement(0.6, 0.9)})
    assert both.verdict == "holds"
    # a role with fewer than 3 cells cannot be checked; the others must line up, and one at least must be checked
    assert F._lora_finding(agreement(0.6, 0.95), {}, {"base": agreement(0.55, 0.9), "post-trained": None}).verdict == "holds"
    few = F._lora_finding(agreement(0.6, 0.95), {}, {"base": agreement(0.1, 0.4), "post-trained": None})
    assert few.verdict == "undetermined" and "within post-trained models fewer than 3 cells" in few.statistic
    assert F._lora_finding(agreement(0.6, 0.95), {}, {"base": None, "post-trained": None}).verdict == "undetermined"


def test_the_study_findings_state_soft_prompt_and_lora_within_each_role(tmp_path):
    """From cells: base models score low and post-trained ones high under both methods, and
    within each group the two methods disagree; the pooled r alone would say they line up."""
    from softeval.scoring import METRICS, EvalResult, Metric
    from softeval.scoring.metrics import Sample

    def cell(model: str, method: str, correct: int, role: str) -> EvalResult:
        samples = [Sample(index=i, source=f"q{i}", prompt="Q?", n_demos=0, truncated=False, raw_completion="x", completion="x",
                          stop_reason="stop", gold="A", strict_answer="A", strict_failure=None, lenient_answer="A", lenient_status="answer",
                          lenient_note=None, format_ok=True, task_correct=i < correct, lenient_correct=i < correct, knowledge_correct=i < correct)
                   for i in range(20)]
        value = Metric(value=correct / 20, ci_low=None, ci_high=None)
        config = {"model": model, "task": "t", "method": method, "chat": False, "k": 0, "seed": 0, "role": role}
        return EvalResult(config=config, metrics=dict.fromkeys(METRICS, value), samples=samples, model={},
                          data={"spec_sha256": "s", "split": "test", "sha256": "d", "rows": 20}, timings={}, n_truncated=0)

    # within each role the soft prompt and LoRA order the models oppositely; between roles both jump
    scores = {"base": [(2, 5), (3, 4), (4, 3), (5, 2)], "post-trained": [(15, 18), (16, 17), (17, 16), (18, 15)]}
    results = [cell(f"{role}{i}", method, score, role) for role, pairs in scores.items() for i, pair in enumerate(pairs)
               for method, score in zip(("soft-prompt", "lora"), pair)]
    cells = {F.cell_key(r): r for r in results}
    from softeval.analysis.comparisons import tuned_agreement

    pooled = tuned_agreement(cells)
    assert pooled["pearson"]["ci_low"] > 0.5  # the gap between the roles alone
    [finding] = [f for f in F.study_findings(tmp_path, results, [], pooled) if f.claim == "soft_prompt_vs_lora"]
    assert finding.verdict == "undetermined" and "within base models r -1.00" in finding.statistic
    # two post-trained models only: too few to check within, and the base models still do not line up
    fewer = [r for r in results if r.config["model"] not in ("post-trained2", "post-trained3")]
    cells = {F.cell_key(r): r for r in fewer}
    [finding] = [f for f in F.study_findings(tmp_path, fewer, [], tuned_agreement(cells)) if f.claim == "soft_prompt_vs_lora"]
    assert finding.verdict == "undetermined" and "within post-trained models fewer than 3 cells" in finding.statistic


def test_saturation_step_over_resamples_matches_one_at_a_time():
    rng = np.random.default_rng(3)
    means = np.sort(rng.random((6, 50)), axis=0)
    steps = [0, 10, 20, 30, 40, 50]
    together = F.saturation_step(steps, means)
    assert together.tolist() == [int(F.saturation_step(steps, means[:, j])) for j in range(50)]


def test_a_tiny_study_states_its_findings_everywhere(tmp_path, family_dirs):
    """Three families, every method: every claim is stated, in comparison.json, first in
    comparison.md and in the terminal."""
    study = write_study(tmp_path, family_dirs, ["zero-shot", "few-shot", "soft-prompt", "lora"], rows=STUDY_ROWS,
                        tuning={"steps": 4, "eval_every": 2, "val_size": 12, "batch_size": 2, "length": 2})
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", str(study), "--output", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "comparison.json").read_text())["findings"]
    # stated only where a study declares a ground truth, or series
    assert {f["claim"] for f in saved} == set(F.CLAIMS) - {"true_knowledge", "early_decision"}
    # the paired findings' p-values, Holm-adjusted across the study's
    tested = [f for f in saved if f["p_value"] is not None]
    # every finding with an interval carries the p-value of the bound its verdict tests
    assert all(f["p_value"] is not None for f in saved if f["ci_low"] is not None), [f for f in saved if f["ci_low"] is not None and f["p_value"] is None]
    assert {f["claim"] for f in tested} >= {"above_zero_shot", "above_few_shot", "post_trained_format"}
    assert all(f["p_holm"] >= f["p_value"] for f in tested) and all(f["holm_verdict"] for f in tested)
    assert all(f["verdict"] in ("holds", "does not hold", "undetermined", "not applicable") for f in saved)
    by_claim = {}
    for f in saved:
        by_claim.setdefault(f["claim"], []).append(f)
    assert len(by_claim["saturation"]) == 6 + 3  # a soft prompt per base model, two per post-trained one
    assert {f["model"] for f in by_claim["above_zero_shot"]} == {"alpha-base0", "beta-base0", "gamma-base0"}
    assert all(f["chat"] for f in by_claim["post_trained_format"])
    assert all(f["verdict"] != "not applicable" for f in by_claim["ranking_vs_zero_shot"] + by_claim["soft_prompt_vs_lora"])
    # a fifth of 24 tuning rows is held out for validation: too few to read a curve
    assert all(f["verdict"] == "undetermined" and "4 validation rows" in f["reason"] for f in by_claim["saturation"])
    report = (out / "comparison.md").read_text()
    assert report.index("## Findings") < report.index("## Cells")
    assert "findings (95% intervals" in result.output and "soft-prompt and LoRA scores line up" in result.output


# --- numbers a finding must not rest on -----------------------------------------------------------


def test_tuning_on_the_evaluation_split_is_refused_before_work(tmp_path, tiny_model_dirs):
    from conftest import ROWS, write_user_task

    task = write_user_task(tmp_path, ROWS * 10)
    spec = task.read_text().replace("tune_split: train", "tune_split: test")
    task.write_text(spec)
    args = ["run", "--model", str(tiny_model_dirs["llama"]), "--task", str(task), "--method", "soft-prompt", "--steps", "1", "--output", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert str(result.exception) == (
        "task capitals tunes on its evaluation split 'test': soft-prompt and LoRA scores would be measured on the rows they were tuned on; "
        "give the spec a tune_split of other rows (or dataset.tune_on_eval_rows: true to run it, flagged)"
    )
    assert not (tmp_path / "o").exists()


def test_tuning_rows_that_ask_an_evaluation_question_are_left_out(tmp_path, tiny_llama, caplog):
    from conftest import ROWS, write_user_task
    from softeval.tasks import load_task
    from softeval.tuning import TuneConfig
    from softeval.tuning.tuner import Tuner

    task = write_user_task(tmp_path, ROWS * 10)
    train = tmp_path / "train.jsonl"
    lines = train.read_text().splitlines()
    # two tuning rows ask, in other spacing and case, what evaluation rows ask
    lines[:2] = [json.dumps({**json.loads(line), "q": "  capital of FRANCE? "}) for line in lines[:2]]
    train.write_text("\n".join(lines) + "\n")
    with caplog.at_level("INFO", logger="softeval"):
        tuner = Tuner(tiny_llama, load_task(task), TuneConfig(length=2, val_size=2))
    assert len(tuner.train) + len(tuner.val) == 18 and tuner.eval_rows_in_tuning == 0
    assert "2 of the 20 rows of its tuning split ask what an evaluation row asks; tuning leaves them out" in caplog.text
    train.write_text((tmp_path / "test.jsonl").read_text())  # the same rows under another split name
    with pytest.raises(Exception, match="every row of its tuning split 'train' asks what a row of its evaluation split 'test' asks"):
        Tuner(tiny_llama, load_task(task), TuneConfig(length=2, val_size=2))


def test_tuning_on_evaluation_rows_where_allowed_flags_the_cells(tmp_path, tiny_model_dirs):
    from conftest import ROWS, write_user_task

    task = write_user_task(tmp_path, ROWS * 10)
    task.write_text(task.read_text().replace("tune_split: train", "tune_split: test\n  tune_on_eval_rows: true"))
    out = tmp_path / "o"
    args = ["run", "--model", str(tiny_model_dirs["llama"]), "--task", str(task), "--method", "zero-shot,soft-prompt", "--steps", "1",
            "--val-size", "4", "--length", "2", "--output", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    cells = {c["method"]: c for c in json.loads((out / "comparison.json").read_text())["cells"]}
    assert "tuned on its evaluation rows" in cells["soft-prompt"]["diagnostics"]["flags"]
    assert "tuned on its evaluation rows" not in cells["zero-shot"]["diagnostics"]["flags"]


def test_a_cell_of_mostly_empty_completions_is_flagged_with_the_chat_hint(tiny_llama):
    from softeval.scoring import Metric
    from softeval.scoring.metrics import Sample, diagnose

    def sample(completion: str) -> Sample:
        return Sample(index=0, source="s", prompt="p", n_demos=0, truncated=False, raw_completion=completion, completion=completion,
                      stop_reason="eos", gold="A", strict_answer=None, strict_failure="empty", lenient_answer=None, lenient_status="no_answer",
                      lenient_note=None, format_ok=bool(completion), task_correct=False, lenient_correct=False, knowledge_correct=False)

    diagnostics = diagnose([sample("")] * 6 + [sample("A")] * 4, Metric(value=0.0, ci_low=0.0, ci_high=0.0), None)
    assert diagnostics.flags == ["mostly empty (60%)"]
    diagnostics.chat_template_unused = True
    assert diagnostics.flags == ["mostly empty (60%)", "--chat runs it with its chat template"]


def test_a_whole_sentence_is_no_bare_short_answer(mirror, tmp_path):
    """TriviaQA's gold answers are a few words: 99% of its tuning split's have at most 5, so a
    sentence of six does not follow the format; results.json says which rule a cell used."""
    from softeval.tasks import load_examples, load_task, with_answer_words

    spec = with_answer_words(load_task("triviaqa"), mirror)
    assert spec.answer_words == (5, "99% of the 2000 gold answers of split 'train' have at most 5")
    example = load_examples(spec, "validation", mirror, limit=1)[0]
    assert spec.format.strict("The capital of France is Paris.", example).status == "no_answer"
    assert spec.format.strict("Paris", example).status == "answer"
    assert load_task("triviaqa").sha256() == spec.sha256()  # what the spec says is unchanged


def test_a_model_may_declare_its_role_alone(tmp_path):
    from softeval.study import load_study

    path = tmp_path / "study.yaml"
    path.write_text("models: [{model: gemma-3-270m, role: base}, {model: smollm2-135m-instruct, role: post-trained}]\ntasks: [arc_easy]\n")
    study = load_study(path)
    assert [m.role for m in study.models] == ["base", "post-trained"] and all(m.family is None for m in study.models)


def test_tuning_and_evaluation_splits_read_from_one_file_are_refused(tmp_path, tiny_model_dirs):
    from conftest import ROWS, write_user_task

    task = write_user_task(tmp_path, ROWS * 10)
    task.write_text(task.read_text().replace("train: train.jsonl", "train: test.jsonl"))
    args = ["run", "--model", str(tiny_model_dirs["llama"]), "--task", str(task), "--method", "lora", "--steps", "1", "--output", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "\n" not in str(result.exception)
    assert str(result.exception) == (
        f"task capitals reads its tuning split 'train' and its evaluation split 'test' from one file, {tmp_path / 'test.jsonl'}: "
        "give the spec a tune_split of other rows (or dataset.tune_on_eval_rows: true to run it, flagged)"
    )
    assert not (tmp_path / "o").exists()


def test_a_prompt_that_does_not_record_its_evaluation_rows_is_tuned_again():
    from softeval.tuning import provenance_difference

    wanted = {"model": {"spec": "m"}, "task": {"name": "t"}, "chat": False, "produced": {"by": "run"},
              "data": {"tune": None, "validation": None}, "config": {}}
    assert provenance_difference(wanted | {"eval_rows_in_tuning": 0}, wanted, sweep=False) is None
    assert provenance_difference(wanted, wanted, sweep=False) == "record of the evaluation rows left out of tuning"


def test_an_unused_chat_template_is_flagged_except_for_a_declared_base_model(tmp_path, tiny_llama):
    from conftest import ROWS, write_user_task
    from softeval.study import evaluate
    from softeval.tasks import load_task

    assert tiny_llama.post_trained  # its tokenizer ships a chat template
    spec = load_task(write_user_task(tmp_path, ROWS))
    guessed = evaluate(tiny_llama, spec, "zero-shot", progress=False)
    assert guessed.diagnostics.chat_template_unused and guessed.config["role_from"] is None
    declared = evaluate(tiny_llama, spec, "zero-shot", role="base", progress=False)
    assert not declared.diagnostics.chat_template_unused
    assert (declared.config["role"], declared.config["role_from"]) == ("base", "study")


def test_a_study_that_runs_the_chat_template_too_is_not_told_to_run_it(tmp_path, tiny_model_dirs, caplog):
    """Advice fits the command: the plain cell of a model whose chat-template cell the same study
    evaluates is not flagged, nor its emptiness hinted, with '--chat runs it'."""
    from conftest import ROWS, write_user_task
    from softeval import Study, run_study
    from softeval.analysis import finished_cells

    task = write_user_task(tmp_path, ROWS)
    run_study(Study(models=[{"model": str(tiny_model_dirs["llama"])}], tasks=[str(task)], methods=["zero-shot"], chat=True),
              output=tmp_path / "out", progress=False)
    plain, chat = finished_cells(tmp_path / "out")
    assert (plain.config["chat"], chat.config["chat"]) == (False, True)
    assert not plain.diagnostics.chat_template_unused and not any("--chat" in flag for flag in plain.diagnostics.flags)
    assert not [r for r in caplog.records if "--chat runs it" in r.getMessage()]


def test_a_short_answer_cell_records_its_word_rule(tmp_path, tiny_model_dirs):
    answers = ["Paris", "Rome", "New Delhi", "Buenos Aires", "Berlin", "Salt Lake City"]
    rows = [{"q": f"Capital number {i}?", "a": answers[i % len(answers)], "also": [answers[i % len(answers)].lower()]} for i in range(30)]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:20] if split == "train")
                                                 + "".join(json.dumps(r) + "\n" for r in rows[20:] if split == "test"))
    spec = {"name": "capitals_short", "answer_format": "short_answer", "fields": {"question": "q", "answer": "a", "aliases": "also"},
            "dataset": {"path": "local/capitals_short", "eval_split": "test", "tune_split": "train", "fewshot_split": "train",
                        "data_files": {"train": "train.jsonl", "test": "test.jsonl"}},
            "template": "Question: {{ question }}\nAnswer:", "target": " {{ answer }}", "stop": ["\n"], "max_new_tokens": 6}
    task = tmp_path / "capitals_short.yaml"
    task.write_text(json.dumps(spec))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dirs["llama"]), "--task", str(task), "--output", str(out)])
    assert result.exit_code == 0, result.output
    (results,) = out.rglob("results.json")
    config = json.loads(results.read_text())["config"]
    rule = "99% of the 20 gold answers of split 'train' have at most 3"
    assert (config["max_answer_words"], config["max_answer_words_from"]) == (3, rule)
    assert f"Strict short answers: at most 3 words ({rule})." in (out / "comparison.md").read_text()


def test_a_tuned_run_decides_saturation_from_its_own_curve(tmp_path, tiny_model_dirs):
    """Enough tuning rows that twelve are held out: the verdict is read from the curve the run
    wrote, with the step computed from its recorded per-row outcomes."""
    from conftest import ROWS, write_user_task

    task = write_user_task(tmp_path, ROWS * 30)
    out = tmp_path / "o"
    args = ["run", "--model", str(tiny_model_dirs["llama"]), "--task", str(task), "--method", "soft-prompt", "--steps", "4",
            "--eval-every", "2", "--val-size", "12", "--length", "2", "--output", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    (curve_file,) = out.rglob("curve.json")
    curve = json.loads(curve_file.read_text())
    assert [len(point["rows"]["format_following"]) for point in curve] == [12] * len(curve)
    (finding,) = [f for f in json.loads((out / "comparison.json").read_text())["findings"] if f["claim"] == "saturation"]
    means = np.array([np.mean(point["rows"]["format_following"]) for point in curve])
    assert finding["value"] == F.saturation_step([point["step"] for point in curve], means)
    assert finding["verdict"] != "not applicable" and "validation rows" not in finding["reason"]


def test_the_early_decision_finding_is_undetermined_on_a_flagged_target_and_counts_flagged_checkpoints(tmp_path):
    series = {"a": [{"model": "a@1"}, {"model": "a@2"}], "b": [{"model": "b@1"}, {"model": "b@2"}]}
    proxy = {"best_continuous": True, "first": "soft-prompt / task_accuracy", "second": "zero-shot / gold_prob", "among": 3,
             "mean": {"value": 0.4, "ci_low": 0.2, "ci_high": 0.6}, "verdict": "better", "p_value": 0.01}

    def finding(target_flags: dict, flags: dict) -> F.Finding:
        found = {"rows": 8, "target_flags": target_flags, "predictors": {"budgets": [1, 2], "differences": [proxy]}}
        references = {name: {"model": f"{name}-ref", "method": "zero-shot", "chat": True} for name in series}
        analysis = {"target": {"kind": "reference", "metric": "task_accuracy"}, "references": references, "series": series, "tasks": {"quiz": found}}
        (tmp_path / "analysis.json").write_text(json.dumps(analysis))
        [only] = F._decision_findings(tmp_path, flags)
        return only

    assert finding({}, {}).verdict == "holds" and finding({}, {}).reason == "the interval against each of the 3 proxies lies above 0"
    # the finding names what it decides against
    assert finding({}, {}).statistic.startswith("decision accuracy against the references' zero-shot chat task_accuracy, averaged over 2 budgets")
    flagged = finding({"b-ref": ["at chance (25%)"]}, {})
    assert flagged.verdict == "undetermined" and flagged.reason == "the target's cells are flagged (b-ref: at chance (25%))"
    # the soft prompt's own checkpoints at chance or without strict answers are what it measures: counted, not undetermining
    counted = finding({}, {("a@1", "quiz", "soft-prompt", False): ["no strict answers"], ("b@1", "quiz", "soft-prompt", False): ["at chance (25%)"],
                           ("b@2", "quiz", "zero-shot", False): ["at chance (25%)"]})
    assert counted.verdict == "holds" and counted.reason.endswith("; 2 of its 4 checkpoint cells are flagged (no strict answers 1, at chance 1)")
    proxy |= {"verdict": "worse", "decided_by": "few-shot / gold_bpb", "against": {"few-shot / gold_bpb": {"value": -0.1, "ci_low": -0.2, "ci_high": -0.05}}}
    worse = finding({}, {})
    assert worse.verdict == "does not hold" and worse.reason.startswith("few-shot / gold_bpb decides better (the soft prompt minus it: -0.10 [-0.20, -0.05])")
