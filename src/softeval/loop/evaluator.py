"""`InLoop`: soft-prompted (and zero-shot, few-shot, LoRA) scores from inside a training loop.

    evaluator = InLoop(tasks=["arc_easy"], output="runs/live", recipe="baseline", limit=200)
    for step in range(1, steps + 1):
        train_step(...)
        if step % 500 == 0:
            evaluator.evaluate(model, tokenizer, step=step, tokens=step * tokens_per_step)

Each call evaluates the live model object, with no save and no reload, and files the step as a
checkpoint of the recipe's series (`recipe@step-N`, see `filing.py`), so the output folder reads
as a post-hoc study's: `softeval analyze`, the report page and the exports. The call never
changes training (`guard.py`), never crashes it (a failure is logged, recorded in its cell and
the call returns; `raise_errors=True` raises instead), and says what it cost (`cost.py`). Under
`torch.distributed`, the ranks share the cells (`ranks.py`). Everything that can be checked
before training starts is checked when the evaluator is made.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pydantic import ValidationError

from softeval.errors import SoftevalError, validation_problem
from softeval.loop.checkpoints import CheckpointEvaluator, Evaluation, Unit, check_recipe_name, check_tokenizer, one_line
from softeval.loop.ranks import World, gather, report
from softeval.loop.settings import LoopSettings
from softeval.study.folders import CellReport

log = logging.getLogger("softeval")

SOURCE = "in-loop"


class InLoop:
    """Evaluates a model while it trains, every call a checkpoint of `recipe`'s series in `output`.

    `tasks` and `methods` (default zero-shot, few-shot, soft-prompt) are named as in a study
    file, and so are the other settings (`limit`, `k`, `seed`, `batch_size`, `tuning={"steps":
    40, ...}`, `lora`), with `warm_start` (each step's soft prompt tuned from the last step's;
    default on), a fast set (`fast={"limit": 50, "steps": 10}`: run at every call into
    OUTPUT/fast, the full set every `full_every`-th call) and `tokens_per_step`. `tokenizer`,
    where given, is checked against the tasks now, before training starts."""

    def __init__(
        self,
        tasks: list[str],
        *,
        output: str | Path,
        recipe: str,
        methods: list[str] | None = None,
        data_dir: str | Path | None = None,
        tokenizer=None,
        raise_errors: bool = False,
        wandb: str | None = None,
        mlflow: str | None = None,
        progress: bool = False,
        quiet: bool = False,
        **settings,
    ):
        if isinstance(tasks, str):
            tasks = [tasks]
        try:
            validated = LoopSettings.model_validate({"tasks": list(tasks), **({"methods": list(methods)} if methods else {}), **settings})
        except ValidationError as exc:
            raise SoftevalError(f"InLoop: {validation_problem(exc, LoopSettings)}") from exc
        self.recipe = check_recipe_name(recipe, "InLoop")
        try:
            self.checkpoints = CheckpointEvaluator(validated, Path(output), data_dir, source=SOURCE, raise_errors=raise_errors, progress=progress,
                                                   quiet=quiet, wandb=wandb, mlflow=mlflow)
            self.checkpoints.check_recipe(self.recipe)
            if tokenizer is not None:
                check_tokenizer(tokenizer, list(self.checkpoints.specs.values()), validated, self.checkpoints.data_dir)
        except SoftevalError as exc:
            raise SoftevalError(f"InLoop: {exc}") from exc
        self.settings, self.output = validated, Path(output)
        self.calls = 0

    def check_model(self, model, tokenizer) -> None:
        """What can be told of the model before training starts: softeval can evaluate it (a
        transformers causal LM, not sharded), and the tokenizer encodes the tasks. Callbacks call
        this when training begins; an error here is raised, not logged."""
        from softeval.models import live_model

        live_model(f"{self.recipe}@step-0", unwrapped(model), tokenizer, weights_sha256="")
        try:
            check_tokenizer(tokenizer, list(self.checkpoints.specs.values()), self.settings, self.checkpoints.data_dir)
        except SoftevalError as exc:
            raise SoftevalError(f"InLoop: {exc}") from exc

    def evaluate(self, model, tokenizer, *, step: int, tokens: float | None = None, full: bool | None = None) -> Evaluation:
        """Evaluate the live `model` at training `step` (and `tokens`, else step x tokens_per_step),
        with the fast set and, at every full_every-th call or where `full` says so, the full set.
        Returns what it did; on rank 0 of a distributed run, with every rank's cells."""
        started = time.perf_counter()
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise SoftevalError(f"InLoop.evaluate: step must be a whole number of steps (0 or more), not {step!r}")
        if tokens is None and self.settings.tokens_per_step:
            tokens = step * self.settings.tokens_per_step
        world = World.current()
        evaluation = Evaluation(self.recipe, f"{self.recipe}@step-{step}", step, tokens)
        units = self.checkpoints.units(self._full_due(full))
        self.calls += 1
        weights = self._evaluate_share(model, tokenizer, world.share(units), evaluation)
        try:
            if world.rank != 0:
                evaluation.seconds = time.perf_counter() - started
                report(self.output, self.recipe, step, world.rank, _rank_record(evaluation, weights))
                return evaluation
            if world.size > 1:
                self._gather(evaluation, world, weights)
            self.checkpoints.file(evaluation, spec=evaluation.model)
            evaluation.seconds = time.perf_counter() - started
            self.checkpoints.finish(evaluation)
        except Exception as exc:  # noqa: BLE001 - a folder that cannot be written stops no training either
            self._failed(evaluation, exc)
            evaluation.seconds = time.perf_counter() - started
        return evaluation

    def close(self) -> None:
        """Write the reports that are behind their cells (see `refresh_every`), and finish
        softeval's own tracker runs (a training run's own tracker run is left to it)."""
        try:
            self.checkpoints.close()
        except Exception as exc:  # noqa: BLE001
            if self.checkpoints.raise_errors:
                raise
            log.error("softeval could not write the reports of %s: %s; softeval report %s writes them", self.output, one_line(exc), self.output)

    def _failed(self, evaluation: Evaluation, exc: Exception) -> None:
        """A failure to file or report a checkpoint whose cells are done: logged and recorded in
        the evaluation it returns, and training goes on (raised with `raise_errors`)."""
        if self.checkpoints.raise_errors:
            raise exc
        evaluation.failures.append(f"{evaluation.model} (filing): {one_line(exc)}")
        log.error("softeval could not file %s in %s: %s; training goes on", evaluation.model, self.output, one_line(exc))

    def _full_due(self, full: bool | None) -> bool:
        if self.settings.fast is None:
            return True
        return full if full is not None else self.calls % self.settings.full_every == 0

    def _evaluate_share(self, model, tokenizer, units: list[Unit], evaluation: Evaluation) -> str | None:
        """This rank's units on the live model; returns the hash of the weights evaluated."""
        from softeval.loop.cost import compute_parameters, counted_positions
        from softeval.loop.guard import training_untouched
        from softeval.models import live_model, parameters_sha256

        weights = None
        try:
            network = unwrapped(model)
            with training_untouched(network), counted_positions(network) as positions:
                weights = parameters_sha256(network)
                lm = live_model(evaluation.model, network, tokenizer, weights_sha256=weights)
                evaluation.cells += self.checkpoints.run(lm, units, self.recipe, evaluation.step)
            evaluation.flops = positions.flops(compute_parameters(network))
        except Exception as exc:  # noqa: BLE001 - an evaluation never stops the training it measures
            if self.checkpoints.raise_errors:
                raise
            evaluation.failures.append(f"{evaluation.model}: {one_line(exc)}")
            log.error("softeval could not evaluate %s: %s; training goes on", evaluation.model, one_line(exc))
        return weights

    def _gather(self, evaluation: Evaluation, world: World, weights: str | None) -> None:
        """The other ranks' cells, failures and FLOPs, as their reports give them."""
        reports, missing = gather(self.output, self.recipe, evaluation.step, world, self.settings.rank_timeout, weights or "")
        for rank, record in sorted(reports.items()):
            evaluation.cells += [CellReport(Path(folder), status, message) for folder, status, message in record["cells"]]
            evaluation.failures += [f"rank {rank}: {failure}" for failure in record["failures"]]
            if record.get("flops") is not None:
                evaluation.flops = (evaluation.flops or 0.0) + record["flops"]
        for rank in missing:
            message = (f"rank {rank} did not report its cells of {evaluation.model} within {self.settings.rank_timeout:.0f} s; "
                       "they are read once they land (or raise rank_timeout)")
            evaluation.failures.append(message)
            log.error("%s", message)


