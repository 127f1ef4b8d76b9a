"""Export: a folder's finished cells in the files other tools read, keeping what softeval tells
apart (strict from lenient answers, format from knowledge, each score's bootstrap interval).

- `eee`: Every Eval Ever (schema 0.3.0), the datastore layout
  `data/<task>/<developer>/<model>/<uuid>.json` with its `<uuid>_samples.jsonl`, one pair per
  cell (model x task x method x chat mode); every metric is an evaluation result of its own.
- `lm-eval`: lm-evaluation-harness 0.4's `<model>/results_<time>.json` and
  `<model>/samples_<task>_<time>.jsonl`, one results file per model, method and chat mode with
  that group's tasks; the method is part of the model's name, so methods never share a file.

A series checkpoint's cells record its recipe, checkpoint, step and tokens (lm-eval: in the
config's `model_args` and the `softeval` block; Every Eval Ever: in the model's and the
generation's details), so a folder's series can be rebuilt from either export.

Metric names in lm-eval's `metric,filter` spelling: the filter says how the answer was read.

| softeval             | lm-eval key                                                              |
| format_following     | format_following,strict                                                  |
| task_accuracy        | task_accuracy,strict                                                     |
| conditional_accuracy | conditional_accuracy,strict                                              |
| lenient_accuracy     | lenient_accuracy,lenient                                                 |
| knowledge            | knowledge,acc_norm: option log-likelihoods per character (acc: summed);  |
|                      | knowledge,lenient: open-ended tasks; knowledge,loglikelihood: multiple   |
|                      | choice whose spec has changed since, so its normalisation is not known   |

lm-eval has standard errors, not intervals: `<metric>_stderr` is the 95% interval's half-width
/ 1.96, and the exact bounds are kept in the results file's `softeval` block.

No torch here, and nothing of the every-eval-ever or lm-eval packages: softeval writes the JSON.
"""

from __future__ import annotations

from pathlib import Path

from softeval.errors import SoftevalError
from softeval.reports.export_cells import described, series_checkpoints
from softeval.reports.export_eee import write_eee
from softeval.reports.export_lm_eval import write_lm_eval

EXPORT_FORMATS = ("eee", "lm-eval")


def export_folder(folder: str | Path, fmt: str, output: str | Path | None = None) -> list[Path]:
    """Write every finished cell of `folder` in format `fmt` (see EXPORT_FORMATS) under `output`
    (default: FOLDER/export/<fmt>/); returns the files written."""
    if fmt not in EXPORT_FORMATS:
        raise SoftevalError(f"--format: unknown format '{fmt}'; choose one of: {', '.join(EXPORT_FORMATS)}")
    folder = Path(folder)
    if not folder.is_dir():
        raise SoftevalError(f"no results folder at {folder}; give the --output folder of softeval eval, run or study")
    from softeval.analysis import finished_cells  # with scipy (1.5 s): not imported to answer a mistake

    results = finished_cells(folder)
    if not results:
        raise SoftevalError(f"{folder} holds no finished cells (OUTPUT/<model>/<task>/<method>/results.json); run softeval eval, run or study into it")
    cells = described(results, series_checkpoints(folder))
    output = Path(output) if output is not None else folder / "export" / fmt
    return write_eee(cells, output) if fmt == "eee" else write_lm_eval(cells, output)
