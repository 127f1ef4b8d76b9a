"""A pre-training program's folder at scale: how `softeval analyze`, the comparison, the report
page and the exports grow with the cells, and whether the analysis still finds the known truth.

For each size it writes a folder of valid cells through softeval's own writers (`EvalResult.write`
for results.json and samples.jsonl, `save_soft_prompt` for each tuned prompt with its provenance,
series.json, models.json, ground_truth.json) from a generative model whose truth is set:

* every test row is one fact; row i is known by a checkpoint whose knowledge level k exceeds
  u_i, one fixed grid value per row (the same for every model), so the facts a checkpoint knows
  are nested in those of any checkpoint with a higher level;
* recipe r has a quality q_r (spread over [0.3, 0.9], shuffled); its checkpoint c knows
  k = 0.05 + 0.9 q_r (0.5 + 0.5 (c + 1) / (C + 1)) (C written, one more to land): recipes never cross, so the last checkpoints order
  the recipes by quality and so does every earlier budget;
* a method writes the answer of a known fact in the task's format with a probability of its own
  (soft prompt 1, LoRA 0.95, few-shot 0.7, zero-shot 0.35), drawn per model and row: the soft
  prompt's task accuracy is exactly each checkpoint's known share, the others add format noise.

So the analysis must find: the recipes' order (the last checkpoints' soft-prompt scores), a soft
prompt that decides every pair at every budget (decision accuracy 1 from the first budget), a
Kendall tau of 1 between its knowledge and the true knowledge, and, for every other method, the
decision accuracy per budget and the earliest decision that this script computes from its own
draws (`truth_ok` says whether all of them match analysis.json).

It then times, in a fresh process each (peak memory is that process's high-water mark):
`softeval analyze` (the analysis, comparison and page together, as the command runs), the page
alone, both exports, and a refresh after one more checkpoint of every recipe lands
(`refresh_reports`, what the in-loop evaluator and `watch` run after each checkpoint), and how long
headless Chromium takes to open the page, whose views it then checks through the page's DOM
(`page_views`: `page_ok`). Each size ends with one JSON line of its figures.

    .venv/bin/python benchmarks/analysis_scale.py --sizes 100,1000,6000 --rows 500 --work /tmp/scale
    .venv/bin/python benchmarks/analysis_scale.py --recipes 4 --checkpoints 5 --tasks 2 --methods 3 --rows 60
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

METHOD_FORMAT = {"soft-prompt": 1.0, "lora": 0.95, "few-shot": 0.7, "zero-shot": 0.35}  # how often a known answer keeps the format
METHOD_ORDER = ("soft-prompt", "zero-shot", "few-shot", "lora")
TOKENS_PER_STEP = 1_048_576
STEP_EVERY = 1000
PROMPT_WORDS = "the plant water light energy sun leaf root soil animal heat cold rock river cloud rain wind force motion".split()


@dataclass
class Program:
    """The known truth of a synthetic pre-training program."""

    recipes: list[str]
    checkpoints: int
    tasks: list[str]
    methods: list[str]
    rows: int
    quality: dict[str, float]  # each recipe's quality q_r
    grid: np.ndarray  # (rows,) u_i: row i is known where a checkpoint's level exceeds it
    horizon: int  # the checkpoints each run will have: the ones written and one more that lands later

    def level(self, recipe: str, checkpoint: int) -> float:
        return 0.05 + 0.9 * self.quality[recipe] * (0.5 + 0.5 * (checkpoint + 1) / self.horizon)

    def known(self, recipe: str, checkpoint: int) -> np.ndarray:
        return self.grid < self.level(recipe, checkpoint)

    def model(self, recipe: str, checkpoint: int) -> str:
        return f"{recipe}@step-{(checkpoint + 1) * STEP_EVERY}"


def program(recipes: int, checkpoints: int, tasks: int, methods: int, rows: int, seed: int = 0) -> Program:
    rng = np.random.default_rng(seed)
    names = [f"recipe-{r:02d}" for r in range(recipes)]
    qualities = rng.permutation(np.linspace(0.3, 0.9, recipes)) if recipes > 1 else np.array([0.6])
    grid = rng.permutation((np.arange(rows) + 0.5) / rows)
    return Program(names, checkpoints, [f"facts_{t:02d}" for t in range(tasks)], list(METHOD_ORDER[:methods]), rows,
                   dict(zip(names, qualities.tolist())), grid, checkpoints + 1)


def outcomes(world: Program, recipe: str, checkpoint: int, task: str, method: str) -> tuple[np.ndarray, np.ndarray]:
    """(format kept, correct) per row of one cell: the model's draws, seeded by the cell."""
    seed = [world.recipes.index(recipe), checkpoint, world.tasks.index(task), METHOD_ORDER.index(method)]
    keeps = np.random.default_rng(seed).random(world.rows) < METHOD_FORMAT[method]
    if method == "soft-prompt":
        keeps[:] = True
    return keeps, keeps & world.known(recipe, checkpoint)


