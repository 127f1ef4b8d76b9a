"""Task specs: benchmarks declared as YAML data, validated into `TaskSpec`.

A spec says where the data lives (hub path, config, splits, or local files), how a row maps to
the values scoring needs (`fields`, Jinja expressions), how a prompt and its tuning target are
rendered (Jinja templates), and the answer format, which picks the strict and lenient parsers.
Built-in specs live in `softeval/tasks/builtin/*.yaml`; a user spec is any YAML file of the same shape.
"""

from __future__ import annotations

import difflib
import hashlib
import random
import re
from functools import cache
from importlib.resources import files
from pathlib import Path

from jinja2 import StrictUndefined, TemplateError, Undefined
from jinja2.sandbox import SandboxedEnvironment
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from softeval._io import read_yaml_mapping
from softeval.errors import SoftevalError, validation_problem
from softeval.formats import FORMATS, AnswerFormat, ClozeNormalization, Example, Normalization, answer_format, last_boxed


class DatasetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="hub dataset path, also the folder under a mirror root")
    config: str | None = None
    eval_split: str
    tune_split: str
    fewshot_split: str
    validation_split: str | None = Field(None, description="held-out split for tuning curves")
    # Tuning a soft prompt or adapter on the rows it is then scored on measures memory, not the
    # method: a tune_split that is the eval_split is refused, and tuning rows whose content is an
    # evaluation row's are left out. True allows both; every such cell is flagged.
    tune_on_eval_rows: bool = False
    # user tasks: split name -> JSONL/CSV/Parquet file, relative to the spec file
    data_files: dict[str, str] | None = None


class LmEvalSource(BaseModel):
    """A task built from lm-evaluation-harness's configuration of it (see `lm_eval.py`)."""

    model_config = ConfigDict(extra="forbid")
    task: str
    version: str  # lm-eval's, and the task's own: either may change what a row becomes
    task_version: str


class ChoicesFrom(BaseModel):
    """Options built from separate columns: the correct answer placed among the distractors."""

    model_config = ConfigDict(extra="forbid")

    correct: str = Field(description="expression for the correct option's text")
    distractors: list[str] = Field(min_length=1, description="expressions for the other options' texts")

    def options(self, row: dict) -> tuple[list[str], int]:
        """The options in a shuffled order and the correct one's index. The order is seeded by the
        option texts alone, so it is the same on every run and machine, whatever else the row holds
        and whichever file format it came from."""
        expressions = {"choices_from.correct": self.correct}
        expressions |= {f"choices_from.distractors[{i}]": d for i, d in enumerate(self.distractors)}
        options = [_option_text(key, expression, row) for key, expression in expressions.items()]
        if len(set(options)) < len(options):
            raise ValueError(f"two options have the same text ({', '.join(options)}); skip such rows with a filter")
        order = list(range(len(options)))
        random.Random("\x1f".join(sorted(options))).shuffle(order)
        return [options[i] for i in order], order.index(0)


def _option_text(key: str, expression: str, row: dict) -> str:
    value = _evaluate(expression, row)
    if isinstance(value, Undefined) or value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{key} ({expression}) is missing or empty; skip such rows with a filter")
    return value if isinstance(value, str) else str(value)  # a numeric column reads as its text


