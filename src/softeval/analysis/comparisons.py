"""Reporting: metric tables for the terminal, and the comparison of every finished cell of an
output folder (comparison.md and comparison.json), with paired differences between methods."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from softeval.analysis.stats import method_agreement, paired_difference
from softeval.errors import SoftevalError
from softeval.models import model_name
from softeval.scoring import ROW_METRICS, EvalResult
from softeval.tuning import METHODS

log = logging.getLogger("softeval")

# (method, baseline): the differences the comparison shows, where both cells exist
PAIRS = (("soft-prompt", "zero-shot"), ("soft-prompt", "few-shot"), ("soft-prompt", "lora"), ("lora", "few-shot"))
LINE_UP_R = 0.5  # soft-prompt and LoRA scores line up where Pearson r is above this
# the cell flags that make a score mean little: a finding resting on such a cell is undetermined
UNDERMINING = ("no strict answers", "at chance", "collapsed", "mostly empty", "tuned on its evaluation rows", "task version", "judged by parsers")
# flags that undermine any metric of a cell: it is not comparable, or measured on what it memorised
INVALIDATING = ("tuned on its evaluation rows", "task version", "judged by parsers")
# the flags that undermine each metric (others: INVALIDATING alone). Knowledge reads the options'
# likelihoods or a lenient parser, so a failed format does not undermine it, and format-following
# is what a format flag measures; knowledge collapsed onto one option undermines knowledge.
UNDERMINING_FOR = {"task_accuracy": UNDERMINING, "knowledge": (*INVALIDATING, "knowledge collapsed"), "format_following": INVALIDATING}
# the metrics compared row by row: per-row outcomes, so a paired bootstrap applies
PAIRED_METRICS = {m: ROW_METRICS[m] for m in ("task_accuracy", "knowledge", "format_following")}


def cell_label(config: dict) -> str:
    return config["method"] + ("-chat" if config.get("chat") else "")


def undermining(flags: list[str], metric: str = "task_accuracy") -> list[str]:
    """The flags among a cell's that make its `metric` mean little (see UNDERMINING_FOR)."""
    return [f for f in flags if f.startswith(UNDERMINING_FOR.get(metric, INVALIDATING))]


def cell_flags(results: list, among: list | None = None) -> dict[int, list[str]]:
    """Why each cell's score may mean little, by the cell's `id`: its diagnostics' flags (at
    chance, collapsed) and, where the cells of its task `among` the folder's (default: these)
    read different versions of the task's spec or data, its version (their scores do not
    compare, whatever a table puts side by side); where they were judged by different versions of
    the parsers, the parsers' version."""
    versions: dict[str, list] = {}
    parsers: dict[str, set] = {}
    for r in results + (among or []):
        known = versions.setdefault(r.config["task"], [])
        if evaluated_on(r) not in known:
            known.append(evaluated_on(r))
        parsers.setdefault(r.config["task"], set()).add(r.versions.get("parsers"))
    flagged = {}
    for r in results:
        flagged[id(r)] = list(r.diagnostics.flags) if r.diagnostics else []
        n_versions = len(versions[r.config["task"]])
        if n_versions > 1:
            spec, _, data = (str(part or "?")[:8] for part in evaluated_on(r))
            flagged[id(r)].append(f"task version {spec}/{data}, one of {n_versions} here: rerun older cells with --force")
        n_parsers = len(parsers[r.config["task"]])
        if n_parsers > 1:  # a rerun of the cell's command judges it again without generating
            flagged[id(r)].append(f"judged by parsers {r.versions.get('parsers') or 'unrecorded'}, one of {n_parsers} here: rerun its command")
    return flagged


# unreadable results files already told of (path and time written): the comparison, the ranking
# and the page each read every cell, and one warning is enough
_unreadable_told: set[tuple[Path, int]] = set()
# the cells of the folders read last, by results.json: the files' identity when read, and the cell
# (its samples left on disk, its rows' columns read once). The analysis, the comparison and the
# page read the same folder one after the other, and an evaluator that refreshes them after each
# checkpoint reads its folder again and again: only a cell that is new or changed is read anew.
_read: dict[Path, dict[Path, tuple[tuple, EvalResult]]] = {}
_FOLDERS_KEPT = 4