# --- writing the folder --------------------------------------------------------------------------


def write_program(world: Program, folder: Path, workers: int = 1) -> int:
    """Every cell of the program into `folder` (in `workers` processes), with its series, roles and
    ground truth; returns the number of cells."""
    from softeval._io import write_json_atomic

    folder.mkdir(parents=True, exist_ok=True)
    points = [(recipe, checkpoint) for recipe in world.recipes for checkpoint in range(world.checkpoints)]
    if workers > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            written = sum(pool.starmap(write_checkpoint, [(world, folder, r, c) for r, c in points]))
    else:
        written = sum(write_checkpoint(world, folder, r, c) for r, c in points)
    write_files(world, folder, world.checkpoints)
    write_json_atomic(folder / "models.json", {world.model(r, c): {"model": f"runs/{r}/step-{(c + 1) * STEP_EVERY}", "family": None, "role": "base"}
                                               for r in world.recipes for c in range(world.checkpoints + 1)})
    return written


def write_files(world: Program, folder: Path, checkpoints: int) -> None:
    """series.json and ground_truth.json for the first `checkpoints` checkpoints of each recipe."""
    from softeval._io import write_json_atomic

    series = {r: {"checkpoints": [{"model": world.model(r, c), "spec": f"runs/{r}/step-{(c + 1) * STEP_EVERY}", "step": (c + 1) * STEP_EVERY,
                                   "tokens": float((c + 1) * STEP_EVERY * TOKENS_PER_STEP)} for c in range(checkpoints)], "reference": None}
              for r in world.recipes}
    write_json_atomic(folder / "series.json", series)
    truth = {"measure": "synthetic: a row is known where the checkpoint's level exceeds the row's grid value", "tasks": world.tasks,
             "facts": [f"fact {i}" for i in range(world.rows)],
             "models": {world.model(r, c): world.known(r, c).astype(int).tolist() for r in world.recipes for c in range(checkpoints)}}
    write_json_atomic(folder / "ground_truth.json", truth)


def write_checkpoint(world: Program, folder: Path, recipe: str, checkpoint: int, *, charts: bool = False) -> int:
    """The cells of one checkpoint (every task and method); returns how many. `charts`: each tuned
    prompt's curve.svg too, as tuning draws it (left out of the program written at first: drawing
    thousands would take longer than everything measured)."""
    for task in world.tasks:
        for method in world.methods:
            write_cell(world, folder, recipe, checkpoint, task, method, chart=charts)
    return len(world.tasks) * len(world.methods)