DEFAULT_ANSWER_WORDS = 10  # where a short-answer task's gold answers were not read
# a bare answer is at most as long as this share of the task's own gold answers
ANSWER_WORDS_QUANTILE = 0.99


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    dataset: DatasetSpec
    answer_format: str = Field(description=f"one of: {', '.join(FORMATS)}")
    fields: dict[str, str]
    choices_from: ChoicesFrom | None = Field(None, description="multiple choice: `choices` and `answer` from columns")
    filter: str | None = Field(None, description="expression over a row: rows where it is false are skipped")
    instruction: str = ""
    # what precedes knowledge (cloze) prompts: the instruction asks for a letter, which cloze
    # scoring does not use; lm-eval's tasks put their description here, as lm-eval scores them
    cloze_instruction: str = ""
    template: str
    cloze_template: str | None = None
    target: str
    stop: list[str] = Field(min_length=1)
    max_new_tokens: int = Field(gt=0)
    max_answer_words: int | None = Field(
        None, gt=0, description="short_answer: longest first line strict accepts (default: from the task's own gold answers)"
    )
    normalization: Normalization = Field("squad", description="short_answer: the benchmark's answer normalisation")
    cloze_normalization: ClozeNormalization = Field(
        "characters", description="multiple choice, knowledge: option log-likelihoods per character (acc_norm) or summed (none: acc)"
    )
    lm_eval: LmEvalSource | None = None  # rows become lm-eval's documents first
    source_file: str | None = None  # where the spec was read from: its file, or lm-eval:NAME
    # short_answer without max_answer_words: (words, how they were found) from the gold answers,
    # once `data.with_answer_words` has read them; not part of what the spec says
    _answer_words: tuple[int, str] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        if self.answer_format not in FORMATS:
            raise ValueError(f"unknown answer_format '{self.answer_format}'; choose one of: {', '.join(FORMATS)}")
        if FORMATS[self.answer_format].has_options and not self.cloze_template:
            raise ValueError(f"answer_format {self.answer_format} needs a cloze_template (the question for option scoring)")
        built = {"choices", "answer"} if self.choices_from else set()
        clash = sorted(built & set(self.fields))
        if clash:
            raise ValueError(
                f"choices_from builds choices and answer; drop fields {', '.join(clash)} "
                "(an included spec's field is dropped by setting it to null)"
            )
        missing = [f for f in FORMATS[self.answer_format].fields if f not in self.fields and f not in built]
        if missing:
            raise ValueError(f"answer_format {self.answer_format} needs fields: {', '.join(missing)}")
        expressions = dict(self.fields) | ({"filter": self.filter} if self.filter else {})
        if self.choices_from:
            expressions["choices_from.correct"] = self.choices_from.correct
            expressions |= {f"choices_from.distractors[{i}]": d for i, d in enumerate(self.choices_from.distractors)}
        for name, expression in expressions.items():
            try:
                _env().compile_expression(expression)
            except TemplateError as exc:
                raise ValueError(f"{name}: invalid expression {expression!r}: {exc}") from exc
        for name in ("template", "cloze_template", "target"):
            if getattr(self, name) is not None:
                try:
                    _env().from_string(getattr(self, name))
                except TemplateError as exc:
                    raise ValueError(f"{name}: invalid template: {exc}") from exc
        return self

    @property
    def format(self) -> AnswerFormat:
        """The answer format with this spec's settings: parsers, correctness, validation."""
        return answer_format(self.answer_format, max_answer_words=self.answer_words[0], normalization=self.normalization,
                             cloze_normalization=self.cloze_normalization)

    @property
    def answer_words(self) -> tuple[int, str]:
        """The most words a strict short answer may have, and where that number comes from."""
        if self.max_answer_words is not None:
            return self.max_answer_words, "set by the task spec"
        # a spec whose gold answers were not read (row validation needs no word limit)
        return self._answer_words or (DEFAULT_ANSWER_WORDS, "the default")

    @property
    def is_multiple_choice(self) -> bool:
        return FORMATS[self.answer_format].has_options

    def render(self, key: str, example: Example, **extra) -> str:
        """One of the spec's templates (`template`, `cloze_template`, `target`) for one example;
        `extra` values are added to the example's (an option's `cloze_context`)."""
        try:
            return _compiled_template(getattr(self, key)).render(example.template_values() | extra)
        except EXPRESSION_ERRORS as exc:
            where = self.source_file or f"task {self.name}"
            raise SoftevalError(
                f"task spec {where}: {key} cannot be rendered for {example.source}: {str(exc).rstrip('.')}; "
                f"fix the {key} or the row"
            ) from exc

    def sha256(self) -> str:
        """Identity of what the spec says, wherever its file lives. Settings left at their default
        are left out, so a new optional setting does not change the identity of existing specs."""
        said = self.model_dump_json(exclude={"source_file"}, exclude_defaults=True)
        return hashlib.sha256(said.encode()).hexdigest()


# what a template or expression can raise on a row: undefined names, sandbox refusals, bad types or indices
EXPRESSION_ERRORS = (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError)


@cache
def _env() -> SandboxedEnvironment:
    """Jinja sandbox for spec expressions: user specs cannot reach Python internals."""
    env = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=False)
    env.filters["regex_replace"] = lambda s, pattern, repl="": re.sub(pattern, repl, s)
    env.filters["last_boxed"] = last_boxed  # a math solution's final answer
    return env


