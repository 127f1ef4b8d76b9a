"""Reports: comparison.md and comparison.json, the ranking's files, the terminal's tables, the
report page and the exports to other tools' formats, each from the folder's finished cells and
their analysis.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # series
    "analysis_files": "series",
    "analyze": "series",
    "update_analysis": "series",
    # comparison
    "metrics_table": "comparison",
    "write_comparison": "comparison",
    # export
    "EXPORT_FORMATS": "export",
    "export_folder": "export",
    # findings
    "findings_table": "findings",
    # page
    "PAGE": "page",
    "write_page": "page",
    # ranking
    "rank_study": "ranking",
    "ranking_table": "ranking",
    "update_ranking": "ranking",
    # trackers
    "check_trackers": "trackers",
    "log_to_trackers": "trackers",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
