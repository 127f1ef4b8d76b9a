"""The `softeval` command line: parses arguments, calls the public API, prints."""

from __future__ import annotations

import json
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

# Only light modules here: `--help`, and a mistake in a command, are answered without importing
# torch, transformers or scipy (seconds); the machinery is imported where it is used.
from softeval.analysis import Reference
from softeval.errors import CellsFailed, SoftevalError
from softeval.models import ALIASES, cache_root, cached_models, prepare_alias
from softeval.progress import console, stdout
from softeval.study import LoraSettings, Study, cell_folder, check_before_work, check_output, load_study, run_study
from softeval.tasks import builtin_tasks, load_task, resolve_data_dir, split_sizes
from softeval.tuning import METHODS, TuneConfig


def _flags_take_no_value() -> None:
    """Typer 0.29 lists a flag's type as `<bool>` in --help, which reads as if it took a value
    (`softeval --debug true models`); a flag takes none, so none is shown."""
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "flags_take_no_value", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_take_no_value = True
    option.display_type_rich = display_type_rich


_flags_take_no_value()
app = typer.Typer(help="Fair LLM benchmark evaluation: format-following apart from knowledge.", no_args_is_help=True)
models_app = typer.Typer(help="List and prepare models.", invoke_without_command=True)
app.add_typer(models_app, name="models")

DataDir = Annotated[Path | None, typer.Option(help="Local mirror in hub layout (or $SOFTEVAL_DATA_DIR).")]
CacheDir = Annotated[Path | None, typer.Option(help="Where converted models live (or $SOFTEVAL_CACHE).")]
Limit = Annotated[int | None, typer.Option(min=1, help="Evaluate a fixed, seeded subset of N rows.")]
Shots = Annotated[int, typer.Option(min=1, help="Demonstrations for few-shot.")]
BatchSize = Annotated[int | None, typer.Option(min=1, help="The most rows per evaluation batch (default: as many as the token and KV-cache budgets allow).")]
Steps = Annotated[int, typer.Option(min=1, help="Tuning steps.")]
Seed = Annotated[int, typer.Option(min=0, help="Seeds the row subset, demonstrations, tuning batches and bootstrap intervals.")]

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
        code = app(args=with_ray_default(sys.argv[1:]), standalone_mode=False)
    except SoftevalError as exc:
        _fail(str(exc))
    except typer.TyperException as exc:  # usage errors: unknown options, values out of range
        message = exc.format_message()
        if not message:  # help was shown instead (no arguments given)
            raise SystemExit(exc.exit_code) from None
        context = getattr(exc, "ctx", None)
        _fail(f"{message} (see '{context.command_path if context else 'softeval'} --help')", exc.exit_code)
    except typer.Abort:
        _fail(_interrupted(), 130)
    except Exception as exc:
        if settings.debug or os.environ.get(DEBUG_ENV):
            raise
        where = _write_crash_log(exc)
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        _fail(f"unexpected {type(exc).__name__}: {reason}; the traceback is in {where} (softeval --debug COMMAND ... prints it)", 1)
    if code == 130:
        _fail(_interrupted(), 130)
    raise SystemExit(code or 0)


