"""A study: every (model, task, method, chat mode) cell of a grid, tuning soft prompts and LoRA
adapters where a method needs one, then a comparison of every finished cell in the output folder.

    OUTPUT/models.json                        family and role (base, post-trained) of each model
    OUTPUT/<model>/<task>/prompt[-chat]/      soft prompt, curve.json, curve.png (tuned once, reused)
    OUTPUT/<model>/<task>/adapter[-chat]/     LoRA adapter in PEFT format, curve.json, curve.png
    OUTPUT/<model>/<task>/<method>[-chat]/    results.json, samples.jsonl (one cell)
    OUTPUT/comparison.md, comparison.json     every finished cell on disk, with paired comparisons

`softeval eval`, `softeval run` and `softeval study` all run through `run_study`; they differ in
where a soft prompt comes from (`prompt`: none, a given file, or tuned here) and in how the grid is
written down (flags or a study file). A cell whose results.json records the identity the cell
would have now is finished and skipped, so a rerun of an interrupted study does only what is left.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from softeval._io import read_yaml_mapping, write_json_atomic
from softeval.errors import SoftevalError, validation_problem
from softeval.evaluate import METHODS, TUNED, cell_identity, evaluate, identity_difference, rejudge
from softeval.lora import WEIGHTS, Adapter, load_adapter
from softeval.metrics import ROW_METRICS
from softeval.models import LoadedModel, load_model, model_name
from softeval.preflight import check_before_work
from softeval.softprompt import SoftPrompt, check_task_made_for, load_soft_prompt
from softeval.task import TaskSpec, load_task
from softeval.tune import TuneConfig, checkpoint_matches, provenance, provenance_difference, sweep, sweep_record, tune

log = logging.getLogger("softeval")

MODELS_FILE = "models.json"


class ModelEntry(BaseModel):
    """A model of the study; `family` and `role` pair a base model with its post-trained version."""

    model_config = ConfigDict(extra="forbid")
    model: str
    family: str | None = None
    role: Literal["base", "post-trained"] | None = None


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int = Field(8, gt=0)
    alpha: int = Field(16, gt=0)
    targets: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)  # adapters take a smaller step than prompt vectors


class Reference(BaseModel):
    """The post-trained models' score that base-model scores should predict the ranking of."""

    model_config = ConfigDict(extra="forbid")
    method: str = "zero-shot"
    chat: bool = True
    metric: str = "task_accuracy"

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str) -> str:
        if method not in METHODS:
            raise ValueError(f"unknown method '{method}'; choose from: {', '.join(METHODS)}")
        return method

    @field_validator("metric")
    @classmethod
    def _rankable_metric(cls, metric: str) -> str:
        if metric not in ROW_METRICS:
            raise ValueError(f"metric '{metric}' cannot be ranked; choose from: {', '.join(ROW_METRICS)}")
        return metric


RAY_RESOURCES = ("num_cpus", "num_gpus", "memory")


# tuning settings that a study sets from its own keys (methods, chat, seed, lora)
STUDY_OWNED = {"method", "chat", "seed"} | {key for key in TuneConfig.model_fields if key.startswith("lora_")}


