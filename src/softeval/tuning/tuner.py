"""Tuning with a frozen model: AdamW updates only the L soft-prompt vectors (method `soft-prompt`)
or only the low-rank adapters of the LoRA baseline (method `lora`, see `lora.py` beside this module).

The loss covers the target tokens only (the gold answer in the strict format, then the stop
string, so the model learns to stop), and vocabulary logits are computed only at those positions.
Every `eval_every` steps the run scores a fixed validation slice, appends to the curve and writes a
checkpoint; batches depend only on (seed, step), so a resumed run ends where an uninterrupted one would.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from softeval._io import write_bytes_atomic, write_json_atomic
from softeval._memo import PerObject
from softeval.engine import start_engine
from softeval.errors import SoftevalError
from softeval.formats import Example
from softeval.models import LoadedModel
from softeval.progress import Bars, progress_bars
from softeval.scoring import ROW_METRICS, aggregate, run_examples
from softeval.tasks import (
    PromptBuilder,
    TaskSpec,
    apart_from_evaluation,
    data_identity,
    load_examples,
    tuning_target,
    with_answer_words,
)
from softeval.tuning.chart import write_curve_chart
from softeval.tuning.config import Init, TuneConfig, check_tuning_rows
from softeval.tuning.lora import (
    Adapter,
    default_targets,
    load_adapter,
    lora_applied,
    lora_config,
    save_adapter,
    trainable_parameters,
)
from softeval.tuning.softprompt import SoftPrompt, initial_vectors, model_difference, save_soft_prompt

log = logging.getLogger("softeval")

CURVE_METRICS = ("format_following", "task_accuracy", "knowledge")
TOKEN_BUDGET = 768  # padded positions (rows x longest row) in one tuning forward and backward pass


class Tuner:
    """Holds the frozen model, the trained parameters (prompt or adapters) and the data of one
    tuning run. For LoRA the adapters live inside the model until `close()`: use it as a context
    manager."""

    def __init__(self, lm: LoadedModel, spec: TaskSpec, config: TuneConfig, data_dir=None, start: SoftPrompt | None = None):
        # validation judges short answers by the rule the evaluation does
        self.lm, self.spec, self.config = lm, with_answer_words(spec, data_dir), config
        if config.chat and not lm.post_trained:
            raise SoftevalError(f"model {lm.name} has no chat template; drop --chat")
        self.train, self.val, self.eval_rows_in_tuning = _train_and_validation(spec, config, data_dir, _tuning_of(lm, spec, config))
        if config.batch_size > len(self.train):
            _say_once(_level(config, "batch_size"), f"{_tuning_of(lm, spec, config)}: batch size {config.batch_size}, but {spec.name} has "
                      f"{len(self.train)} training rows, and each step takes all of them")
        self.prompt: torch.nn.Parameter | None = None
        self._lora = None
        if config.method == "soft-prompt":
            if start is not None:  # a warm start: the vectors another checkpoint's tuning ended at
                vectors = _warm_vectors(start, lm, config)
            else:  # text init starts from the task's own instruction unless given other words
                vectors = initial_vectors(lm, config.length, config.init, config.init_text or spec.instruction or spec.description or spec.name, config.seed)
            self.prompt = torch.nn.Parameter(vectors.to(next(lm.model.parameters()).device))
        n_soft = 0 if self.prompt is None else config.length
        self.builder = PromptBuilder(spec, lm, chat=config.chat, reserve=spec.max_new_tokens + n_soft)
        # each row's prompt and target tokens, once: every step's batch and validation loss draw the same rows
        self._tokens = PerObject(lambda example: (self.builder.generation(example).ids, lm.encode(tuning_target(spec, example))))
        self.lora_targets = None
        self.params = {"soft_prompt": self.prompt}
        if config.method == "lora":
            # the model's own projections unless the settings name them (see lora.default_targets)
            self.lora_targets = config.lora_targets or default_targets(lm)
            self._lora = lora_applied(lm, lora_config(config.lora_rank, config.lora_alpha, self.lora_targets), seed=config.seed)
            self.peft_model = self._lora.__enter__()
        try:  # with the adapters in place: the engine's self-check sees the model it will tune
            if self._lora is not None:
                self.params = trainable_parameters(self.peft_model)
            self.engine = start_engine(lm, soft_prompt=self.prompt)
            self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=config.lr, weight_decay=0.0)
        except BaseException:
            self.close()  # the model leaves as it came
            raise

    @property
    def n_trainable(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def close(self) -> None:
        """Take LoRA layers out of the model again (nothing to do for a soft prompt)."""
        if self._lora is not None:
            self._lora.__exit__(None, None, None)
            self._lora = None

    def __enter__(self) -> Tuner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def tuned(self, output: Path, summary: dict) -> SoftPrompt | Adapter:
        """Save what was tuned into `output` (the commit marker of a finished run) and return it."""
        if self.prompt is None:
            save_adapter(output, self.peft_model, summary)
            return load_adapter(output)
        path = output / "soft_prompt.safetensors"
        save_soft_prompt(path, self.prompt, summary)
        return SoftPrompt(self.prompt.detach().clone(), summary, path)

    def batch(self, step: int) -> list[Example]:
        rng = random.Random(self.config.seed * 1_000_003 + step)
        return rng.sample(self.train, min(self.config.batch_size, len(self.train)))

    def loss(self, examples: list[Example], *, backward: bool = False) -> torch.Tensor:
        """Mean cross-entropy over the target tokens of `examples`.

        It is computed in micro-batches of at most `TOKEN_BUDGET` padded positions; with
        `backward`, each micro-batch's share of the gradient is accumulated as soon as it is
        computed, so only one micro-batch's activations are held at a time (long GSM8K solutions
        would otherwise hold gigabytes). The result is the same as one pass over the batch."""
        sequences = [self._tokens(e) for e in examples]  # shared lists: read, never changed
        n_targets = sum(len(target) for _, target in sequences)
        total = torch.zeros((), device=self.engine.device)
        for group in _micro_batches(sequences, TOKEN_BUDGET):
            part = self.engine.target_loss(group) / n_targets
            if backward:
                if not part.requires_grad:
                    raise SoftevalError("no tuned parameter reaches the loss: the model's forward does not use them; set lora targets to layers it calls")
                part.backward()
            total = total + part.detach()
        return total

    def step(self, step: int) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.batch(step), backward=True)
        if not torch.isfinite(loss):
            raise SoftevalError(f"loss became {loss.item()} at step {step}; lower --lr or check the task's targets")
        unused = next((name for name, p in self.params.items() if p.grad is None), None)
        if unused is not None:
            layer = unused.split(".lora_")[0].removeprefix("base_model.model.")
            raise SoftevalError(f"the adapter on {layer} gets no gradient: the model's forward does not call that layer; set lora targets to layers it calls")
        # a non-finite gradient would put NaN into the parameters and every checkpoint after them
        if any(not torch.isfinite(p.grad).all() for p in self.params.values()):
            raise SoftevalError(f"the gradient became non-finite at step {step}; lower --lr or check the task's targets")
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.config.max_grad_norm)
        self.optimizer.step()
        return loss.item()

    def validate(self, bars: Bars | None = None) -> dict:
        bars = bars or Bars(None)
        engine = start_engine(self.lm, soft_prompt=None if self.prompt is None else self.prompt.detach())
        with torch.no_grad():
            samples, _ = run_examples(self.spec, self.val, self.builder, engine, bars, "validate", gold=False)
            val_loss = float(self.loss(self.val[: 4 * self.config.batch_size]))
        metrics = aggregate(samples, n_resamples=200)
        # each validation row's outcomes, in the slice's fixed order: a step's metrics pair with
        # another step's row by row (the findings' saturation and knowledge tests)
        outcomes = {m: [int(getattr(s, ROW_METRICS[m])) for s in samples] for m in CURVE_METRICS}
        return {"val_loss": val_loss, **{m: metrics[m].value for m in CURVE_METRICS}, "rows": outcomes}

    # --- checkpoints: safetensors only, never pickles --------------------------------------------

    def save_checkpoint(self, path: Path, state: RunState) -> None:
        tensors = {}
        for name, param in self.params.items():
            tensors[name] = param.detach().cpu().contiguous()
            optimizer = self.optimizer.state.get(param, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in optimizer:
                    tensors[f"{key}:{name}"] = optimizer[key].detach().cpu().contiguous()
        meta = {
            "step": str(state.step),
            "curve": json.dumps(state.curve),
            "tuning_seconds": repr(state.seconds),
            "config": self.config.model_dump_json(),
            "made_for": json.dumps(self.made_for()),
        }
        write_bytes_atomic(path, save(tensors, metadata=meta))

    def made_for(self) -> dict:
        """The model and task spec a checkpoint of this run belongs to."""
        return {"model": self.lm.identity, "task_spec_sha256": self.spec.sha256(), "method": self.config.method}

    def load_checkpoint(self, path: Path) -> RunState:
        check_resumable(path, self.config)
        if not checkpoint_matches(path, self.config, self.lm, self.spec):
            raise SoftevalError(
                f"checkpoint {path} was written for another model or task (or an edited task spec); "
                "delete it to tune from step 0, or choose another --output"
            )
        try:
            # the optimizer state goes where the parameters live (the model's device)
            device = str(next(iter(self.params.values())).device)
            with safe_open(str(path), framework="pt", device=device) as f:
                meta = f.metadata()
                state = RunState(int(meta["step"]), json.loads(meta["curve"]), float(meta.get("tuning_seconds", 0.0)))
                keys = set(f.keys())
                for name, param in self.params.items():
                    with torch.no_grad():
                        param.copy_(f.get_tensor(name))
                    # checkpoints of older versions keep a soft prompt's moments unprefixed
                    prefix = f"exp_avg:{name}" if f"exp_avg:{name}" in keys else "exp_avg" if name == "soft_prompt" else None
                    if prefix in keys:
                        self.optimizer.state[param] = {
                            "step": torch.tensor(float(state.step)),
                            "exp_avg": f.get_tensor(prefix),
                            "exp_avg_sq": f.get_tensor(prefix.replace("exp_avg", "exp_avg_sq")),
                        }
        except (KeyError, ValueError, RuntimeError, OSError, SafetensorError) as exc:
            raise _unreadable_checkpoint(path, exc) from exc
        return state


@dataclass
class RunState:
    """Where a tuning run stands: steps done, the curve so far and the tuning time spent on them
    (over every resumed part of the run)."""

    step: int = 0
    curve: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def _micro_batches(sequences: list[tuple[list[int], list[int]]], budget: int) -> list[list[tuple[list[int], list[int]]]]:
    """Consecutive groups, by length, whose rows x longest row stay within `budget` (one row at least)."""
    ordered = sorted(sequences, key=lambda s: len(s[0]) + len(s[1]))
    groups: list[list] = []
    for sequence in ordered:
        width = len(sequence[0]) + len(sequence[1])  # the longest so far: sorted by length
        if groups and (len(groups[-1]) + 1) * width <= budget:
            groups[-1].append(sequence)
        else:
            groups.append([sequence])
    return groups


def checkpoint_config(path: Path) -> TuneConfig | None:
    """The settings an unfinished run's checkpoint was written with, if there is one."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            return TuneConfig.model_validate_json((f.metadata() or {})["config"])
    except (KeyError, ValueError, OSError, SafetensorError) as exc:  # pydantic's error is a ValueError
        raise _unreadable_checkpoint(path, exc) from exc


