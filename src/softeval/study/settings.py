"""What a study and a tuning run are set to: the pydantic models of the settings that every
command validates before any work (`Study`, read from a study file by `load_study`, and
`TuneConfig`), and the checks that need only them and the data.

No torch or transformers here: the command line parses and checks its options, and says what is
wrong with them, without loading either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from softeval._io import read_yaml_mapping
from softeval.analysis import Reference
from softeval.errors import SoftevalError, validation_problem
from softeval.models import checkpoint_step, checkpoint_tokens, expand_checkpoints, model_name
from softeval.tuning import METHODS, TuneConfig


class ModelEntry(BaseModel):
    """A model of the study. `role` says whether it is a base or a post-trained model; `family`
    (with a role) pairs a base model with its post-trained version for the ranking. `revision` (a
    branch, tag or commit of a hub model) is the same as `model: org/name@revision`."""

    model_config = ConfigDict(extra="forbid")
    model: str
    revision: str | None = None
    family: str | None = None
    role: Literal["base", "post-trained"] | None = None

    @model_validator(mode="after")
    def _revision_in_name(self) -> ModelEntry:
        if self.revision is not None:
            if "@" in self.model:
                raise ValueError(f"model '{self.model}' names a revision after '@' and in revision: give it once")
            self.model, self.revision = f"{self.model}@{self.revision}", None
        return self


class SeriesEntry(BaseModel):
    """A pre-training recipe: the checkpoints of one training run, compared with other recipes by
    `softeval analyze`. The checkpoints are a hub model's `revisions`, or `checkpoints`: a training
    run's folder, a glob of model folders, or a list of folders and hub ids. A checkpoint's step is
    read from its name (`checkpoint-500`, `step1000`, `stage1-step10000-tokens21B`), its tokens
    from its name where it holds them, else as `tokens_per_step` times its step. `reference` is the
    recipe's post-trained model: the study evaluates it as the ranking's reference (by default
    zero-shot with its chat template), and the analysis orders the recipes by it."""

    model_config = ConfigDict(extra="forbid")
    name: str
    model: str | None = None
    revisions: list[str] | None = Field(None, min_length=1)
    checkpoints: str | list[str] | None = None
    tokens_per_step: float | None = Field(None, gt=0)
    reference: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SeriesEntry:
        if (self.model is None) == (self.checkpoints is None) or (self.model is None) != (self.revisions is None):
            raise ValueError(f"series '{self.name}' needs either model and revisions, or checkpoints")
        run = Path(self.model).expanduser() if self.model is not None else None
        if run is not None and run.is_dir() and not (run / "config.json").exists():  # a training run's folder
            raise ValueError(f"series '{self.name}': {self.model} is a local training run's folder, and revisions are a hub model's branches or tags; "
                             f"give its checkpoints instead (checkpoints: {self.model})")
        return self

    def specs(self) -> list[str]:
        """The checkpoints as --model values, in training order."""
        if self.model is not None:
            specs = [f"{self.model}@{revision}" for revision in self.revisions]
        else:
            given = [self.checkpoints] if isinstance(self.checkpoints, str) else self.checkpoints
            specs = [spec for item in given for spec in expand_checkpoints(item)]
        if not specs:
            raise ValueError(f"series '{self.name}' names no checkpoint")
        steps = [checkpoint_step(_label(spec)) for spec in specs]
        if None not in steps:  # in training order, whatever order they were given in
            specs = [spec for _, spec in sorted(zip(steps, specs))]
        return specs

    def points(self) -> list[dict]:
        """Each checkpoint's model name, step and tokens (None where neither tells)."""
        found = []
        for spec in self.specs():
            step, tokens = checkpoint_step(_label(spec)), checkpoint_tokens(_label(spec))
            if tokens is None and step is not None and self.tokens_per_step:
                tokens = step * self.tokens_per_step
            found.append({"model": model_name(spec), "spec": spec, "step": step, "tokens": tokens})
        return found


def _label(spec: str) -> str:
    """What names a checkpoint: a hub model's revision, or a folder's name."""
    return spec.split("@", 1)[1] if "@" in spec and not Path(spec).exists() else Path(spec).name


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int = Field(8, gt=0)
    alpha: int = Field(16, gt=0)
    targets: list[str] | None = None  # None: each model's own attention projections (see lora.default_targets)
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)  # adapters take a smaller step than prompt vectors


RAY_RESOURCES = ("num_cpus", "num_gpus", "memory")


# tuning settings that a study sets from its own keys (methods, chat, seed, lora)
STUDY_OWNED = {"method", "chat", "seed"} | {key for key in TuneConfig.model_fields if key.startswith("lora_")}


