"""The method's findings: the questions soft-prompt evaluation answers, stated for every study.

Each finding is stated per model x task (and chat mode) where it applies, with the statistic
behind it, its 95% interval and a verdict:

- *holds*: the interval lies where the claim says;
- *does not hold*: the interval lies where the claim says it should not;
- *undetermined*: the interval cannot decide, there are too few rows or steps, or a cell the
  finding rests on is flagged (at chance, collapsed, without strict answers, mostly empty,
  tuned on its evaluation rows, or of another task version): such a finding never holds;
- *not applicable*: the study has nothing to state it on (the reason says what is missing).

The claims and their rules:

1. `saturation`: format-following saturates within the method's budget of about 80 steps of
   batch 8 (640 tuning examples). The statistic is the first validation step from which
   format-following stays at or above PLATEAU_SHARE of its final value; its interval resamples
   the validation rows (the same draw at every step). Holds where the whole interval is within
   the budget (in this run's steps) and the final format-following is at least MIN_PLATEAU; does
   not hold where the interval is all beyond the budget, or where a run as long as the budget
   ends below MIN_PLATEAU; undetermined where, in a run no longer than the budget, the plateau's
   interval reaches the run's last step (the curve may still be rising: at its last step any
   curve is within PLATEAU_SHARE of its own final value), or where a run shorter than the budget
   has not yet reached MIN_PLATEAU.
2. `knowledge_flat`: knowledge on the validation rows stays flat during tuning: the paired
   difference between the last validation step and step 0. Holds where the interval lies
   within +-KNOWLEDGE_MARGIN, does not hold where it lies outside it; undetermined where every
   row is known at both steps, or none is (it could move one way only).
3. `above_zero_shot`, `above_few_shot`: a soft prompt scores above zero-shot and above few-shot
   for base models (task accuracy, paired difference on the same rows). Holds where the interval
   is above 0, does not hold where it is at or below 0.
4. `post_trained_format`: post-trained models gain format-following from a soft prompt (paired
   difference against zero-shot, with the chat template where both cells have one).
5. `ranking_vs_zero_shot`, `ranking_vs_few_shot`: base models' soft-prompt scores predict the
   post-trained models' ranking better: Kendall tau-b of soft-prompt minus that of the other
   method, intervals from the same row draws (see `ranking.py`). Needs MIN_FAMILIES families.
6. `soft_prompt_vs_lora`: soft-prompt and LoRA task accuracy line up across cells: Pearson r
   (Kendall tau-b beside it). Holds where r's interval lies above LINE_UP_R, does not hold where
   it lies below. Where the cells mix base and post-trained models, r within each group is given
   too, and a holds needs the interval of each group with 3 cells or more (one at least) above
   LINE_UP_R (the gap between the groups alone can line up pooled scores).
7. `early_decision` (where a study holds series): the soft prompt's task accuracy decides
   between recipes better than the best continuous proxy (the gold answer's probability or bits
   per byte, under any method): the difference in decision accuracy, averaged over the budgets,
   with a paired interval (the same row draws for both; see `decisions.py`). Holds where the soft
   prompt decides better than each proxy, does not hold where a proxy decides better (Holm over
   the proxies); undetermined where the target's cells (the references) are flagged, since the
   order they give may be noise.
8. `true_knowledge` (where a study declares a ground truth, as the testbed's does): a method's
   task accuracy orders the series' checkpoints by the share of test facts they truly know:
   Kendall tau-b with a row-bootstrap interval, from the series analysis. Holds where the interval
   lies above TRUE_KNOWLEDGE_TAU, does not hold where it lies below.

In 7 and 8 a flag on a checkpoint's own cell does not make the finding undetermined: a checkpoint
at chance, or one that keeps no answer format, is what these claims measure (whether a method's
score tells checkpoints apart), not a fault in the measurement. The reason counts such cells.

Each finding with an interval carries a two-sided bootstrap p-value against the bound its
verdict tests (0 for differences, the budget for saturation, r = LINE_UP_R, tau =
TRUE_KNOWLEDGE_TAU; for knowledge staying flat, two one-sided tests against +-KNOWLEDGE_MARGIN;
for the early decision, see `decisions.decision_difference`); none where a rule rather than the
interval leaves it undetermined; and a Holm-adjusted one across the study's (`holm_verdict`: a
holds whose adjusted p-value is not below 1 - CONFIDENCE is undetermined there). A paired finding
left undetermined because its interval includes 0 states the smallest difference its rows could
detect and the rows that would detect the observed one, each with 80% power.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from softeval.analysis.comparisons import LINE_UP_R, UNDERMINING_FOR, cell_flags, cell_key, tuned_agreement, undermining
from softeval.analysis.ranking import MIN_FAMILIES, families
from softeval.analysis.series import TRUE_KNOWLEDGE_TAU, flagged_text, target_phrase
from softeval.analysis.stats import CONFIDENCE, holm, paired_difference, row_counts, tail_share
from softeval.scoring import MODELS_FILE, EvalResult

Verdict = Literal["holds", "does not hold", "undetermined", "not applicable"]

METHOD_BUDGET_EXAMPLES = 80 * 8  # the method's ~80 steps of batch 8
PLATEAU_SHARE = 0.95  # format-following at this share of its final value has reached its plateau
MIN_PLATEAU = 0.5  # a plateau below this share of formatted answers is no saturation the method means
KNOWLEDGE_MARGIN = 0.05  # knowledge moving less than 5 points either way is flat
MIN_VALIDATION_ROWS = 10  # fewer validation rows say too little of a curve
N_RESAMPLES = 2000

CLAIMS = {
    "saturation": "format-following saturates within ~80 steps of batch 8",
    "knowledge_flat": "knowledge stays flat while the soft prompt is tuned",
    "above_zero_shot": "a soft prompt scores above zero-shot (base models)",
    "above_few_shot": "a soft prompt scores above few-shot (base models)",
    "post_trained_format": "post-trained models gain format-following from a soft prompt",
    "ranking_vs_zero_shot": "soft-prompted base models predict the post-trained ranking better than zero-shot",
    "ranking_vs_few_shot": "soft-prompted base models predict the post-trained ranking better than few-shot",
    "soft_prompt_vs_lora": "soft-prompt and LoRA scores line up",
    "early_decision": "soft-prompt task accuracy decides between recipes better than the best continuous proxy",
    "true_knowledge": "a method's scores order checkpoints by what they truly know",
}


class Finding(BaseModel):
    claim: str  # a key of CLAIMS
    model: str | None = None
    method: str | None = None  # a finding on one method across models (true knowledge)
    task: str | None = None
    chat: bool | None = None
    statistic: str = ""  # what `value` is
    value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: Verdict
    reason: str
    p_value: float | None = None  # two-sided bootstrap p-value against the bound the verdict tests (see the module's notes)
    p_holm: float | None = None  # Holm-adjusted across the study's findings that have a p-value
    holm_verdict: Verdict | None = None  # the verdict at the Holm-adjusted level; None without a p-value


def study_findings(folder: Path, results: list[EvalResult], comparisons: list[dict], agreement: dict | None) -> list[Finding]:
    """Every finding of the cells of an output folder, from the paired comparisons and the soft
    prompt vs LoRA agreement the comparison computed, the tuning curves and ranking.json."""
    folder = Path(folder)
    flagged = cell_flags(results)
    raw_flags = {cell_key(r): flagged[id(r)] for r in results}
    flags = {key: undermining(found) for key, found in raw_flags.items()}  # as task accuracy reads them
    cells = {cell_key(r): r for r in results}
    roles, guessed = _roles(folder, results)
    findings = []
    findings += _curve_findings(folder, cells, flags)
    findings += _paired_findings(comparisons, roles, guessed, flags)
    findings += _ranking_findings(folder, cells, raw_flags)
    findings.append(_lora_finding(agreement, flags, _agreement_by_role(cells, roles, agreement) if agreement else {}))
    findings += _decision_findings(folder, raw_flags)
    findings += _truth_findings(folder, flags)
    return with_holm(findings)


def with_holm(findings: list[Finding]) -> list[Finding]:
    """The findings with Holm-adjusted p-values across those that have one, and the verdict each
    keeps at the adjusted level: a holds whose adjusted p-value is not below 1 - CONFIDENCE
    becomes undetermined."""
    adjusted = holm([f.p_value for f in findings])
    for f, p in zip(findings, adjusted):
        if p is None:
            continue
        f.p_holm = p
        # the claims are what is tested: a "holds" is a rejection of "no effect" that Holm guards
        f.holm_verdict = "undetermined" if f.verdict == "holds" and p >= 1 - CONFIDENCE else f.verdict
    return findings


# --- 1 and 2: the tuning curves ----------------------------------------------------------------


def _curve_findings(folder: Path, cells: dict, flags: dict) -> list[Finding]:
    tuned = [(key, r) for key, r in cells.items() if key[2] == "soft-prompt"]
    if not tuned:
        reason = "no soft-prompt cells"
        return [Finding(claim=c, verdict="not applicable", reason=reason) for c in ("saturation", "knowledge_flat")]
    findings = []
    for (model, task, _, chat), result in tuned:
        where = {"model": model, "task": task, "chat": chat}
        curve = _curve(folder, result)
        problem = _curve_problem(curve)
        if problem:
            findings += [Finding(claim=c, **where, verdict="undetermined", reason=problem) for c in ("saturation", "knowledge_flat")]
            continue
        undermined = flags.get((model, task, "soft-prompt", chat), [])
        findings.append(_saturation(curve, (result.tuning or {}).get("batch_size"), where, undermined))
        findings.append(_knowledge_flat(curve, where, undermined))
    return findings


def saturation_step(steps: list[int], means: np.ndarray) -> np.ndarray:
    """The first step from which every later mean stays at or above PLATEAU_SHARE of the last
    one; `means` is (points,) or (points, resamples), one answer per resample."""
    means = np.asarray(means, dtype=float)
    reached = means >= PLATEAU_SHARE * means[-1] - 1e-12
    index = np.arange(len(steps)).reshape(-1, *([1] * (means.ndim - 1)))
    last_below = np.where(reached, -1, index).max(axis=0)  # the last point below the plateau
    return np.asarray(steps)[last_below + 1]


def _saturation(curve: list[dict], batch_size: int | None, where: dict, undermined: list[str]) -> Finding:
    steps = [point["step"] for point in curve]
    rows = np.array([point["rows"]["format_following"] for point in curve], dtype=float)  # (points, rows)
    budget = METHOD_BUDGET_EXAMPLES / (batch_size or 8)
    point = float(saturation_step(steps, rows.mean(axis=1)))
    boot = saturation_step(steps, rows @ _row_counts(rows.shape[1]).T / rows.shape[1])
    low, high = (float(q) for q in np.quantile(boot, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2], method="inverted_cdf"))
    final = rows[-1].mean()
    finding = dict(where, claim="saturation", statistic=f"first validation step at {100 * PLATEAU_SHARE:.0f}% of the final format-following "
                   f"({100 * final:.0f}%); the method's budget is {budget:g} steps of batch {batch_size or 8}", value=point, ci_low=low, ci_high=high,
                   p_value=_within_p(boot, budget))
    if batch_size is None:
        return Finding(**finding, verdict="undetermined", reason="the tuned prompt does not record its batch size (tuned by an older softeval)")
    if undermined:
        return Finding(**finding, verdict="undetermined", reason=f"the soft-prompt cell is flagged: {', '.join(undermined)}")
    final_low, final_high = _interval(rows[-1])
    short = steps[-1] < budget  # a run shorter than the budget cannot tell what the budget reaches
    if final_high < MIN_PLATEAU:
        if short:
            return Finding(**finding, verdict="undetermined", reason=f"format-following is at {100 * final:.0f}% at step {steps[-1]}, "
                           f"short of the budget of {budget:g} steps: a longer run may reach {100 * MIN_PLATEAU:.0f}%")
        return Finding(**finding, verdict="does not hold", reason=f"format-following ends at {100 * final:.0f}%, below {100 * MIN_PLATEAU:.0f}%")
    if final_low < MIN_PLATEAU:
        return Finding(**finding, verdict="undetermined", reason=f"the final format-following's interval includes {100 * MIN_PLATEAU:.0f}%")
    # within the budget, a plateau reached only at the last step may be a curve still rising (at
    # the last step any curve is within 95% of its own final value), unless it has no room left
    # to rise out of the plateau (even 100% would keep the last step within it); beyond the
    # budget, such a plateau comes after it whatever it does next
    if high >= steps[-1] and steps[-1] <= budget and final < PLATEAU_SHARE:
        return Finding(**finding | {"p_value": None}, verdict="undetermined",
                       reason=f"format-following may still be rising at the run's last step ({steps[-1]})")
    if high <= budget:
        return Finding(**finding, verdict="holds", reason=f"saturated by step {high:g} at the latest, within {budget:g}")
    if low > budget:
        return Finding(**finding, verdict="does not hold", reason=f"saturated after step {low:g} at the earliest, beyond {budget:g}")
    return Finding(**finding, verdict="undetermined", reason=f"the interval spans the budget of {budget:g} steps")


def _interval(outcomes: np.ndarray) -> tuple[float, float]:
    """The 95% interval of a mean of per-row outcomes, by the findings' resamples."""
    boot = _row_counts(len(outcomes)) @ outcomes / len(outcomes)
    low, high = np.quantile(boot, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2], method="inverted_cdf")
    return float(low), float(high)