def write_cell(world: Program, folder: Path, recipe: str, checkpoint: int, task: str, method: str, *, chart: bool = False) -> None:
    from softeval.scoring import EvalResult
    from softeval.scoring.metrics import aggregate, diagnose
    from softeval.scoring.run import package_versions

    model = world.model(recipe, checkpoint)
    keeps, correct = outcomes(world, recipe, checkpoint, task, method)
    known = world.known(recipe, checkpoint)
    rng = np.random.default_rng([7, world.recipes.index(recipe), checkpoint, world.tasks.index(task), METHOD_ORDER.index(method)])
    gold_prob = np.clip(np.where(known, 0.55, 0.08) + rng.normal(0, 0.05, world.rows), 1e-4, 1.0)
    samples = [sample(i, task, bool(keeps[i]), bool(correct[i]), bool(known[i]), float(gold_prob[i]), method) for i in range(world.rows)]
    metrics = aggregate(samples)
    spec = f"runs/{recipe}/step-{(checkpoint + 1) * STEP_EVERY}"
    config = {"model": model, "post_trained": False, "role": "base", "role_from": "study", "task": task, "method": method, "chat": False,
              "k": 5 if method == "few-shot" else 0, "limit": world.rows, "seed": 0, "max_new_tokens": 16}
    tuning = None
    if method in ("soft-prompt", "lora"):
        prompt = folder / model / task / ("prompt" if method == "soft-prompt" else "adapter")
        tuning = {"trainable_parameters": 640, "tuning_seconds": 1.0, "steps": 80, "stopped_early": None, "batch_size": 8}
        if method == "soft-prompt":
            config["soft_prompt"] = write_prompt(prompt, model, task, checkpoint, chart=chart)
    result = EvalResult(
        config=config, metrics=metrics, samples=samples,
        model={"spec": spec, "model_type": "llama", "n_parameters": 190_000, "weights_sha256": f"{abs(hash(model)):064x}"[:64]},
        data={"task": task, "spec_sha256": "0" * 64, "split": "test", "rows": world.rows, "filtered_out": 0, "sha256": "1" * 64},
        timings={"generate": 0.5, "score": 0.1}, n_truncated=0, diagnostics=diagnose(samples, metrics["task_accuracy"], None),
        versions=package_versions(), identity={"spec": spec, "task": task, "method": method}, tuning=tuning,
    )
    result.write(folder / model / task / method)


def write_prompt(folder: Path, model: str, task: str, checkpoint: int, *, chart: bool = False) -> dict:
    """A tuned prompt's file with its provenance and tuning curve (and, with `chart`, its
    curve.svg), as tuning writes them."""
    import torch

    from softeval.tuning.softprompt import save_soft_prompt

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "soft_prompt.safetensors"
    provenance = {"model": {"spec": model}, "task": {"name": task, "spec_sha256": "0" * 64}, "chat": False,
                  "produced": {"by": "tune", "warm_start": None if checkpoint == 0 else "the previous checkpoint's prompt"}}
    save_soft_prompt(path, torch.zeros(10, 8), provenance)
    curve = [{"step": s, "train_loss": 2.0 - s / 100, "val_loss": 2.1 - s / 100, "format_following": s / 80, "task_accuracy": s / 160,
              "knowledge": 0.4} for s in range(0, 81, 20)]
    (folder / "curve.json").write_text(json.dumps(curve), encoding="utf-8")
    if chart:
        from softeval.tuning.chart import write_curve_chart

        write_curve_chart(curve, folder, f"{model} / {task} / prompt")
    return {"path": str(path), "length": 10, "task": {"name": task, "spec_sha256": "0" * 64}, "chat": False, "produced": {"by": "tune"}}


def sample(index: int, task: str, keeps: bool, correct: bool, known: bool, gold_prob: float, method: str):
    """One realistic row: a prompt of a few hundred characters, a completion in the format or not."""
    from softeval.scoring.metrics import Sample

    gold = f"answer{index}"
    words = " ".join(PROMPT_WORDS[(index + j) % len(PROMPT_WORDS)] for j in range(40))
    prompt = f"Answer with the name alone.\n\nQuestion {index} of {task}: {words}?\nAnswer:"
    answer = gold if correct or (keeps and known) else f"other{index}"
    completion = f" {answer}" if keeps else f" I think that it is {answer}, because {words[:60]}"
    return Sample(
        index=index, source=f"test.jsonl:{index + 1}", prompt=prompt, n_demos=5 if method == "few-shot" else 0, truncated=False,
        raw_completion=completion + "\n", completion=completion, stop_reason="stop", gold=gold,
        strict_answer=answer if keeps else None, strict_failure=None if keeps else "first line has 9 words (at most 2)",
        lenient_answer=answer, lenient_status="answer", lenient_note=None, format_ok=keeps, task_correct=correct,
        lenient_correct=known, knowledge_correct=known, gold_logprob=math.log(gold_prob), gold_prob=gold_prob,
        gold_bpb=-math.log2(gold_prob) / max(1, len(gold)),
    )