def _interrupted() -> str:
    """What an interrupted command kept, and how to go on from it."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if command in ("run", "eval", "study"):
        return "interrupted; finished cells and tuning checkpoints are kept: rerun the same command to do the rest"
    if command == "watch":
        return "interrupted; evaluated checkpoints are kept: rerun the same command to go on where it stopped"
    if command == "tune":
        return "interrupted; the last checkpoint is kept: rerun the same command with --resume to continue from it"
    return "interrupted"


def with_ray_default(args: list[str]) -> list[str]:
    """`--ray` with no address means a local cluster: the command line's parser has no option
    with an optional value, so the default is filled in here."""
    filled = list(args)
    for i, arg in enumerate(filled):
        if arg == "--ray" and (i + 1 == len(filled) or filled[i + 1].startswith("-")):
            filled.insert(i + 1, "local")
            break
    return filled


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


Models = Annotated[list[str], typer.Option("--model", help="Alias, local folder, .gguf file or hub id; a training run's folder (or a glob of "
                  "checkpoints) is a series of its checkpoints; repeatable.")]
Role = Annotated[str | None, typer.Option(help="Declare every --model a base or a post-trained model (the findings otherwise guess it from "
                 "the chat template).")]
Tasks = Annotated[list[str], typer.Option("--task", help="Built-in task name, lm-eval:NAME (a task of lm-evaluation-harness) or task YAML path; repeatable.")]
Chat = Annotated[bool, typer.Option(help="Also run post-trained models with their chat template.")]
Force = Annotated[bool, typer.Option(help="Redo finished cells (and their tuning) instead of skipping them.")]
Ray = Annotated[str | None, typer.Option(help="Run each (model, task) on Ray: --ray alone (or 'local') starts a local cluster; or give a cluster's address.")]
Wandb = Annotated[str | None, typer.Option("--wandb", metavar="PROJECT", help="Also log the results to this W&B project (needs the wandb package).")]
Mlflow = Annotated[str | None, typer.Option("--mlflow", metavar="URI", help="Also log the results to the MLflow tracking server or store at URI (needs the mlflow package).")]
TUNE = TuneConfig()  # the command line's tuning defaults are the library's


def grid_models(models: list[str], role: str | None) -> dict:
    """The models of a command line, as a study names them: a training run's folder or a glob of
    checkpoint folders is a series (named after the run's folder), so `softeval analyze` reads
    the checkpoints as a recipe's; any other --model is a model, declared `role` where given."""
    from softeval.models import expand_checkpoints, local_checkpoint

    if role not in (None, "base", "post-trained"):
        raise SoftevalError(f"--role: unknown role '{role}'; choose base or post-trained")
    entries, series = [], []
    for model in models:
        spec = local_checkpoint(model)
        if expand_checkpoints(model) != [spec]:  # a run's folder or a glob: its checkpoints
            if role == "post-trained":
                raise SoftevalError(f"--role post-trained: {model} holds a training run's checkpoints, which are base models; drop --role")
            globbed = any(c in spec for c in "*?[")
            name = Path(spec.rstrip("/")).parent.name if globbed else Path(spec.rstrip("/")).name
            series.append({"name": name, "checkpoints": model})
        else:
            entries.append({"model": model} | ({"role": role} if role else {}))
    return {"models": entries, "series": series}


def methods_list(values: list[str]) -> list[str]:
    """--method is repeatable and takes comma-separated lists: `--method zero-shot,few-shot`."""
    methods = _split(values)
    if not methods:
        raise SoftevalError(f"--method: give at least one of {', '.join(METHODS)}")
    return methods


def _split(values: list[str]) -> list[str]:
    """A repeatable option that also takes comma-separated lists, as given."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


# study settings whose command-line option is spelt otherwise
OPTION_NAMES = {"methods": "--method", "models": "--model", "tasks": "--task", "tuning.batch_size": "--tune-batch-size",
                "tuning.lr": "--lr", "lora.rank": "--lora-rank", "lora.lr": "--lora-lr", "lora.targets": "--lora-targets"}


def validated(model: type, option_names: dict[str, str] | None = None, **values):
    """A settings model (a Study, a Reference) from command-line options; an invalid value is a
    one-line error naming its option."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"] if not str(part).isdigit()]
        names = OPTION_NAMES | (option_names or {})
        option = names.get(".".join(loc), "--" + loc[-1].replace("_", "-")) if loc else "options"
        message = first["msg"].removeprefix("Value error, ")
        raise SoftevalError(f"{option}: {message[:1].lower()}{message[1:]}") from exc