def _knowledge_flat(curve: list[dict], where: dict, undermined: list[str]) -> Finding:
    first, last = (np.array(curve[i]["rows"]["knowledge"], dtype=float) for i in (0, -1))
    d = paired_difference(last, first, n_resamples=N_RESAMPLES)
    finding = dict(where, claim="knowledge_flat", statistic=f"knowledge at step {curve[-1]['step']} minus step {curve[0]['step']}, "
                   f"{len(first)} validation rows", value=d.value, ci_low=d.ci_low, ci_high=d.ci_high, p_value=_equivalence_p(last - first))
    if undermined:
        return Finding(**finding, verdict="undetermined", reason=f"the soft-prompt cell is flagged: {', '.join(undermined)}")
    if d.ci_low is None:
        return Finding(**finding, verdict="undetermined", reason="too few validation rows for an interval")
    for level, move in ((0, "rise"), (1, "fall")):
        if (first == level).all() and (last == level).all():  # a flat line at a bound shows one direction only
            return Finding(**finding | {"p_value": None}, verdict="undetermined", reason=f"knowledge is {level} on every validation row at both steps: "
                           f"it could only {move}, so staying flat shows half of the claim")
    margin = f"+-{100 * KNOWLEDGE_MARGIN:.0f} points"
    if -KNOWLEDGE_MARGIN <= d.ci_low and d.ci_high <= KNOWLEDGE_MARGIN:
        return Finding(**finding, verdict="holds", reason=f"the interval lies within {margin}")
    if d.ci_low > KNOWLEDGE_MARGIN or d.ci_high < -KNOWLEDGE_MARGIN:
        return Finding(**finding, verdict="does not hold", reason=f"the interval lies outside {margin}")
    return Finding(**finding, verdict="undetermined", reason=f"the interval reaches beyond {margin}")