# --- the truth the analysis should find ----------------------------------------------------------


def expected(world: Program, task: str, method: str) -> tuple[list[float], float | None]:
    """Decision accuracy per budget of `method`'s task accuracy against the last checkpoints' soft
    prompt (the analysis's default target), and its earliest decision at 0.8, from the draws."""
    score = lambda r, c, m: float(outcomes(world, r, c, task, m)[1].mean())  # noqa: E731
    target = [score(r, world.checkpoints - 1, "soft-prompt") for r in world.recipes]
    accuracies = []
    for c in range(world.checkpoints):
        scores = [score(r, c, method) for r in world.recipes]
        pairs = [(i, j) for i in range(len(target)) for j in range(i + 1, len(target)) if target[i] != target[j]]
        agree = [0.5 if scores[i] == scores[j] else float((scores[i] > scores[j]) == (target[i] > target[j])) for i, j in pairs]
        accuracies.append(sum(agree) / len(agree))
    earliest = None
    for c in reversed(range(world.checkpoints)):
        if accuracies[c] < 0.8:
            break
        earliest = float((c + 1) * STEP_EVERY * TOKENS_PER_STEP)
    return accuracies, earliest


def truth_found(world: Program, folder: Path) -> list[str]:
    """What analysis.json gets wrong about the known truth (empty: all of it found)."""
    analysis = json.loads((folder / "analysis.json").read_text(encoding="utf-8"))
    order = sorted(world.recipes, key=lambda r: -world.quality[r])
    wrong = []
    for task in world.tasks:
        found = analysis["tasks"].get(task)
        if found is None:
            wrong.append(f"{task}: no analysis ({analysis['skipped'].get(task)})")
            continue
        ranked = sorted(found["target_scores"], key=lambda r: -found["target_scores"][r])
        if ranked != order:
            wrong.append(f"{task}: recipes ranked {ranked}, truth {order}")
        for method in world.methods:
            accuracies, earliest = expected(world, task, method)
            got = [b["decision_accuracy"]["value"] for b in found["decisions"][method]]
            if not np.allclose(got, accuracies, atol=1e-12):
                wrong.append(f"{task} {method}: decision accuracy {got}, truth {accuracies}")
            if found["earliest"][method] != earliest:
                wrong.append(f"{task} {method}: earliest {found['earliest'][method]}, truth {earliest}")
        tau = found["truth"]["agreement"]["soft-prompt"]["knowledge"]["value"]
        if tau is None or abs(tau - 1) > 1e-12:
            wrong.append(f"{task}: soft-prompt knowledge vs true knowledge tau {tau}, truth 1")
    return wrong


# --- timing ----------------------------------------------------------------------------------------

# each measured step runs in a process of its own, so its peak memory (the kernel's high-water mark
# of its resident set, VmHWM: ru_maxrss would count the parent's pages copied at fork) is its own
STEPS = {
    "analyze": "from softeval.cli import app; app(['analyze', str(FOLDER)], standalone_mode=False)",
    "page": "from softeval.reports import write_page; write_page(FOLDER)",
    # as an evaluator that runs on (in the loop, or watch): the folder's reports refreshed once,
    # then one more checkpoint of every recipe lands, and the refresh after it is what is timed
    "refresh": """
from softeval.loop.filing import refresh_reports
sys.path.insert(0, sys.argv[2])
from analysis_scale import program, write_checkpoint, write_files
world = program(*json.loads(sys.argv[3]))
first = refresh_reports(FOLDER)
for recipe in world.recipes:
    write_checkpoint(world, FOLDER, recipe, world.checkpoints, charts=True)
write_files(world, FOLDER, world.checkpoints + 1)
started = time.perf_counter()
refresh_reports(FOLDER)
""",
    "export_eee": "from softeval.reports import export_folder; export_folder(FOLDER, 'eee', None)",
    "export_lm_eval": "from softeval.reports import export_folder; export_folder(FOLDER, 'lm-eval', None)",
}
MEASURE = """
import json, sys, time
from pathlib import Path
FOLDER = Path(sys.argv[1])
started = time.perf_counter()
{step}
peak = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
print(json.dumps({{"seconds": time.perf_counter() - started, "peak_mb": int(peak.split()[1]) / 1024}}))
"""