def finish(output: Path, reports) -> None:
    """The cells of this command as a table, and where the comparison is."""
    from softeval.analysis import cell_key, finished_cells
    from softeval.reports import PAGE, metrics_table

    # the folder's cells are read once: this command's are shown, all of them set the version flags
    cells = finished_cells(output)
    by_folder = {cell_folder(output, *cell_key(r)): r for r in cells}
    results = [by_folder[r.folder] for r in reports if r.folder in by_folder]
    skipped = sum(r.status == "skipped" for r in reports)
    if skipped:
        console.print(f"{skipped} of {len(reports)} cells were finished already (same identity) and were kept; --force redoes them", highlight=False)
    from softeval.analysis import Finding
    from softeval.reports.findings import counts_table, findings_table
    from softeval.reports.summary import summary_tables

    saved = []  # the findings of every finished cell in the folder
    if (output / "comparison.json").is_file():
        saved = [Finding(**f) for f in json.loads((output / "comparison.json").read_text(encoding="utf-8")).get("findings", [])]
    analysis = json.loads((output / "analysis.json").read_text(encoding="utf-8")) if (output / "analysis.json").is_file() else None
    for table in summary_tables(analysis, saved):  # the answer first: the ranking's verdicts, what the series say
        stdout.print(table)
    stdout.print(metrics_table(results, among=cells))
    if saved:
        stdout.print(findings_table(saved))
        if any(f.model is not None for f in saved):
            stdout.print(counts_table(saved))
    stdout.print(f"wrote {output / 'comparison.md'}", highlight=False)
    if (output / "analysis.json").is_file():  # the folder's series analysis, redone by this command
        print_analysis_files(output)
    stdout.print(f"report: {output / PAGE}", highlight=False)


def print_analysis_files(folder: Path) -> None:
    from softeval.reports import analysis_files

    analysis = json.loads((folder / "analysis.json").read_text(encoding="utf-8"))
    for path in [folder / "analysis.json", *analysis_files(folder, analysis)]:
        stdout.print(f"wrote {path}", highlight=False)


def run_logged(study: Study, output: Path, wandb: str | None, mlflow: str | None, **run):
    """run_study, then the folder logged to the trackers asked for (--wandb, --mlflow), also when
    some cells failed: the finished ones are kept, so they are logged too."""
    if not (wandb or mlflow):
        return run_study(study, output=output, **run)
    from softeval.reports import PAGE, check_trackers, log_to_trackers

    check_trackers(wandb=wandb, mlflow=mlflow)  # a missing package is told before the study, not after it
    page = output / PAGE
    before = page.stat().st_mtime_ns if page.is_file() else None
    try:
        reports = run_study(study, output=output, **run)
    except SoftevalError as exc:
        # the page is rewritten once the cells have run and some finished: only then is there a run to log
        if page.is_file() and page.stat().st_mtime_ns != before:
            try:  # the tracker's run records why each cell failed
                log_to_trackers(output, wandb=wandb, mlflow=mlflow, failure=exc.reasons() if isinstance(exc, CellsFailed) else str(exc))
            except SoftevalError as tracking:  # the study's error is the one that ends the command
                log.error("%s", tracking)
        raise
    log_to_trackers(output, wandb=wandb, mlflow=mlflow)
    return reports


@app.command("eval")
def eval_command(
    model: Models,
    task: Tasks,
    output: Annotated[Path, typer.Option(help="Results go to OUTPUT/<model>/<task>/<method>/.")],
    method: Annotated[list[str], typer.Option(help=f"Of {', '.join(m for m in METHODS if m != 'lora')}; repeatable or comma-separated.")] = ["zero-shot"],  # noqa: B006
    chat: Chat = False,
    role: Role = None,
    k: Shots = 5,
    prompt: Annotated[Path | None, typer.Option(help="Tuned soft prompt (file or tune folder) for --method soft-prompt.")] = None,
    limit: Limit = None,
    seed: Seed = 0,
    batch_size: BatchSize = None,
    force: Force = False,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
    wandb: Wandb = None,
    mlflow: Mlflow = None,
) -> None:
    """Evaluate models on tasks zero-shot, few-shot or with a given soft prompt; nothing is tuned."""
    methods = methods_list(method)
    if "lora" in methods:
        raise SoftevalError("--method lora tunes an adapter: use softeval run or softeval study")
    if "soft-prompt" in methods and prompt is None:
        raise SoftevalError("--method soft-prompt needs a tuned prompt (--prompt PATH); to tune one and evaluate it, use softeval run or softeval study")
    if prompt is not None and "soft-prompt" not in methods:
        raise SoftevalError("--prompt is evaluated by the soft-prompt method only; add --method soft-prompt")
    study = validated(
        Study, **grid_models(model, role), tasks=task, methods=methods, chat=chat, k=k, limit=limit, seed=seed, batch_size=batch_size,
    )
    finish(output, run_logged(study, output, wandb, mlflow, prompt=prompt, data_dir=data_dir, cache_dir=cache_dir, force=force))