def _within_p(boot: np.ndarray, budget: float) -> float:
    """Saturation's p-value: twice the smaller share of resampled steps within the budget (at or
    before it, as the verdict counts them) or beyond it (see `stats.tail_share`)."""
    return float(min(1.0, 2 * min(tail_share(boot, budget, above=False), tail_share(boot, budget, above=True, strict=True))))


def _equivalence_p(diff: np.ndarray) -> float | None:
    """The p-value of "knowledge moved by KNOWLEDGE_MARGIN or more" (two one-sided tests on the
    row-bootstrap of the mean difference): twice the larger share of resamples beyond either
    margin (see `stats.tail_share`); below 1 - CONFIDENCE where the interval lies within it."""
    if diff.size < 2:
        return None
    boot = diff @ _row_counts(diff.size).T / diff.size
    beyond = max(tail_share(boot, -KNOWLEDGE_MARGIN, above=False), tail_share(boot, KNOWLEDGE_MARGIN, above=True))
    return float(min(1.0, 2 * beyond))


def _curve(folder: Path, result: EvalResult) -> list[dict] | None:
    """The tuning curve of a soft-prompt cell's prompt: curve.json beside it."""
    recorded = (result.config.get("soft_prompt") or {}).get("path")
    model, task, _, chat = cell_key(result)
    candidates = [Path(recorded).parent / "curve.json"] if recorded else []
    candidates.append(folder / model / task / ("prompt-chat" if chat else "prompt") / "curve.json")
    for path in candidates:
        if path.is_file():
            try:
                curve = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                return None
            return curve if isinstance(curve, list) and all(isinstance(point, dict) for point in curve) else None
    return None