def measure(step: str, folder: Path, *extra: str) -> dict:
    """Seconds and peak resident memory of one step, in a fresh process (with one thread)."""
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", MEASURE.format(step=STEPS[step]), str(folder), *extra], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"analysis_scale: {step} failed on {folder}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_size(world: Program, folder: Path, *, exports: bool) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    cells = write_program(world, folder, workers=2)  # not measured: written as fast as the machine allows
    write_s = time.perf_counter() - started
    samples_mb = sum(p.stat().st_size for p in folder.glob("*/*/*/samples.jsonl")) / 2**20
    print(f"{cells} cells x {world.rows} rows written in {write_s:.0f} s ({samples_mb:.0f} MB of samples)", flush=True)
    analyzed = measure("analyze", folder)
    print(f"  analyze: {analyzed['seconds']:.1f} s, peak {analyzed['peak_mb']:.0f} MB", flush=True)
    wrong = truth_found(world, folder)
    for line in wrong[:10]:
        print(f"  truth not found: {line}", flush=True)
    page = measure("page", folder)
    print(f"  page: {page['seconds']:.1f} s, peak {page['peak_mb']:.0f} MB, {(folder / 'index.html').stat().st_size / 2**20:.1f} MB", flush=True)
    loaded = page_load(world, folder / "index.html")
    if loaded is not None:
        print(f"  page load in Chromium: {loaded[0]:.2f} s", flush=True)
        for line in loaded[1][:10]:
            print(f"  page not as it should be: {line}", flush=True)
    found = {"cells": cells, "rows": cells * world.rows, "samples_mb": round(samples_mb), "analyze_s": round(analyzed["seconds"], 1),
             "page_s": round(page["seconds"], 1), "page_mb": round((folder / "index.html").stat().st_size / 2**20, 1),
             "page_load_s": None if loaded is None else round(loaded[0], 2), "page_ok": None if loaded is None else not loaded[1]}
    peaks = [analyzed["peak_mb"], page["peak_mb"]]
    if exports:
        for step in ("export_eee", "export_lm_eval"):
            done = measure(step, folder)
            found[f"{step}_s"] = round(done["seconds"], 1)
            peaks.append(done["peak_mb"])
            print(f"  {step}: {done['seconds']:.1f} s, peak {done['peak_mb']:.0f} MB", flush=True)
    drawn = [len(world.recipes), world.checkpoints, len(world.tasks), len(world.methods), world.rows]
    refreshed = measure("refresh", folder, str(Path(__file__).parent), json.dumps(drawn))
    peaks.append(refreshed["peak_mb"])
    print(f"  refresh after one more checkpoint per recipe, in a process that refreshed before: {refreshed['seconds']:.1f} s, "
          f"peak {refreshed['peak_mb']:.0f} MB", flush=True)
    world_after = replace(world, checkpoints=world.checkpoints + 1)
    wrong += [f"after the refresh: {line}" for line in truth_found(world_after, folder)]
    return found | {"refresh_s": round(refreshed["seconds"], 1), "peak_mb": round(max(peaks)), "truth_ok": not wrong}


