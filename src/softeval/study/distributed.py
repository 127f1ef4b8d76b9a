"""A study's cells as Ray tasks, for grids too big for one machine.

Each (model, task) unit is one task, so a worker loads its model once for all of the unit's
methods and chat modes. Workers write their cells into the same output folder layout, atomically,
exactly as a serial run does; the driver only collects what happened. A unit that fails is
reported and the others finish; a rerun skips every finished cell, as it does serially.
Ray is an optional dependency: `pip install 'softeval[ray]'`.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from softeval.errors import SoftevalError
from softeval.models import load_model, model_kind, model_name, prepare_alias
from softeval.progress import progress_bars
from softeval.study.cells import free_evaluated_revision, run_unit
from softeval.study.folders import CellReport
from softeval.study.settings import Study
from softeval.tasks import TaskSpec
from softeval.tuning import SoftPrompt

log = logging.getLogger("softeval")


def run_on_ray(
    study: Study,
    specs: list[TaskSpec],
    address: str,
    *,
    output: Path,
    soft: SoftPrompt | None,
    data_dir,
    cache_dir,
    force: bool,
    tell_failures: bool = True,
) -> list[CellReport]:
    """Run every unit on Ray ("local": a cluster started for this command; otherwise the address
    of a running cluster, whose workers see the same files and have softeval installed) and
    return the reports of every cell."""
    try:
        import ray
    except ImportError as exc:
        raise SoftevalError("--ray needs Ray; install it with: pip install 'softeval[ray]'") from exc
    # aliases are converted here, once: units of one alias must not convert it side by side
    for entry in study.models:
        if model_kind(entry.model) == "alias":
            prepare_alias(entry.model, cache_dir)
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
        except Exception as exc:  # noqa: BLE001 - Ray raises several kinds for an unreachable cluster
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise SoftevalError(f"cannot start or reach Ray at '{address}': {reason}; use --ray local or a running cluster's address") from exc
    # workers may start elsewhere: every path they get is absolute
    where = {
        "output": Path(output).resolve(),
        "data_dir": None if data_dir is None else str(Path(data_dir).resolve()),
        "cache_dir": None if cache_dir is None else str(Path(cache_dir).resolve()),
    }
    task = ray.remote(_run_unit).options(**study.resources)
    try:
        pending = {
            task.remote(entry.model, spec, study, role=entry.role, soft=soft, force=force, tell_failures=tell_failures, **where): (entry.model, spec.name)
            for entry in study.models
            for spec in specs
        }
        reports: list[CellReport] = []
        units_left = Counter(model for model, _ in pending.values())
        failed: set[str] = set()
        with progress_bars(True) as bars:
            advance = bars.row(f"ray: {len(pending)} (model, task) units", len(pending))
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                model, task_name = pending.pop(done[0])
                try:
                    unit = ray.get(done[0])
                except Exception as exc:  # noqa: BLE001 - a failing unit must not stop the others
                    reason = (str(getattr(exc, "cause", None) or exc).strip().splitlines() or [type(exc).__name__])[-1]
                    log.error("%s on %s failed: %s", model, task_name, reason)
                    unit = [CellReport(where["output"] / model_name(model) / task_name, "failed", reason[:300])]
                reports += unit
                failed |= {model} if any(r.status == "failed" for r in unit) else set()
                units_left[model] -= 1
                if study.free_weights and not units_left[model] and model not in failed:
                    free_evaluated_revision(unit)
                advance(1)
        return reports
    finally:
        if started_here:
            ray.shutdown()


def _run_unit(
    model: str, spec: TaskSpec, study: Study, *, role: str | None, output: Path, soft, data_dir, cache_dir, force: bool, tell_failures: bool
) -> list[CellReport]:
    """One (model, task) unit inside a Ray worker, computing on as many threads as the CPUs it
    holds: set here rather than left to the worker's environment, so that a unit's floating-point
    results (which depend on how sums are split between threads) follow the study file."""
    import torch

    torch.set_num_threads(max(1, int(study.resources.get("num_cpus", 1))))
    lm = load_model(model, cache_dir=cache_dir, lazy=True)
    return run_unit(lm, spec, study, role=role, output=output, soft=soft, data_dir=data_dir, force=force, progress=False, tell_failures=tell_failures)