def _curve_problem(curve: list[dict] | None) -> str | None:
    """Why a curve cannot state findings 1 and 2, or None."""
    if not curve:
        return "no readable tuning curve beside its soft prompt (a given prompt, one tuned elsewhere, or a damaged curve.json)"
    if any("rows" not in point for point in curve):
        return "its tuning curve records no per-row outcomes (tuned by an older softeval): retune it with --force"
    if len(curve) < 2:
        return "its tuning curve has a single validation step"
    try:
        lengths = {len(point["rows"][metric]) for point in curve for metric in ("format_following", "knowledge")}
        steps = [int(point["step"]) for point in curve]
    except (KeyError, TypeError, ValueError):
        lengths, steps = set(), []
    if len(lengths) != 1 or steps != sorted(steps):
        return "its tuning curve.json is damaged (points without steps or per-row outcomes): retune it with --force"
    n = lengths.pop()
    if n < MIN_VALIDATION_ROWS:
        return f"{n} validation rows; at least {MIN_VALIDATION_ROWS} are needed"
    return None


@lru_cache(maxsize=8)
def _row_counts(n_rows: int) -> np.ndarray:
    """(N_RESAMPLES, n_rows): how often each validation row is drawn in each resample."""
    return row_counts(np.random.default_rng(0).integers(0, n_rows, size=(N_RESAMPLES, n_rows))).astype(float)


