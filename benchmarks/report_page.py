"""The report page at scale: how long `write_page` takes and how the page behaves in a browser.

It builds a synthetic results folder in a temporary directory: N samples in total (default 10,000)
spread evenly over models x tasks x methods cells (default 4 x 2 x 3 = 24 cells). The tasks are a
multiple-choice task (ARC-like: four options, letter answers, option log-likelihoods) and an
open-ended number task (GSM8K-like: worked answers ending `#### <number>`). Samples are realistic
records: prompts of a few hundred characters (more with few-shot demonstrations), raw and cut
completions, strict and lenient readings and a mix of outcomes (correct, wrong, format failure,
ambiguous, conflict). Each cell's metrics come from `softeval.metrics.aggregate` and its diagnostics
from `diagnose`, and the cell is written with `EvalResult.save` to OUTPUT/<model>/<task>/<method>/,
just as a study writes it.

It then measures:

* `write_page`: seconds to read every cell back and render index.html, and the page's size (MB, and
  the part that is the samples' JSON block);
* in headless Chromium (driven by Playwright), with `time.perf_counter` around the Playwright calls
  (wall time as a script sees it, round trips included), and with `performance.now()` inside the
  page (the event handler's own time, and the time until the next frame has been drawn):
  - load: navigation until the first sample rows are rendered (plus the page's navigation timings:
    rows in the DOM, DOMContentLoaded, load, first contentful paint, and the JS heap used);
  - filter: choosing a model in `#filter-model` until `#sample-count` shows the new count;
  - text search: typing a word into `#filter-text` (every sample's completion and gold searched)
    until the count updates;
  - next page: clicking `#page-next` until `#page-label` shows the next page.
  Each interaction is repeated (--repeats) and reported as median, min and max.

Console errors and page errors are recorded throughout; the script prints them and exits 1 if there
are any. Without Playwright or a Chromium binary it exits with a one-line error.

    .venv/bin/python benchmarks/report_page.py --samples 10000
    .venv/bin/python benchmarks/report_page.py --samples 50000 --models 6 --methods 4 --keep /tmp/page
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
MODEL_NAMES = ("pico-base", "nano-base", "micro-base", "mini-base", "small-base", "medium-base", "large-base", "xl-base")
TASKS = ("arc_easy", "gsm8k")
LETTERS = "ABCD"
WORDS_TEXT = (
    "the plant water light energy sun leaf root soil animal heat cold rock river cloud rain wind "
    "force motion speed mass weight friction magnet metal electric circuit battery sound wave "
    "because therefore first then total each every more less than apples books students hours "
    "miles dollars cookies pages minutes price sold bought left remaining twice half per week"
)
WORDS = WORDS_TEXT.split()
SEARCH_WORDS = ("because", "dollars", "zyzzyva")  # common, rarer, absent: every row is searched each time

# an interaction inside the page: the handler's own time, and the time until the next frame is drawn
IN_PAGE = """async ([selector, kind, value]) => {
  const el = document.querySelector(selector);
  const t0 = performance.now();
  if (kind === "click") { el.click(); } else { el.value = value; el.dispatchEvent(new Event(kind, {bubbles: true})); }
  const t1 = performance.now();
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  const t2 = performance.now();
  return {script: t1 - t0, frame: t2 - t0, count: document.getElementById("sample-count").textContent,
          label: document.getElementById("page-label").textContent, rows: document.querySelectorAll("tr.sample").length};
}"""

# recorded from the first moment of every navigation: when the first sample row enters the DOM
FIRST_ROWS = """(() => {
  window.__firstRows = null;
  new MutationObserver((records, observer) => {
    if (document.querySelector("tr.sample")) { window.__firstRows = performance.now(); observer.disconnect(); }
  }).observe(document, {childList: true, subtree: true});
})();"""

NAVIGATION = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const fcp = performance.getEntriesByName("first-contentful-paint")[0];
  return {rows: window.__firstRows, dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd,
          fcp: fcp ? fcp.startTime : null, heap: performance.memory ? performance.memory.usedJSHeapSize : null};
}"""


def fail(message: str) -> None:
    sys.exit(f"report_page: {message}")


def find_browser(path: str | None):
    """The Chromium binary and Playwright's sync API, or a one-line error."""
    try:
        from playwright import sync_api
    except ImportError:
        fail("Playwright is not installed (pip install playwright): nothing measured")
    executable = path or next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    if executable is None or not Path(executable).exists():
        fail(f"no Chromium binary {'at ' + path if path else 'on PATH'} (Debian: apt-get install chromium; or --chromium PATH): nothing measured")
    return executable, sync_api


