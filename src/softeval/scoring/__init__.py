"""Scoring: each completion judged by its task's answer format, a cell's metrics with bootstrap
intervals and the diagnostics that say when they mean little, the result record a cell writes,
and the loop that runs an engine over examples and judges its output.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # likelihood
    "CLOZE_BYTES": "likelihood",
    "GOLD_MEANINGS": "likelihood",
    "GOLD_METRICS": "likelihood",
    "LOWER_IS_BETTER": "likelihood",
    # metrics
    "COLLAPSE_MARGIN": "metrics",
    "COLLAPSE_MIN_ANSWERS": "metrics",
    "COLLAPSE_SHARE": "metrics",
    "CONFIDENCE": "metrics",
    "CUT_SHARE": "metrics",
    "INTERVALS": "metrics",
    "MEANINGS": "metrics",
    "METRICS": "metrics",
    "Metric": "metrics",
    "ROW_METRICS": "metrics",
    "aggregate": "metrics",
    "score_sample": "metrics",
    # results
    "EvalResult": "results",
    "MODELS_FILE": "results",
    "SERIES_FILE": "results",
    "TRUTH_FILE": "results",
    # run
    "package_versions": "run",
    "parsers_version": "run",
    "run_examples": "run",
    "scores": "run",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
