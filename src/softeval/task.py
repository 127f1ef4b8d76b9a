"""Task specs: benchmarks declared as YAML data, validated into `TaskSpec`.

A spec says where the data lives (hub path, config, splits, or local files), how a row maps to
the values scoring needs (`fields`, Jinja expressions), how a prompt and its tuning target are
rendered (Jinja templates), and the answer format, which picks the strict and lenient parsers.
Built-in specs live in `softeval/tasks/*.yaml`; a user spec is any YAML file of the same shape.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib.resources import files
from pathlib import Path

import yaml
from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from softeval._io import read_utf8
from softeval.errors import SoftevalError
from softeval.formats import FORMATS, AnswerFormat, Example, Normalization, answer_format


class DatasetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="hub dataset path, also the folder under a mirror root")
    config: str | None = None
    eval_split: str
    tune_split: str
    fewshot_split: str
    validation_split: str | None = Field(None, description="held-out split for tuning curves")
    # user tasks: split name -> JSONL/CSV/Parquet file, relative to the spec file
    data_files: dict[str, str] | None = None


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    dataset: DatasetSpec
    answer_format: str = Field(description=f"one of: {', '.join(FORMATS)}")
    fields: dict[str, str]
    instruction: str = ""
    template: str
    cloze_template: str | None = None
    target: str
    stop: list[str] = Field(min_length=1)
    max_new_tokens: int = Field(gt=0)
    max_answer_words: int = Field(10, gt=0, description="short_answer: longest first line strict accepts")
    normalization: Normalization = Field("squad", description="short_answer: the benchmark's answer normalisation")
    source_file: str | None = None  # where the spec was read from

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        if self.answer_format not in FORMATS:
            raise ValueError(f"unknown answer_format '{self.answer_format}'; choose one of: {', '.join(FORMATS)}")
        if FORMATS[self.answer_format].has_options and not self.cloze_template:
            raise ValueError(f"answer_format {self.answer_format} needs a cloze_template (the question for option scoring)")
        missing = [f for f in FORMATS[self.answer_format].fields if f not in self.fields]
        if missing:
            raise ValueError(f"answer_format {self.answer_format} needs fields: {', '.join(missing)}")
        for name, expression in self.fields.items():
            try:
                _env().compile_expression(expression)
            except TemplateError as exc:
                raise ValueError(f"field '{name}': invalid expression {expression!r}: {exc}") from exc
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
        return answer_format(self.answer_format, max_answer_words=self.max_answer_words, normalization=self.normalization)

    @property
    def is_multiple_choice(self) -> bool:
        return FORMATS[self.answer_format].has_options

    def render(self, key: str, example: Example) -> str:
        """One of the spec's templates (`template`, `cloze_template`, `target`) for one example."""
        try:
            return _compiled_template(getattr(self, key)).render(example.template_values())
        except RENDER_ERRORS as exc:
            where = self.source_file or f"task {self.name}"
            raise SoftevalError(
                f"task spec {where}: {key} cannot be rendered for {example.source}: {str(exc).rstrip('.')}; "
                f"fix the {key} or the row"
            ) from exc

    def sha256(self) -> str:
        """Identity of what the spec says, wherever its file lives."""
        return hashlib.sha256(self.model_dump_json(exclude={"source_file"}).encode()).hexdigest()


# what a template can raise on a row: undefined names, sandbox refusals, bad types or indices
RENDER_ERRORS = (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError)


@cache
def _env() -> SandboxedEnvironment:
    """Jinja sandbox for spec expressions: user specs cannot reach Python internals."""
    env = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=False)
    env.filters["regex_replace"] = lambda s, pattern, repl="": re.sub(pattern, repl, s)
    return env


def compile_fields(spec: TaskSpec) -> dict:
    """The spec's field expressions, compiled once: name -> callable(row) -> value."""
    return {name: _env().compile_expression(expr, undefined_to_none=False) for name, expr in spec.fields.items()}


@cache
def _compiled_template(source: str):
    return _env().from_string(source)


def builtin_task_files() -> dict[str, Path]:
    folder = files("softeval") / "tasks"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".yaml")}


def builtin_tasks() -> list[str]:
    return sorted(builtin_task_files())


def load_task(name_or_path: str | Path) -> TaskSpec:
    """A built-in task by name, or a user spec by path to its YAML file."""
    path = Path(name_or_path)
    builtins = builtin_task_files()
    if str(name_or_path) in builtins:
        path = builtins[str(name_or_path)]
    elif path.suffix not in (".yaml", ".yml"):
        raise SoftevalError(
            f"unknown task '{name_or_path}'; known tasks: {', '.join(builtin_tasks())}, or give a path to a task YAML"
        )
    if not path.is_file():
        raise SoftevalError(f"task spec not found: {path}")
    try:
        raw = yaml.safe_load(read_utf8(path))
    except yaml.YAMLError as exc:
        raise SoftevalError(f"task spec {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(raw, dict):
        raise SoftevalError(f"task spec {path} must be a YAML mapping of task fields")
    try:
        return TaskSpec(**raw, source_file=str(path.resolve()))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "spec"
        raise SoftevalError(f"task spec {path}: {where}: {first['msg']}") from exc
