"""The `softeval` command line: parses arguments, calls the public API, prints."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from platformdirs import user_log_dir
from pydantic import ValidationError
from rich.logging import RichHandler
from rich.table import Table
from rich.text import Text

from softeval.data import split_sizes
from softeval.errors import SoftevalError
from softeval.evaluate import METHODS, evaluate
from softeval.export import export_peft
from softeval.models import (
    ALIASES,
    cache_root,
    cached_models,
    load_model,
    prepare_alias,
)
from softeval.preflight import check_before_work, check_output
from softeval.progress import console, stdout
from softeval.report import cell_label, metrics_table, write_comparison
from softeval.softprompt import load_soft_prompt
from softeval.study import run_study
from softeval.task import builtin_tasks, load_task
from softeval.tune import TuneConfig, check_resumable, sweep, tune

app = typer.Typer(help="Fair LLM benchmark evaluation: format-following apart from knowledge.", no_args_is_help=True)
models_app = typer.Typer(help="List and prepare models.", invoke_without_command=True)
app.add_typer(models_app, name="models")

DataDir = Annotated[Path | None, typer.Option(help="Local mirror in hub layout (or $SOFTEVAL_DATA_DIR).")]
CacheDir = Annotated[Path | None, typer.Option(help="Where converted models live (or $SOFTEVAL_CACHE).")]
Limit = Annotated[int | None, typer.Option(min=1, help="Evaluate a fixed, seeded subset of N rows.")]
Shots = Annotated[int, typer.Option(min=1, help="Demonstrations for few-shot.")]
BatchSize = Annotated[int, typer.Option(min=1, help="Evaluation rows per batch.")]
Steps = Annotated[int, typer.Option(min=1, help="Tuning steps.")]
Positive = Annotated[int, typer.Option(min=1)]

DEBUG_ENV = "SOFTEVAL_DEBUG"
log = logging.getLogger("softeval")


@dataclass
class Settings:
    """Options given before the command (`softeval --debug run ...`)."""

    debug: bool = False


settings = Settings()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[RichHandler(console=console, show_path=False)])
    log.setLevel(logging.INFO)  # softeval's own notes (resuming, reusing a prompt) are shown too
    try:
        # not standalone: usage errors come back here, to be printed as one line like every error
        code = app(standalone_mode=False)
    except SoftevalError as exc:
        _fail(str(exc))
    except typer.TyperException as exc:  # usage errors: unknown options, values out of range
        message = exc.format_message()
        if not message:  # help was shown instead (no arguments given)
            raise SystemExit(exc.exit_code) from None
        context = getattr(exc, "ctx", None)
        _fail(f"{message} (see '{context.command_path if context else 'softeval'} --help')", exc.exit_code)
    except typer.Abort:
        _fail("interrupted", 130)
    except Exception as exc:
        if settings.debug or os.environ.get(DEBUG_ENV):
            raise
        where = _write_crash_log(exc)
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        _fail(f"unexpected {type(exc).__name__}: {reason}; the traceback is in {where} (softeval --debug COMMAND ... prints it)", 1)
    if code == 130:
        _fail("interrupted", 130)
    raise SystemExit(code or 0)


def _fail(message: str, code: int = 2) -> None:
    # the message is printed as written: brackets in it are text, not terminal markup
    console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True, highlight=False)
    raise SystemExit(code) from None


def _write_crash_log(exc: Exception) -> Path:
    """The full traceback, with the command line, in a log file; returns its path."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    text = f"{' '.join(sys.argv)}\n\n" + "".join(traceback.format_exception(exc))
    for folder in (Path(user_log_dir("softeval")), Path(tempfile.gettempdir())):
        path = folder / f"crash-{stamp}-{os.getpid()}.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    return Path("(no writable log folder)")


@app.callback()
def options(
    debug: Annotated[bool, typer.Option("--debug", help="Print the full traceback of an unexpected error.")] = False,
) -> None:
    settings.debug = debug or bool(os.environ.get(DEBUG_ENV))


def tune_settings(option_names: dict[str, str] | None = None, **values) -> TuneConfig:
    """Tuning settings from the command line; an invalid one is a one-line error naming its option
    (`option_names` maps a setting to its option where the names differ)."""
    try:
        return TuneConfig(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0])
        option = (option_names or {}).get(field, "--" + field.replace("_", "-"))
        raise SoftevalError(f"{option}: {first['msg'].lower()}") from exc