class Settings(BaseModel):
    """What every cell of a grid is evaluated with: the tasks and methods, the rows, the
    demonstrations, the tuning and LoRA settings. A study adds its models and series
    (`Study`); an evaluator inside a training loop adds when and how often it runs
    (`softeval.loop.LoopSettings`)."""

    model_config = ConfigDict(extra="forbid")
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

    @model_validator(mode="after")
    def _init_text_is_read(self) -> Settings:
        if self.tuning.init_text is not None and self.tuning.init != "text" and not self.sweep:
            raise ValueError("tuning.init_text is read by init: text only; set tuning.init: text (or sweep: true, which tries it) or drop init_text")
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


class Study(Settings):
    """A grid of cells and every setting its results depend on; a study file holds one."""

    models: list[ModelEntry] = []
    series: list[SeriesEntry] = []  # pre-training recipes: their checkpoints join the models as base models
    warm_start: bool = False  # tune each series checkpoint's soft prompt from the previous checkpoint's
    # once every cell of a hub revision is finished, delete its weight files from the Hugging Face
    # cache (many revisions fill a disk); its config and tokenizer stay, so a rerun skips its cells
    free_weights: bool = False
    reference: Reference | None = None  # None: as the folder's last ranking, else the default
    # a JSON file of each series checkpoint's known test facts (see softeval.testbed.truth):
    # `softeval analyze` then says how well each method's scores order checkpoints by them
    ground_truth: str | None = None
    resources: dict[str, float] = {"num_cpus": 1}  # per (model, task) unit on Ray, e.g. num_gpus: 1

    @field_validator("resources")
    @classmethod
    def _ray_resources(cls, resources: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(resources) - set(RAY_RESOURCES))
        if unknown:
            raise ValueError(f"unknown resource '{unknown[0]}'; use {', '.join(RAY_RESOURCES)}")
        return resources

    @field_validator("models")
    @classmethod
    def _checkpoints_expand(cls, models: list[ModelEntry]) -> list[ModelEntry]:
        """A training run's folder, or a glob of model folders, stands for each checkpoint in it."""
        expanded = []
        for entry in models:
            specs = expand_checkpoints(entry.model)
            if len(specs) > 1 and entry.family is not None:
                raise ValueError(f"'{entry.model}' holds {len(specs)} checkpoints, and a family pairs one base with one post-trained model; "
                                 "drop the family")
            expanded += [entry.model_copy(update={"model": spec}) for spec in specs]
        return expanded

    @model_validator(mode="after")
    def _series_checkpoints_are_models(self) -> Study:
        listed = {entry.model for entry in self.models}
        for series in self.series:
            self.models += [ModelEntry(model=spec, role="base") for spec in series.specs() if spec not in listed]
            if series.reference is not None and series.reference not in listed | {entry.model for entry in self.models}:
                self.models.append(ModelEntry(model=series.reference, role="post-trained"))
        evaluated = self.reference or Reference()
        if any(s.reference for s in self.series) and evaluated.chat and not self.chat:
            raise ValueError("a series' reference is evaluated with its chat template: set chat: true (or reference.chat: false)")
        if any(s.reference for s in self.series) and evaluated.method not in self.methods:
            raise ValueError(f"a series' reference is evaluated {evaluated.method}, which methods does not hold: add it, or set reference.method")
        names = [series.name for series in self.series]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"two series are named '{twice[0]}'; give each recipe a name of its own")
        if not self.models:
            raise ValueError("models: give at least one model (or a series of checkpoints)")
        return self

    @field_validator("ground_truth")
    @classmethod
    def _truth_file(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).expanduser().is_file():
            raise ValueError(f"ground truth file not found: {path}; give the ground_truth.json that softeval testbed wrote")
        return path

    @model_validator(mode="after")
    def _warm_start_has_series(self) -> Study:
        if self.warm_start and not self.series:
            raise ValueError("warm_start tunes each checkpoint of a series from the one before it: declare series: (or drop warm_start)")
        if self.warm_start and self.sweep:
            raise ValueError("warm_start and sweep both choose where a prompt starts: drop one of them")
        return self

    def previous_checkpoint(self, name: str) -> str | None:
        """The model name of the checkpoint before `name` in its series, or None (not in a series, or its first)."""
        for series in self.series:
            names = [point["model"] for point in series.points()]
            if name in names[1:]:
                return names[names.index(name) - 1]
        return None

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
            # a role alone says what a model is (the findings need no more); a family pairs roles
            if entry.family is not None and entry.role is None:
                raise ValueError(f"model '{entry.model}' has a family but no role; give it role: base or role: post-trained")
            if entry.family is not None:
                if entry.role in roles.setdefault(entry.family, set()):
                    raise ValueError(f"family '{entry.family}' has two {entry.role} models; give each family one base and one post-trained model")
                roles[entry.family].add(entry.role)
        for family, found in roles.items():
            if len(found) < 2:
                missing = ({"base", "post-trained"} - found).pop()
                raise ValueError(f"family '{family}' has no {missing} model; add it, or drop the family (a role alone may stay)")
        if roles and (self.reference or Reference()).chat and not self.chat:
            raise ValueError("the ranking's reference is the post-trained models' chat-template cells: set chat: true (or reference.chat: false)")
        return self


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


