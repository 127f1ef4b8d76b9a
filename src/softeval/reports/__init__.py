"""Reports: comparison.md and comparison.json, the ranking's files, the terminal's tables and the
report page, each from the folder's finished cells and their analysis.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # series
    "analyze": "series",
    "update_analysis": "series",
    # comparison
    "metrics_table": "comparison",
    "write_comparison": "comparison",
    # findings
    "findings_table": "findings",
    # page
    "PAGE": "page",
    "write_page": "page",
    # ranking
    "rank_study": "ranking",
    "ranking_table": "ranking",
    "update_ranking": "ranking",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
