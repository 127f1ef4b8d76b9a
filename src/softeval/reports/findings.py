"""The findings as the reader sees them: a markdown table for comparison.md and a rich table for
the terminal, each finding with where it applies, its estimate and interval, and its verdict.
"""

from __future__ import annotations

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


def findings_markdown(findings: list[Finding]) -> list[str]:
    family = sum(f.p_holm is not None for f in findings)
    lines = [
        "## Findings",
        "",
        "What the cells say of the method's claims, with 95% intervals (differences in percentage points; tau and r as they are;",
        "saturation in tuning steps). *Undetermined*: the interval cannot decide, or a cell it rests on is flagged.",
        f"p: two-sided bootstrap p-value against the bound the verdict tests (0 for differences); Holm: adjusted across the {family}",
        "findings that have one (a study tests many claims at once), with the verdict at the adjusted level.",
        "",
        "| claim | where | estimate | verdict | p | Holm | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in findings:
        lines.append(f"| {CLAIMS[f.claim]} | {where(f)} | {estimate_text(f)} | **{f.verdict}** | {p_text(f.p_value)} | {holm_text(f)} | "
                     f"{f.reason}{'; ' + f.statistic if f.statistic else ''} |")
    return lines + [""]


def findings_table(findings: list[Finding]) -> Table:
    table = Table(title="findings (95% intervals; p two-sided, Holm-adjusted across the study)")
    for header in ("claim", "where", "estimate", "verdict", "p", "Holm", "why"):
        table.add_column(header)
    style = {"holds": "green", "does not hold": "red", "undetermined": "yellow", "not applicable": "dim"}
    for f in findings:
        table.add_row(CLAIMS[f.claim], where(f), estimate_text(f), f"[{style[f.verdict]}]{f.verdict}[/]", p_text(f.p_value), holm_text(f), f.reason)
    return table