def finished_cells(folder: Path) -> list[EvalResult]:
    """Every finished cell under `folder` (OUTPUT/<model>/<task>/<cell>/results.json), ordered
    by task, model, method and chat mode; a cell that cannot be read is left out with a warning.
    The cells' samples stay on disk (`EvalResult.load(lazy=True)`): the analysis reads the rows'
    columns (`EvalResult.rows`)."""
    key = Path(folder).resolve()
    before = _read.pop(key, {})
    now: dict[Path, tuple[tuple, EvalResult]] = {}
    for path in sorted(Path(folder).glob("*/*/*/results.json")):
        try:
            identity = _identity(path)
            if path in before and before[path][0] == identity:
                now[path] = before[path]
            else:
                cell = EvalResult.load(path.parent, lazy=True)
                cell.files = identity
                _ = cell.rows  # read now: a damaged samples.jsonl leaves the cell out here, not halfway through a report
                now[path] = (identity, cell)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            seen = (path.resolve(), path.stat().st_mtime_ns if path.exists() else 0)
            if seen not in _unreadable_told:
                _unreadable_told.add(seen)
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:100]
                log.warning("left out of the comparison: %s cannot be read (%s); rerun the command that made it to evaluate it again",
                            path.parent, reason)
    _read[key] = now
    while len(_read) > _FOLDERS_KEPT:
        del _read[next(iter(_read))]
    kept = {(cell.folder, cell.files) for cells in _read.values() for _, cell in cells.values()}
    for done in [k for k in _derived if any(cell not in kept for cell in k[0])]:
        del _derived[done]
    results = [cell for _, cell in now.values()]
    rank = {m: i for i, m in enumerate(METHODS)}
    return sorted(results, key=lambda r: (r.config["task"], r.config["model"], rank.get(r.config["method"], 99), bool(r.config.get("chat"))))


def _identity(results: Path) -> tuple:
    """The size, modification time and inode of a cell's results.json and samples.jsonl: a cell
    written again (rerun, rejudged; each file replaced by an atomic rename) differs in them."""
    stats = [results.stat(), (results.parent / "samples.jsonl").stat()]
    return tuple((s.st_size, s.st_mtime_ns, s.st_ino) for s in stats)


def paired_comparisons(results: list[EvalResult], *, seed: int = 0) -> list[dict]:
    """For each model, task and chat mode, each method minus a baseline on the rows both were
    evaluated on, with paired bootstrap 95% intervals."""
    cells = {(cell_key(r)[0], r.config["task"], bool(r.config.get("chat")), r.config["method"]): r for r in results}
    comparisons = []
    for (model, task, chat, method), result in cells.items():
        for first, baseline in PAIRS:
            other = cells.get((model, task, chat, baseline))
            if method != first or other is None:
                continue
            if evaluated_on(result) != evaluated_on(other):
                log.warning("no paired comparison of %s and %s on %s: other versions of the task or its data", method, baseline, task)
                continue
            entry = _paired(result, other, seed)
            if entry is not None:  # copied: a reader's change to one stays out of the kept figures
                copied = {k: dict(v) if isinstance(v, dict) else v for k, v in entry.items()}
                comparisons.append({"model": cell_key(result)[0], "task": task, "chat": chat, "method": method, "baseline": baseline} | copied)
    return comparisons


def _paired(result: EvalResult, other: EvalResult, seed: int) -> dict | None:
    """The rows both cells evaluated (n) and the paired difference on them of each paired metric;
    None below 2 rows. Computed once per pair of cells' files: the comparison and the page of one
    folder compare the same pairs, and a folder refreshed after each checkpoint its older pairs."""
    return derived([result, other], ("paired", seed), lambda: _paired_difference(result, other, seed))


