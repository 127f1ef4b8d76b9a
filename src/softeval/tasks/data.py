"""Data: read a task's split from a mirror folder, local files or the hub, into validated examples.

Sources, in order: the spec's own `data_files` (user tasks); a mirror folder in hub layout
`ROOT/<path>/<config>/<split>.jsonl` given by `data_dir` or $SOFTEVAL_DATA_DIR; the Hugging Face
hub through `datasets`. Every row is checked against the spec as it is read, and a bad row is
reported by file and line.

Each split is read and turned into examples once per process: the checks before any work, the
cells' identities and their evaluation all take the same rows and examples (`_read`). A split is
known by its source and, for a file, by the sha256 of its bytes, so a file edited between two
reads is read again; examples are also known by the spec's identity.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import random
from contextlib import nullcontext
from pathlib import Path

from jinja2 import Undefined

from softeval._io import file_sha256, read_utf8
from softeval.errors import SoftevalError
from softeval.formats import AnswerFormat, Example
from softeval.models import hub_unreachable, offline
from softeval.tasks.spec import ANSWER_WORDS_QUANTILE, EXPRESSION_ERRORS, TaskSpec, compile_fields, keeps

DATA_ENV = "SOFTEVAL_DATA_DIR"

log = logging.getLogger("softeval")


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    if data_dir is not None:
        return Path(data_dir)
    return Path(os.environ[DATA_ENV]) if os.environ.get(DATA_ENV) else None


def load_examples(
    spec: TaskSpec,
    split: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[Example]:
    """The split's examples; with `limit`, a fixed seeded subset kept in split order."""
    if limit is not None and limit < 1:
        raise SoftevalError(f"limit {limit}: evaluate at least 1 row, or give no limit for the whole split")
    examples = _examples(spec, split, data_dir)
    if limit is not None and limit < len(examples):
        return [examples[i] for i in sorted(random.Random(seed).sample(range(len(examples)), limit))]
    return list(examples)


def _examples(spec: TaskSpec, split: str, data_dir: str | Path | None) -> list[Example]:
    """Every example of a split that the filter keeps, made once per spec and split contents."""
    source, source_key, rows = _read(spec, split, data_dir)
    key = (source_key, spec.sha256(), spec.answer_words)
    if key in _EXAMPLES:
        return _EXAMPLES[key]
    if not rows:
        raise SoftevalError(f"task {spec.name}: split '{split}' has no rows ({source} is empty); check the data source")
    kept = [i for i, (row, where) in enumerate(rows) if _keeps(spec, row, where)]
    if not kept:
        raise SoftevalError(f"task {spec.name}: the filter ({spec.filter}) keeps none of the {len(rows)} rows of split '{split}'")
    extract, answer_format = compile_fields(spec), spec.format
    # an example's index is its row's position in the split, filtered rows counted
    examples = [_to_example(spec, answer_format, extract, i, *rows[i]) for i in kept]
    _remember(_EXAMPLES, key, examples)
    return examples


def with_answer_words(spec: TaskSpec, data_dir: str | Path | None) -> TaskSpec:
    """The spec, for a short-answer task that sets no max_answer_words, with the words a bare
    answer may have: as many as ANSWER_WORDS_QUANTILE of the gold answers of its tuning split
    have at most. A whole sentence ("The capital of France is Paris.") then does not follow the
    format of a task whose answers are a few words."""
    if spec.answer_format != "short_answer" or spec.max_answer_words is not None or spec._answer_words is not None:
        return spec
    split = spec.dataset.tune_split
    words = sorted(len(e.answer.split()) for e in load_examples(spec, split, data_dir))
    limit = max(1, words[max(0, math.ceil(ANSWER_WORDS_QUANTILE * len(words)) - 1)])
    resolved = spec.model_copy()
    resolved._answer_words = (limit, f"{100 * ANSWER_WORDS_QUANTILE:.0f}% of the {len(words)} gold answers of split '{split}' have at most {limit}")
    return resolved


def content_key(example: Example) -> str:
    """What a row asks, for telling the same question in two splits: its question and options,
    in lower case with runs of whitespace made one space."""
    parts = [example.question, *(example.choices or [])]
    return "\x1f".join(" ".join(part.lower().split()) for part in parts)


def apart_from_evaluation(spec: TaskSpec, tuning: list[Example], data_dir: str | Path | None) -> tuple[list[Example], int]:
    """The tuning rows whose content is no evaluation row's (all of them, where the spec allows
    tuning on evaluation rows), and how many evaluation rows are among those kept."""
    evaluated = {content_key(e) for e in load_examples(spec, spec.dataset.eval_split, data_dir)}
    shared = [e for e in tuning if content_key(e) in evaluated]
    if spec.dataset.tune_on_eval_rows:
        return tuning, len(shared)
    if len(shared) == len(tuning):
        raise SoftevalError(
            f"task {spec.name}: every row of its tuning split '{spec.dataset.tune_split}' asks what a row of its evaluation split "
            f"'{spec.dataset.eval_split}' asks; give the spec a tune_split of other rows"
        )
    if shared:
        log.info("task %s: %d of the %d rows of its tuning split ask what an evaluation row asks; tuning leaves them out",
                 spec.name, len(shared), len(tuning))
    return [e for e in tuning if content_key(e) not in evaluated], 0