@app.command("run")
def run_command(
    model: Models,
    task: Tasks,
    output: Annotated[Path, typer.Option(help="Report folder: cells, tuned prompts and adapters, curves, comparison.md.")],
    method: Annotated[list[str], typer.Option(help=f"Of {', '.join(METHODS)}; repeatable or comma-separated.")] = ["zero-shot,few-shot,soft-prompt"],  # noqa: B006
    chat: Chat = False,
    role: Role = None,
    k: Shots = 5,
    limit: Limit = None,
    steps: Steps = TUNE.steps,
    tune_batch_size: Annotated[int, typer.Option(min=1, help="Tuning examples per step.")] = TUNE.batch_size,
    lr: Annotated[float, typer.Option(help="Soft-prompt learning rate.")] = TUNE.lr,
    length: Annotated[int, typer.Option(min=1, help="Soft-prompt vectors (L).")] = TUNE.length,
    lora_rank: Annotated[int, typer.Option(min=1, help="LoRA rank.")] = LoraSettings().rank,
    lora_lr: Annotated[float, typer.Option(help="LoRA learning rate.")] = LoraSettings().lr,
    lora_targets: Annotated[list[str] | None, typer.Option(help="LoRA target modules; repeatable or comma-separated (default: each model's attention projections).")] = None,
    eval_every: Annotated[int, typer.Option(min=1, help="Validate and checkpoint every E tuning steps.")] = TUNE.eval_every,
    val_size: Annotated[int, typer.Option(min=1, help="Validation rows scored during tuning.")] = TUNE.val_size,
    sweep_grid: Annotated[bool, typer.Option("--sweep", help="Pick the soft prompt's lr and init from a small grid first.")] = False,
    sweep_steps: Annotated[int, typer.Option(min=1, help="Steps per sweep trial.")] = 40,
    seed: Seed = 0,
    batch_size: BatchSize = None,
    force: Force = False,
    ray: Ray = None,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
    wandb: Wandb = None,
    mlflow: Mlflow = None,
) -> None:
    """Tune soft prompts and LoRA adapters where needed, evaluate every method, compare them."""
    study = validated(
        Study, **grid_models(model, role), tasks=task, methods=methods_list(method), chat=chat, k=k, limit=limit,
        seed=seed, batch_size=batch_size, sweep=sweep_grid, sweep_steps=sweep_steps,
        tuning={"steps": steps, "batch_size": tune_batch_size, "lr": lr, "length": length, "eval_every": eval_every, "val_size": val_size},
        lora={"rank": lora_rank, "lr": lora_lr, "targets": _split(lora_targets) if lora_targets else None},
    )
    finish(output, run_logged(study, output, wandb, mlflow, data_dir=data_dir, cache_dir=cache_dir, force=force, ray=ray))


@app.command("study")
def study_command(
    study_file: Annotated[Path, typer.Argument(help="Study YAML: models (family, role), tasks, methods, settings.")],
    output: Annotated[Path, typer.Option(help="Report folder; rerunning into it does only unfinished cells.")],
    force: Force = False,
    ray: Ray = None,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
    wandb: Wandb = None,
    mlflow: Mlflow = None,
) -> None:
    """Run a study file's grid, then rank base models against post-trained ones where pairs exist."""
    study = load_study(study_file)
    finish(output, run_logged(study, output, wandb, mlflow, data_dir=data_dir, cache_dir=cache_dir, force=force, ray=ray))
    if (output / "ranking.json").is_file():  # the study ranked its families: show it
        from softeval.reports import ranking_table

        analysis = json.loads((output / "ranking.json").read_text(encoding="utf-8"))
        stdout.print(ranking_table(analysis))
        stdout.print(f"wrote {output / 'ranking.md'}", highlight=False)