# --- 3 and 4: paired differences -----------------------------------------------------------------


def _paired_findings(comparisons: list[dict], roles: dict[str, str | None], guessed: set[str], flags: dict) -> list[Finding]:
    findings = []
    base = [m for m, role in roles.items() if role == "base"]
    post = [m for m, role in roles.items() if role == "post-trained"]
    for claim, baseline in (("above_zero_shot", "zero-shot"), ("above_few_shot", "few-shot")):
        found = [c for c in comparisons if c["model"] in base and not c["chat"] and (c["method"], c["baseline"]) == ("soft-prompt", baseline)]
        if not base:
            findings.append(Finding(claim=claim, verdict="not applicable", reason="no base model (declare role: base in a study file)"))
        elif not found:
            findings.append(Finding(claim=claim, verdict="not applicable", reason=f"no base model has both soft-prompt and {baseline} cells"))
        findings += [_above(claim, c, "task_accuracy", flags, guessed) for c in found]
    chat_pairs = {(c["model"], c["task"]) for c in comparisons if c["chat"] and (c["method"], c["baseline"]) == ("soft-prompt", "zero-shot")}
    found = [
        c for c in comparisons
        if c["model"] in post and (c["method"], c["baseline"]) == ("soft-prompt", "zero-shot") and c["chat"] == ((c["model"], c["task"]) in chat_pairs)
    ]
    if not post:
        findings.append(Finding(claim="post_trained_format", verdict="not applicable", reason="no post-trained model"))
    elif not found:
        findings.append(Finding(claim="post_trained_format", verdict="not applicable", reason="no post-trained model has both soft-prompt and zero-shot cells"))
    findings += [_above("post_trained_format", c, "format_following", flags, guessed) for c in found]
    return findings


def _above(claim: str, comparison: dict, metric: str, flags: dict, guessed: set[str]) -> Finding:
    """A method above its baseline on `metric` by the paired difference's interval."""
    d = comparison[metric]
    model, task, chat, baseline = comparison["model"], comparison["task"], comparison["chat"], comparison["baseline"]
    finding = dict(claim=claim, model=model, task=task, chat=chat, value=d["value"], ci_low=d["ci_low"], ci_high=d["ci_high"], p_value=d.get("p_value"),
                   statistic=f"{metric.replace('_', ' ')}, soft-prompt minus {baseline}{' (chat)' if chat else ''}, {comparison['n']} rows")
    undermined = sorted({f for method in ("soft-prompt", baseline) for f in flags.get((model, task, method, chat), [])})
    if undermined:
        return Finding(**finding, verdict="undetermined", reason=f"a cell it rests on is flagged: {', '.join(undermined)}")
    if model in guessed:
        return Finding(**finding, verdict="undetermined", reason=f"{model}'s role is guessed from its chat template (a base model may have one): "
                       "declare it in a study file (role: base or role: post-trained)")
    verdict = _sign_verdict(d["ci_low"], d["ci_high"])
    if verdict["verdict"] == "undetermined" and d["ci_low"] is not None:
        verdict["reason"] += _rows_that_would_decide(d)
    return Finding(**finding, **verdict)


def _rows_that_would_decide(d: dict) -> str:
    """What an undetermined paired difference's rows can detect and how many would detect it."""
    if d.get("detectable") is None:
        return ""
    said = f"; at {d['n']} rows it detects {100 * d['detectable']:.1f} points or more (80% power)"
    if d.get("rows_needed") is not None:
        said += f", and about {d['rows_needed']:,} rows would detect the observed {100 * d['value']:+.1f}"
    return said


def _sign_verdict(low: float | None, high: float | None) -> dict:
    if low is None:
        return {"verdict": "undetermined", "reason": "no interval (too few rows, or the statistic is undefined on them)"}
    if low > 0:
        return {"verdict": "holds", "reason": "the interval lies above 0"}
    if high <= 0:
        return {"verdict": "does not hold", "reason": "the interval lies at or below 0"}
    return {"verdict": "undetermined", "reason": "the interval includes 0"}