def load_rows(spec: TaskSpec, split: str, data_dir: str | Path | None = None) -> list[tuple[dict, str]]:
    """Raw rows of a split, each with its source location."""
    return list(_read(spec, split, data_dir)[2])


# The splits and examples read so far, by their source key (and the spec's identity): a command
# reads a few splits of a few tasks, each of at most a few megabytes.
_ROWS: dict[tuple, list[tuple[dict, str]]] = {}
_EXAMPLES: dict[tuple, list[Example]] = {}
MAX_REMEMBERED = 16


def _read(spec: TaskSpec, split: str, data_dir: str | Path | None) -> tuple[Path | str, tuple, list[tuple[dict, str]]]:
    """Where a split comes from, its source key (see `_source_key`: a file's holds its sha256)
    and its rows, read once per source contents."""
    source = split_source(spec, split, data_dir)
    if isinstance(source, Path) and not source.is_file():
        if spec.dataset.data_files is not None:
            raise SoftevalError(f"task {spec.name}: data file {source} not found; check dataset.data_files in the spec")
        raise SoftevalError(f"task {spec.name}: {source} not found; check --data-dir (expects <root>/<hub path>/<config>/<split>.jsonl)")
    key = _source_key(source)
    if key not in _ROWS:
        _remember(_ROWS, key, _read_hub(spec, split) if isinstance(source, str) else _read_file(source))
    if spec.lm_eval is None:
        return source, key, _ROWS[key]
    # an lm-eval task's rows are lm-eval's documents, with what lm-eval computes of each
    key = (*key, spec.lm_eval.task, spec.lm_eval.version)
    if key not in _ROWS:
        from softeval.tasks.lm_eval import lm_eval_docs

        _remember(_ROWS, key, lm_eval_docs(spec.lm_eval.task, split, _ROWS[key[:-2]]))
    return source, key, _ROWS[key]


def _source_key(source: Path | str) -> tuple:
    """A split's source as a key: the hub dataset's name, or a file's path and the sha256 of its
    bytes (a file's modification time may not change between two quick writes)."""
    if isinstance(source, str):
        return (source,)
    return (str(source.resolve()), file_sha256(source))


def _remember(memory: dict, key: tuple, value) -> None:
    if len(memory) >= MAX_REMEMBERED:
        memory.pop(next(iter(memory)))  # the oldest
    memory[key] = value


def split_source(spec: TaskSpec, split: str, data_dir: str | Path | None) -> Path | str:
    """Where a split is read from: the spec's own file, the mirror file, or (a string) the hub
    dataset, "hub:<path>/<config> split <split>"."""
    ds = spec.dataset
    if ds.data_files is not None:
        if split not in ds.data_files:
            raise SoftevalError(f"task {spec.name}: no file for split '{split}' in dataset.data_files")
        base = Path(spec.source_file).parent if spec.source_file else Path.cwd()
        return base / ds.data_files[split]
    root = resolve_data_dir(data_dir)
    if root is not None:
        return mirror_path(spec, split, root)
    return f"hub:{ds.path}" + (f"/{ds.config}" if ds.config else "") + f" split {split}"


def mirror_path(spec: TaskSpec, split: str, root: Path) -> Path:
    """ROOT/<path>/<config>/<split>.jsonl; a spec without a config reads `default`, or the data
    set's one config where the mirror holds one alone (as the hub's default config is read)."""
    folder = root / spec.dataset.path
    config = spec.dataset.config
    if config is None:
        configs = [f.name for f in folder.iterdir() if f.is_dir()] if folder.is_dir() else []
        config = configs[0] if len(configs) == 1 and not (folder / "default").is_dir() else "default"
    return folder / config / f"{split}.jsonl"


def data_identity(spec: TaskSpec, split: str, data_dir: str | Path | None) -> dict:
    """Which data a split was read from: the spec's hash, the file and its sha256 (or the hub path)."""
    identity = {"task": spec.name, "task_spec": spec.source_file, "spec_sha256": spec.sha256(), "split": split}
    source, key, rows = _read(spec, split, data_dir)  # rows a filter skips are counted, never silently dropped
    identity |= {"rows": len(rows), "filtered_out": sum(not _keeps(spec, row, where) for row, where in rows)}
    if isinstance(source, str):
        return identity | {"source": source}
    return identity | {"source": key[0], "sha256": key[1]}


def split_sizes(spec: TaskSpec, data_dir: str | Path | None) -> dict[str, int | None]:
    """Rows per split where the data is found locally (None where it is not); never touches the hub."""
    ds = spec.dataset
    names = [ds.eval_split, ds.tune_split, ds.fewshot_split, ds.validation_split]
    splits: dict[str, int | None] = dict.fromkeys(n for n in names if n)
    for split in splits:
        source = split_source(spec, split, data_dir)
        if isinstance(source, Path) and source.is_file():
            splits[split] = len(_read_file(source))
    return splits