@app.command("eval")
def eval_command(
    model: Annotated[list[str], typer.Option(help="Alias, local folder, .gguf file or hub id; repeatable.")],
    task: Annotated[list[str], typer.Option(help="Built-in task name or task YAML path; repeatable.")],
    output: Annotated[Path, typer.Option(help="Results go to OUTPUT/<model>/<task>/<method>/.")],
    method: Annotated[list[str], typer.Option(help=f"One of {', '.join(METHODS)}; repeatable.")] = ["zero-shot"],  # noqa: B006
    chat: Annotated[bool, typer.Option(help="Wrap prompts in the chat template (models that have one).")] = False,
    k: Shots = 5,
    prompt: Annotated[Path | None, typer.Option(help="Tuned soft prompt (file or tune folder) for --method soft-prompt.")] = None,
    limit: Limit = None,
    seed: int = 0,
    batch_size: BatchSize = 16,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
) -> None:
    """Evaluate models on tasks zero-shot or few-shot, and report format-following apart from knowledge."""
    for m in method:
        if m not in METHODS:
            raise SoftevalError(f"unknown method '{m}'; choose from: {', '.join(METHODS)}")
    if ("soft-prompt" in method) != (prompt is not None):
        raise SoftevalError("--method soft-prompt needs a tuned prompt (--prompt PATH), and only it takes one")
    # every check that needs no model comes first: a mistake costs seconds, not an evaluation
    specs = [load_task(t) for t in task]
    soft = load_soft_prompt(prompt) if prompt is not None else None
    check_before_work(model, specs, method, k=k, tuning=False, outputs=[output], data_dir=data_dir)
    results = []
    for spec_name in model:
        lm = load_model(spec_name, cache_dir=cache_dir)
        use_chat = chat and lm.post_trained
        if chat and not use_chat:
            log.warning("%s has no chat template: evaluated without --chat", lm.name)
        for spec in specs:
            for m in method:
                result = evaluate(
                    lm, spec, m, chat=use_chat, k=k, soft_prompt=soft if m == "soft-prompt" else None,
                    limit=limit, seed=seed, data_dir=data_dir, batch_size=batch_size,
                )
                folder = result.save(output / lm.name / spec.name / cell_label(result.config).replace(" +", "-"))
                console.print(f"wrote {folder}", highlight=False)
                results.append(result)
    write_comparison(results, output)
    stdout.print(metrics_table(results))


@app.command("run")
def run_command(
    model: Annotated[list[str], typer.Option(help="Alias, local folder, .gguf file or hub id; repeatable.")],
    task: Annotated[list[str], typer.Option(help="Built-in task name or task YAML path; repeatable.")],
    output: Annotated[Path, typer.Option(help="Report folder: cells, tuned prompts, curves, comparison.md.")],
    methods: Annotated[str, typer.Option(help="Comma-separated methods.")] = "zero-shot,few-shot,soft-prompt",
    chat: Annotated[bool, typer.Option(help="Also run post-trained models with their chat template.")] = False,
    k: Shots = 5,
    limit: Limit = None,
    steps: Steps = 120,
    tune_batch_size: Positive = 8,
    lr: float = 0.01,
    length: Annotated[int, typer.Option(min=1, help="Soft-prompt vectors (L).")] = 10,
    eval_every: Positive = 10,
    val_size: Positive = 64,
    sweep_grid: Annotated[bool, typer.Option("--sweep", help="Pick lr and init from a small grid first.")] = False,
    sweep_steps: Positive = 40,
    seed: int = 0,
    batch_size: BatchSize = 16,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
) -> None:
    """Tune where needed, evaluate every method, and write a comparison report."""
    config = tune_settings(
        {"batch_size": "--tune-batch-size"},
        steps=steps, batch_size=tune_batch_size, lr=lr, length=length, eval_every=eval_every, val_size=val_size,
    )
    results = run_study(
        model, task, [m.strip() for m in methods.split(",") if m.strip()], output=output, chat=chat, k=k, limit=limit,
        seed=seed, tune_config=config, sweep_grid=sweep_grid, sweep_steps=sweep_steps, data_dir=data_dir,
        cache_dir=cache_dir, batch_size=batch_size,
    )
    stdout.print(metrics_table(results))
    stdout.print(f"wrote {output / 'comparison.md'}", highlight=False)