def checkpoint_matches(path: Path, config: TuneConfig, lm: LoadedModel, spec: TaskSpec) -> bool:
    """Whether `path` holds an unfinished run of these settings, model and task spec."""
    if checkpoint_config(path) != config:
        return False
    with safe_open(str(path), framework="pt") as f:
        made_for = json.loads((f.metadata() or {}).get("made_for", "{}"))
    return (
        not model_difference(made_for.get("model", {}), lm.identity)
        and made_for.get("task_spec_sha256") == spec.sha256()
        and made_for.get("method", "soft-prompt") == config.method
    )


def check_resumable(path: Path, config: TuneConfig) -> None:
    """An error, before any work, when a run with `config` cannot continue the checkpoint at `path`."""
    saved = checkpoint_config(path)
    if saved is None or saved == config:
        return
    changed = ", ".join(k for k, v in config.model_dump().items() if saved.model_dump().get(k) != v)
    raise SoftevalError(
        f"checkpoint {path} was written with other settings ({changed}); resume with the same flags, "
        "or delete it to tune from step 0"
    )


def _unreadable_checkpoint(path: Path, exc: Exception) -> SoftevalError:
    if isinstance(exc, KeyError):
        reason = f"it has no '{exc.args[0]}' entry"
    else:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    return SoftevalError(
        f"checkpoint {path} is truncated or not a softeval tuning checkpoint ({reason}); "
        "delete it to tune from step 0"
    )