# --- the synthetic results folder -------------------------------------------------------------


def sentence(rng: random.Random, n: int) -> str:
    words = rng.choices(WORDS, k=n)
    return " ".join(words).capitalize() + "."


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def mc_question(rng: random.Random, index: int) -> dict:
    choices = [sentence(rng, rng.randint(2, 6)).rstrip(".").lower() for _ in LETTERS]
    return {"index": index, "question": sentence(rng, rng.randint(18, 40)), "choices": choices, "gold": rng.randrange(len(choices))}


def number_question(rng: random.Random, index: int) -> dict:
    a, b, c = rng.randint(2, 90), rng.randint(2, 40), rng.randint(2, 9)
    text = (f"{sentence(rng, rng.randint(10, 20))} A shop sold {a} apples on Monday and {b} more on Tuesday than on Monday. "
            f"{sentence(rng, rng.randint(8, 16))} Each apple costs {c} dollars. How many dollars did the shop take in the two days?")
    return {"index": index, "question": text, "gold": str((a + a + b) * c), "parts": (a, b, c)}


def mc_prompt(q: dict, demos: list[dict]) -> str:
    def block(item: dict, answer: bool) -> str:
        options = "\n".join(f"{l}. {c}" for l, c in zip(LETTERS, item["choices"]))
        return f"Question: {item['question']}\n{options}\nAnswer:" + (f" {LETTERS[item['gold']]}\n\n" if answer else "")
    return "".join(block(d, True) for d in demos) + block(q, False)


def number_prompt(q: dict, demos: list[dict]) -> str:
    def block(item: dict, answer: bool) -> str:
        a, b, c = item["parts"]
        worked = f" On Tuesday it sold {a} + {b} = {a + b}. In total {a} + {a + b} = {2 * a + b} apples, so {2 * a + b} * {c} = {item['gold']} dollars.\n#### {item['gold']}\n\n"
        return f"Question: {item['question']}\nAnswer:" + (worked if answer else "")
    return "".join(block(d, True) for d in demos) + block(q, False)


def mc_sample(rng: random.Random, q: dict, prompt: str, skill: float):
    """A multiple-choice sample with the outcome drawn from the cell's skill."""
    from softeval.scoring.metrics import Sample

    gold = LETTERS[q["gold"]]
    wrong = rng.choice([l for l in LETTERS if l != gold])
    roll = rng.random()
    strict = lenient = None
    status, failure, note = "answer", None, None
    if roll < skill:  # correct, sometimes with an explanation
        completion = gold + ("" if rng.random() < 0.6 else f". {q['choices'][q['gold']]} because {sentence(rng, 8).lower()}")
        strict = lenient = gold
    elif roll < skill + 0.25 * (1 - skill):  # wrong letter
        completion = wrong
        strict = lenient = wrong
    elif roll < skill + 0.55 * (1 - skill):  # no letter: an answer in words, or rambling
        if rng.random() < 0.5:
            completion = f"The answer is {q['choices'][q['gold'] if rng.random() < 0.5 else LETTERS.index(wrong)]} because {sentence(rng, 10).lower()}"
            lenient = gold if q["choices"][q["gold"]] in completion else wrong
            failure = f"does not start with an option letter: {completion[:30]!r}"
        else:
            completion = "" if rng.random() < 0.3 else sentence(rng, rng.randint(6, 20))
            status, note = "no_answer", "names no option"
            failure = "empty completion" if not completion else f"does not start with an option letter: {completion[:30]!r}"
    elif roll < skill + 0.8 * (1 - skill):  # hedging: several letters
        completion = f"{gold} or {wrong}"
        status, note = "ambiguous", f"names several options: {gold}, {wrong}"
        failure = note
    else:  # the letter of one option with the text of another
        completion = f"{gold}. {q['choices'][LETTERS.index(wrong)]}"
        status, note = "conflict", f"letter {gold} but the text of option {wrong}"
        failure = note
    stop = rng.choice(["stop_string", "eos", "max_tokens"])
    raw = completion + ("\n\nQuestion:" if stop == "stop_string" else "")
    lengths = [max(len(c), 1) for c in q["choices"]]
    loglikelihoods: list[float | None] = [round(-rng.uniform(0.5, 3.0) * n, 4) for n in lengths]
    if rng.random() < skill + 0.1:  # the model knows more than it writes down: gold wins per character
        best = max(ll / n for i, (ll, n) in enumerate(zip(loglikelihoods, lengths)) if i != q["gold"])
        loglikelihoods[q["gold"]] = round(0.9 * best * lengths[q["gold"]], 4)
    if rng.random() < 0.01:  # an option that tokenises to nothing
        loglikelihoods[rng.randrange(len(LETTERS))] = None
    normalised = [float("-inf") if ll is None else ll / n for ll, n in zip(loglikelihoods, lengths)]
    pick = max(range(len(normalised)), key=normalised.__getitem__)
    return Sample(
        index=q["index"], source=f"test.jsonl:{q['index'] + 1}", prompt=prompt, n_demos=prompt.count("Answer:") - 1,
        truncated=False, raw_completion=raw, completion=completion, stop_reason=stop, gold=gold, choices=q["choices"],
        strict_answer=strict, strict_failure=failure, lenient_answer=lenient, lenient_status=status, lenient_note=note,
        format_ok=strict is not None, task_correct=strict == gold, lenient_correct=lenient == gold,
        knowledge_correct=pick == q["gold"] and normalised[pick] > float("-inf"), option_loglikelihoods=loglikelihoods,
    )