# --- 5: the ranking ------------------------------------------------------------------------------


def _ranking_findings(folder: Path, cells: dict, raw_flags: dict) -> list[Finding]:
    claims = (("ranking_vs_zero_shot", "zero-shot"), ("ranking_vs_few_shot", "few-shot"))
    n_families = len(families(folder))
    path = folder / "ranking.json"
    if n_families < MIN_FAMILIES or not path.is_file():
        reason = f"{n_families} families with a base and a post-trained model; the ranking needs {MIN_FAMILIES}"
        if n_families >= MIN_FAMILIES:
            reason = "no ranking: the study lacks cells it needs (see the log)"
        return [Finding(claim=c, verdict="not applicable", reason=reason) for c, _ in claims]
    try:
        ranking = json.loads(path.read_text(encoding="utf-8"))
        metric = ranking["reference"]["metric"]
        comparison = ranking["by_metric"][metric]
    except (ValueError, KeyError, TypeError):
        return [Finding(claim=c, verdict="not applicable", reason=f"{path} cannot be read: run softeval rank again") for c, _ in claims]
    if "tau_pairwise" not in comparison:
        return [Finding(claim=c, verdict="not applicable", reason=f"{path} was written by an older softeval: run softeval rank again") for c, _ in claims]
    findings = []
    for claim, other in claims:
        ranked = _ranked_cells(ranking, cells, ("soft-prompt", other))
        undermined = sorted({f for key in ranked for f in undermining(raw_flags.get(key, []), metric)})
        d = comparison["tau_pairwise"].get(f"soft-prompt - {other}")
        if d is None:
            findings.append(Finding(claim=claim, verdict="not applicable", reason=f"the ranking has no soft-prompt and {other} cells of every base model"))
            continue
        reference = ranking["reference"]
        finding = dict(claim=claim, statistic=f"Kendall tau-b of soft-prompt minus {other}, base {metric} against the post-trained models' "
                       f"{reference['method']}{' chat' if reference.get('chat') else ''} {metric}, {n_families} families", value=d["value"], ci_low=d["ci_low"], ci_high=d["ci_high"],
                       p_value=comparison.get("tau_pairwise_p", {}).get(f"soft-prompt - {other}"))
        if undermined:
            findings.append(Finding(**finding, verdict="undetermined", reason=f"ranked cells are flagged: {', '.join(undermined)}"))
        else:
            findings.append(Finding(**finding, **_sign_verdict(d["ci_low"], d["ci_high"])))
    return findings


def _ranked_cells(ranking: dict, cells: dict, methods: tuple[str, ...]) -> list[tuple]:
    """The cells a ranking claim rests on: the base models' cells of the methods it compares, and
    the post-trained references'."""
    reference = ranking["reference"]
    keys = []
    for roles in ranking["families"].values():
        for task in ranking["tasks"]:
            keys += [(roles["base"], task, method, False) for method in methods]
            keys.append((roles["post-trained"], task, reference["method"], reference["chat"]))
    return [k for k in keys if k in cells]


# --- 6: soft prompt vs LoRA ----------------------------------------------------------------------


def _agreement_by_role(cells: dict, roles: dict[str, str | None], agreement: dict) -> dict[str, dict | None]:
    """Where the agreement's cells mix roles (base, post-trained, or unknown), soft prompt against
    LoRA within each role (see `comparisons.tuned_agreement`; None where a role has fewer than 3
    cells); empty where they are of one role."""
    role_of = lambda model: roles.get(model) or "unknown"  # noqa: E731
    present = list(dict.fromkeys(role_of(model) for model, _, _ in agreement["cells"]))
    if len(present) < 2:
        return {}
    return {role: tuned_agreement({key: cell for key, cell in cells.items() if role_of(key[0]) == role}) for role in present}


