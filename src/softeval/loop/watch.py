"""`softeval watch RUN_DIR...`: evaluate a training run's checkpoints as they land, for any trainer,
with no change to it.

Each run folder is polled for checkpoint folders (`checkpoint-500/`, `step1000/`, ...). A
checkpoint is evaluated once it is complete, and never read while it is being written:

* its config.json is there, and every safetensors file it holds (or its index names) is as
  long as its own header says (a file cut short, or still growing, is not);
* where the trainer marks a finished checkpoint (transformers' Trainer writes trainer_state.json
  last), that marker is there; otherwise the files it holds have not changed for `settle`
  seconds.

Checkpoints are evaluated in step order, each soft prompt warm-started from the one before, and
filed as a series of the run (named after its folder) in the output folder, whose analysis,
comparison, report page and trackers are refreshed after each. A checkpoint that fails to load
(corrupt, deleted while read) is recorded with its one-line reason and skipped; one whose files
change while it is evaluated is evaluated again once they settle. OUTPUT/watch.json records what
was evaluated, so a restart goes on where it stopped.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from softeval._io import write_json_atomic
from softeval.errors import SoftevalError
from softeval.loop.checkpoints import CheckpointEvaluator, Evaluation, check_recipe_name, one_line
from softeval.loop.settings import LoopSettings
from softeval.models import checkpoint_step, checkpoint_tokens, model_name
from softeval.models.fingerprint import TRAINING_STATE
from softeval.progress import console

log = logging.getLogger("softeval")

SOURCE = "watch"
STATE_FILE = "watch.json"
TRAINER_MARKER = "trainer_state.json"  # transformers' Trainer writes it last into a checkpoint
SHARD_NAME = re.compile(r"-\d{5}-of-\d{5}\.safetensors$")  # model-00001-of-00003.safetensors
STALE_AFTER_S = 600.0  # an unfinished checkpoint unchanged this long no longer holds back the later ones


@dataclass
class WatchState:
    """What a watch evaluated (by checkpoint folder): its files' stamp, and the reason where it failed."""

    path: Path
    evaluated: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def load(cls, output: Path) -> WatchState:
        path = Path(output) / STATE_FILE
        try:
            recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, ValueError):  # unreadable: the cells on disk are still skipped by their identity
            recorded = {}
        return cls(path, recorded.get("evaluated", {}) if isinstance(recorded, dict) else {})

    def done(self, folder: Path, stamp: list) -> bool:
        """Evaluated (or failed) already, with the files it has now."""
        entry = self.evaluated.get(str(folder.resolve()))
        return entry is not None and entry.get("stamp") == stamp

    def record(self, folder: Path, stamp: list, failure: str | None) -> None:
        self.evaluated[str(folder.resolve())] = {"stamp": stamp, "failure": failure}
        write_json_atomic(self.path, {"evaluated": self.evaluated})


@dataclass
class Candidate:
    folder: Path
    step: int
    stamp: list  # its files as they were when it was found complete (see files_stamp)


