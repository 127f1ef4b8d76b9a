"""One (model, task) unit of a study, on a loaded model: for each method and chat mode, tune or
reuse the soft prompt or LoRA adapter the method needs, then evaluate the cell, or judge it again
if it is finished already. `runner.run_study` runs the units, here or on Ray (`distributed.py`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from softeval.errors import SoftevalError
from softeval.models import LoadedModel, free_hub_weights
from softeval.study.evaluation import cell_identity, evaluate, identity_difference, model_facts, rejudge
from softeval.study.folders import CellReport, cell_folder, finished_identity, tuned_folder
from softeval.study.locks import claimed
from softeval.study.settings import Settings
from softeval.tasks import TaskSpec
from softeval.tuning import (
    TUNED,
    WEIGHTS,
    WEIGHTS_KEY,
    Adapter,
    SoftPrompt,
    TuneConfig,
    checkpoint_matches,
    load_adapter,
    load_soft_prompt,
    provenance,
    provenance_difference,
    sweep,
    sweep_record,
    tune,
    warm_start_record,
)

log = logging.getLogger("softeval")


def run_unit(
    lm: LoadedModel, spec: TaskSpec, study: Settings, *, role: str | None = None, output: Path, soft: SoftPrompt | None, data_dir,
    force: bool, progress: bool = True, tell_failures: bool = True, warm_from: str | None = None,
) -> list[CellReport]:
    """Every method and chat mode of one model on one task. A cell that fails is reported (and
    logged as it fails, with `tell_failures`) and the others go on. `warm_from` names the
    checkpoint (in `output`) whose tuned prompt a soft prompt starts from (a warm start)."""
    reports = []
    for chat in chat_modes(lm, study, role):
        for method in study.methods:
            if method == "soft-prompt" and soft is not None and bool(soft.metadata.get("chat")) != chat:
                if chat:  # a given prompt serves the one mode it was tuned for
                    log.warning("%s was tuned without the chat template: no soft-prompt cell with --chat (tune one with --chat)", soft.name)
                continue
            folder = cell_folder(output, lm.name, spec.name, method, chat)
            try:
                reports.append(_run_cell(lm, spec, study, method, chat, folder, role=role, output=output, soft=soft, data_dir=data_dir,
                                         force=force, progress=progress, warm_from=warm_from))
            except SoftevalError as exc:
                if tell_failures:
                    log.error("%s failed: %s", folder, exc)
                reports.append(CellReport(folder, "failed", str(exc)))
    return reports


def chat_modes(lm: LoadedModel, study: Settings, role: str | None) -> list[bool]:
    """Plain, and with `chat` also the chat template for post-trained models: a model declared
    `base` runs plain even where its tokenizer ships a chat template."""
    if not study.chat:
        return [False]
    if (role or lm.role) == "base" or not lm.post_trained:
        if (role or lm.role) is None:
            log.warning("%s has no chat template: run without --chat", lm.name)
        return [False]
    return [False, True]


def _run_cell(lm, spec, study: Settings, method: str, chat: bool, folder: Path, *, output: Path, **options) -> CellReport:
    """A cell, claimed for as long as it is computed: a second command that shares the output
    folder waits, then finds it finished (see `locks.py`)."""
    with claimed(output, folder):
        return _compute_cell(lm, spec, study, method, chat, folder, output=output, **options)


def _compute_cell(lm, spec, study: Settings, method: str, chat: bool, folder: Path, *, role, output, soft, data_dir, force, progress,
                  warm_from: str | None) -> CellReport:
    tuned = None
    if method in TUNED:
        if method == "soft-prompt" and soft is not None:
            tuned = soft
        else:
            place = tuned_folder(output, lm.name, spec.name, method, chat)
            start = _warm_start(warm_from, output, lm.name, spec.name, chat) if method == "soft-prompt" else None
            with claimed(output, place):
                tuned = tuned_or_reused(lm, spec, study.tune_config(method, chat), place, data_dir=data_dir, sweep_grid=study.sweep,
                                        sweep_steps=study.sweep_steps, force=force, progress=progress, start=start)
    settings = dict(chat=chat, k=study.k, limit=study.limit, seed=study.seed, data_dir=data_dir)
    wanted = cell_identity(lm, spec, method, **settings, tuned=tuned)
    # the model's chat-template cells run in this command too (see chat_modes)
    chat_too = study.chat and (role or lm.role) != "base" and lm.post_trained
    finished = finished_identity(folder)
    if not force and finished == wanted:
        try:
            changed = rejudge(folder, spec, data_dir=data_dir, limit=study.limit, seed=study.seed, facts=model_facts(lm, role), chat_too=chat_too)
        except SoftevalError as exc:  # its completions are lost: computing them again costs time, not trust
            log.warning("%s; evaluating it again", exc)
        else:
            log.info("finished already: %s", folder)
            if changed:
                log.warning("%s: %d completions are judged otherwise by this version's parsers; its scores are updated", folder, changed)
            return CellReport(folder, "skipped")
    elif finished is not None and not force:  # replaced, so say why: the old cell is gone after this
        # a checkpoint whose weights changed is told once, in one line, not once per cell
        level = logging.DEBUG if tell_changed_weights(lm, finished.get("model")) else logging.WARNING
        log.log(level, "evaluating %s again; changed since it finished: %s", folder, identity_difference(finished, wanted))
    result = evaluate(
        lm, spec, method, **settings, batch_size=study.batch_size, role=role, chat_too=chat_too, progress=progress,
        soft_prompt=tuned if method == "soft-prompt" else None, adapter=tuned if method == "lora" else None,
    )
    result.write(folder)
    return CellReport(folder, "done")


def _warm_start(previous: str | None, output: Path, name: str, task: str, chat: bool) -> tuple[str, SoftPrompt] | None:
    """The tuned prompt of checkpoint `previous` (same task and mode) that `name`'s soft prompt
    starts from, where it is warm-started (else None)."""
    if previous is None:
        return None
    folder = tuned_folder(output, previous, task, "soft-prompt", chat)
    prompt = _saved_tuning(folder, "soft-prompt")
    if prompt is None:
        raise SoftevalError(f"a warm start of {name} needs the prompt of the checkpoint before it, in {folder}, which its tuning did not write; "
                            "run that checkpoint's cells first (or drop warm_start)")
    return previous, prompt


def tuned_or_reused(
    lm, spec, config: TuneConfig, folder: Path, *, data_dir, sweep_grid: bool = False, sweep_steps: int = 40, force: bool = False, progress: bool = True,
    start: tuple[str, SoftPrompt] | None = None,
) -> SoftPrompt | Adapter:
    """The soft prompt or LoRA adapter for a cell: reused when a finished one with the same
    provenance (model, task spec, chat mode, data, settings, plain or swept, warm start) exists,
    tuned otherwise. An interrupted run with the same settings continues from its checkpoint.
    `start` is (checkpoint name, its prompt) for a warm start."""
    sweeping = sweep_grid and config.method == "soft-prompt"  # LoRA is tuned at its own lr
    produced = sweep_record(sweep_steps) if sweeping else warm_start_record(start[1], start[0]) if start else {"by": "tune"}
    wanted = provenance(lm, spec, config, data_dir, produced)
    saved = _saved_tuning(folder, config.method)
    if saved is not None and not force:
        changed = provenance_difference(saved.metadata, wanted, sweep=sweeping)
        if changed is None:
            log.info("reusing %s", saved.path)
            return saved
        level = logging.DEBUG if changed == "model" and tell_changed_weights(lm, saved.metadata.get("model")) else logging.WARNING
        log.log(level, "tuning %s again: its %s changed", folder, changed)
    if sweeping:
        return sweep(lm, spec, config, output=folder, data_dir=data_dir, sweep_steps=sweep_steps, progress=progress)
    resume = not force and checkpoint_matches(folder / "checkpoint.safetensors", config, lm, spec)
    return tune(lm, spec, config, output=folder, data_dir=data_dir, resume=resume, progress=progress, produced=produced,
                start=start[1] if start else None)


_told_weights: set[tuple[str, str]] = set()


def tell_changed_weights(lm: LoadedModel, recorded: dict | None) -> bool:
    """Whether a finished cell or tuned prompt recorded this same local model with other weights
    (a checkpoint retrained into its folder), said in one line per model and weights, however
    many of its cells and prompts are computed again."""
    now = lm.identity.get(WEIGHTS_KEY)
    where = lambda identity: (identity.get("folder"), identity.get("gguf"))  # noqa: E731
    if not recorded or now is None or recorded.get(WEIGHTS_KEY) == now or where(recorded) != where(lm.identity):
        return False
    if (lm.identity["spec"], now) not in _told_weights:
        _told_weights.add((lm.identity["spec"], now))
        before = recorded.get(WEIGHTS_KEY)
        if before is None:
            log.warning("%s (%s): its finished cells and prompts were computed before softeval recorded a model's weights, so they may "
                        "be of other weights; its cells and prompts are computed again", lm.name, lm.identity["spec"])
        else:
            log.warning("the weights of %s (%s) changed since its cells were computed (sha256 %s -> %s); its cells and prompts are "
                        "computed again", lm.name, lm.identity["spec"], before[:12], now[:12])
    return True


def _saved_tuning(folder: Path, method: str) -> SoftPrompt | Adapter | None:
    if method == "lora":
        return load_adapter(folder) if (folder / WEIGHTS).is_file() else None
    path = folder / "soft_prompt.safetensors"
    return load_soft_prompt(path) if path.is_file() else None



def free_evaluated_revision(reports: list[CellReport]) -> None:
    """The weight files of the hub revision a model's finished cells evaluated, once all its
    cells are finished (serially, or on Ray by the driver). The commit is the one the cells
    record (a branch may have moved since), freed in this process's Hugging Face cache: Ray
    workers on the driver's machine share it, workers elsewhere keep their copies."""
    for report in reports:
        saved = report.folder / "results.json"
        if not saved.is_file():
            continue
        model = json.loads(saved.read_text(encoding="utf-8"))["identity"].get("model") or {}
        if model.get("hub_id") and model.get("revision"):
            freed = free_hub_weights(model["hub_id"], model["commit"])
            if freed:
                log.info("freed %.1f MB: the weights of %s@%s, whose cells are all finished", freed / 1e6, model["hub_id"], model["revision"])
        return