def _lora_finding(agreement: dict | None, flags: dict, by_role: dict[str, dict | None]) -> Finding:
    """Pearson r across the cells. Where they mix base and post-trained models (`by_role`), the
    gap between the two groups alone can line the scores up, so a holds needs the r of each group
    with 3 cells or more above the bound too (and one such group at least), and the statistic
    gives each."""
    if agreement is None:
        return Finding(claim="soft_prompt_vs_lora", verdict="not applicable", reason="fewer than 3 (model, task) cells with both soft-prompt and LoRA")
    r, tau = agreement["pearson"], agreement["tau_b"]
    tau_text = "n/a" if tau["value"] is None else f"{tau['value']:.2f}"
    within = "".join(f"; within {role} models " + (f"r {_r_text(a['pearson'])} over {a['n_cells']}" if a else "fewer than 3 cells")
                     for role, a in by_role.items())
    finding = dict(claim="soft_prompt_vs_lora", statistic=f"Pearson r of task accuracy over {agreement['n_cells']} cells (Kendall tau-b {tau_text}){within}",
                   value=r["value"], ci_low=r["ci_low"], ci_high=r["ci_high"], p_value=agreement.get("pearson_p"))
    cells = [(m, t, method, c) for m, t, c in agreement["cells"] for method in ("soft-prompt", "lora")]
    undermined = sorted({f for key in cells for f in flags.get(tuple(key), [])})
    if undermined:
        return Finding(**finding, verdict="undetermined", reason=f"cells it rests on are flagged: {', '.join(undermined)}")
    if r["ci_low"] is None:
        return Finding(**finding, verdict="undetermined", reason="no interval (the scores are tied)")
    pooled = _against(finding, "r", LINE_UP_R)
    if pooled.verdict == "holds" and by_role:
        checked = {role: a for role, a in by_role.items() if a is not None}
        short = [role for role, a in checked.items() if a["pearson"]["ci_low"] is None or a["pearson"]["ci_low"] <= LINE_UP_R]
        if short:
            return Finding(**finding, verdict="undetermined", reason=f"the pooled interval lies above r = {LINE_UP_R}, but within {short[0]} models "
                           "it does not: the gap between base and post-trained models may be what lines the scores up")
        if not checked:
            return Finding(**finding, verdict="undetermined", reason=f"the pooled interval lies above r = {LINE_UP_R}, but no role has 3 cells "
                           "to show it within: the gap between base and post-trained models may be what lines the scores up")
    return pooled


def _r_text(r: dict) -> str:
    if r["value"] is None:
        return "n/a"
    return f"{r['value']:.2f}" + (f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if r["ci_low"] is not None else "")


# --- 7: true knowledge ----------------------------------------------------------------------------


def _decision_findings(folder: Path, raw_flags: dict) -> list[Finding]:
    """Per task of the folder's series analysis, the soft prompt's task accuracy against the best
    continuous proxy in decision accuracy (mean over budgets, paired interval)."""
    path = folder / "analysis.json"
    if not path.is_file():
        return []
    findings = []
    analysis = json.loads(path.read_text(encoding="utf-8"))
    for task, found in analysis.get("tasks", {}).items():
        proxy = next((d for d in (found.get("predictors") or {}).get("differences", []) if d["best_continuous"]), None)
        if proxy is None:
            continue
        mean = proxy["mean"]
        finding = dict(claim="early_decision", method="soft-prompt", task=task, value=mean["value"], ci_low=mean["ci_low"], ci_high=mean["ci_high"],
                       p_value=proxy.get("p_value"),
                       statistic=f"decision accuracy against {target_phrase(analysis)}, averaged over {len(found['predictors']['budgets'])} "
                       f"budgets, {proxy['first']} minus {proxy['second']} (the best of {proxy['among']} by it), {found['rows']} rows")
        if found.get("target_flags"):
            findings.append(Finding(**finding, verdict="undetermined", reason=f"the target's cells are flagged ({flagged_text(found['target_flags'])})"))
            continue
        if analysis["target"]["kind"] != "reference":
            findings.append(Finding(**finding, verdict="undetermined", reason="the target is the last checkpoints' own score, by which a "
                                    "predictor of the same method grades itself; declare each recipe's reference model"))
            continue
        verdict = _among_verdict(proxy)
        # the soft prompt's checkpoint cells are read by their task accuracy, whatever the target's metric
        flags = {key: undermining(found) for key, found in raw_flags.items()}
        verdict["reason"] += _flagged_checkpoints(analysis["series"], task, "soft-prompt", flags)
        findings.append(Finding(**finding, **verdict))
    return findings


def _among_verdict(proxy: dict) -> dict:
    """The early-decision verdict from the comparison with every proxy (`decision_difference`)."""
    n = proxy["among"]
    if "verdict" not in proxy:
        return {"verdict": "undetermined", "reason": "analysis.json was written by an older softeval, without this verdict: run softeval analyze again"}
    if proxy["verdict"] == "better":
        return {"verdict": "holds", "reason": f"the interval against each of the {n} proxies lies above 0"}
    if proxy["verdict"] == "worse":
        other = proxy["against"][proxy["decided_by"]]
        interval = f" [{other['ci_low']:+.2f}, {other['ci_high']:+.2f}]" if other["ci_low"] is not None else ""
        return {"verdict": "does not hold", "reason": f"{proxy['decided_by']} decides better (the soft prompt minus it: {other['value']:+.2f}"
                f"{interval}), its p-value Holm-adjusted over the {n} proxies"}
    return {"verdict": "undetermined", "reason": f"neither better than each of the {n} proxies nor worse than one of them"}


