"""The answer first: what a folder's series analysis found, per task, in a few lines a pre-training
lead reads before any table.

Per task: what orders the recipes (the target), which predictor decides first and from which
budget, the soft prompt against the best continuous proxy and against zero- and few-shot, the
score that best follows what the checkpoints truly know (where a ground truth exists); each
with its estimate, 95% interval and the table it comes from (`link`: an anchor the reports
give that table). A figure that rests on ties says so ("5 of 6 recipes tied at 0.00").
"""

from __future__ import annotations

import re
from collections import Counter

from softeval.analysis.series import budget_text, flagged_text, target_phrase

TIE_SHARE = 0.5  # a statistic rests on ties where at least this share of the recipes share one score


def anchor(task: str, table: str) -> str:
    """The anchor of a task's table in analysis.md and on the page (GitHub's heading slugs)."""
    return re.sub(r"[^a-z0-9_ -]", "", f"{task}: {table}".lower()).replace(" ", "-")


def tied_text(scores: dict[str, float | None], what: str) -> str | None:
    """"5 of 6 recipes tied at 0.00" where most recipes share one score (`what` names the score)."""
    known = [round(v, 6) for v in scores.values() if v is not None]
    if len(known) < 2:
        return None
    value, count = Counter(known).most_common(1)[0]
    if count < 2 or count / len(known) < TIE_SHARE:
        return None
    return f"{count} of {len(known)} recipes tied at {value:.2f} in {what}"


def task_summary(analysis: dict, task: str) -> dict:
    """The summary of one task's analysis: `rows` of (question, answer, estimate, note, link),
    the `ties` the figures rest on, and the `lead`: the rows in a few sentences."""
    found = analysis["tasks"][task]
    target = analysis.get("target") or {}
    rows = [{"question": "target", "answer": target_phrase(analysis), "estimate": None,
             "note": ", ".join(f"{name} {value:.2f}" for name, value in found["target_scores"].items()), "link": anchor(task, "decision accuracy")}]
    ties = [t for t in [tied_text(found["target_scores"], "the target")] if t]
    predictors = found.get("predictors") or {}
    # against the last checkpoints' own score, that method's predictors grade themselves at the last budget
    own = f"{target.get('method')} / " if target.get("kind") == "last" else None
    first = _decides_first(task, found, predictors, own)
    if first is not None:
        rows.append(first)
    rows += _soft_prompt_rows(task, found, predictors, caveat(analysis, found))
    soft_scores = _last_scores(found, "soft-prompt", "task_accuracy")
    if soft_scores:
        ties += [t for t in [tied_text(soft_scores, "the soft prompt's last task accuracy")] if t]
    if found.get("truth"):
        rows.append(_truth_row(task, found["truth"]))
    return {"task": task, "lead": lead(task, rows, ties), "rows": rows, "ties": ties}


def caveat(analysis: dict, found: dict) -> str | None:
    """Why the soft prompt's decision verdicts cannot be read here (as the early-decision finding
    says): a flagged target, or a target that is the soft prompt's own last score."""
    if found.get("target_flags"):
        return f"the target's cells are flagged ({flagged_text(found['target_flags'])})"
    if (analysis.get("target") or {}).get("kind") != "reference":
        return "the target is the last checkpoints' own score, by which a predictor of its method grades itself; declare references"
    return None


def _decides_first(task: str, found: dict, predictors: dict, own: str | None) -> dict | None:
    """The predictor with the best mean decision accuracy (not the target's own method's), from
    which budget it decides, and how many others share its mean."""
    means = {name: predictors["results"][name]["mean"]["value"] for name in predictors.get("ranked", [])}
    candidates = [name for name, value in means.items() if value is not None and not (own and name.startswith(own))]
    if not candidates:
        return None
    best = candidates[0]  # ranked: best mean first
    result = predictors["results"][best]
    if result["earliest"] is None:
        note = "decides from no budget"
    else:
        there = result["decision_accuracy"][result["earliest"]]
        interval = f" [{there['ci_low']:.2f}, {there['ci_high']:.2f}]" if there.get("ci_low") is not None else ""
        note = f"decides from {budget_text(predictors['budgets'][result['earliest']], found['axis'])} ({there['value']:.2f}{interval} there)"
    tied = sum(round(means[name], 6) == round(means[best], 6) for name in candidates) - 1
    if tied:
        note += f"; {tied} other predictor{'s' if tied > 1 else ''} share{'' if tied > 1 else 's'} its mean"
    if own:
        note += f"; the target's own method ({own.removesuffix(' / ')}) left out"
    return {"question": "decides first (mean decision accuracy)", "answer": best, "estimate": result["mean"], "note": note,
            "link": anchor(task, "predictors")}