class Watcher:
    """Polls run folders and evaluates their checkpoints as they complete (see the module's docstring)."""

    def __init__(self, runs: list[str | Path], *, output: str | Path, settings: LoopSettings, data_dir=None, settle: float = 10.0,
                 until_step: int | None = None, progress: bool = True, wandb: str | None = None, mlflow: str | None = None,
                 refresh_every: float = 0.0):
        self.runs = [Path(run) for run in runs]
        if not self.runs:
            raise SoftevalError("softeval watch: give at least one training run's folder")
        for run in self.runs:
            if not run.is_dir():
                raise SoftevalError(f"run folder not found: {run}; give the folder the trainer saves its checkpoints into")
        self.recipes = {run: check_recipe_name(run.resolve().name, "softeval watch") for run in self.runs}
        names = list(self.recipes.values())
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice:
            raise SoftevalError(f"two run folders are named '{twice}': their checkpoints would share names; give runs of different names")
        self.output, self.settings, self.settle, self.until_step = Path(output), settings, settle, until_step
        self.checkpoints = CheckpointEvaluator(settings, self.output, data_dir, source=SOURCE, progress=progress, wandb=wandb, mlflow=mlflow,
                                               refresh_every=refresh_every)
        for recipe in self.recipes.values():
            self.checkpoints.check_recipe(recipe)
        self.state = WatchState.load(self.output)
        self.evaluations: list[Evaluation] = []

    def run(self, *, poll: float = 30.0, once: bool = False, stop: threading.Event | None = None) -> list[Evaluation]:
        """Evaluate checkpoints as they complete until every run has reached `until_step`, `stop`
        is set, or (with `once`) nothing more is complete now."""
        stop = stop or threading.Event()
        said = ""
        try:
            while not stop.is_set():
                found = {run: self._next_ready(run) for run in self.runs}
                ready = [(run, candidate) for run, (candidate, _) in found.items() if candidate is not None]
                for run, candidate in ready:
                    self._evaluate(run, candidate)
                if self._finished() or (once and not ready):
                    break
                if not ready:
                    waiting = "; ".join(reason for _, reason in found.values())
                    if waiting != said:  # one line each time what it waits for changes
                        console.print(f"softeval watch: {waiting}", highlight=False, markup=False)
                        said = waiting
                    stop.wait(poll)
        finally:
            self.checkpoints.close()
        return self.evaluations

    # --- which checkpoint is next ------------------------------------------------------------

    def _next_ready(self, run: Path) -> tuple[Candidate | None, str]:
        """The run's first checkpoint in step order that is not evaluated yet, if it is complete,
        else what the run waits for. An unfinished checkpoint holds the later ones back until its
        files have not changed for a long while (a save that was abandoned)."""
        waiting = None
        for folder, step in checkpoint_folders(run):
            if self.until_step is not None and step > self.until_step:
                break
            stamp = files_stamp(folder)
            if self.state.done(folder, stamp):
                continue
            still = time.time() - max((mtime for _, _, mtime in stamp), default=0) / 1e9  # seconds since a file last changed
            reason = incomplete_reason(folder)
            if reason is None and not (folder / TRAINER_MARKER).is_file() and still < self.settle:
                reason = f"its files have not been still for {self.settle:g} s yet"
            if reason is None:
                return Candidate(folder, step, stamp), ""
            waiting = waiting or f"waiting for {folder} ({reason})"
            if still < STALE_AFTER_S:
                break
        return None, waiting or f"waiting for a new checkpoint in {run}"

    def _finished(self) -> bool:
        """Every run has reached --until-step (a checkpoint at or past it), and each of its
        checkpoints up to it is evaluated (or failed)."""
        if self.until_step is None:
            return False
        for run in self.runs:
            found = checkpoint_folders(run)
            if not any(step >= self.until_step for _, step in found):
                return False
            if not all(self.state.done(folder, files_stamp(folder)) for folder, step in found if step <= self.until_step):
                return False
        return True

    # --- one checkpoint ------------------------------------------------------------------------

    def _evaluate(self, run: Path, candidate: Candidate) -> None:
        from softeval.loop.cost import compute_parameters, counted_positions
        from softeval.models import load_model

        started = time.perf_counter()
        folder, recipe = candidate.folder, self.recipes[run]
        evaluation = Evaluation(recipe, model_name(str(folder)), candidate.step, checkpoint_tokens_of(folder, candidate.step, self.settings))
        failure = None
        try:
            lm = load_model(str(folder))
            with counted_positions(lm.model) as positions:
                evaluation.cells = self.checkpoints.run(lm, self.checkpoints.units(full=True), recipe, candidate.step)
            evaluation.flops = positions.flops(compute_parameters(lm.model))
        except Exception as exc:  # noqa: BLE001 - a checkpoint that cannot be evaluated is skipped, the next ones go on
            failure = one_line(exc)
        if files_stamp(folder) != candidate.stamp:  # rewritten (or deleted) while read: not this checkpoint's result
            if folder.is_dir():
                console.print(f"softeval watch: {folder} changed while it was evaluated; evaluating it again once its files settle",
                              highlight=False, markup=False)
                return
            failure = failure or "its folder was deleted while it was evaluated"
        if failure is not None:
            evaluation.failures.append(f"{folder}: {failure}")
            log.error("%s was not evaluated: %s; the next checkpoints go on", folder, failure)
        self.state.record(folder, candidate.stamp, failure)
        self.checkpoints.file(evaluation, spec=str(folder))
        evaluation.seconds = time.perf_counter() - started
        self.checkpoints.finish(evaluation)
        self.evaluations.append(evaluation)


