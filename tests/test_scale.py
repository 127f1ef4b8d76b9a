"""A pre-training program's folder at scale, small enough for the suite: the scale benchmark's
known-truth folder (`benchmarks/analysis_scale.py`), the rows' columns kept beside samples.jsonl,
a refresh that reads only new cells and gives a full analysis's numbers, and the report page's
bounded views in Chromium."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from softeval.analysis import comparisons
from softeval.scoring import EvalResult
from softeval.scoring.rows import ROWS, read_rows
from test_report_page import browser, open_page  # noqa: F401 - the module-scoped browser fixture


@pytest.fixture(scope="module")
def scale(request):
    """The benchmark's module (benchmarks/ on the path for this module's tests)."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    request.addfinalizer(lambda: sys.path.remove(str(REPO / "benchmarks")))
    import analysis_scale

    return analysis_scale


def analyzed(folder: Path) -> dict:
    from softeval.reports import analyze

    analyze(folder)
    return json.loads((folder / "analysis.json").read_text())


def test_the_scale_benchmark_folder_holds_a_truth_the_analysis_finds(scale, tmp_path):
    world = scale.program(recipes=3, checkpoints=3, tasks=2, methods=3, rows=40)
    assert scale.write_program(world, tmp_path) == 3 * 3 * 2 * 3
    analyzed(tmp_path)
    assert scale.truth_found(world, tmp_path) == []
    # the check can fail: a truth with two recipes' qualities swapped is not what the folder holds
    swapped = dict(world.quality)
    first, second = world.recipes[:2]
    swapped[first], swapped[second] = swapped[second], swapped[first]
    wrong = dataclasses.replace(world, quality=swapped)
    assert any("ranked" in line for line in scale.truth_found(wrong, tmp_path))


def test_a_cells_columns_are_kept_beside_its_samples_and_read_again_when_they_change(scale, tmp_path):
    world = scale.program(recipes=2, checkpoints=1, tasks=1, methods=1, rows=12)
    scale.write_program(world, tmp_path)
    folder = next(tmp_path.glob("*/*/soft-prompt"))
    assert (folder / ROWS).is_file()  # written with the cell
    cell = EvalResult.load(folder)
    rows = read_rows(folder)
    assert rows.index.tolist() == [s.index for s in cell.samples]
    assert rows.values("task_correct", [3, 0]).tolist() == [float(cell.samples[3].task_correct), float(cell.samples[0].task_correct)]
    assert rows.values("gold_prob", [5])[0] == cell.samples[5].gold_prob
    assert np.isnan(rows.columns["cloze_gold_prob"]).all()  # not scored: no value, not 0
    with pytest.raises(KeyError, match="row 99"):
        rows.values("task_correct", [99])
    # samples.jsonl rewritten (a rejudged cell): the columns follow it, not the kept file
    lines = (folder / "samples.jsonl").read_text().splitlines()
    first = json.loads(lines[0]) | {"task_correct": not cell.samples[0].task_correct}
    (folder / "samples.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert read_rows(folder).values("task_correct", [0])[0] == float(not cell.samples[0].task_correct)
    # a damaged rows.npz is read past, from samples.jsonl
    (folder / ROWS).write_bytes(b"not a zip")
    assert read_rows(folder).values("task_correct", [0])[0] == float(not cell.samples[0].task_correct)
    # a damaged samples.jsonl leaves the cell out with a warning, as before
    (folder / ROWS).unlink()
    (folder / "samples.jsonl").write_text('{"index": 0}\n')
    assert folder not in [c.folder for c in comparisons.finished_cells(tmp_path)]


def test_a_refresh_reads_only_the_new_cells_and_gives_a_full_analysiss_numbers(scale, tmp_path, monkeypatch):
    world = scale.program(recipes=3, checkpoints=3, tasks=1, methods=2, rows=40)
    scale.write_program(world, tmp_path)
    analyzed(tmp_path)
    loaded = []
    load = EvalResult.load
    monkeypatch.setattr(EvalResult, "load", classmethod(lambda cls, folder, **kw: loaded.append(Path(folder)) or load(folder, **kw)))
    for recipe in world.recipes:  # one more checkpoint of every recipe lands
        scale.write_checkpoint(world, tmp_path, recipe, world.checkpoints)
    scale.write_files(world, tmp_path, world.checkpoints + 1)
    refreshed = analyzed(tmp_path)
    new = {world.model(r, world.checkpoints) for r in world.recipes}
    assert loaded and {p.parent.parent.name for p in loaded} == new  # only the new checkpoints' cells were read
    forget_everything_read()  # as a fresh process reads the folder
    assert analyzed(tmp_path) == refreshed
    after = dataclasses.replace(world, checkpoints=world.checkpoints + 1)
    assert scale.truth_found(after, tmp_path) == []

    # a checkpoint's cell rewritten in place (rejudged): the figures kept for it are dropped, and
    # the analysis is again what a fresh process computes
    cell = tmp_path / world.model(world.recipes[0], 1) / world.tasks[0] / "soft-prompt"
    samples = [json.loads(line) for line in (cell / "samples.jsonl").read_text().splitlines()]
    for sample in samples[:10]:
        sample["task_correct"] = not sample["task_correct"]
    (cell / "samples.jsonl").write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    rejudged = analyzed(tmp_path)
    assert rejudged != refreshed
    forget_everything_read()
    assert analyzed(tmp_path) == rejudged


def forget_everything_read() -> None:
    """What a process keeps of the folders it read: its cells and the figures computed from them."""
    for kept in (comparisons._read, comparisons._derived):
        kept.clear()


def test_the_page_of_a_large_folder_opens_with_aggregated_views_and_paged_tables(scale, tmp_path, browser, monkeypatch):  # noqa: F811
    from softeval.reports import page as page_module

    world = scale.program(recipes=4, checkpoints=8, tasks=1, methods=3, rows=20)
    cells = scale.write_program(world, tmp_path)
    analyzed(tmp_path)
    monkeypatch.setattr(page_module, "MAX_SAMPLE_ROWS", 250)  # the cap, small: 12 of the 96 cells' samples
    path = page_module.write_page(tmp_path)
    started = time.perf_counter()
    page = open_page(browser, path)
    page.wait_for_selector("tr.sample")
    print(f"page of {cells} cells loaded in {time.perf_counter() - started:.2f} s")
    assert page.errors == []
    # what the benchmark checks at every size (6,000 cells included): the recipe views first and
    # visible, every cell's table paged and saying so, the bar chart and samples caps said
    assert scale.page_views(page, world, sample_rows=250) == []
    # the samples embedded are the last checkpoints' first
    shown = json.loads(page.locator("#samples-data").inner_text())
    last = {world.model(r, world.checkpoints - 1) for r in world.recipes}
    assert {c["model"] for c in shown["cells"]} == last and len(shown["rows"]) == 12 * world.rows
    assert page.locator("#sample-count").inner_text() == f"{12 * world.rows} of {12 * world.rows} samples"
    # the check can fail: the page of a program of other checkpoints is not this one
    other = dataclasses.replace(world, checkpoints=world.checkpoints - 1)
    assert "facts_00: checkpoints of its first row: '8 of 8', expected '7 of 7'" in scale.page_views(page, other, sample_rows=250)
    page.close()