def tune(
    lm: LoadedModel,
    spec: TaskSpec,
    config: TuneConfig | None = None,
    *,
    output: str | Path,
    data_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    produced: dict | None = None,
    prior_seconds: float = 0.0,
    start: SoftPrompt | None = None,
) -> SoftPrompt | Adapter:
    """Tune a soft prompt (or, with `config.method == "lora"`, a LoRA adapter) and return it.

    Writes curve.json, curve.svg and then soft_prompt.safetensors (or the PEFT adapter files) into
    `output`. Its metadata records the provenance (see `provenance`), the final validation metrics,
    the trainable parameter count and the tuning time; `produced` says how it was made when that is
    more than a plain run (a sweep passes its grid, and its trials' time as `prior_seconds`, so the
    recorded tuning time is the prompt's whole cost). With `start`, a soft prompt's tuning starts
    from that prompt's vectors (a warm start from an earlier checkpoint's prompt; `produced`
    should record it, see `warm_start_record`)."""
    config = config or TuneConfig()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    with Tuner(lm, spec, config, data_dir, start=start) as tuner:
        state = _train(tuner, output / "checkpoint.safetensors", resume, progress)
        summary = provenance(lm, spec, config, data_dir, produced or {"by": "tune"}) | {
            "steps": state.step,  # fewer than config.steps where adaptive tuning stopped it
            "stopped_early": stopped_early(state.curve, config),
            "final": {k: v for k, v in state.curve[-1].items() if k != "rows"},
            "trainable_parameters": tuner.n_trainable,
            # the whole run's tuning time, resumed parts (and sweep trials) included
            "tuning_seconds": round(state.seconds + prior_seconds, 2),
            "engine": tuner.engine.check,  # the path the tuning ran on (softeval.engine.selfcheck)
            # evaluation rows among the tuning rows: its cells are flagged (none unless the spec allows them)
            "eval_rows_in_tuning": tuner.eval_rows_in_tuning,
        }
        if tuner.lora_targets is not None:
            summary["lora_targets"] = tuner.lora_targets  # as resolved for this model
        write_json_atomic(output / "curve.json", state.curve)
        write_curve_chart(state.curve, output, title=f"{lm.name} / {spec.name} / {config.method}{' (chat)' if config.chat else ''}")
        # what was tuned last: where it exists, so do its curves (a finished run is reused by it)
        return tuner.tuned(output, summary)