def watch(runs: list[str | Path], *, output: str | Path, settings: LoopSettings, data_dir=None, poll: float = 30.0, settle: float = 10.0,
          until_step: int | None = None, once: bool = False, stop: threading.Event | None = None, progress: bool = True,
          wandb: str | None = None, mlflow: str | None = None, refresh_every: float = 0.0) -> list[Evaluation]:
    """Evaluate the checkpoints of training runs as they land (see `Watcher`); returns what each
    evaluation did. The reports are written after every checkpoint, or at most every
    `refresh_every` seconds (and when it stops)."""
    watcher = Watcher(runs, output=output, settings=settings, data_dir=data_dir, settle=settle, until_step=until_step, progress=progress,
                      wandb=wandb, mlflow=mlflow, refresh_every=refresh_every)
    return watcher.run(poll=poll, once=once, stop=stop)


# --- a checkpoint folder's state ------------------------------------------------------------------


def checkpoint_folders(run: Path) -> list[tuple[Path, int]]:
    """The run's checkpoint folders (named with a step) in step order."""
    # a trainer's staging folder (tmp-checkpoint-500, renamed when complete) is not a checkpoint yet
    found = [(child, checkpoint_step(child.name)) for child in run.iterdir() if child.is_dir() and not child.name.startswith((".", "tmp"))]
    return sorted(((folder, step) for folder, step in found if step is not None), key=lambda item: item[1])


def files_stamp(folder: Path) -> list:
    """Name, size and modification time of each file a model loads from the folder (the training
    state beside it left out: the model may be read while an optimizer state is still written)."""
    try:
        files = sorted(f for f in folder.iterdir() if f.is_file() and not f.name.startswith((".", *TRAINING_STATE, TRAINER_MARKER)))
        return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    except OSError:  # deleted while looked at
        return []


def incomplete_reason(folder: Path) -> str | None:
    """Why the checkpoint cannot be read yet, or None when its files are whole."""
    if not (folder / "config.json").is_file():
        return "no config.json yet"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return f"{index.name} does not parse yet"
    else:
        shards = sorted(f.name for f in folder.glob("*.safetensors"))
        if any(SHARD_NAME.search(name) for name in shards):  # shards whose index (written last) has not landed
            return f"{index.name} is not there yet"
    if not shards:
        other = [f.name for f in folder.iterdir() if f.suffix in (".bin", ".pt", ".pth") and not f.name.startswith(TRAINING_STATE)]
        return None if other else "no weight files yet"
    for shard in shards:
        reason = safetensors_incomplete(folder / shard)
        if reason:
            return reason
    return None


def safetensors_incomplete(path: Path) -> str | None:
    """Why a safetensors file is not whole yet, or None: its header must parse and the file be as
    long as the header's last tensor says."""
    try:
        with path.open("rb") as file:
            prefix = file.read(8)
            if len(prefix) < 8:
                return f"{path.name} has no header yet"
            (length,) = struct.unpack("<Q", prefix)
            header = json.loads(file.read(length))
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name} is not there yet"
    except (OSError, ValueError, struct.error):
        return f"{path.name}'s header does not parse yet"
    end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    if size < 8 + length + end:
        return f"{path.name} holds {size / 1e6:.1f} of {(8 + length + end) / 1e6:.1f} MB"
    return None


def checkpoint_tokens_of(folder: Path, step: int, settings: LoopSettings) -> float | None:
    """Tokens a checkpoint was trained on: from its name (`...-tokens21B`), the Trainer's count
    (trainer_state.json's num_input_tokens_seen), or step x tokens_per_step."""
    named = checkpoint_tokens(folder.name)
    if named is not None:
        return named
    try:
        seen = json.loads((folder / TRAINER_MARKER).read_text(encoding="utf-8")).get("num_input_tokens_seen")
    except (OSError, ValueError, AttributeError):
        seen = None
    if seen:
        return float(seen)
    return step * settings.tokens_per_step if settings.tokens_per_step else None