@app.command("rank")
def rank_command(
    folder: Annotated[Path, typer.Argument(help="An output folder of softeval study or run.")],
    reference_method: Annotated[str, typer.Option(help="Method of the post-trained reference scores.")] = Reference().method,
    reference_chat: Annotated[bool, typer.Option(help="Reference scores with the chat template.")] = Reference().chat,
    reference_metric: Annotated[str, typer.Option(help="Metric of the reference scores.")] = Reference().metric,
) -> None:
    """How well each method's base-model scores predict the post-trained models' ranking."""
    reference = validated(
        Reference, {"method": "--reference-method", "metric": "--reference-metric"},
        method=reference_method, chat=reference_chat, metric=reference_metric,
    )
    show_ranking(folder, reference)


@app.command("analyze")
def analyze_command(
    folder: Annotated[Path, typer.Argument(help="An output folder of a study that declares series (pre-training recipes).")],
    target: Annotated[
        str | None,
        typer.Option(help="What orders the recipes: 'reference' (their post-trained models; the default where every series declares one) "
                     "or 'last' (their last checkpoints)."),
    ] = None,
    target_method: Annotated[str | None, typer.Option(help="Method of the last checkpoints' score, with --target last (default: soft-prompt, "
                             "else the first of few-shot, zero-shot, lora the checkpoints have).")] = None,
    target_metric: Annotated[str, typer.Option(help="Metric of the target, and of the scores ordered against it.")] = "task_accuracy",
    threshold: Annotated[float, typer.Option(min=0, max=1, help="Decision accuracy a method must keep from its earliest decision on.")] = 0.8,
) -> None:
    """Which pre-training recipe is better, and from how many tokens each method can tell."""
    if target_method is not None and target_method not in METHODS:
        raise SoftevalError(f"--target-method: unknown method '{target_method}'; choose one of: {', '.join(METHODS)}")
    if target_metric not in ("task_accuracy", "knowledge", "format_following"):
        raise SoftevalError(f"--target-metric: '{target_metric}' is no curve metric; choose task_accuracy, knowledge or format_following")
    if target not in (None, "reference", "last"):
        raise SoftevalError(f"--target: unknown target '{target}'; choose reference (the recipes' post-trained models) or last (their last checkpoints)")
    if not folder.is_dir():
        raise SoftevalError(f"no results folder at {folder}; give the --output folder of softeval study")
    from softeval.reports import analyze, write_comparison, write_page

    analyze(folder, target=target, target_method=target_method, target_metric=target_metric, threshold=threshold)
    write_comparison(folder)  # its findings read the analysis (agreement with true knowledge)
    page = write_page(folder)  # its section on checkpoints
    stdout.print((folder / "analysis.md").read_text(encoding="utf-8"), highlight=False, markup=False)
    print_analysis_files(folder)
    stdout.print(f"report: {page}", highlight=False)