def warm_start_record(start: SoftPrompt, checkpoint: str) -> dict:
    """How a warm-started prompt was produced: from which checkpoint's prompt (by its hash, so a
    prompt tuned again there makes this one be tuned again too)."""
    return {"by": "tune", "warm_start": {"from": checkpoint, "sha256": start.sha256}}


def _warm_vectors(start: SoftPrompt, lm: LoadedModel, config: TuneConfig) -> torch.Tensor:
    if tuple(start.vectors.shape) != (config.length, lm.hidden_size):
        raise SoftevalError(f"a warm start from {start.path} needs {config.length} vectors of {lm.hidden_size} values for {lm.name}, "
                            f"and it holds {tuple(start.vectors.shape)}; a series' checkpoints must share one architecture (or drop warm_start)")
    return start.vectors.detach().float().clone()


def _train(tuner: Tuner, checkpoint: Path, resume: bool, progress: bool) -> RunState:
    """Every step from the checkpoint (or step 0) to the end, validating and checkpointing every
    `eval_every` steps."""
    config, output = tuner.config, checkpoint.parent
    state = RunState()
    if resume:
        if checkpoint.exists():
            state = tuner.load_checkpoint(checkpoint)
            log.info("resuming %s at step %d of %d", output, state.step, config.steps)
        else:
            log.warning("no checkpoint in %s yet: tuning from step 0", output)
    started = time.perf_counter()
    with progress_bars(progress) as bars:
        advance = bars.row(f"{tuner.lm.name} {tuner.spec.name}: tune {config.method}", config.steps)
        if not state.curve:  # the untuned starting point, so the curve shows what tuning changed
            state.curve.append({"step": 0, "train_loss": None, **tuner.validate(bars)})
        advance(state.step)
        losses: list[float] = []
        for step in range(state.step, config.steps):
            if stalled(state.curve, config.patience):
                break
            losses.append(tuner.step(step))
            state.step = step + 1
            if state.step % config.eval_every == 0 or state.step == config.steps:
                metrics = tuner.validate(bars)
                # a step can throw the parameters so far that the next forward pass overflows: the
                # last step's shows only here, and nothing would stop it from being saved
                if not math.isfinite(metrics["val_loss"]):
                    raise SoftevalError(f"the validation loss became {metrics['val_loss']} after step {state.step}; lower --lr")
                state.curve.append({"step": state.step, "train_loss": sum(losses) / len(losses), **metrics})
                losses = []
                state.seconds += time.perf_counter() - started
                started = time.perf_counter()
                tuner.save_checkpoint(checkpoint, state)
            advance(1)
    return state