def page_load(world: Program, page: Path) -> tuple[float, list[str]] | None:
    """Seconds headless Chromium takes to open the page until its first sample rows are drawn, and
    what `page_views` finds wrong there; None without Playwright or a Chromium binary."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    executable = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if executable is None:
        return None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        tab.on("pageerror", lambda error: errors.append(str(error)))
        started = time.perf_counter()
        tab.goto(page.as_uri(), timeout=120_000)
        tab.wait_for_selector("tr.sample", timeout=120_000)
        seconds = time.perf_counter() - started
        wrong = [f"page error: {error}" for error in errors] + page_views(tab, world)
        browser.close()
    return seconds, wrong


def page_views(tab, world: Program, sample_rows: int | None = None) -> list[str]:
    """What is wrong with the page of the program's folder as a reader sees it in a freshly opened
    browser tab (empty where nothing is; it turns a pager, so ask once per tab). For every task:
    the table per recipe and method is visible, one row per recipe and method over its
    checkpoints, its first page shown; the table of every cell holds each of the task's cells and
    shows its first 50, and the first task's pager says so and turns to the next 50. A folder of
    more models than one bar chart shows says so; where the samples embedded are capped at
    `sample_rows` (the page's cap by default), the page says whose it holds."""
    from softeval.reports.page import MAX_BAR_MODELS, MAX_SAMPLE_ROWS

    sample_rows = MAX_SAMPLE_ROWS if sample_rows is None else sample_rows
    wrong = []

    def expect(what: str, got, wanted) -> None:
        if got != wanted:
            wrong.append(f"{what}: {got!r}, expected {wanted!r}")

    per_recipe, per_task = len(world.recipes) * len(world.methods), len(world.recipes) * world.checkpoints * len(world.methods)
    expect("recipe tables", tab.locator("table.recipes").count(), len(world.tasks))
    expect("cell tables", tab.locator("table.overview").count(), len(world.tasks))
    for k, task in enumerate(world.tasks[: tab.locator("table.recipes").count()]):
        recipes, cells = tab.locator("table.recipes").nth(k), tab.locator("table.overview").nth(k)
        rows = recipes.locator("tr:not(:has(th))")
        expect(f"{task}: rows of the recipe table", rows.count(), per_recipe)
        expect(f"{task}: recipe rows shown", recipes.locator("tr:not(:has(th)):visible").count(), min(20, per_recipe))
        expect(f"{task}: the recipe table's first row visible", rows.first.is_visible(), True)
        expect(f"{task}: checkpoints of its first row", rows.first.locator("td").nth(2).inner_text(), f"{world.checkpoints} of {world.checkpoints}")
        expect(f"{task}: rows of the cell table", cells.locator("tr:not(:has(th))").count(), per_task)
        expect(f"{task}: cell rows shown", cells.locator("tr:not(:has(th)):visible").count(), min(50, per_task))
    if per_task > 50:
        cells, label = tab.locator("table.overview").first, tab.locator("table.overview + .table-pager span").first
        expect("the cell table's pager", label.inner_text(), f"rows 1\u201350 of {per_task}")
        tab.locator("table.overview + .table-pager").first.locator("button").nth(1).click()
        expect("its pager, a page on", label.inner_text(), f"rows 51\u2013{min(100, per_task)} of {per_task}")
        expect("cell rows shown, a page on", cells.locator("tr:not(:has(th)):visible").count(), min(50, per_task - 50))
    models = len(world.recipes) * world.checkpoints
    if models > MAX_BAR_MODELS:
        said = f"{models} models are more than one bar chart shows"
        expect("the overview says why it has no bar chart", said in tab.locator("#overview").inner_text(), True)
    n_cells = per_task * len(world.tasks)
    if n_cells * world.rows > sample_rows:
        held = max(1, sample_rows // world.rows)  # whole cells, and always one
        note = f"This page holds the samples of {held} of the {n_cells} cells"
        expect("the samples note", tab.locator("#samples-note").inner_text().startswith(note), True)
    return wrong


def shape(cells: int, tasks: int, methods: int) -> tuple[int, int]:
    """(recipes, checkpoints) for about `cells` cells: as many checkpoints as recipes."""
    per_model = tasks * methods
    side = max(2, round(math.sqrt(cells / per_model)))
    return side, max(2, round(cells / per_model / side))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help="comma-separated cell counts (each shaped as recipes x checkpoints x tasks x methods)")
    parser.add_argument("--recipes", type=int, default=4)
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--methods", type=int, default=3, choices=range(1, 5))
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--exports", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/analysis_scale"))
    args = parser.parse_args(argv)
    if args.sizes:
        shapes = [shape(int(n), args.tasks, args.methods) for n in args.sizes.split(",")]
    else:
        shapes = [(args.recipes, args.checkpoints)]
    results = []
    for recipes, checkpoints in shapes:
        world = program(recipes, checkpoints, args.tasks, args.methods, args.rows)
        print(f"{recipes} recipes x {checkpoints} checkpoints x {args.tasks} tasks x {args.methods} methods", flush=True)
        results.append(run_size(world, args.work / f"{recipes}x{checkpoints}", exports=args.exports))
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    main()
    print(f"this process's peak: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", file=sys.stderr)
