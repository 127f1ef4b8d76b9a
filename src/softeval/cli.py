"""The `softeval` command line: parses arguments, calls the public API, prints."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.logging import RichHandler
from rich.table import Table

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
from softeval.progress import console, stdout
from softeval.report import cell_label, metrics_table, write_comparison
from softeval.softprompt import load_soft_prompt
from softeval.study import run_study
from softeval.task import builtin_tasks, load_task
from softeval.tune import TuneConfig, sweep, tune

app = typer.Typer(help="Fair LLM benchmark evaluation: format-following apart from knowledge.", no_args_is_help=True)
models_app = typer.Typer(help="List and prepare models.", invoke_without_command=True)
app.add_typer(models_app, name="models")

DataDir = Annotated[Path | None, typer.Option(help="Local mirror in hub layout (or $SOFTEVAL_DATA_DIR).")]
CacheDir = Annotated[Path | None, typer.Option(help="Where converted models live (or $SOFTEVAL_CACHE).")]


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[RichHandler(console=console, show_path=False)])
    try:
        app()
    except SoftevalError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None


@app.command("eval")
def eval_command(
    model: Annotated[list[str], typer.Option(help="Alias, local folder, .gguf file or hub id; repeatable.")],
    task: Annotated[list[str], typer.Option(help="Built-in task name or task YAML path; repeatable.")],
    output: Annotated[Path, typer.Option(help="Results go to OUTPUT/<model>/<task>/<method>/.")],
    method: Annotated[list[str], typer.Option(help=f"One of {', '.join(METHODS)}; repeatable.")] = ["zero-shot"],  # noqa: B006
    chat: Annotated[bool, typer.Option(help="Wrap prompts in the chat template (models that have one).")] = False,
    k: Annotated[int, typer.Option(help="Demonstrations for few-shot.")] = 5,
    prompt: Annotated[Path | None, typer.Option(help="Tuned soft prompt (file or tune folder) for --method soft-prompt.")] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate a fixed, seeded subset of N rows.")] = None,
    seed: int = 0,
    batch_size: int = 16,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
) -> None:
    """Evaluate models on tasks zero-shot or few-shot, and report format-following apart from knowledge."""
    for m in method:
        if m not in METHODS:
            raise SoftevalError(f"unknown method '{m}'; choose from: {', '.join(METHODS)}")
    specs = [load_task(t) for t in task]  # fail on a bad task before loading any model
    results = []
    for spec_name in model:
        lm = load_model(spec_name, cache_dir=cache_dir)
        use_chat = chat and lm.post_trained
        if chat and not use_chat:
            logging.getLogger("softeval").warning("%s has no chat template: evaluated without --chat", lm.name)
        soft = load_soft_prompt(prompt) if prompt is not None else None
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
    k: Annotated[int, typer.Option(help="Demonstrations for few-shot.")] = 5,
    limit: Annotated[int | None, typer.Option(help="Evaluate a fixed, seeded subset of N rows.")] = None,
    steps: int = 120,
    tune_batch_size: int = 8,
    lr: float = 0.01,
    length: Annotated[int, typer.Option(help="Soft-prompt vectors (L).")] = 10,
    eval_every: int = 10,
    val_size: int = 64,
    sweep_grid: Annotated[bool, typer.Option("--sweep", help="Pick lr and init from a small grid first.")] = False,
    sweep_steps: int = 40,
    seed: int = 0,
    batch_size: int = 16,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
) -> None:
    """Tune where needed, evaluate every method, and write a comparison report."""
    config = TuneConfig(steps=steps, batch_size=tune_batch_size, lr=lr, length=length, eval_every=eval_every, val_size=val_size)
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
    steps: int = 120,
    batch_size: int = 8,
    lr: float = 0.01,
    length: Annotated[int, typer.Option(help="Soft-prompt vectors (L).")] = 10,
    init: Annotated[str, typer.Option(help="vocab, text or random.")] = "vocab",
    init_text: Annotated[str | None, typer.Option(help="Words to start from with --init text.")] = None,
    eval_every: Annotated[int, typer.Option(help="Validate, record the curve and checkpoint every E steps.")] = 10,
    val_size: int = 64,
    chat: Annotated[bool, typer.Option(help="Tune with the chat template applied.")] = False,
    resume: Annotated[bool, typer.Option(help="Continue from OUTPUT/checkpoint.safetensors.")] = False,
    sweep_grid: Annotated[bool, typer.Option("--sweep", help="Pick lr and init from a small grid first.")] = False,
    sweep_steps: Annotated[int, typer.Option(help="Steps per sweep trial.")] = 40,
    export_peft_to: Annotated[Path | None, typer.Option("--export-peft", help="Also write a PEFT adapter folder.")] = None,
    seed: int = 0,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
) -> None:
    """Tune a soft prompt for a frozen model on a task's tuning split."""
    if init not in ("vocab", "text", "random"):
        raise SoftevalError(f"unknown init '{init}'; choose vocab, text or random")
    spec = load_task(task)
    config = TuneConfig(
        steps=steps, batch_size=batch_size, lr=lr, length=length, init=init, init_text=init_text,
        eval_every=eval_every, val_size=val_size, chat=chat, seed=seed,
    )
    lm = load_model(model, cache_dir=cache_dir)
    if sweep_grid:
        if resume:
            raise SoftevalError("--resume and --sweep do not combine; resume the chosen run without --sweep")
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