class Study(BaseModel):
    """A grid of cells and every setting its results depend on; a study file holds one."""

    model_config = ConfigDict(extra="forbid")
    models: list[ModelEntry] = Field(min_length=1)
    tasks: list[str] = Field(min_length=1)
    methods: list[str] = Field(["zero-shot", "few-shot", "soft-prompt"], min_length=1)
    chat: bool = False  # also run post-trained models with their chat template
    k: int = Field(5, ge=1)
    limit: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0)  # numpy's generators take no negative seeds
    batch_size: int | None = Field(None, ge=1)  # None: batches sized by the engine's budgets
    tuning: TuneConfig = TuneConfig()
    lora: LoraSettings = LoraSettings()
    sweep: bool = False
    sweep_steps: int = Field(40, gt=0)
    reference: Reference | None = None  # None: as the folder's last ranking, else the default
    resources: dict[str, float] = {"num_cpus": 1}  # per (model, task) unit on Ray, e.g. num_gpus: 1

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        for method in methods:
            if method not in METHODS:
                raise ValueError(f"unknown method '{method}'; choose from: {', '.join(METHODS)}")
        return list(dict.fromkeys(methods))

    @field_validator("tuning")
    @classmethod
    def _tuning_settings_only(cls, tuning: TuneConfig) -> TuneConfig:
        # these come from the study's own keys: a value under tuning would be silently replaced
        misplaced = sorted(tuning.model_fields_set & STUDY_OWNED)
        if misplaced:
            raise ValueError(f"'{misplaced[0]}' is not a tuning setting here; set chat and seed at the top level, methods under methods, LoRA under lora")
        return tuning

    @field_validator("resources")
    @classmethod
    def _ray_resources(cls, resources: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(resources) - set(RAY_RESOURCES))
        if unknown:
            raise ValueError(f"unknown resource '{unknown[0]}'; use {', '.join(RAY_RESOURCES)}")
        return resources

    @model_validator(mode="after")
    def _init_text_is_read(self) -> Study:
        if self.tuning.init_text is not None and self.tuning.init != "text" and not self.sweep:
            raise ValueError("tuning.init_text is read by init: text only; set tuning.init: text (or sweep: true, which tries it) or drop init_text")
        return self

    @model_validator(mode="after")
    def _models_pair_up(self) -> Study:
        names: dict[str, str] = {}
        for entry in self.models:
            name = model_name(entry.model)
            if name in names:
                raise ValueError(f"models '{names[name]}' and '{entry.model}' would share the results folder '{name}'; give one of them as a local folder of another name")
            names[name] = entry.model
        roles: dict[str, set[str]] = {}
        for entry in self.models:
            if (entry.family is None) != (entry.role is None):
                raise ValueError(f"model '{entry.model}' needs both a family and a role, or neither")
            if entry.family is not None:
                if entry.role in roles.setdefault(entry.family, set()):
                    raise ValueError(f"family '{entry.family}' has two {entry.role} models; give each family one base and one post-trained model")
                roles[entry.family].add(entry.role)
        for family, found in roles.items():
            if len(found) < 2:
                missing = ({"base", "post-trained"} - found).pop()
                raise ValueError(f"family '{family}' has no {missing} model; add it or drop the family and role")
        if roles and (self.reference or Reference()).chat and not self.chat:
            raise ValueError("the ranking's reference is the post-trained models' chat-template cells: set chat: true (or reference.chat: false)")
        return self

    def tune_config(self, method: str, chat: bool) -> TuneConfig:
        """The tuning settings of one tuned cell."""
        config = self.tuning.model_copy(update={"chat": chat, "seed": self.seed, "method": method})
        if method == "lora":  # the soft prompt's own settings do not apply, so they cannot retune it
            lora, defaults = self.lora, TuneConfig()
            config = config.model_copy(update={
                "lr": lora.lr, "lora_rank": lora.rank, "lora_alpha": lora.alpha, "lora_targets": lora.targets,
                "length": defaults.length, "init": defaults.init, "init_text": defaults.init_text,
            })
        return config


def load_study(path: str | Path) -> Study:
    """A study file (YAML), validated; a mistake is one line naming the file and the setting."""
    path = Path(path)
    if not path.is_file():
        raise SoftevalError(f"study file not found: {path}; give the path of a study YAML")
    raw = read_yaml_mapping(path, "study file", "models, tasks, methods and settings")
    # a model may be given as a bare name: a study without ranking needs no families
    raw["models"] = [{"model": m} if isinstance(m, str) else m for m in raw.get("models") or []]
    try:
        return Study.model_validate(raw)
    except ValidationError as exc:
        raise SoftevalError(f"study file {path}: {validation_message(exc)}; fix the study file") from exc


def validation_message(exc: ValidationError) -> str:
    for error in exc.errors():  # a tuning setting written at the top level
        key = str(error["loc"][0]) if error["type"] == "extra_forbidden" and len(error["loc"]) == 1 else ""
        if key in TuneConfig.model_fields and key not in STUDY_OWNED:
            return f"'{key}' is a tuning setting; put it under tuning"
    return validation_problem(exc, Study)


# --- where cells live -------------------------------------------------------------------------


def cell_folder(output: Path, model: str, task: str, method: str, chat: bool) -> Path:
    """The folder of one cell's results.json and samples.jsonl."""
    return Path(output) / model / task / (method + ("-chat" if chat else ""))


def tuned_folder(output: Path, model: str, task: str, method: str, chat: bool) -> Path:
    """The folder of the soft prompt or LoRA adapter a tuned cell evaluates."""
    kind = {"soft-prompt": "prompt", "lora": "adapter"}[method]
    return Path(output) / model / task / (kind + ("-chat" if chat else ""))


def finished_identity(folder: Path) -> dict | None:
    """The identity recorded by a finished cell (its results.json), or None."""
    path = folder / "results.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("identity")
    except (ValueError, OSError):  # unreadable: the cell is redone and the file replaced
        return None


# --- running a study -------------------------------------------------------------------------


@dataclass
class CellReport:
    """What happened to one cell in this command."""

    folder: Path
    status: Literal["done", "skipped", "failed"]
    message: str = ""