def number_sample(rng: random.Random, q: dict, prompt: str, skill: float):
    """An open-ended number sample: a worked answer, then `#### <number>` or not."""
    from softeval.scoring.metrics import Sample

    a, b, c = q["parts"]
    right = rng.random() < skill
    total = q["gold"] if right else str(int(q["gold"]) + rng.choice([-c, c, -1, 10, a * c]))
    reasoning = f"On Monday the shop sold {a} apples. On Tuesday it sold {a} + {b} = {a + b}. {sentence(rng, rng.randint(5, 25))} So it took {total} dollars."
    roll = rng.random()
    status, note = "answer", None
    if roll < 0.75:
        completion, strict, failure = f"{reasoning}\n#### {total}", total, None
    elif roll < 0.95:
        completion, strict, failure = reasoning, None, "no '#### <number>' in the completion"
    else:
        completion, strict, failure = "", None, "empty completion"
    lenient = total if completion else None
    if not completion:
        status, note = "no_answer", "empty completion"
    stop = "max_tokens" if strict is None and completion else rng.choice(["stop_string", "eos"])
    raw = completion + ("\n\nQuestion:" if stop == "stop_string" else "")
    correct = lenient == q["gold"]
    return Sample(
        index=q["index"], source=f"test.jsonl:{q['index'] + 1}", prompt=prompt, n_demos=prompt.count("Answer:") - 1,
        truncated=False, raw_completion=raw, completion=completion, stop_reason=stop, gold=q["gold"],
        strict_answer=strict, strict_failure=failure, lenient_answer=lenient, lenient_status=status, lenient_note=note,
        format_ok=strict is not None, task_correct=strict is not None and correct, lenient_correct=correct, knowledge_correct=correct,
    )


