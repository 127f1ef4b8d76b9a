"""Analysis of a folder's finished cells: their flags, paired comparisons, the ranking prediction,
the method's findings, and the statistics under them. Nothing here writes a file.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # comparisons
    "PAIRED_METRICS": "comparisons",
    "cell_flags": "comparisons",
    "cell_key": "comparisons",
    "cell_label": "comparisons",
    "finished_cells": "comparisons",
    "paired_comparisons": "comparisons",
    "tuned_agreement": "comparisons",
    # findings
    "CLAIMS": "findings",
    "Finding": "findings",
    "study_findings": "findings",
    # ranking
    "MIN_FAMILIES": "ranking",
    "families": "ranking",
    "ranking_analysis": "ranking",
    # series
    "read_series": "series",
    "series_analysis": "series",
    # settings
    "Reference": "settings",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