def compile_fields(spec: TaskSpec) -> dict:
    """The spec's field expressions, compiled once: name -> callable(row) -> value."""
    return {name: _compiled_expression(expr) for name, expr in spec.fields.items()}


@cache
def _compiled_template(source: str):
    return _env().from_string(source)


@cache
def _compiled_expression(source: str):
    return _env().compile_expression(source, undefined_to_none=False)


def _evaluate(expression: str, row: dict):
    return _compiled_expression(expression)(**row)


def keeps(spec: TaskSpec, row: dict) -> bool:
    """Whether a row passes the spec's `filter` (every row does without one)."""
    return spec.filter is None or bool(_evaluate(spec.filter, row))


def builtin_task_files() -> dict[str, Path]:
    folder = files("softeval.tasks") / "builtin"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".yaml")}


def builtin_tasks() -> list[str]:
    return sorted(builtin_task_files())


def load_task(name_or_path: str | Path) -> TaskSpec:
    """A built-in task by name, a task of lm-evaluation-harness (`lm-eval:NAME`), or a user spec
    by path to its YAML file."""
    from softeval.tasks.lm_eval import is_lm_eval_task, lm_eval_spec

    if is_lm_eval_task(str(name_or_path)):
        try:
            return TaskSpec(**lm_eval_spec(str(name_or_path)), source_file=str(name_or_path))
        except ValidationError as exc:
            raise SoftevalError(f"task {name_or_path}: {validation_problem(exc, TaskSpec)}") from exc
    path = _spec_file(name_or_path)
    raw = _read_spec(path, seen=())
    try:
        return TaskSpec(**raw, source_file=str(path.resolve()))
    except ValidationError as exc:
        raise SoftevalError(f"task spec {path}: {validation_problem(exc, TaskSpec)}") from exc


def _spec_file(name_or_path: str | Path, relative_to: Path | None = None) -> Path:
    """A built-in task's file, or a YAML path (relative to `relative_to` when given)."""
    builtins = builtin_task_files()
    if str(name_or_path) in builtins:
        return builtins[str(name_or_path)]
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        close = difflib.get_close_matches(str(name_or_path).replace("-", "_").lower(), builtin_tasks(), n=1, cutoff=0.7)
        if close:
            raise SoftevalError(f"unknown task '{name_or_path}'; did you mean '{close[0]}'? (softeval tasks lists them)")
        raise SoftevalError(
            f"unknown task '{name_or_path}'; known tasks: {', '.join(builtin_tasks())}, lm-eval:NAME for a task of lm-evaluation-harness, "
            "or give a path to a task YAML"
        )
    path = relative_to / path if relative_to is not None and not path.is_absolute() else path
    if not path.is_file():
        raise SoftevalError(f"task spec not found: {path}; check the path, or give a built-in task name (softeval tasks lists them)")
    return path.resolve()


def _read_spec(path: Path, seen: tuple[Path, ...]) -> dict:
    """A spec file's mapping, merged over the spec it `include`s (a built-in name or a path
    relative to the file): the including file's keys override, mappings key by key."""
    raw = read_yaml_mapping(path, "task spec", "task fields")
    if "include" not in raw:
        return raw
    included = raw.pop("include")
    if not isinstance(included, str):
        raise SoftevalError(f"task spec {path}: include must name one task or YAML file")
    if "name" not in raw:  # results are filed by task name: a variant must not reuse its base's
        raise SoftevalError(f"task spec {path}: a spec that includes another needs its own name")
    base_path = _spec_file(included, relative_to=path.parent)
    if base_path.resolve() in seen:
        raise SoftevalError(f"task spec {path}: include {base_path} includes itself in the end; break the cycle")
    base = _read_spec(base_path, (*seen, path.resolve()))
    files = base.get("dataset", {}).get("data_files")
    if files:  # the base's data files stay relative to the base's own file
        base["dataset"]["data_files"] = {split: str(base_path.parent / f) for split, f in files.items()}
    return _merged(base, raw)


def _merged(base: dict, override: dict) -> dict:
    """`override` over `base`: mappings merge key by key, a null removes the base's key."""
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merged(base[key], value)
        else:
            merged[key] = value
    return merged
