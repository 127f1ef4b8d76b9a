"""Data: read a task's split from a mirror folder, local files or the hub, into validated examples.

Sources, in order: the spec's own `data_files` (user tasks); a mirror folder in hub layout
`ROOT/<path>/<config>/<split>.jsonl` given by `data_dir` or $SOFTEVAL_DATA_DIR; the Hugging Face
hub through `datasets`. Every row is checked against the spec as it is read, and a bad row is
reported by file and line.
"""

from __future__ import annotations

import json
import os
import random
import string
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import TemplateError, Undefined, UndefinedError

from softeval.errors import SoftevalError
from softeval.task import TaskSpec, compile_fields

DATA_ENV = "SOFTEVAL_DATA_DIR"
LETTERS = string.ascii_uppercase


@dataclass
class Example:
    """One benchmark item, with the values scoring needs already pulled out of its row."""

    index: int  # position in its split
    source: str  # "file:line" or "hub:split[index]", for error messages and sample logs
    row: dict
    question: str
    answer: str  # the gold answer: an option letter, a number, or the canonical short answer
    choices: list[str] | None = None
    answer_index: int | None = None
    aliases: list[str] = field(default_factory=list)
    solution: str | None = None

    @property
    def letters(self) -> list[str]:
        return list(LETTERS[: len(self.choices or [])])

    def template_values(self) -> dict:
        """What prompt and target templates can refer to: the row's own fields plus ours."""
        values = dict(self.row)
        values.update(question=self.question, answer=self.answer, aliases=self.aliases, solution=self.solution)
        if self.choices is not None:
            values.update(
                choices=self.choices,
                letters=self.letters,
                letter=self.answer,
                options="\n".join(f"{l}. {c}" for l, c in zip(self.letters, self.choices)),
            )
        return values


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
    rows = load_rows(spec, split, data_dir)
    if not rows:
        raise SoftevalError(f"task {spec.name}: split '{split}' is empty; check the data source")
    indices = range(len(rows))
    if limit is not None and limit < len(rows):
        indices = sorted(random.Random(seed).sample(indices, limit))
    extract = compile_fields(spec)
    return [_to_example(spec, extract, i, *rows[i]) for i in indices]


def load_rows(spec: TaskSpec, split: str, data_dir: str | Path | None = None) -> list[tuple[dict, str]]:
    """Raw rows of a split, each with its source location."""
    ds = spec.dataset
    if ds.data_files is not None:
        if split not in ds.data_files:
            raise SoftevalError(f"task {spec.name}: no file for split '{split}' in dataset.data_files")
        base = Path(spec.source_file).parent if spec.source_file else Path.cwd()
        return _read_file(base / ds.data_files[split])
    root = resolve_data_dir(data_dir)
    if root is not None:
        path = mirror_path(spec, split, root)
        if not path.is_file():
            raise SoftevalError(f"task {spec.name}: {path} not found; check --data-dir (expects <root>/<hub path>/<config>/<split>.jsonl)")
        return _read_file(path)
    return _read_hub(spec, split)


def mirror_path(spec: TaskSpec, split: str, root: Path) -> Path:
    return root / spec.dataset.path / (spec.dataset.config or "default") / f"{split}.jsonl"


def split_sizes(spec: TaskSpec, data_dir: str | Path | None) -> dict[str, int | None]:
    """Rows per split where the data is found locally (None where it is not); never touches the hub."""
    ds = spec.dataset
    names = [ds.eval_split, ds.tune_split, ds.fewshot_split, ds.validation_split]
    splits: dict[str, int | None] = dict.fromkeys(n for n in names if n)
    root = resolve_data_dir(data_dir)
    for split in splits:
        if ds.data_files is not None and split in ds.data_files:
            path = Path(spec.source_file).parent / ds.data_files[split]
        elif root is not None:
            path = mirror_path(spec, split, root)
        else:
            continue
        if path.is_file():
            splits[split] = sum(1 for _ in path.open(encoding="utf-8")) if path.suffix == ".jsonl" else len(_read_file(path))
    return splits


def _read_file(path: Path) -> list[tuple[dict, str]]:
    if not path.is_file():
        raise SoftevalError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if suffix in (".csv", ".parquet"):
        import datasets

        try:
            table = datasets.Dataset.from_csv(str(path)) if suffix == ".csv" else datasets.Dataset.from_parquet(str(path))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            raise SoftevalError(f"cannot read {path}: {str(exc).splitlines()[0][:200]}") from exc
        return [(row, f"{path}:{i + 2 if suffix == '.csv' else i}") for i, row in enumerate(table)]
    raise SoftevalError(f"unsupported data file {path}; use .jsonl, .csv or .parquet")


def _read_jsonl(path: Path) -> list[tuple[dict, str]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
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

    try:
        table = datasets.load_dataset(spec.dataset.path, spec.dataset.config, split=split)
    except Exception as exc:  # noqa: BLE001 - network and hub errors come in many types
        raise SoftevalError(
            f"task {spec.name}: cannot load {spec.dataset.path} ({split}) from the Hugging Face hub "
            f"({type(exc).__name__}); pass --data-dir with a local mirror or set ${DATA_ENV}"
        ) from exc
    name = f"hub:{spec.dataset.path}/{spec.dataset.config}/{split}"
    return [(row, f"{name}[{i}]") for i, row in enumerate(table)]


def _to_example(spec: TaskSpec, extract: dict, index: int, row: dict, source: str) -> Example:
    values = {}
    for name, fn in extract.items():
        try:
            values[name] = fn(**row)
        except (UndefinedError, TemplateError, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise SoftevalError(f"{source}: cannot compute field '{name}' ({spec.fields[name]}): {exc}") from exc
        if _has_undefined(values[name]):
            raise SoftevalError(f"{source}: cannot compute field '{name}' ({spec.fields[name]}): the row lacks a field it uses")
    question = values["question"]
    if not isinstance(question, str) or not question.strip():
        raise SoftevalError(f"{source}: field 'question' is empty or not text")
    example = Example(index=index, source=source, row=row, question=question, answer="")
    if spec.answer_format == "multiple_choice":
        choices, gold = values["choices"], values["answer"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise SoftevalError(f"{source}: field 'choices' must be a list of at least two strings")
        if len(choices) > len(LETTERS):
            raise SoftevalError(f"{source}: {len(choices)} options; at most {len(LETTERS)} are supported")
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
            raise SoftevalError(f"{source}: answer index {gold!r} is out of range for {len(choices)} options")
        example.choices, example.answer_index, example.answer = choices, gold, LETTERS[gold]
    else:
        answer = values["answer"]
        if not isinstance(answer, str | int | float) or not str(answer).strip():
            raise SoftevalError(f"{source}: field 'answer' is empty")
        example.answer = str(answer).strip()
        aliases = values.get("aliases") or []
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise SoftevalError(f"{source}: field 'aliases' must be a list of strings")
        example.aliases = list(dict.fromkeys([example.answer, *aliases]))
        example.solution = values.get("solution")
    return example


def _has_undefined(value) -> bool:
    """Jinja leaves a missing row field inside a list literal as an Undefined object."""
    if isinstance(value, Undefined):
        return True
    if isinstance(value, list | tuple):
        return any(_has_undefined(v) for v in value)
    return False