def _flagged_checkpoints(series: dict, task: str, method: str, flags: dict) -> str:
    """How many of the method's checkpoint cells are flagged, and with what, as a clause of a
    reason; empty where none is."""
    keys = [(point["model"], task, method, False) for points in series.values() for point in points]
    every_kind = dict.fromkeys(kind for kinds in UNDERMINING_FOR.values() for kind in kinds)
    kinds = Counter(kind for key in keys for flag in flags.get(key, []) for kind in every_kind if flag.startswith(kind))
    n = sum(bool(flags.get(key)) for key in keys)
    if not n:
        return ""
    return f"; {n} of its {len(keys)} checkpoint cells are flagged ({', '.join(f'{kind} {count}' for kind, count in kinds.most_common())})"


def _truth_findings(folder: Path, flags: dict) -> list[Finding]:
    """Per task and method, whether its task accuracy orders the series' checkpoints by their true
    knowledge (Kendall tau-b, from the folder's analysis.json); none where no study declared a
    ground truth."""
    path = folder / "analysis.json"
    if not path.is_file():
        return []
    analysis = json.loads(path.read_text(encoding="utf-8"))
    findings = []
    for task, found in analysis.get("tasks", {}).items():
        truth = found.get("truth")
        if truth is None:
            continue
        for method, metrics in truth["agreement"].items():
            tau = metrics["task_accuracy"]
            finding = dict(claim="true_knowledge", method=method, task=task, value=tau["value"], ci_low=tau["ci_low"], ci_high=tau["ci_high"],
                           p_value=tau.get("p_value"),
                           statistic=f"Kendall tau-b of task accuracy against the share of known facts over {truth['checkpoints']} checkpoints, "
                           f"{truth['rows']} rows")
            verdict = _agreement_verdict(finding)
            verdict.reason += _flagged_checkpoints(analysis["series"], task, method, flags)
            findings.append(verdict)
    return findings


def _agreement_verdict(finding: dict) -> Finding:
    if finding["value"] is None:
        return Finding(**finding, verdict="undetermined", reason="the scores or the true knowledge are the same at every checkpoint")
    if finding["ci_low"] is None:
        return Finding(**finding, verdict="undetermined", reason="no interval")
    return _against(finding, "tau", TRUE_KNOWLEDGE_TAU)


# --- shared pieces -------------------------------------------------------------------------------


def _against(finding: dict, statistic: str, bound: float) -> Finding:
    """A correlation's verdict against the bound the claim sets: holds where its interval lies
    above it, does not hold where it lies below, undetermined where it includes it."""
    if finding["ci_low"] > bound:
        return Finding(**finding, verdict="holds", reason=f"the interval lies above {statistic} = {bound}")
    if finding["ci_high"] < bound:
        return Finding(**finding, verdict="does not hold", reason=f"the interval lies below {statistic} = {bound}")
    return Finding(**finding, verdict="undetermined", reason=f"the interval includes {statistic} = {bound}")


def _roles(folder: Path, results: list[EvalResult]) -> tuple[dict[str, str | None], set[str]]:
    """Each model's role, and the models whose role is only a guess. The role is as a study
    declared it (models.json) or as its cells recorded it (declared, or known to the model
    registry); failing those it is guessed from the chat template (a base model may ship one,
    as Qwen's do), and a finding on a guessed role is undetermined."""
    path = folder / MODELS_FILE
    try:
        declared = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError:
        declared = {}
    known: dict[str, str] = {}
    guesses: dict[str, str] = {}
    for r in results:
        name = cell_key(r)[0]
        role = (declared.get(name) or {}).get("role") or r.config.get("role")
        if role:
            known[name] = role
        elif "post_trained" in r.config or r.config.get("chat"):
            template = bool(r.config.get("chat") or r.config.get("post_trained")) or guesses.get(name) == "post-trained"
            guesses[name] = "post-trained" if template else "base"
    roles = {name: known.get(name) or guesses.get(name) for name in (cell_key(r)[0] for r in results)}
    guessed = {name for name in guesses if name not in known}
    return roles, guessed


# --- how findings are shown ----------------------------------------------------------------------


