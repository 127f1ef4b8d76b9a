"""A study: every (model, task, method) cell of a grid, tuning soft prompts where needed, then one
comparison report.

    OUTPUT/<model>/<task>/prompt[-chat]/     soft prompt, curve.json, curve.png (tuned once, reused)
    OUTPUT/<model>/<task>/<method>[-chat]/   results.json, samples.jsonl
    OUTPUT/comparison.md, comparison.json    every cell side by side
"""

from __future__ import annotations

import logging
from pathlib import Path

from softeval.errors import SoftevalError
from softeval.evaluate import METHODS, EvalResult, evaluate
from softeval.models import load_model
from softeval.preflight import check_before_work
from softeval.report import write_comparison
from softeval.softprompt import SoftPrompt, load_soft_prompt
from softeval.task import load_task
from softeval.tune import TuneConfig, checkpoint_matches, provenance, provenance_difference, sweep, sweep_record, tune

log = logging.getLogger("softeval")


def run_study(
    models: list[str],
    tasks: list[str],
    methods: list[str],
    *,
    output: str | Path,
    chat: bool = False,
    k: int = 5,
    limit: int | None = None,
    seed: int = 0,
    tune_config: TuneConfig | None = None,
    sweep_grid: bool = False,
    sweep_steps: int = 40,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    batch_size: int = 16,
    progress: bool = True,
) -> list[EvalResult]:
    """Evaluate every cell; with `chat`, post-trained models are also run with their chat template."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SoftevalError(f"unknown method '{unknown[0]}'; choose from: {', '.join(METHODS)}")
    output = Path(output)
    # every check that needs no model comes first: a mistake costs seconds, not a study
    specs = [load_task(t) for t in tasks]
    tuning = "soft-prompt" in methods
    check_before_work(models, specs, methods, k=k, tuning=tuning, outputs=[output], data_dir=data_dir)
    results: list[EvalResult] = []
    curves: dict[str, str] = {}
    for model in models:
        lm = load_model(model, cache_dir=cache_dir)
        chat_modes = [False, True] if chat and lm.post_trained else [False]
        if chat and not lm.post_trained:
            log.warning("%s has no chat template: run without --chat", lm.name)
        for spec in specs:
            for use_chat in chat_modes:
                suffix = "-chat" if use_chat else ""
                soft = None
                if "soft-prompt" in methods:
                    config = (tune_config or TuneConfig()).model_copy(update={"chat": use_chat, "seed": seed})
                    folder = output / lm.name / spec.name / f"prompt{suffix}"
                    soft = _tuned_prompt(lm, spec, config, folder, data_dir, sweep_grid, sweep_steps, progress)
                    curves[f"{lm.name} / {spec.name}{suffix}"] = str((folder / "curve.png").relative_to(output))
                for method in methods:
                    result = evaluate(
                        lm, spec, method, chat=use_chat, k=k, soft_prompt=soft if method == "soft-prompt" else None,
                        limit=limit, seed=seed, data_dir=data_dir, batch_size=batch_size, progress=progress,
                    )
                    result.save(output / lm.name / spec.name / f"{method}{suffix}")
                    results.append(result)
        write_comparison(results, output, curves)  # after each model: a crash loses no finished cell
    return results


def _tuned_prompt(lm, spec, config: TuneConfig, folder: Path, data_dir, sweep_grid: bool, sweep_steps: int, progress: bool) -> SoftPrompt:
    """The soft prompt for this cell: reused when a finished one with the same provenance (model,
    task spec, chat mode, data, settings, plain or swept) exists, tuned otherwise."""
    path = folder / "soft_prompt.safetensors"
    wanted = provenance(lm, spec, config, data_dir, sweep_record(sweep_steps) if sweep_grid else {"by": "tune"})
    if path.exists():
        saved = load_soft_prompt(path)
        changed = provenance_difference(saved.metadata, wanted, sweep=sweep_grid)
        if changed is None:
            log.info("reusing %s", path)
            return saved
        log.warning("tuning %s again: its %s changed", path, changed)
    if sweep_grid:
        sweep(lm, spec, config, output=folder, data_dir=data_dir, sweep_steps=sweep_steps, progress=progress)
    else:
        # an interrupted tuning run with the same settings continues where it stopped
        resume = checkpoint_matches(folder / "checkpoint.safetensors", config, lm, spec)
        tune(lm, spec, config, output=folder, data_dir=data_dir, resume=resume, progress=progress)
    return load_soft_prompt(path)