def lead(task: str, rows: list[dict], ties: list[str]) -> str:
    """The summary's rows said in a few sentences, each with its interval."""
    said = {row["question"].split(" (")[0]: row for row in rows}
    interval = lambda e: f" ({e['value']:.2f} [{e['ci_low']:.2f}, {e['ci_high']:.2f}])" if e and e.get("ci_low") is not None else ""  # noqa: E731
    sentences = [f"On {task}, the recipes are ordered by {said['target']['answer']}."]
    if "decides first" in said:
        first = said["decides first"]
        sentences.append(f"{first['answer']} decides between them first{interval(first['estimate'])}: it {first['note']}.")
    proxy = said.get("soft prompt vs the best continuous proxy")
    if proxy:
        sentences.append({"decides better": f"The soft prompt decides better than every continuous proxy (the best: {proxy['other']})",
                          "decides worse": f"The soft prompt decides worse than {proxy['other']}",
                          "undetermined": f"Whether the soft prompt decides better than the best continuous proxy ({proxy['other']}) is "
                                          f"undetermined: {proxy['note']}"}.get(
            proxy["verdict"], f"The soft prompt and the best continuous proxy, {proxy['other']}, show no difference")
            + f"{interval(proxy['estimate'])}.")
    truth = said.get("follows true knowledge best")
    if truth and truth["estimate"]:
        sentences.append(f"{truth['answer']} follows what the checkpoints truly know best{interval(truth['estimate'])}.")
    if ties:
        sentences.append(f"Some of this rests on ties ({'; '.join(ties)}).")
    return " ".join(sentences)


def _soft_prompt_rows(task: str, found: dict, predictors: dict, caveat: str | None) -> list[dict]:
    """The soft prompt's task accuracy against the best continuous proxy (the early-decision
    verdict: where it decides worse, against the proxy that decides it), and against zero- and
    few-shot task accuracy, in mean decision accuracy (paired intervals); undetermined, saying
    why, where the target cannot grade it (`caveat`)."""
    rows = []
    differences = predictors.get("differences", [])
    proxy = next((d for d in differences if d["best_continuous"]), None)
    if proxy is not None:
        verdict = {"better": "decides better", "worse": "decides worse", "no difference shown": "no difference shown"}.get(proxy.get("verdict"), "n/a")
        other, estimate = proxy["second"], proxy["mean"]
        note = f"soft prompt minus it, of {proxy['among']} proxies"
        if verdict == "decides worse" and proxy.get("decided_by"):  # the proxy the verdict rests on, and its own difference
            other, estimate = proxy["decided_by"], proxy["against"][proxy["decided_by"]]
            note = f"soft prompt minus it (Holm over {proxy['among']} proxies)"
        if caveat:
            verdict, note = "undetermined", caveat
        rows.append({"question": "soft prompt vs the best continuous proxy", "answer": f"{verdict} ({other})", "estimate": estimate,
                     "note": note, "link": anchor(task, "predictors"), "verdict": verdict, "other": other})
    against = next((d for d in differences if not d["best_continuous"]), {}).get("against", {})
    for other in ("zero-shot", "few-shot"):
        difference = against.get(f"{other} / task_accuracy")
        if difference is not None:
            shown = "better" if (difference.get("ci_low") or 0) > 0 else "worse" if (difference.get("ci_high") or 0) < 0 else "no difference shown"
            rows.append({"question": f"soft prompt vs {other}", "answer": "undetermined" if caveat else shown, "estimate": difference,
                         "note": caveat or f"soft prompt minus {other}, both by task accuracy", "link": anchor(task, "predictors")})
    return rows


def _truth_row(task: str, truth: dict) -> dict:
    """The (method, metric) whose scores best order the checkpoints by their true knowledge, and
    how many others share its tau."""
    scored = [(metrics[metric]["value"], f"{method} / {metric}", metrics[metric])
              for method, metrics in truth["agreement"].items() for metric in metrics if metrics[metric]["value"] is not None]
    if not scored:
        return {"question": "follows true knowledge best", "answer": "n/a", "estimate": None,
                "note": "no score varies with the checkpoints", "link": anchor(task, "true knowledge")}
    value, name, tau = max(scored, key=lambda item: item[0])
    tied = sum(round(v, 6) == round(value, 6) for v, _, _ in scored) - 1
    note = f"over {truth['checkpoints']} checkpoints" + (f"; {tied} other score{'s' if tied > 1 else ''} share{'' if tied > 1 else 's'} its tau" if tied else "")
    return {"question": "follows true knowledge best (Kendall tau-b)", "answer": name, "estimate": tau, "note": note, "link": anchor(task, "true knowledge")}


def _last_scores(found: dict, method: str, metric: str) -> dict[str, float | None]:
    curves = (found.get("curves") or {}).get(method, {}).get(metric, {})
    return {name: points[-1]["value"] for name, points in curves.items() if points}


def summary(analysis: dict) -> list[dict]:
    """Every analysed task's summary (see `task_summary`)."""
    return [task_summary(analysis, task) for task in analysis["tasks"]]
