"""Checks that run before any model loads, so a mistake costs seconds, not a finished evaluation.

The model names must name something loadable; every split a command will read is loaded and
validated row by row, and the spec's templates are rendered on every row; the number of
demonstrations must fit the few-shot split; tuning needs rows to hold out for validation; a
given soft prompt must be a file; the output folder must be a folder (or creatable) that can be
written and has room (`folders.check_cell_folders` checks the folders a study makes in it).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from softeval._io import fix_for
from softeval.errors import SoftevalError
from softeval.models import model_kind
from softeval.tasks import DATA_ENV, TaskSpec, load_examples, resolve_data_dir, split_source
from softeval.tuning import check_tuning_rows, soft_prompt_file

log = logging.getLogger("softeval")

MIN_FREE_BYTES = 64 << 20  # results, samples and prompts of a typical grid fit many times over
PROBE_BYTES = 1 << 20  # written and removed, so a full disk or a file-size limit shows at once


def check_before_work(
    models: list[str],
    specs: list[TaskSpec],
    methods: list[str],
    *,
    k: int,
    tuning: bool,
    outputs: list[Path],
    data_dir: str | Path | None,
    limit: int | None = None,
    prompt: str | Path | None = None,
) -> None:
    """Everything a command can check without loading a model, in the order a user fixes it."""
    for name in models:
        model_kind(name)
    if prompt is not None:
        soft_prompt_file(prompt)
    root = resolve_data_dir(data_dir)
    if root is not None and root.exists() and not root.is_dir():
        raise SoftevalError(f"the data folder {root} (--data-dir or ${DATA_ENV}) is a file; give the benchmark mirror's root folder")
    for spec in specs:
        sizes = check_task(spec, splits_needed(spec, methods, tuning), data_dir)
        if methods and limit is not None:
            say_limit(spec, limit, sizes[spec.dataset.eval_split])
        if "few-shot" in methods:
            check_demonstrations(spec, k, sizes)
        if tuning:
            check_tuning_apart(spec, data_dir)
            check_tuning_rows(spec, sizes[spec.dataset.tune_split])
    for folder in outputs:
        check_output(folder)


def check_tuning_apart(spec: TaskSpec, data_dir=None) -> None:
    """Tuning reads other rows than evaluation scores (unless the spec allows it): a soft prompt
    tuned on its evaluation rows scores what it memorised. The same split, or two split names
    read from one file, are refused here; rows of another file with an evaluation row's content
    are left out of tuning when it starts (see `data.apart_from_evaluation`)."""
    ds = spec.dataset
    if ds.tune_on_eval_rows:
        return
    tune_source, eval_source = (split_source(spec, split, data_dir) for split in (ds.tune_split, ds.eval_split))
    if ds.tune_split != ds.eval_split and isinstance(tune_source, Path) and tune_source.resolve() == Path(eval_source).resolve():
        raise SoftevalError(
            f"task {spec.name} reads its tuning split '{ds.tune_split}' and its evaluation split '{ds.eval_split}' from one file, "
            f"{tune_source}: give the spec a tune_split of other rows (or dataset.tune_on_eval_rows: true to run it, flagged)"
        )
    if ds.tune_split == ds.eval_split:
        raise SoftevalError(
            f"task {spec.name} tunes on its evaluation split '{ds.eval_split}': soft-prompt and LoRA scores would be measured on the rows "
            "they were tuned on; give the spec a tune_split of other rows (or dataset.tune_on_eval_rows: true to run it, flagged)"
        )


def check_task(spec: TaskSpec, splits: list[str | None], data_dir: str | Path | None) -> dict[str, int]:
    """Load every row of each named split (errors name the file and line) and render the spec's
    templates on every row; returns the rows per split."""
    keys = ["template", "target"] + (["cloze_template"] if spec.is_multiple_choice else [])
    sizes = {}
    for split in dict.fromkeys(s for s in splits if s):
        examples = load_examples(spec, split, data_dir)
        for example in examples:
            for key in keys:
                _check_rendering(spec, key, example)
        sizes[split] = len(examples)
    return sizes


def _check_rendering(spec: TaskSpec, key: str, example) -> None:
    """A template renders to some text; with partial scoring, the cloze template renders each
    option's context, and differently for each."""
    where = f"task spec {spec.source_file or spec.name}: {key}"
    partial = key == "cloze_template" and example.cloze_contexts
    texts = [spec.render(key, example, cloze_context=c) for c in example.cloze_contexts] if partial else [spec.render(key, example)]
    if not all(t.strip() for t in texts):
        raise SoftevalError(f"{where} renders to nothing for {example.source}; give the {key} some text")
    if partial and len(set(texts)) == 1:
        raise SoftevalError(
            f"{where} renders the same text for every option of {example.source}; use {{{{ cloze_context }}}} in it"
        )


def say_limit(spec: TaskSpec, limit: int, rows: int) -> None:
    """A limit above the rows there are evaluates them all (and is recorded as no limit): said once."""
    if limit > rows:
        kept = " its filter keeps" if spec.filter else ""
        log.warning("--limit %d is above the %d rows%s of task %s's %s split: evaluating all of them", limit, rows, kept, spec.name, spec.dataset.eval_split)


def splits_needed(spec: TaskSpec, methods: list[str], tuning: bool) -> list[str | None]:
    """The splits a command reads: evaluation, few-shot demonstrations, tuning and validation."""
    ds = spec.dataset
    splits: list[str | None] = [ds.eval_split] if methods else []
    if "few-shot" in methods:
        splits.append(ds.fewshot_split)
    if tuning:
        splits += [ds.tune_split, ds.validation_split]
    return splits


def check_demonstrations(spec: TaskSpec, k: int, sizes: dict[str, int]) -> None:
    ds = spec.dataset
    available = sizes[ds.fewshot_split]
    shared = ds.fewshot_split == ds.eval_split
    if shared:  # an evaluated example is never its own demonstration
        available -= 1
    if k > available:
        why = f"{available + 1} rows, shared with evaluation" if shared else f"{available} rows"
        raise SoftevalError(
            f"--k {k} is more demonstrations than task {spec.name}'s few-shot split "
            f"'{ds.fewshot_split}' can give ({why}); use --k {available} or fewer"
        )


def check_output(folder: str | Path, option: str = "--output") -> None:
    """The folder is one (or can be made under its nearest existing parent), is writable and has
    room; nothing is created, so a later failure leaves no empty folders behind."""
    folder = Path(folder)
    existing = next(p for p in [folder, *folder.absolute().parents] if p.exists())
    if not existing.is_dir():
        where = f"{option} {folder} is a file" if existing == folder.absolute() else f"{option} {folder} cannot be made: {existing} is a file"
        raise SoftevalError(f"{where}, not a folder; give a folder path")
    try:  # an anonymous file: nothing to clean up, whatever happens
        with tempfile.TemporaryFile(dir=existing) as probe:
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise SoftevalError(f"cannot write in {existing} for {option} {folder}: {exc.strerror}; {fix_for(exc, option)}") from exc
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise SoftevalError(f"only {free >> 20} MiB free for {folder}; free disk space or choose another {option}")
