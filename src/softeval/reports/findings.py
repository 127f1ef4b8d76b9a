"""The findings as the reader sees them: a markdown table for comparison.md and a rich table for
the terminal, each finding with where it applies, its estimate and interval, and its verdict.
"""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from softeval.analysis import CLAIMS, Finding


def where(f: Finding) -> str:
    if f.model is None:
        return f"{f.method} / {f.task}" if f.method else "study"
    return f"{f.model} / {f.task}" + (" (chat)" if f.chat else "")


def estimate_text(f: Finding) -> str:
    if f.value is None:
        return "n/a"
    percent = f.claim in ("knowledge_flat", "above_zero_shot", "above_few_shot", "post_trained_format")  # early_decision: a share, as it is
    scale, form = (100, "{:+.1f}") if percent else (1, "{:g}" if f.claim == "saturation" else "{:+.2f}")
    ci = f" [{form.format(scale * f.ci_low)}, {form.format(scale * f.ci_high)}]" if f.ci_low is not None else ""
    return form.format(scale * f.value) + ci


def p_text(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else "<0.001"


def holm_text(f: Finding) -> str:
    """The Holm-adjusted p-value and the verdict at that level; "-" outside the family."""
    return "-" if f.p_holm is None else f"{p_text(f.p_holm)}: {f.holm_verdict}"


# why a per-cell finding is undetermined, by the first words of its reason that tell it
UNDETERMINED_KINDS = (
    ("rests on a flagged cell", ("flagged", "is flagged")),
    ("its model's role is guessed", ("role is guessed",)),
    ("too few rows or steps", ("too few", "no interval", "not record")),
    ("the interval cannot decide (with the rows that would)", ("interval",)),
)
OTHER = "other reasons"


def reason_kind(f: Finding) -> str:
    """The group an undetermined finding is counted in (see UNDETERMINED_KINDS)."""
    return next((kind for kind, words in UNDETERMINED_KINDS if any(word in f.reason for word in words)), OTHER)


def folded(findings: list[Finding]) -> dict:
    """The findings as a reader takes them in: the study's and the series' own (`broad`), then
    the per-cell ones as counts per claim and verdict, those that hold or fail listed, the
    undetermined ones grouped by why, and what does not apply here."""
    broad = [f for f in findings if f.model is None and f.verdict != "not applicable"]
    cells = [f for f in findings if f.model is not None]
    counts: dict[str, dict[str, int]] = {}
    for f in cells:
        counts.setdefault(f.claim, {v: 0 for v in VERDICTS})[f.verdict] += 1
    groups: dict[str, list[Finding]] = {}
    for f in cells:
        if f.verdict == "undetermined":
            groups.setdefault(reason_kind(f), []).append(f)
    return {"broad": broad, "counts": counts, "decided": [f for f in cells if f.verdict in ("holds", "does not hold")],
            "undetermined": groups, "not_applicable": [f for f in findings if f.verdict == "not applicable"]}


VERDICTS = ("holds", "does not hold", "undetermined", "not applicable")
FINDINGS_TEXT = ("What the cells say of the method's claims, with 95% intervals (differences in percentage points; tau and r as they are; "
                 "saturation in tuning steps). *Undetermined*: the interval cannot decide, or a cell it rests on is flagged. p: two-sided "
                 "bootstrap p-value against the bound the verdict tests (0 for differences); Holm: adjusted across the {family} findings "
                 "that have one (a study tests many claims at once), with the verdict at the adjusted level.")
HEADER = "| claim | where | estimate | verdict | p | Holm | why |"


def _row(f: Finding) -> str:
    return (f"| {CLAIMS[f.claim]} | {where(f)} | {estimate_text(f)} | **{f.verdict}** | {p_text(f.p_value)} | {holm_text(f)} | "
            f"{f.reason}{'; ' + f.statistic if f.statistic else ''} |")


def findings_markdown(findings: list[Finding]) -> list[str]:
    """comparison.md's findings, folded (see `folded`): the undetermined per-cell ones in
    sections a reader opens."""
    found = folded(findings)
    family = sum(f.p_holm is not None for f in findings)
    lines = ["## Findings", "", FINDINGS_TEXT.format(family=family), ""]
    if found["broad"]:
        lines += ["### The study and its series", "", HEADER, "|---|---|---|---|---|---|---|", *map(_row, found["broad"]), ""]
    if found["counts"]:
        lines += ["### Per cell", "", "| claim | " + " | ".join(VERDICTS) + " |", "|---|" + "---|" * len(VERDICTS)]
        lines += [f"| {CLAIMS[claim]} | " + " | ".join(str(n[v]) for v in VERDICTS) + " |" for claim, n in found["counts"].items()]
        lines += [""]
        if found["decided"]:
            lines += ["Those that hold or do not hold:", "", HEADER, "|---|---|---|---|---|---|---|", *map(_row, found["decided"]), ""]
        for kind, group in found["undetermined"].items():
            lines += [f"<details><summary>Undetermined: {kind} ({len(group)})</summary>", "", HEADER, "|---|---|---|---|---|---|---|",
                      *map(_row, group), "", "</details>", ""]
    if found["not_applicable"]:
        lines += ["Not applicable here: " + "; ".join(f"{CLAIMS[f.claim]} ({f.reason})" for f in _distinct(found["not_applicable"])) + ".", ""]
    return lines


def _distinct(findings: list[Finding]) -> list[Finding]:
    """One finding per (claim, reason)."""
    seen: dict[tuple, Finding] = {}
    for f in findings:
        seen.setdefault((f.claim, f.reason), f)
    return list(seen.values())


def findings_table(findings: list[Finding]) -> Table:
    """The terminal's findings: the study's and series' own, and the per-cell ones that hold or
    fail; the rest are counted (`counts_table`)."""
    found = folded(findings)
    table = Table(title="findings (95% intervals; p two-sided, Holm-adjusted across the study)")
    for header in ("claim", "where", "estimate", "verdict", "p", "Holm", "why"):
        table.add_column(header, overflow="fold")
    style = {"holds": "green", "does not hold": "red", "undetermined": "yellow", "not applicable": "dim"}
    for f in found["broad"] + found["decided"]:
        table.add_row(CLAIMS[f.claim], where(f), estimate_text(f), f"[{style[f.verdict]}]{f.verdict}[/]", p_text(f.p_value), holm_text(f), f.reason)
    return table


def counts_table(findings: list[Finding]) -> Table:
    """Per claim checked cell by cell, how many findings have each verdict, and why the
    undetermined ones are."""
    found = folded(findings)
    reasons = Counter(reason_kind(f) for group in found["undetermined"].values() for f in group)
    caption = "undetermined: " + "; ".join(f"{kind} {n}" for kind, n in reasons.most_common()) if reasons else None
    table = Table(title="findings per cell (counts; comparison.md and the page list them)", caption=caption)
    for header in ("claim", *VERDICTS):
        table.add_column(header, overflow="fold")
    for claim, n in found["counts"].items():
        table.add_row(CLAIMS[claim], *(str(n[v]) for v in VERDICTS))
    return table