def unwrapped(model):
    """The model a wrapper trains: DistributedDataParallel's `module`, torch.compile's original.
    A model whose parameters are sharded (FSDP) is refused: each rank holds a part of it."""
    if _sharded(model):
        raise SoftevalError(f"InLoop: {type(model).__name__} is sharded (FSDP): each rank holds a part of its parameters, and softeval "
                            "evaluates whole models; save a full checkpoint and evaluate it with softeval watch (see docs/training.md)")
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            return model


def _sharded(model) -> bool:
    """Whether a model's parameters are split over ranks: FSDP's wrapper, FSDP2's DTensors,
    DeepSpeed ZeRO-3's partitioned parameters (`ds_id`), or parameters left empty on this rank."""
    if any(type(module).__name__ == "FullyShardedDataParallel" for module in model.modules()):
        return True
    parameters = list(model.parameters())
    if any(hasattr(p, "ds_id") or p.numel() == 0 for p in parameters):
        return True
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed tensors shards nothing this way
        return False
    return any(isinstance(p, DTensor) for p in parameters)


def _rank_record(evaluation: Evaluation, weights: str | None) -> dict:
    return {"weights_sha256": weights or "", "cells": [[str(c.folder), c.status, c.message] for c in evaluation.cells],
            "failures": evaluation.failures, "flops": evaluation.flops, "seconds": evaluation.seconds}