def build_folder(folder: Path, n_samples: int, n_models: int, n_methods: int, seed: int) -> int:
    """Write every cell; returns the number of cells."""
    from softeval.scoring import EvalResult, aggregate, package_versions
    from softeval.scoring.metrics import diagnose
    from softeval.tuning import METHODS

    rng = random.Random(seed)
    methods = METHODS[:n_methods]
    cells = [(m, t, x) for t in TASKS for m in MODEL_NAMES[:n_models] for x in methods]
    per_task_rows = -(-n_samples // len(cells))  # a task's rows: enough for its largest cell
    questions = {
        "arc_easy": [mc_question(rng, i) for i in range(per_task_rows + 5)],
        "gsm8k": [number_question(rng, i) for i in range(per_task_rows + 5)],
    }
    versions = package_versions()
    for c, (model, task, method) in enumerate(cells):
        n = n_samples // len(cells) + (c < n_samples % len(cells))
        qs, demos = questions[task][5 : 5 + n], questions[task][:5] if method == "few-shot" else []
        skill = min(0.9, 0.3 + 0.12 * MODEL_NAMES.index(model) + 0.08 * methods.index(method))
        build = mc_sample if task == "arc_easy" else number_sample
        prompt = mc_prompt if task == "arc_easy" else number_prompt
        samples = [build(rng, q, prompt(q, demos[:2]), skill) for q in qs]
        metrics = aggregate(samples, seed=seed)
        tuned = method in ("soft-prompt", "lora")
        n_parameters = int(10e6 * 2 ** MODEL_NAMES.index(model))
        result = EvalResult(
            config={
                "model": f"synthetic/{model}", "task": task, "method": method, "chat": False, "k": 5 if method == "few-shot" else 0,
                "soft_prompt_length": 20 if method == "soft-prompt" else 0,
                "soft_prompt": {"sha256": sha(f"{model}{task}sp"), "length": 20} if method == "soft-prompt" else None,
                "adapter": {"sha256": sha(f"{model}{task}lora"), "rank": 8} if method == "lora" else None,
                "limit": None, "seed": seed, "batch_size": 16, "eval_split": "test",
                "max_new_tokens": 8 if task == "arc_easy" else 256, "stop": ["\n\nQuestion:"],
            },
            metrics=metrics,
            samples=samples,
            model={"spec": f"synthetic/{model}", "hub_id": f"synthetic/{model}", "model_type": "llama", "n_parameters": n_parameters,
                   "config_sha256": sha(model + "config"), "dtype": "float32"},
            data={"split": "test", "rows": per_task_rows, "filtered_out": 0, "sha256": sha(task + "data"), "spec_sha256": sha(task + "spec")},
            timings={"prepare": round(0.002 * n, 3), "generate": round(0.05 * n, 3), "total": round(0.06 * n, 3)}
            | ({"loglikelihood": round(0.01 * n, 3)} if task == "arc_easy" else {}),
            n_truncated=0,
            diagnostics=diagnose(samples, metrics["task_accuracy"], 0.25 if task == "arc_easy" else None),
            versions=versions,
            identity={"method": method, "seed": seed},
            tuning={"trainable_parameters": 20 * 512 if method == "soft-prompt" else n_parameters // 100,
                    "tuning_seconds": 60.0 + rng.random() * 600, "steps": 200} if tuned else None,
        )
        result.write(folder / model / task / method)
    return len(cells)


# --- the browser ----------------------------------------------------------------------------------


def measure_browser(sync_api, executable: str, path: Path, models: list[str], repeats: int) -> tuple[dict, list[str]]:
    """Figures in milliseconds (lists, one value per repeat), and the console and page errors."""
    figures: dict[str, list[float]] = {}
    errors: list[str] = []
    add = lambda name, value: figures.setdefault(name, []).append(value)
    with sync_api.sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except sync_api.Error as exc:
            fail(f"Chromium at {executable} did not start: {str(exc).splitlines()[0]}")
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.add_init_script(FIRST_ROWS)
            count = lambda: page.locator("#sample-count").inner_text()
            label = lambda: page.locator("#page-label").inner_text()
            total = None
            for _ in range(repeats):
                start = time.perf_counter()
                page.goto(path.as_uri(), wait_until="commit")
                page.wait_for_selector("tr.sample")
                add("load: until first rows (wall)", 1000 * (time.perf_counter() - start))
                page.wait_for_load_state("load")
                nav = page.evaluate(NAVIGATION)
                add("load: rows in DOM (in page)", nav["rows"])
                add("load: DOMContentLoaded (in page)", nav["dcl"])
                add("load: load event (in page)", nav["load"])
                if nav["fcp"] is not None:
                    add("load: first contentful paint", nav["fcp"])
                if nav["heap"] is not None:
                    add("JS heap used after load (MB)", nav["heap"] / 1e6)
                total = count()

            # wall: Playwright's own action until the page shows the change
            for i in range(repeats):
                model = models[i % len(models)]
                before = count()
                start = time.perf_counter()
                page.select_option("#filter-model", model)
                page.wait_for_function("b => document.getElementById('sample-count').textContent !== b", arg=before)
                add("filter model (wall)", 1000 * (time.perf_counter() - start))
                assert page.locator("tr.sample").count() > 0, f"no rows for model {model}"
                page.select_option("#filter-model", "")
            for i in range(repeats):
                before = count()
                start = time.perf_counter()
                page.fill("#filter-text", SEARCH_WORDS[i % len(SEARCH_WORDS)])
                page.wait_for_function("b => document.getElementById('sample-count').textContent !== b", arg=before)
                add("text search (wall)", 1000 * (time.perf_counter() - start))
                page.fill("#filter-text", "")
            for _ in range(repeats):
                before = label()
                start = time.perf_counter()
                page.click("#page-next")
                page.wait_for_function("b => document.getElementById('page-label').textContent !== b", arg=before)
                add("next page (wall)", 1000 * (time.perf_counter() - start))

            # in page: the handler alone, and until the next frame
            for i in range(repeats):
                r = page.evaluate(IN_PAGE, ["#filter-model", "change", models[i % len(models)]])
                assert r["count"] != total and r["rows"] > 0, r
                add("filter model: handler (in page)", r["script"])
                add("filter model: next frame (in page)", r["frame"])
                page.evaluate(IN_PAGE, ["#filter-model", "change", ""])
            for i in range(repeats):
                r = page.evaluate(IN_PAGE, ["#filter-text", "input", SEARCH_WORDS[i % len(SEARCH_WORDS)]])
                assert r["count"] != total, r
                add("text search: handler (in page)", r["script"])
                add("text search: next frame (in page)", r["frame"])
                page.evaluate(IN_PAGE, ["#filter-text", "input", ""])
            for _ in range(repeats):
                before = label()
                r = page.evaluate(IN_PAGE, ["#page-next", "click", None])
                assert r["label"] != before, r
                add("next page: handler (in page)", r["script"])
                add("next page: next frame (in page)", r["frame"])
            assert count() == total, (count(), total)
        finally:
            browser.close()
    return figures, errors


# --- main -----------------------------------------------------------------------------------------


def row(name: str, values: list[float], unit: str = "ms") -> str:
    if len(values) == 1:
        return f"  {name:<38} {values[0]:>10.1f} {'':>10} {'':>10}  {unit}"
    return f"  {name:<38} {statistics.median(values):>10.1f} {min(values):>10.1f} {max(values):>10.1f}  {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000, help="samples in total, over every cell (default 10000)")
    parser.add_argument("--models", type=int, default=4, help=f"models (1-{len(MODEL_NAMES)}, default 4)")
    parser.add_argument("--methods", type=int, default=3, help="methods: the first N of zero-shot, few-shot, soft-prompt, lora (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="times each browser measurement is taken (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chromium", help="the Chromium binary (default: the first of chromium, chromium-browser, google-chrome, chrome on PATH)")
    parser.add_argument("--keep", type=Path, help="build the results folder here and keep it (default: a temporary folder, removed)")
    args = parser.parse_args()
    if not 1 <= args.models <= len(MODEL_NAMES) or not 1 <= args.methods <= 4 or args.repeats < 1:
        fail(f"--models must be 1-{len(MODEL_NAMES)}, --methods 1-4 and --repeats at least 1")
    n_cells = args.models * len(TASKS) * args.methods
    if args.samples < 2 * n_cells:
        fail(f"--samples {args.samples}: use at least 2 per cell ({2 * n_cells} for {n_cells} cells)")
    executable, sync_api = find_browser(args.chromium)

    from softeval.reports import write_page

    temporary = None if args.keep else tempfile.TemporaryDirectory(prefix="report_page_")
    folder = args.keep or Path(temporary.name)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        cells = build_folder(folder, args.samples, args.models, args.methods, args.seed)
        build_seconds = time.perf_counter() - start
        start = time.perf_counter()
        path = write_page(folder)
        page_seconds = time.perf_counter() - start
        html = path.read_text(encoding="utf-8")
        opening = '<script type="application/json" id="samples-data">'
        data = html[html.index(opening) + len(opening) : html.index("</script>", html.index(opening))]
        page_mb, data_mb = path.stat().st_size / 1e6, len(data.encode()) / 1e6
        models = list(MODEL_NAMES[: args.models])
        figures, errors = measure_browser(sync_api, executable, path, models, args.repeats)
    finally:
        if temporary:
            temporary.cleanup()

    print(f"\nreport page: {args.samples:,} samples in {cells} cells ({args.models} models x {len(TASKS)} tasks x {args.methods} methods)")
    print(f"Chromium: {executable}; {args.repeats} repeat(s) of each browser measurement\n")
    print(f"  {'measure':<38} {'median':>10} {'min':>10} {'max':>10}")
    print(f"  {'-' * 38} {'-' * 10} {'-' * 10} {'-' * 10}")
    print(row("build synthetic folder (not the page)", [build_seconds], "s"))
    print(row("write_page", [page_seconds], "s"))
    print(row("page size", [page_mb], "MB"))
    print(row("  of which samples JSON", [data_mb], "MB"))
    for name, values in figures.items():
        print(row(name, values, "MB" if name.endswith("(MB)") else "ms"))
    print("\n  wall: time.perf_counter around the Playwright calls, round trips included;")
    print("  in page: performance.now(); 'handler' is the event handler's own time (filter and DOM),")
    print("  'next frame' runs until a requestAnimationFrame and the task after it (style, layout, paint).")
    if errors:
        print(f"\nconsole errors: {len(errors)}")
        for error in errors:
            print(f"  {error}")
        sys.exit(1)
    print("\nconsole errors: none")


if __name__ == "__main__":
    main()