@app.command("tune")
def tune_command(
    model: Annotated[str, typer.Option(help="Alias, local folder, .gguf file or hub id.")],
    task: Annotated[str, typer.Option(help="Built-in task name or task YAML path.")],
    output: Annotated[Path, typer.Option(help="Folder for soft_prompt.safetensors, curve.json, curve.png.")],
    steps: Steps = 120,
    batch_size: Annotated[int, typer.Option(min=1, help="Tuning examples per step.")] = 8,
    lr: float = 0.01,
    length: Annotated[int, typer.Option(min=1, help="Soft-prompt vectors (L).")] = 10,
    init: Annotated[str, typer.Option(help="vocab, text or random.")] = "vocab",
    init_text: Annotated[str | None, typer.Option(help="Words to start from with --init text.")] = None,
    eval_every: Annotated[int, typer.Option(min=1, help="Validate, record the curve and checkpoint every E steps.")] = 10,
    val_size: Positive = 64,
    chat: Annotated[bool, typer.Option(help="Tune with the chat template applied.")] = False,
    resume: Annotated[bool, typer.Option(help="Continue from OUTPUT/checkpoint.safetensors (from step 0 if there is none).")] = False,
    sweep_grid: Annotated[bool, typer.Option("--sweep", help="Pick lr and init from a small grid first.")] = False,
    sweep_steps: Annotated[int, typer.Option(min=1, help="Steps per sweep trial.")] = 40,
    export_peft_to: Annotated[Path | None, typer.Option("--export-peft", help="Also write a PEFT adapter folder.")] = None,
    seed: int = 0,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
) -> None:
    """Tune a soft prompt for a frozen model on a task's tuning split."""
    if init not in ("vocab", "text", "random"):
        raise SoftevalError(f"unknown init '{init}'; choose vocab, text or random")
    if resume and sweep_grid:
        raise SoftevalError("--resume and --sweep do not combine; resume the chosen run without --sweep")
    config = tune_settings(
        steps=steps, batch_size=batch_size, lr=lr, length=length, init=init, init_text=init_text,
        eval_every=eval_every, val_size=val_size, chat=chat, seed=seed,
    )
    spec = load_task(task)
    check_before_work([model], [spec], [], k=0, tuning=True, outputs=[output], data_dir=data_dir)
    if export_peft_to is not None:
        check_output(export_peft_to, "--export-peft")
    if resume:  # a checkpoint that cannot be resumed is reported before the model loads
        check_resumable(output / "checkpoint.safetensors", config)
    lm = load_model(model, cache_dir=cache_dir)
    if sweep_grid:
        summary = sweep(lm, spec, config, output=output, data_dir=data_dir, sweep_steps=sweep_steps)
    else:
        summary = tune(lm, spec, config, output=output, data_dir=data_dir, resume=resume)
    if export_peft_to is not None:
        export_peft(load_soft_prompt(output).vectors, lm, export_peft_to)
        stdout.print(f"wrote PEFT adapter {export_peft_to}", highlight=False)
    final = summary["final"]
    stdout.print(
        f"tuned {steps} steps in {summary['tuning_seconds']} s; validation: "
        + ", ".join(f"{k} {v:.3f}" for k, v in final.items() if isinstance(v, float)),
        highlight=False,
    )
    stdout.print(f"wrote {output / 'soft_prompt.safetensors'}", highlight=False)


@app.command("tasks")
def tasks_command(data_dir: DataDir = None) -> None:
    """List the built-in tasks with their splits and, where data is found locally, their sizes."""
    table = Table(title="tasks")
    for header in ["task", "format", "source", "eval", "tune", "few-shot"]:
        table.add_column(header)
    for name in builtin_tasks():
        spec = load_task(name)
        sizes = split_sizes(spec, data_dir)
        show = {split: split if n is None else f"{split} ({n})" for split, n in sizes.items()}.__getitem__
        ds = spec.dataset
        source = f"{ds.path}/{ds.config}" if ds.config else ds.path
        table.add_row(name, spec.answer_format, source, show(ds.eval_split), show(ds.tune_split), show(ds.fewshot_split))
    stdout.print(table)


@models_app.callback()
def models_command(ctx: typer.Context, cache_dir: CacheDir = None) -> None:
    """List the model aliases and the models prepared in the cache."""
    if ctx.invoked_subcommand is not None:
        return
    prepared = {m["alias"]: m["path"] for m in cached_models(cache_dir)}
    table = Table(title=f"models (cache: {cache_root(cache_dir)})")
    for header in ["alias", "kind", "prepared", "description"]:
        table.add_column(header)
    for alias in ALIASES.values():
        kind = "post-trained" if alias.post_trained else "base"
        table.add_row(alias.name, kind, prepared.get(alias.name, "no (softeval models pull NAME)"), alias.description)
    stdout.print(table)
    stdout.print("Any local folder, .gguf file or hub id (owner/name) also works as --model.")


@models_app.command("pull")
def pull_command(name: Annotated[str, typer.Argument(help="A model alias.")], cache_dir: CacheDir = None) -> None:
    """Convert an alias's packaged GGUF weights into the cache, once."""
    with console.status(f"preparing {name}"):
        folder = prepare_alias(name, cache_dir)
    console.print(f"{name}: {folder}", highlight=False)