def _read_file(path: Path) -> list[tuple[dict, str]]:
    if not path.is_file():
        raise SoftevalError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if suffix in (".csv", ".parquet"):
        import datasets

        # a CSV's mistakes are told by line here, before pandas' own errors (which name no line)
        lines = _csv_record_lines(path, read_utf8(path)) if suffix == ".csv" else None
        try:
            table = datasets.Dataset.from_csv(str(path)) if suffix == ".csv" else datasets.Dataset.from_parquet(str(path))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            raise SoftevalError(f"cannot read {path}: {str(exc).splitlines()[0][:200]}") from exc
        if lines is None or len(lines) != len(table):  # a parquet row is named by its position
            lines = [i + 2 if suffix == ".csv" else i for i in range(len(table))]
        return [(row, f"{path}:{line}") for line, row in zip(lines, table)]
    raise SoftevalError(f"unsupported data file {path}; use .jsonl, .csv or .parquet")


def _csv_record_lines(path: Path, text: str) -> list[int]:
    """The line each record of a CSV file starts on (a quoted field may hold newlines); a record
    with more or fewer fields than the header, or a quote left open, is an error naming its line."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    starts, start = [], 1
    try:
        header = next(reader, None)
        while header is not None:
            start = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                break
            if not record:  # a blank line
                continue
            if len(record) != len(header):
                raise SoftevalError(f"{path}:{start}: {len(record)} fields where the header has {len(header)}; "
                                    "quote a field that holds a comma, or fix the row")
            starts.append(start)
    except csv.Error as exc:
        raise SoftevalError(f"{path}:{start}: {exc} (a quote left open?); fix the quoting of the row") from exc
    return starts


def _read_jsonl(path: Path) -> list[tuple[dict, str]]:
    rows = []
    # split on newlines only: U+2028 and friends may sit inside a JSON string
    for number, line in enumerate(read_utf8(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SoftevalError(f"{path}:{number}: malformed JSON ({exc.msg}); fix or remove the line") from exc
        if not isinstance(row, dict):
            raise SoftevalError(f"{path}:{number}: a row must be a JSON object")
        rows.append((row, f"{path}:{number}"))
    return rows


def _read_hub(spec: TaskSpec, split: str) -> list[tuple[dict, str]]:
    import datasets

    unreachable = hub_unreachable()
    try:
        # where the hub cannot be reached, datasets reads its own cache at once instead of retrying
        with offline() if unreachable else nullcontext():
            table = datasets.load_dataset(spec.dataset.path, spec.dataset.config, split=split)
    except Exception as exc:  # noqa: BLE001 - network and hub errors come in many types
        reason = f"{unreachable}, and the datasets cache does not hold it" if unreachable else type(exc).__name__
        raise SoftevalError(
            f"task {spec.name}: cannot load {spec.dataset.path} ({split}) from the Hugging Face hub ({reason}); "
            f"pass --data-dir with a local mirror or set ${DATA_ENV}"
        ) from exc
    name = f"hub:{spec.dataset.path}/{spec.dataset.config}/{split}"
    return [(row, f"{name}[{i}]") for i, row in enumerate(table)]


def _keeps(spec: TaskSpec, row: dict, source: str) -> bool:
    try:
        return keeps(spec, row)
    except EXPRESSION_ERRORS as exc:
        raise SoftevalError(f"{source}: cannot evaluate the filter ({spec.filter}): {exc}; fix the task spec's filter or the row") from exc


def _to_example(spec: TaskSpec, answer_format: AnswerFormat, extract: dict, index: int, row: dict, source: str) -> Example:
    values = {}
    if spec.choices_from is not None:
        try:
            values["choices"], values["answer"] = spec.choices_from.options(row)
        except EXPRESSION_ERRORS as exc:
            raise SoftevalError(f"{source}: choices_from: {exc}") from exc
    for name, fn in extract.items():
        try:
            values[name] = fn(**row)
        except EXPRESSION_ERRORS as exc:
            raise _field_error(spec, name, source, str(exc)) from exc
        if _has_undefined(values[name]):
            raise _field_error(spec, name, source, "the row lacks a field it uses")
    return answer_format.example(values, index=index, source=source, row=row)


def _field_error(spec: TaskSpec, name: str, source: str, reason: str) -> SoftevalError:
    expression = spec.fields[name]
    if "'str'" in reason and "'int'" in reason:
        reason += " (a text column used as a number? add `| int`)"
    return SoftevalError(f"{source}: cannot compute field '{name}' ({expression}): {reason}; fix the task spec's fields or the row")


def _has_undefined(value) -> bool:
    """Jinja leaves a missing row field inside a list literal as an Undefined object."""
    if isinstance(value, Undefined):
        return True
    if isinstance(value, list | tuple):
        return any(_has_undefined(v) for v in value)
    return False
