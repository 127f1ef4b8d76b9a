"""`softeval testbed DIR`: a pre-training testbed where the truth is known, built in one command.

It makes the world and its two tasks, trains the tokenizer, pre-trains each recipe (checkpoints
in DIR/runs/<recipe>/), post-trains each recipe's last checkpoint into its reference chat model
(DIR/references/<recipe>-chat/), measures every model's true knowledge (DIR/ground_truth.json),
checks the design (the recipes know different shares of the facts; base models rarely keep the
QA format zero-shot, the references nearly always do) and writes DIR/study.yaml: the recipes as
series with their references, each recipe a base/post-trained family, zero-shot, few-shot,
soft-prompt and LoRA. `softeval study DIR/study.yaml --output OUT` then runs it, analysis
included.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from softeval._io import write_json_atomic, write_text_atomic
from softeval.errors import SoftevalError
from softeval.models.loading import quiet_weight_loading
from softeval.testbed.corpus import filler_passages, train_tokenizer
from softeval.testbed.tasks import write_tasks
from softeval.testbed.training import BATCH, LENGTH, Recipe, posttrain, pretrain
from softeval.testbed.truth import known_facts, test_facts
from softeval.testbed.world import make_world

log = logging.getLogger("softeval")


@dataclass(frozen=True)
class Size:
    """How big a testbed is: its world, recipes and the study's settings."""

    people: int
    splits: dict[str, int]  # people per split: test, validation, tune, post
    recipes: tuple[Recipe, ...]
    vocab: int
    post_steps: int
    limit: int  # test rows per cell
    tune_steps: int
    eval_every: int
    val_size: int