def stalled(curve: list[dict], patience: int | None) -> bool:
    """Whether adaptive tuning stops here: validation format-following has not risen above its
    best for the last `patience` validations (the untuned start counts as the first). Read off
    the curve alone, so a resumed run stops where an uninterrupted one would."""
    if patience is None or not curve:
        return False
    scores = [point["format_following"] for point in curve]
    best = scores.index(max(scores))  # the first validation that reached the best
    return len(scores) - 1 - best >= patience


def stopped_early(curve: list[dict], config: TuneConfig) -> dict | None:
    """Where and why adaptive tuning stopped a run before its steps, as the prompt records it."""
    last = curve[-1]["step"] if curve else 0
    if config.patience is None or last >= config.steps:
        return None
    best = max(curve, key=lambda point: point["format_following"])
    return {"step": last, "patience": config.patience, "best_step": best["step"], "of_steps": config.steps}


SWEEP_LRS = (0.003, 0.01, 0.03)
SWEEP_INITS: tuple[Init, ...] = ("vocab", "text")


def sweep(
    lm: LoadedModel,
    spec: TaskSpec,
    config: TuneConfig | None = None,
    *,
    output: str | Path,
    data_dir: str | Path | None = None,
    sweep_steps: int = 40,
    lrs: tuple[float, ...] = SWEEP_LRS,
    inits: tuple[Init, ...] = SWEEP_INITS,
    progress: bool = True,
) -> SoftPrompt:
    """Try each (learning rate, init) for `sweep_steps` steps, pick the best on the validation
    slice (task accuracy, then lower validation loss), tune it for the full run, record all."""
    config = config or TuneConfig()
    output = Path(output)
    trials = []
    for lr in lrs:
        for init in inits:
            trial = config.model_copy(update={"lr": lr, "init": init, "steps": min(sweep_steps, config.steps)})
            trial = trial.model_copy(update={"eval_every": min(trial.eval_every, trial.steps)})
            tuned = tune(lm, spec, trial, output=output / "sweep" / f"lr{lr:g}-{init}", data_dir=data_dir, progress=progress)
            trials.append({"lr": lr, "init": init, "steps": trial.steps, "final": tuned.metadata["final"], "tuning_seconds": tuned.metadata["tuning_seconds"]})
    best = max(trials, key=lambda t: ((t["final"].get("task_accuracy") or 0.0), -t["final"]["val_loss"]))
    chosen = config.model_copy(update={"lr": best["lr"], "init": best["init"]})
    write_json_atomic(output / "sweep.json", {"trials": trials, "chosen": {"lr": best["lr"], "init": best["init"]}})
    produced = sweep_record(sweep_steps, lrs, inits)
    trial_seconds = sum(t["tuning_seconds"] for t in trials)
    return tune(lm, spec, chosen, output=output, data_dir=data_dir, progress=progress, produced=produced, prior_seconds=trial_seconds)


def sweep_record(sweep_steps: int, lrs: tuple[float, ...] = SWEEP_LRS, inits: tuple[Init, ...] = SWEEP_INITS) -> dict:
    """How a swept prompt was produced, as its metadata records it."""
    return {"by": "sweep", "sweep_steps": sweep_steps, "lrs": list(lrs), "inits": list(inits)}