def run_study(
    study: Study,
    *,
    output: str | Path,
    prompt: str | Path | None = None,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    ray: str | None = None,
    progress: bool = True,
) -> list[CellReport]:
    """Run every unfinished cell of `study` into `output`, then rebuild the comparison and the
    report page (index.html) there from every finished cell.

    A soft prompt comes from `prompt` when given (a file or folder `softeval tune` wrote) and is
    tuned (or reused) otherwise; LoRA adapters are always tuned or reused. `force` redoes finished
    cells and tuning. `ray` runs each (model, task) unit as a Ray task: "local" starts a local
    cluster, anything else is the address of a running one."""
    from softeval.page import write_page
    from softeval.rank import update_ranking
    from softeval.report import write_comparison

    output = Path(output)
    specs = _distinct_tasks([load_task(t) for t in study.tasks])
    tuning = "lora" in study.methods or ("soft-prompt" in study.methods and prompt is None)
    # every check that needs no model comes first: a mistake costs seconds, not a study
    check_before_work([m.model for m in study.models], specs, study.methods, k=study.k, tuning=tuning, outputs=[output], data_dir=data_dir,
                      limit=study.limit)
    soft = load_soft_prompt(prompt) if prompt is not None and "soft-prompt" in study.methods else None
    if soft is not None:
        check_given_prompt(soft, study, specs)
    run = dict(output=output, soft=soft, data_dir=data_dir, force=force)
    if ray is not None:
        from softeval.distributed import run_on_ray

        reports = run_on_ray(study, specs, ray, cache_dir=cache_dir, **run)
    else:
        reports = []
        for entry in study.models:
            lm = None  # the last model is freed before the next one loads, not after
            try:
                lm = load_model(entry.model, cache_dir=cache_dir)
            except SoftevalError as exc:  # reported with the failed cells; the other models go on
                log.error("%s", exc)
                reports += [CellReport(output / model_name(entry.model) / spec.name, "failed", str(exc)) for spec in specs]
                continue
            for spec in specs:
                reports += run_unit(lm, spec, study, role=entry.role, progress=progress, **run)
            if _any_finished(reports):
                write_comparison(output)  # after each model: the comparison is never far behind
    if _any_finished(reports):  # else nothing changed, and the folder is left as it was
        record_models(output, study.models)
        write_comparison(output)
        update_ranking(output, study.reference)
        write_page(output)
    failed = [r for r in reports if r.status == "failed"]
    if failed:
        rest = f" (and {len(failed) - 1} more, listed above)" if len(failed) > 1 else ""
        kept = "; the other cells finished and are kept by a rerun" if _any_finished(reports) else ""
        raise SoftevalError(f"{failed[0].folder} failed: {failed[0].message}{rest}{kept}")
    return reports


def check_given_prompt(soft: SoftPrompt, study: Study, specs: list[TaskSpec]) -> None:
    """What can be told of a given soft prompt before a model loads: it serves one model and one
    task, the task and chat mode it was tuned for (the model itself is checked once it has loaded)."""
    if len(study.models) > 1:
        raise SoftevalError(f"{soft.name} was tuned for one model; evaluate it with one --model")
    if len(specs) > 1:
        raise SoftevalError(f"{soft.name} was tuned for one task; evaluate it with one --task")
    chat = bool(soft.metadata.get("chat"))
    if chat and not study.chat:
        raise SoftevalError(f"{soft.name} was tuned with the chat template; add --chat to evaluate it")
    check_task_made_for(soft.name, soft.metadata, specs[0], chat)


def _any_finished(reports: list[CellReport]) -> bool:
    """Whether a cell of this command finished, now or in an earlier command (skipped)."""
    return any(r.status != "failed" for r in reports)


def run_unit(
    lm: LoadedModel, spec: TaskSpec, study: Study, *, role: str | None = None, output: Path, soft: SoftPrompt | None, data_dir,
    force: bool, progress: bool = True,
) -> list[CellReport]:
    """Every method and chat mode of one model on one task. A cell that fails is reported and the
    others go on."""
    reports = []
    for chat in chat_modes(lm, study, role):
        for method in study.methods:
            if method == "soft-prompt" and soft is not None and bool(soft.metadata.get("chat")) != chat:
                continue  # a given prompt serves the one mode it was tuned for
            folder = cell_folder(output, lm.name, spec.name, method, chat)
            try:
                reports.append(_run_cell(lm, spec, study, method, chat, folder, output=output, soft=soft, data_dir=data_dir, force=force, progress=progress))
            except SoftevalError as exc:
                log.error("%s failed: %s", folder, exc)
                reports.append(CellReport(folder, "failed", str(exc)))
    return reports