def _paired_difference(result: EvalResult, other: EvalResult, seed: int) -> dict | None:
    a, b = result.rows, other.rows
    rows = np.intersect1d(a.index, b.index)
    if len(rows) < 2:
        return None
    return {"n": len(rows)} | {metric: paired_difference(a.values(field, rows), b.values(field, rows), seed=seed).model_dump()
                               for metric, field in PAIRED_METRICS.items()}


def cell_key(result: EvalResult) -> tuple[str, str, str, bool]:
    """(model name, task, method, chat) of a cell."""
    config = result.config
    return model_name(config["model"]), config["task"], config["method"], bool(config.get("chat"))


def evaluated_on(result: EvalResult) -> tuple:
    """The task spec and evaluation data a cell read. A row index means the same question only
    between cells that agree on both: cells are paired row by row only then."""
    data = result.data
    return data.get("spec_sha256"), data.get("split"), data.get("sha256") or data.get("source")


# figures computed from one cell's rows or a pair's (a paired difference, a checkpoint's point on
# a curve, its format gap), by the cells' folders and files and what else they depend on: a
# folder analysed again after each checkpoint computes only the new cells' figures
_derived: dict[tuple, dict | None] = {}


def derived(cells: Sequence[EvalResult], what: tuple, compute: Callable[[], dict | None]) -> dict | None:
    """`compute()`, or what it gave before for the same cells' files and the same `what` (every
    other input it reads, hashable); a copy either way, so a reader's change stays its own."""
    if any(cell.files is None for cell in cells):  # cells not read from a folder: nothing to know them by
        return compute()
    key = (tuple((cell.folder, cell.files) for cell in cells), what)
    if key not in _derived:
        _derived[key] = compute()
    return None if _derived[key] is None else dict(_derived[key])


def common_rows(results: list[EvalResult]) -> list[int]:
    """The rows every one of the cells evaluated, so all are compared on the same rows; an error
    when the cells read different versions of the task or its data."""
    if len({evaluated_on(r) for r in results}) > 1:
        task = results[0].config["task"]
        raise SoftevalError(
            f"the cells of task {task} were evaluated on different versions of its spec or data; "
            "rerun the older cells (softeval ... --force) so they compare the same questions"
        )
    return sorted(set.intersection(*(set(r.rows.index.tolist()) for r in results)))


def outcome_table(results: list[EvalResult], rows: list[int], field: str) -> np.ndarray:
    """(cells, rows) per-row outcomes (`field` of each sample), columns in `rows` order."""
    if not results:
        return np.empty((0, len(rows)))
    return np.stack([result.rows.values(field, rows) for result in results])


def tuned_agreement(cells: dict, *, n_resamples: int = 2000, seed: int = 0) -> dict | None:
    """Soft prompt against LoRA task accuracy across every (model, task, chat mode) that has both
    (`cells` keyed by `cell_key`): Pearson r and Kendall tau-b with intervals; None below 3 cells."""
    both = [(model, task, chat) for (model, task, method, chat) in cells if method == "soft-prompt" and (model, task, "lora", chat) in cells]
    if len(both) < 3:
        return None
    x, y, tasks = [], [], []
    for task in dict.fromkeys(t for _, t, _ in both):
        keys = [k for k in both if k[1] == task]
        try:
            rows = common_rows([cells[(m, task, method, c)] for m, _, c in keys for method in ("soft-prompt", "lora")])
        except SoftevalError as exc:
            log.warning("soft prompt vs LoRA leaves out %s: %s", task, exc)
            continue
        if len(rows) < 2:
            continue
        for model, _, chat in keys:
            x.append(outcome_table([cells[(model, task, "soft-prompt", chat)]], rows, "task_correct")[0])
            y.append(outcome_table([cells[(model, task, "lora", chat)]], rows, "task_correct")[0])
            tasks.append(task)
    if len(x) < 3:
        return None
    agreement = method_agreement(x, y, tasks, n_resamples=n_resamples, seed=seed, against=LINE_UP_R)
    return agreement.model_dump() | {"metric": "task_accuracy", "cells": [list(k) for k in both if k[1] in tasks]}