def provenance(lm: LoadedModel, spec: TaskSpec, config: TuneConfig, data_dir, produced: dict) -> dict:
    """Everything a tuned prompt depends on: the model, the task spec, the chat mode, the data
    it was tuned and validated on, the settings and how it was produced (plain run or sweep)."""
    ds = spec.dataset
    held_out = not ds.validation_split or ds.validation_split == ds.tune_split
    return {
        "model": lm.identity,
        "task": {"name": spec.name, "spec_sha256": spec.sha256()},
        "chat": config.chat,
        "data": {
            "tune": data_identity(spec, ds.tune_split, data_dir),
            "validation": None if held_out else data_identity(spec, ds.validation_split, data_dir),
        },
        "config": config.model_dump(),
        "produced": produced,
    }


def provenance_difference(saved: dict, wanted: dict, *, sweep: bool) -> str | None:
    """What differs between a saved prompt's provenance and the one a run wants, or None.
    A sweep chooses lr and init itself, so those settings are not compared for one. A prompt
    that does not record whether evaluation rows were among its tuning rows (tuned before they
    were left out) is tuned again: it may have been tuned on the rows it is scored on."""
    if model_difference(saved.get("model", {}), wanted["model"]):
        return "model"
    if "eval_rows_in_tuning" not in saved:
        return "record of the evaluation rows left out of tuning"
    for key in ("task", "chat", "produced"):
        if saved.get(key) != wanted[key]:
            return key
    for split in ("tune", "validation"):
        if _data_key(saved.get("data", {}).get(split)) != _data_key(wanted["data"][split]):
            return f"{split} data"
    ignore = {"lr", "init"} if sweep else set()
    settings = lambda c: {k: v for k, v in c.items() if k not in ignore}  # noqa: E731
    return None if settings(saved.get("config", {})) == settings(wanted["config"]) else "tuning settings"


def _data_key(identity: dict | None):
    # the content hash where there is one: a moved mirror is the same data
    return None if identity is None else (identity["split"], identity.get("sha256") or identity.get("source"))


def _level(config: TuneConfig, setting: str) -> int:
    """A setting the user chose and that cannot be met is a warning; a default that shrinks to
    the rows there are is as documented, and only logged."""
    return logging.INFO if getattr(config, setting) == TuneConfig.model_fields[setting].default else logging.WARNING


def _tuning_of(lm: LoadedModel, spec: TaskSpec, config: TuneConfig) -> str:
    """Which tuning a message is about: the method, model, task and mode."""
    return f"{config.method} of {lm.name} on {spec.name} ({'with' if config.chat else 'without'} the chat template)"


_said: set[str] = set()  # messages already logged: a sweep's trials and a study's cells repeat them


def _say_once(level: int, message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.log(level, "%s", message)


def _train_and_validation(spec: TaskSpec, config: TuneConfig, data_dir, tuning: str) -> tuple[list[Example], list[Example], int]:
    """Training pool and a fixed validation slice: the task's validation split where it has one,
    otherwise a seeded slice held out of the tuning split; and how many evaluation rows the
    tuning split kept (none, unless the spec allows tuning on them). `tuning` names the run in
    what is logged."""
    train, shared = apart_from_evaluation(spec, load_examples(spec, spec.dataset.tune_split, data_dir), data_dir)
    if spec.dataset.validation_split and spec.dataset.validation_split != spec.dataset.tune_split:
        val = load_examples(spec, spec.dataset.validation_split, data_dir, limit=config.val_size, seed=config.seed)
        if config.val_size > len(val):
            _say_once(_level(config, "val_size"), f"{tuning}: validation size {config.val_size}, but {spec.name}'s "
                      f"{spec.dataset.validation_split} split has {len(val)} rows; validating on those")
        return train, val, shared
    check_tuning_rows(spec, len(train))
    n_held = min(config.val_size, len(train) // 5)
    if n_held < config.val_size:
        _say_once(_level(config, "val_size"), f"{tuning}: validation size {config.val_size}, but only {n_held} rows (a fifth of "
                  f"{spec.name}'s tuning split) are held out; validating on those")
    held = set(random.Random(config.seed).sample(range(len(train)), n_held))
    return [e for i, e in enumerate(train) if i not in held], [e for i, e in enumerate(train) if i in held], shared