@app.command("testbed")
def testbed_command(
    folder: Annotated[Path, typer.Argument(help="Where the testbed goes: world, tasks, checkpoints, references, ground truth, study.yaml.")],
    seed: Annotated[int, typer.Option(min=0, help="Seeds the world, the data and every model's training.")] = 0,
    size: Annotated[str, typer.Option(help="small (the test suite's) or full (make testbed).")] = "small",
    recipes: Annotated[str | None, typer.Option(help="Only these recipes, comma-separated (each trained as in the whole testbed).")] = None,
    in_loop: Annotated[Path | None, typer.Option(help="Also evaluate each recipe's checkpoints from inside its pre-training loop, into this folder.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Build a pre-training testbed where the truth is known: recipes of tiny models that know a
    measured share of invented facts, their checkpoints and post-trained references, and a study."""
    from softeval.tasks import resolve_data_dir
    from softeval.testbed import build_testbed, describe

    check_output(folder, "FOLDER")
    if in_loop is not None:
        check_output(in_loop, "--in-loop")
    chosen = _split([recipes]) if recipes is not None else None
    design = build_testbed(folder, seed=seed, size=size, data_dir=resolve_data_dir(data_dir), recipes=chosen, in_loop=in_loop)
    for line in describe(design):
        stdout.print(line, highlight=False, markup=False)
    stdout.print(f"built in {design['seconds']:.0f} s; wrote {folder / 'study.yaml'}; run it with: softeval study {folder / 'study.yaml'} --output OUT",
                 highlight=False)
    if in_loop is not None and (in_loop / "analysis.md").is_file():  # what the checkpoints evaluated in the loop decide
        stdout.print((in_loop / "analysis.md").read_text(encoding="utf-8"), highlight=False, markup=False)
        print_analysis_files(in_loop)
    if in_loop is not None:
        from softeval.reports import PAGE

        stdout.print(f"in-loop evaluations: {in_loop / 'evaluations.jsonl'}; report: {in_loop / PAGE}", highlight=False)


@app.command("watch")
def watch_command(
    runs: Annotated[list[Path], typer.Argument(help="Training run folders; each checkpoint folder in them (checkpoint-N/, step-N/) is evaluated once complete.")],
    output: Annotated[Path, typer.Option(help="Report folder: each run a series of checkpoints, with analysis, comparison and page.")],
    study_file: Annotated[Path | None, typer.Option("--study", help="A study file whose settings (tasks, methods, limit, tuning) the checkpoints are evaluated with.")] = None,
    task: Annotated[list[str] | None, typer.Option("--task", help="Built-in task, lm-eval:NAME or task YAML; repeatable (or give --study).")] = None,
    method: Annotated[list[str] | None, typer.Option(help=f"Of {', '.join(METHODS)}; repeatable or comma-separated (default zero-shot, few-shot, soft-prompt).")] = None,
    k: Shots = 5,
    limit: Limit = None,
    steps: Steps = TUNE.steps,
    eval_every: Annotated[int, typer.Option(min=1, help="Validate every E tuning steps.")] = TUNE.eval_every,
    val_size: Annotated[int, typer.Option(min=1, help="Validation rows scored during tuning.")] = TUNE.val_size,
    warm_start: Annotated[bool | None, typer.Option(help="Tune each checkpoint's soft prompt from the previous checkpoint's (default: on).")] = None,
    tokens_per_step: Annotated[float | None, typer.Option(min=0, help="Tokens per training step, where a checkpoint's name and trainer state give none.")] = None,
    until_step: Annotated[int | None, typer.Option(min=0, help="Stop once every run has a checkpoint at or past this step evaluated.")] = None,
    poll: Annotated[float, typer.Option(min=0.05, help="Seconds between looks at the run folders.")] = 30.0,
    settle: Annotated[float, typer.Option(min=0, help="Seconds a checkpoint's files must stay unchanged (where its trainer marks no finished save).")] = 10.0,
    once: Annotated[bool, typer.Option(help="Evaluate what is complete now, then stop.")] = False,
    refresh_every: Annotated[float, typer.Option(min=0, help="Write the analysis, comparison and page at most every S seconds (0: after each checkpoint).")] = 0.0,
    seed: Seed = 0,
    data_dir: DataDir = None,
    wandb: Wandb = None,
    mlflow: Mlflow = None,
) -> None:
    """Evaluate training runs' checkpoints as they land, with no change to the trainer."""
    import signal
    import threading

    from softeval.loop.settings import LoopSettings, load_loop_settings

    flags = {key: value for key, value in {"warm_start": warm_start, "tokens_per_step": tokens_per_step}.items() if value is not None}
    if study_file is not None:
        if task or method:
            raise SoftevalError("--study gives the tasks and methods; drop --task and --method (or --study)")
        settings = load_loop_settings(study_file, **flags)
    elif not task:
        raise SoftevalError("give the tasks to evaluate: --task NAME (repeatable), or --study FILE")
    else:
        settings = validated(
            LoopSettings, tasks=task, methods=methods_list(method) if method else ["zero-shot", "few-shot", "soft-prompt"], k=k, limit=limit,
            seed=seed, tuning={"steps": steps, "eval_every": eval_every, "val_size": val_size}, **flags,
        )
    from softeval.loop import watch

    stop = threading.Event()  # SIGTERM (a scheduler's stop): the checkpoint under way is finished first
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watched = watch(runs, output=output, settings=settings, data_dir=data_dir, poll=poll, settle=settle, until_step=until_step, once=once,
                    stop=stop, wandb=wandb, mlflow=mlflow, refresh_every=refresh_every)
    stdout.print(f"evaluated {len(watched)} checkpoints", highlight=False)
    if (output / "analysis.json").is_file():
        print_analysis_files(output)
    from softeval.reports import PAGE

    if (output / PAGE).is_file():
        stdout.print(f"report: {output / PAGE}", highlight=False)


@app.command("report")
def report_command(folder: Annotated[Path, typer.Argument(help="An output folder of softeval eval, run or study.")]) -> None:
    """Write FOLDER/index.html (and the comparison) from the results on disk."""
    if not folder.is_dir():
        raise SoftevalError(f"no results folder at {folder}; give the --output folder of softeval eval, run or study")
    from softeval.analysis import finished_cells
    from softeval.reports import write_comparison, write_page

    if not finished_cells(folder):
        raise SoftevalError(f"{folder} holds no finished cells (OUTPUT/<model>/<task>/<method>/results.json); run softeval eval, run or study into it")
    write_comparison(folder)
    stdout.print(f"report: {write_page(folder)}", highlight=False)


@app.command("export")
def export_command(
    folder: Annotated[Path, typer.Argument(help="An output folder of softeval eval, run or study.")],
    fmt: Annotated[str, typer.Option("--format", help="eee (Every Eval Ever 0.3.0 logs and samples) or lm-eval (lm-evaluation-harness results and samples).")],
    output: Annotated[Path | None, typer.Option(help="Where the files go (default: FOLDER/export/<format>/).")] = None,
) -> None:
    """Write the folder's finished cells in another tool's format, every metric with its interval."""
    from softeval.reports import export_folder  # checks the format and the folder before writing

    written = export_folder(folder, fmt, output)
    stdout.print(f"wrote {len(written)} files to {output or folder / 'export' / fmt}", highlight=False)


def show_ranking(folder: Path, reference: Reference) -> None:
    from softeval.reports import rank_study, ranking_table, write_comparison, write_page

    analysis = rank_study(folder, reference)
    write_comparison(folder)  # its findings read the ranking
    stdout.print(ranking_table(analysis))
    stdout.print(f"wrote {folder / 'ranking.md'}", highlight=False)
    stdout.print(f"report: {write_page(folder)}", highlight=False)


@app.command("tune")
def tune_command(
    model: Annotated[str, typer.Option(help="Alias, local folder, .gguf file or hub id.")],
    task: Annotated[str, typer.Option(help="Built-in task name, lm-eval:NAME (a task of lm-evaluation-harness) or task YAML path.")],
    output: Annotated[Path, typer.Option(help="Folder for soft_prompt.safetensors, curve.json, curve.svg.")],
    steps: Steps = TUNE.steps,
    tune_batch_size: Annotated[int, typer.Option(min=1, help="Tuning examples per step.")] = TUNE.batch_size,
    lr: Annotated[float, typer.Option(help="Soft-prompt learning rate.")] = TUNE.lr,
    length: Annotated[int, typer.Option(min=1, help="Soft-prompt vectors (L).")] = TUNE.length,
    init: Annotated[str, typer.Option(help="vocab, text or random.")] = TUNE.init,
    init_text: Annotated[str | None, typer.Option(help="Words to start from with --init text.")] = None,
    eval_every: Annotated[int, typer.Option(min=1, help="Validate and checkpoint every E tuning steps.")] = TUNE.eval_every,
    val_size: Annotated[int, typer.Option(min=1, help="Validation rows scored during tuning.")] = TUNE.val_size,
    chat: Annotated[bool, typer.Option(help="Tune the prompt for the chat-template mode of a post-trained model.")] = False,
    resume: Annotated[bool, typer.Option(help="Continue from OUTPUT/checkpoint.safetensors (from step 0 if there is none).")] = False,
    sweep_grid: Annotated[bool, typer.Option("--sweep", help="Pick lr and init from a small grid first.")] = False,
    sweep_steps: Annotated[int, typer.Option(min=1, help="Steps per sweep trial.")] = 40,
    export_peft_to: Annotated[Path | None, typer.Option("--export-peft", help="Also write a PEFT adapter folder.")] = None,
    seed: Seed = 0,
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
) -> None:
    """Tune a soft prompt for a frozen model on a task's tuning split."""
    if resume and sweep_grid:
        raise SoftevalError("--resume and --sweep do not combine; resume the chosen run without --sweep")
    config = validated(
        TuneConfig, {"batch_size": "--tune-batch-size"},
        steps=steps, batch_size=tune_batch_size, lr=lr, length=length, init=init, init_text=init_text,
        eval_every=eval_every, val_size=val_size, chat=chat, seed=seed,
    )
    if init_text is not None and init != "text" and not sweep_grid:
        raise SoftevalError("--init-text is read by --init text only; add --init text (or --sweep, which tries it) or drop --init-text")
    spec = load_task(task)
    check_before_work([model], [spec], [], k=0, tuning=True, outputs=[output], data_dir=data_dir)
    if export_peft_to is not None:
        check_output(export_peft_to, "--export-peft")
    from softeval.models import load_model
    from softeval.tuning import check_resumable, export_peft, sweep, tune

    if resume:  # a checkpoint that cannot be resumed is reported before the model loads
        check_resumable(output / "checkpoint.safetensors", config)
    elif not sweep_grid and (output / "checkpoint.safetensors").is_file():
        log.warning("tuning from step 0 into %s, which holds an earlier run's checkpoint (replaced as this run goes); "
                    "to continue that run instead, stop and add --resume", output)
    lm = load_model(model, cache_dir=cache_dir)
    if sweep_grid:
        tuned = sweep(lm, spec, config, output=output, data_dir=data_dir, sweep_steps=sweep_steps)
    else:
        tuned = tune(lm, spec, config, output=output, data_dir=data_dir, resume=resume)
    if export_peft_to is not None:
        export_peft(tuned.vectors, lm, export_peft_to)
        stdout.print(f"wrote PEFT adapter {export_peft_to}", highlight=False)
    final = tuned.metadata["final"]
    stdout.print(
        f"tuned {steps} steps in {tuned.metadata['tuning_seconds']} s; validation: "
        + ", ".join(f"{k} {v:.3f}" for k, v in final.items() if isinstance(v, float)),
        highlight=False,
    )
    stdout.print(f"wrote {output / 'soft_prompt.safetensors'}", highlight=False)


@app.command("tasks")
def tasks_command(data_dir: DataDir = None) -> None:
    """List the built-in tasks with their splits and, where data is found locally, their sizes."""
    data_dir = resolve_data_dir(data_dir)  # --data-dir, else $SOFTEVAL_DATA_DIR
    table = Table(title="tasks" if data_dir is None else f"tasks (rows in {data_dir})")
    for header in ["task", "format", "source", "eval", "tune", "few-shot"]:
        table.add_column(header)
    missing = "" if data_dir is None else " (not found)"  # without a mirror, data comes from the hub
    for name in builtin_tasks():
        spec = load_task(name)
        sizes = split_sizes(spec, data_dir)
        show = {split: f"{split}{missing}" if n is None else f"{split} ({n})" for split, n in sizes.items()}.__getitem__
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