def _recipes(steps: int, checkpoints: int, wide: int) -> tuple[Recipe, ...]:
    """Six recipes that vary one thing each from `base`: size, tokens, paraphrases, filler."""
    return (
        Recipe("base", hidden=64, steps=steps, templates=4, checkpoints=checkpoints),
        Recipe("wide", hidden=wide, steps=steps, templates=4, checkpoints=checkpoints),
        Recipe("narrow", hidden=32, steps=steps, templates=4, checkpoints=checkpoints),
        Recipe("one-template", hidden=64, steps=steps, templates=1, checkpoints=checkpoints),
        Recipe("filler", hidden=64, steps=steps, templates=4, filler=0.5, checkpoints=checkpoints),
        Recipe("short", hidden=64, steps=steps // 2, templates=4, checkpoints=checkpoints),
    )


SIZES = {
    "small": Size(people=48, splits={"test": 6, "validation": 3, "tune": 10, "post": 12}, recipes=_recipes(600, 5, 96), vocab=768,
                  post_steps=150, limit=24, tune_steps=16, eval_every=8, val_size=12),
    "full": Size(people=240, splits={"test": 50, "validation": 20, "tune": 50, "post": 60}, recipes=_recipes(2400, 5, 96), vocab=1024,
                 post_steps=300, limit=160, tune_steps=80, eval_every=20, val_size=24),
}
DESIGN = {"best_knows": 0.6, "worst_knows": 0.4, "base_zero_shot_format": 0.5, "reference_format": 0.9}


def build_testbed(folder: Path, *, seed: int = 0, size: str = "small", data_dir: Path | None = None, recipes: list[str] | None = None,
                  in_loop: Path | None = None) -> dict:
    """Build everything in `folder` and return the design check; a step whose files exist is kept.
    `recipes` names a subset of the size's recipes (the world, tokenizer and each recipe's
    training are the same as in the whole testbed). With `in_loop`, each recipe's checkpoints are
    also evaluated from inside its pre-training loop (`softeval.InLoop`, the study's settings)
    into that folder, with their ground truth."""
    if size not in SIZES:
        raise SoftevalError(f"--size: unknown size '{size}'; choose one of: {', '.join(SIZES)}")
    settings = SIZES[size]
    folder = Path(folder).resolve()
    # the tokenizer is trained on the filler prose too wherever the size has a filler recipe, so
    # a subset of the recipes trains each one exactly as the whole testbed does
    needs_filler = any(r.filler for r in settings.recipes)
    if needs_filler and data_dir is None:
        raise SoftevalError("the 'filler' recipe mixes in prose from the benchmark mirror; give --data-dir (the mirror's folder)")
    if recipes is not None:
        known = [r.name for r in settings.recipes]
        unknown = next((name for name in recipes if name not in known), None)
        if unknown is not None or not recipes:
            raise SoftevalError(f"--recipes: unknown recipe '{unknown}'; choose among: {', '.join(known)}")
        settings = replace(settings, recipes=tuple(r for r in settings.recipes if r.name in recipes))
    with quiet_weight_loading():  # dozens of tiny models are saved and loaded: no bar for each
        return _build(folder, settings, seed, data_dir, needs_filler, None if in_loop is None else Path(in_loop).resolve())


def _build(folder: Path, settings: Size, seed: int, data_dir: Path | None, needs_filler: bool, in_loop: Path | None) -> dict:
    started = time.perf_counter()
    world = make_world(seed, settings.people, settings.splits)
    filler = filler_passages(data_dir) if needs_filler else []
    tokenizer = train_tokenizer(world, filler, settings.vocab)
    tasks = write_tasks(world, folder / "tasks")
    runs, references = folder / "runs", {}
    plan = study(settings, runs, {r.name: folder / "references" / f"{r.name}-chat" for r in settings.recipes}, tasks, folder / "ground_truth.json", seed)
    if in_loop is None:
        references = train_recipes(settings, world, tokenizer, filler, folder, list(tasks.values()), seed)
    for recipe in settings.recipes if in_loop is not None else ():  # one process: each checkpoint evaluated as it is saved
        evaluate = in_loop_evaluation(plan, recipe.name, in_loop, tokenizer)
        references[recipe.name] = train_recipe(recipe, settings, world, tokenizer, filler, folder, list(tasks.values()), seed, evaluate=evaluate)
        evaluate_reference(plan, recipe.name, references[recipe.name], in_loop)
    truth = ground_truth(world, settings, runs, references)
    write_json_atomic(folder / "ground_truth.json", truth)
    if in_loop is not None:
        file_in_loop_truth(truth, settings, in_loop)
    design = design_check(truth, settings, runs, references, tasks["world_qa"])
    write_json_atomic(folder / "design.json", design)
    write_text_atomic(folder / "study.yaml", yaml.safe_dump(plan, sort_keys=False))
    design["seconds"] = round(time.perf_counter() - started, 1)
    return design


def train_recipe(recipe: Recipe, settings: Size, world, tokenizer, filler: list[str], folder: Path, tasks: list[Path], seed: int,
                 evaluate=None) -> Path:
    """Pre-train a recipe (its checkpoints in folder/runs/<recipe>/) and post-train its last
    checkpoint into its reference; returns the reference's folder."""
    log.info("pre-training recipe %s (%d steps)", recipe.name, recipe.steps)
    checkpoints = pretrain(recipe, world, tokenizer, filler, folder / "runs", seed, evaluate=evaluate)
    log.info("post-training %s into its reference", checkpoints[-1])
    return posttrain(checkpoints[-1], world, tokenizer, tasks, folder / "references" / f"{recipe.name}-chat", settings.post_steps, seed)


def train_recipes(settings: Size, world, tokenizer, filler: list[str], folder: Path, tasks: list[Path], seed: int) -> dict[str, Path]:
    """Every recipe trained, one process per core, each on one thread (the same weights as one
    process training them in turn); returns each recipe's reference folder."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    workers = min(len(settings.recipes), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    arguments = (settings, world, tokenizer, filler, folder, tasks, seed)
    if workers < 2:
        return {recipe.name: train_recipe(recipe, *arguments) for recipe in settings.recipes}
    log.info("training %d recipes in %d processes", len(settings.recipes), workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        started = {recipe.name: pool.submit(_train_in_worker, recipe, *arguments) for recipe in settings.recipes}
        return {name: future.result() for name, future in started.items()}


def _train_in_worker(recipe: Recipe, *arguments) -> Path:
    """`train_recipe` in a worker process, without transformers' bar for each save and load."""
    with quiet_weight_loading():
        return train_recipe(recipe, *arguments)


def in_loop_evaluation(plan: dict, recipe: str, output: Path, tokenizer):
    """What pre-training calls at each checkpoint: an `InLoop` evaluation of the live model with
    the study's settings (its base-model cells: the references are post-trained afterwards)."""
    from softeval.loop import InLoop

    settings = {key: plan[key] for key in ("methods", "k", "limit", "seed", "tuning")}
    # as the study evaluates the saved checkpoints: each prompt tuned from its own start
    evaluator = InLoop(plan["tasks"], output=output, recipe=recipe, tokenizer=tokenizer, warm_start=False, tokens_per_step=BATCH * LENGTH,
                       **settings)
    return lambda model, step: evaluator.evaluate(model, tokenizer, step=step)


def evaluate_reference(plan: dict, recipe: str, reference: Path, output: Path) -> None:
    """A recipe's post-trained reference, evaluated into the in-loop folder as the study evaluates
    it, and named as its series' reference: the analysis orders the recipes by it."""
    from softeval.loop.filing import file_reference
    from softeval.models import model_name
    from softeval.study import Study, run_study

    evaluated = plan["reference"]
    study = Study(models=[{"model": str(reference), "role": "post-trained"}], methods=[evaluated["method"]], chat=evaluated["chat"],
                  **{key: plan[key] for key in ("tasks", "k", "limit", "seed", "tuning")})
    run_study(study, output=output, progress=False)
    file_reference(output, recipe, {"model": model_name(str(reference)), "method": evaluated["method"], "chat": evaluated["chat"]})


def file_in_loop_truth(truth: dict, settings: Size, output: Path) -> None:
    """The ground truth of the checkpoints evaluated in the loop, by their names there
    (`recipe@step-N`), and the folder's reports refreshed with it."""
    from softeval.loop.filing import refresh_reports
    from softeval.models import model_name

    renamed = {}
    for recipe in settings.recipes:
        for step in recipe.checkpoint_steps:
            renamed[f"{recipe.name}@step-{step}"] = truth["models"][model_name(str(Path("runs") / recipe.name / f"checkpoint-{step}"))]
    write_json_atomic(output / "ground_truth.json", truth | {"models": renamed})
    refresh_reports(output)


def ground_truth(world, settings: Size, runs: Path, references: dict[str, Path]) -> dict:
    """Every model's known test facts (see `truth.py`), by softeval's name of the model."""
    from softeval.models import model_name

    models = {}
    for recipe in settings.recipes:
        for step in recipe.checkpoint_steps:
            folder = runs / recipe.name / f"checkpoint-{step}"
            models[model_name(str(folder))] = known_facts(folder, world)
        models[model_name(str(references[recipe.name]))] = known_facts(references[recipe.name], world)
    return {
        "measure": "the right value ranks first among its attribute's values by log-likelihood after the fact's prose stem",
        "tasks": ["world_qa", "world_mc"],  # their test row i is fact i
        "facts": [dict(zip(("person", "attribute", "value"), fact)) for fact in test_facts(world)],
        "models": models,
    }


def design_check(truth: dict, settings: Size, runs: Path, references: dict[str, Path], qa_task: Path) -> dict:
    """The testbed's design, measured: each recipe's last checkpoint's share of known facts, the
    base models' zero-shot and the references' chat format-following on the QA task."""
    from softeval.models import load_model, model_name
    from softeval.study import evaluate
    from softeval.tasks import load_task

    spec = load_task(qa_task)
    known, base_format, reference_format, reference_accuracy = {}, {}, {}, {}
    for recipe in settings.recipes:
        last = runs / recipe.name / f"checkpoint-{recipe.checkpoint_steps[-1]}"
        outcomes = truth["models"][model_name(str(last))]
        known[recipe.name] = sum(outcomes) / len(outcomes)
        base = evaluate(load_model(str(last), device="cpu"), spec, "zero-shot", limit=settings.limit, progress=False)
        base_format[recipe.name] = base.metrics["format_following"].value
        reference = evaluate(load_model(str(references[recipe.name]), device="cpu"), spec, "zero-shot", chat=True, limit=settings.limit, progress=False)
        reference_format[recipe.name] = reference.metrics["format_following"].value
        reference_accuracy[recipe.name] = reference.metrics["task_accuracy"].value
    checks = {
        "best recipe knows >= 60% of test facts": max(known.values()) >= DESIGN["best_knows"],
        "worst recipe knows <= 40%": min(known.values()) <= DESIGN["worst_knows"],
        "base models' zero-shot QA format-following <= 50%": max(base_format.values()) <= DESIGN["base_zero_shot_format"],
        "references' QA format-following (chat) >= 90%": min(reference_format.values()) >= DESIGN["reference_format"],
    }
    return {"known": known, "base_zero_shot_format": base_format, "reference_chat_format": reference_format,
            "reference_chat_accuracy": reference_accuracy, "checks": checks}


def study(settings: Size, runs: Path, references: dict[str, Path], tasks: dict[str, Path], truth: Path, seed: int) -> dict:
    """The study of the testbed: each recipe a series with its reference, and a family of its last
    checkpoint (base) and its reference (post-trained) for the ranking."""
    series, models = [], []
    for recipe in settings.recipes:
        series.append({"name": recipe.name, "checkpoints": str(runs / recipe.name), "tokens_per_step": BATCH * LENGTH,
                       "reference": str(references[recipe.name])})
        last = runs / recipe.name / f"checkpoint-{recipe.checkpoint_steps[-1]}"
        models += [{"model": str(last), "family": recipe.name, "role": "base"},
                   {"model": str(references[recipe.name]), "family": recipe.name, "role": "post-trained"}]
    return {
        "models": models,
        "series": series,
        "ground_truth": str(truth),
        "tasks": [str(path) for path in tasks.values()],
        "methods": ["zero-shot", "few-shot", "soft-prompt", "lora"],
        "chat": True,
        "k": 3,
        "limit": settings.limit,
        "seed": seed,
        "tuning": {"steps": settings.tune_steps, "eval_every": settings.eval_every, "val_size": settings.val_size},
        "reference": {"method": "zero-shot", "chat": True},
    }


def describe(design: dict) -> list[str]:
    """The design check as lines for the terminal."""
    lines = [f"{'recipe':<14}{'knows':>8}{'zero-shot QA format':>22}{'reference chat format':>24}{'reference accuracy':>21}"]
    for name, share in design["known"].items():
        lines.append(f"{name:<14}{100 * share:>7.0f}%{100 * design['base_zero_shot_format'][name]:>21.0f}%"
                     f"{100 * design['reference_chat_format'][name]:>23.0f}%{100 * design['reference_chat_accuracy'][name]:>20.0f}%")
    lines += [f"{'holds' if ok else 'FAILS'}: {check}" for check, ok in design["checks"].items()]
    return lines
