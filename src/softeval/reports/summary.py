"""The summary that opens analysis.md, comparison.md, the report page and the terminal's output:
per task, one small table of what the series analysis found (see `analysis.summary`), each
figure with its interval and a link to the table it comes from."""

from __future__ import annotations

from rich.table import Table

from softeval.analysis.summary import summary

SUMMARY_TEXT = ("What the checkpoints say, per task: the target that orders the recipes, the predictor that decides between them "
                "first, the soft prompt against the best continuous proxy and against zero- and few-shot (in mean decision "
                "accuracy over the budgets), and the score that best follows what the checkpoints truly know; 95% intervals "
                "resample benchmark rows (a decision accuracy's is the spread of its estimate, not coverage of its value at "
                "more rows: docs/studies.md, Intervals).")


def estimate_text(e: dict | None) -> str:
    if not e or e.get("value") is None:
        return ""
    interval = f" [{e['ci_low']:.2f}, {e['ci_high']:.2f}]" if e.get("ci_low") is not None else ""
    return f"{e['value']:.2f}{interval}"


RANKING_CLAIMS = ("ranking_vs_zero_shot", "ranking_vs_few_shot")


def ranking_rows(findings: list) -> list[dict]:
    """The ranking's verdicts (soft-prompted base models against zero- and few-shot ones at
    ordering the post-trained models), where the folder has a ranking."""
    return [{"question": f"predicts the post-trained ranking better than {f.claim.removeprefix('ranking_vs_').replace('_', '-')}",
             "answer": f.verdict, "estimate": {"value": f.value, "ci_low": f.ci_low, "ci_high": f.ci_high}, "note": f.statistic or f.reason}
            for f in findings if f.claim in RANKING_CLAIMS and f.verdict != "not applicable"]


def summary_markdown(analysis: dict | None, link_to: str = "", findings: list | None = None) -> list[str]:
    """Markdown lines of the summary; links lead to the tables of `link_to` (analysis.md from
    comparison.md, or "" within analysis.md itself). `findings` adds the ranking's verdicts."""
    ranking = ranking_rows(findings or [])
    if not ranking and not (analysis and analysis.get("tasks")):
        return []
    lines = ["## Summary", "", SUMMARY_TEXT]
    if ranking:
        lines += ["", "**the ranking** (soft-prompted base models' scores against the post-trained models' ranking)", "",
                  "| | verdict | tau difference [95% interval] | |", "|---|---|---|---|"]
        lines += [f"| {row['question']} | {row['answer']} | {estimate_text(row['estimate'])} | {row['note']} |" for row in ranking]
    for task in summary(analysis) if analysis else []:
        lines += ["", f"**{task['task']}**: {task['lead']}", "", "| | answer | estimate [95% interval] | |", "|---|---|---|---|"]
        lines += [f"| {row['question']} | {row['answer']} | {estimate_text(row['estimate'])} | {row['note']} ([table]({link_to}#{row['link']})) |"
                  for row in task["rows"]]
        if task["ties"]:
            lines += ["", "Resting on ties: " + "; ".join(task["ties"]) + "."]
    return lines + [""]


def summary_tables(analysis: dict | None, findings: list | None = None) -> list[Table]:
    """The summary for the terminal: the ranking's verdicts, then a table per analysed task."""
    tables = []
    ranking = ranking_rows(findings or [])
    if ranking:
        table = Table(title="summary: the ranking (95% intervals)")
        for header in ("", "verdict", "tau difference", ""):
            table.add_column(header, overflow="fold")
        for row in ranking:
            table.add_row(row["question"], row["answer"], estimate_text(row["estimate"]), row["note"])
        tables.append(table)
    for task in summary(analysis) if analysis and analysis.get("tasks") else []:
        table = Table(title=f"summary: {task['task']} (95% intervals)", caption=task["lead"])
        for header in ("", "answer", "estimate", ""):
            table.add_column(header, overflow="fold")
        for row in task["rows"]:
            table.add_row(row["question"], row["answer"], estimate_text(row["estimate"]), row["note"])
        tables.append(table)
    return tables


def summary_view(analysis: dict) -> list[dict]:
    """The summary as the report page shows it."""
    return [task | {"rows": [row | {"estimate": estimate_text(row["estimate"])} for row in task["rows"]]} for task in summary(analysis)]