def chat_modes(lm: LoadedModel, study: Study, role: str | None) -> list[bool]:
    """Plain, and with `chat` also the chat template for post-trained models: a model declared
    `base` runs plain even where its tokenizer ships a chat template."""
    if not study.chat:
        return [False]
    if role == "base" or not lm.post_trained:
        if role is None:
            log.warning("%s has no chat template: run without --chat", lm.name)
        return [False]
    return [False, True]


def _distinct_tasks(specs: list[TaskSpec]) -> list[TaskSpec]:
    """The tasks once each: one spec given twice (a name and its file, two spellings of a path)
    runs once; two different specs of one name would share a results folder, so are refused."""
    seen: dict[str, TaskSpec] = {}
    for spec in specs:
        first = seen.setdefault(spec.name, spec)
        if (first.source_file, first.sha256()) != (spec.source_file, spec.sha256()):
            raise SoftevalError(f"two tasks are named '{spec.name}' ({first.source_file or spec.name} and {spec.source_file or spec.name}); give each task its own name")
    return list(seen.values())


def _run_cell(lm, spec, study: Study, method: str, chat: bool, folder: Path, *, output, soft, data_dir, force, progress) -> CellReport:
    tuned = None
    if method in TUNED:
        if method == "soft-prompt" and soft is not None:
            tuned = soft
        else:
            place = tuned_folder(output, lm.name, spec.name, method, chat)
            tuned = tuned_or_reused(lm, spec, study.tune_config(method, chat), place, data_dir=data_dir, sweep_grid=study.sweep,
                                    sweep_steps=study.sweep_steps, force=force, progress=progress)
    settings = dict(chat=chat, k=study.k, limit=study.limit, seed=study.seed, data_dir=data_dir)
    wanted = cell_identity(lm, spec, method, **settings, tuned=tuned)
    finished = finished_identity(folder)
    if not force and finished == wanted:
        log.info("finished already: %s", folder)
        changed = rejudge(folder, spec, data_dir=data_dir, limit=study.limit, seed=study.seed)
        if changed:
            log.warning("%s: %d completions are judged otherwise by this version's parsers; its scores are updated", folder, changed)
        return CellReport(folder, "skipped")
    if finished is not None and not force:  # replaced, so say why: the old cell is gone after this
        log.warning("evaluating %s again; changed since it finished: %s", folder, identity_difference(finished, wanted))
    result = evaluate(
        lm, spec, method, **settings, batch_size=study.batch_size, progress=progress,
        soft_prompt=tuned if method == "soft-prompt" else None, adapter=tuned if method == "lora" else None,
    )
    result.save(folder)
    return CellReport(folder, "done")


def tuned_or_reused(
    lm, spec, config: TuneConfig, folder: Path, *, data_dir, sweep_grid: bool = False, sweep_steps: int = 40, force: bool = False, progress: bool = True
) -> SoftPrompt | Adapter:
    """The soft prompt or LoRA adapter for a cell: reused when a finished one with the same
    provenance (model, task spec, chat mode, data, settings, plain or swept) exists, tuned
    otherwise. An interrupted run with the same settings continues from its checkpoint."""
    sweeping = sweep_grid and config.method == "soft-prompt"  # LoRA is tuned at its own lr
    wanted = provenance(lm, spec, config, data_dir, sweep_record(sweep_steps) if sweeping else {"by": "tune"})
    saved = _saved_tuning(folder, config.method)
    if saved is not None and not force:
        changed = provenance_difference(saved.metadata, wanted, sweep=sweeping)
        if changed is None:
            log.info("reusing %s", saved.path)
            return saved
        log.warning("tuning %s again: its %s changed", folder, changed)
    if sweeping:
        return sweep(lm, spec, config, output=folder, data_dir=data_dir, sweep_steps=sweep_steps, progress=progress)
    resume = not force and checkpoint_matches(folder / "checkpoint.safetensors", config, lm, spec)
    return tune(lm, spec, config, output=folder, data_dir=data_dir, resume=resume, progress=progress)


def _saved_tuning(folder: Path, method: str) -> SoftPrompt | Adapter | None:
    if method == "lora":
        return load_adapter(folder) if (folder / WEIGHTS).is_file() else None
    path = folder / "soft_prompt.safetensors"
    return load_soft_prompt(path) if path.is_file() else None


def record_models(output: Path, models: list[ModelEntry]) -> None:
    """Add the study's models (family, role) to OUTPUT/models.json, keeping those of earlier
    commands into the same folder: the ranking reads it."""
    path = output / MODELS_FILE
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for entry in models:
        name = model_name(entry.model)
        previous = known.get(name, {})
        known[name] = {
            "model": entry.model,
            # a later command without families (softeval run) keeps what a study file declared
            "family": entry.family or previous.get("family"),
            "role": entry.role or previous.get("role"),
        }
    write_json_atomic(path, known)

