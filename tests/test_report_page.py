"""The report page as a user sees it: a tiny-model study's index.html opened in headless Chromium.

Skipped only where no browser can be had (no Chromium binary, or no Playwright to drive it), and
the skip says which. `.ci/run` installs Debian's chromium when it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from conftest import STUDY_ROWS, write_study
from softeval.cli import app
from softeval.reports.page import outcome

# a row whose text tries to end the page's data block and run a script of its own
HOSTILE = {"q": 'Capital of </script><script>document.title="pwned"</script><!-- France?', "a": "Paris", "b": "Rome", "gold": 0}
SCREENSHOT_ENV = "SOFTEVAL_SCREENSHOT_DIR"  # keep the screenshots (CI artifacts, a look by eye)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("no Chromium binary on PATH (Debian: apt-get install chromium): the report's browser check did not run")


@pytest.fixture(scope="module")
def study_page(tmp_path_factory, family_dirs) -> Path:
    tmp_path = tmp_path_factory.mktemp("page")
    out = tmp_path / "out"
    # every row (the hostile one too); knowledge as the reference, so random models rank apart
    methods = ["zero-shot", "few-shot", "soft-prompt", "lora"]
    study = write_study(tmp_path, family_dirs, methods, rows=[HOSTILE] + STUDY_ROWS, limit=None, reference={"metric": "knowledge"})
    result = CliRunner().invoke(app, ["study", str(study), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'index.html'}" in result.output
    return out / "index.html"


@pytest.fixture(scope="module")
def browser():
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: the report's browser check did not run")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield instance
        instance.close()


def open_page(browser, path: Path):
    """The page loaded from disk, with every console error, page error and request recorded."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.errors, page.requests = [], []
    page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.on("request", lambda request: page.requests.append(request.url))
    page.goto(path.as_uri())
    return page


def expected_samples(out: Path, **wanted) -> int:
    """Samples of the cells on disk that match: counted from samples.jsonl, not from the page."""
    count = 0
    for path in out.glob("*/*/*/samples.jsonl"):
        model, task, method = path.parent.relative_to(out).parts  # the folder is the label: "soft-prompt-chat"
        if wanted.get("model", model) != model or wanted.get("method", method) != method:
            continue
        samples = [json.loads(line) for line in path.read_text().splitlines()]
        if wanted.get("outcome") == "correct":
            samples = [s for s in samples if s["task_correct"]]
        count += len(samples)
    return count


def test_the_page_shows_each_tuning_chart_as_drawn_when_it_ended_and_redraws_an_older_one(study_page, tmp_path):
    import base64
    import os

    from softeval.reports.page import tuning_curves
    from softeval.tuning.chart import curve_chart

    tuned = sorted(study_page.parent.glob("*/*/prompt/curve.json"))[0].parent
    copy = tmp_path / "out" / tuned.relative_to(study_page.parent)
    shutil.copytree(tuned, copy)
    shown = lambda: base64.b64decode(tuning_curves(tmp_path / "out")[0][0]["src"].split(",", 1)[1]).decode()  # noqa: E731
    assert shown() == (copy / "curve.svg").read_text()
    # a curve.json written after its chart: the page draws the curve it holds now
    points = json.loads((copy / "curve.json").read_text())
    points[-1]["val_loss"] = 123.0
    (copy / "curve.json").write_text(json.dumps(points))
    chart_time = (copy / "curve.svg").stat().st_mtime_ns
    os.utime(copy / "curve.json", ns=(chart_time + 10**9, chart_time + 10**9))
    name = " / ".join(copy.relative_to(tmp_path / "out").parts)
    assert shown() == curve_chart(points, name) != (copy / "curve.svg").read_text()
    # a folder tuned before charts were SVG holds a curve.png: the comparison links it, the page draws the curve
    from softeval.reports.comparison import tuning_curves as linked

    (copy / "curve.svg").rename(copy / "curve.png")
    assert linked(tmp_path / "out") == {name: str((copy / "curve.png").relative_to(tmp_path / "out"))}
    assert shown() == curve_chart(points, name)


def test_page_loads_offline_with_every_section(study_page, browser, tmp_path):
    assert study_page.stat().st_size < 3_000_000
    page = open_page(browser, study_page)
    assert page.errors == []
    assert page.requests == [study_page.as_uri()]  # nothing but the file itself: no CDN, no network
    assert page.title() != "pwned" and "pwned" not in page.evaluate("document.title")
    for section in ("summary", "findings", "run", "overview", "paired", "curves", "ranking", "samples"):
        assert page.locator(f"section#{section}").count() == 1, section
    # the answer first (here, the ranking's verdicts), then the findings
    assert [s.get_attribute("id") for s in page.locator("main > section").all()[:2]] == ["summary", "findings"]
    saved = json.loads((study_page.parent / "comparison.json").read_text())["findings"]
    ranking = [f["verdict"] for f in saved if f["claim"].startswith("ranking_vs_")]
    assert page.locator("#summary table.summary tr td:nth-child(2)").all_text_contents() == ranking
    # every finding that applies, with the verdict comparison.json gives it: the study's own and
    # those that hold or fail in view, the undetermined per-cell ones folded by why
    shown = sorted(page.locator("table.findings span.verdict").all_text_contents())
    assert shown == sorted(f["verdict"] for f in saved if f["verdict"] != "not applicable")
    folded = page.locator("details.undetermined")
    assert folded.count() >= 1 and not folded.first.evaluate("d => d.open")
    assert not folded.first.locator("table.findings").is_visible()
    assert page.locator("table.counts tr").count() == 1 + len({f["claim"] for f in saved if f["model"] is not None})
    assert page.locator("#run table").first.locator("tr").count() == 1 + 6  # six models with their identity
    assert page.locator("table.overview tr").count() == 1 + 3 * 4 + 3 * 8  # base: 4 methods, post-trained: 4 x 2 chat modes
    # every cell's likelihood of the gold answer, bits per byte said to be lower-is-better
    assert page.locator("table.gold tr").count() == 1 + 3 * 4 + 3 * 8
    assert "lower is better" in page.locator("table.gold th", has_text="gold bpb").first.get_attribute("title")
    assert page.locator("table.findings").count() == page.locator("table.findings th", has_text="Holm").count() >= 2
    # each metric's column says what it measures
    assert "right when it keeps the format" in page.locator("table.overview th", has_text="cond acc").first.get_attribute("title")
    assert page.locator("#overview svg").count() == 1
    curves = page.locator("#curves img")  # each tuning's chart, as drawn when it ended
    assert curves.count() == 3 * 2 + 3 * 4
    curves.last.scroll_into_view_if_needed()  # drawn lazily, when scrolled to: the last one decodes
    for _ in range(50):
        if curves.last.evaluate("img => img.complete && img.naturalWidth"):
            break
        page.wait_for_timeout(100)
    assert curves.last.evaluate("img => img.naturalWidth") > 0  # a damaged SVG decodes to nothing
    assert page.locator("#ranking table tr").count() == 1 + 4 * 4  # four metrics x four methods
    # the hostile row's text is shown as text, in full
    page.select_option("#filter-model", "alpha-base0")
    page.select_option("#filter-method", "zero-shot")
    texts = page.locator("tr.sample details pre").all_text_contents()
    assert any("</script><script>document.title" in t for t in texts)

    shot = Path(os.environ.get(SCREENSHOT_ENV, tmp_path)) / "report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.goto(study_page.as_uri())
    page.screenshot(path=str(shot), full_page=True)
    from PIL import Image

    image = Image.open(shot).convert("L")
    assert image.size[1] > 2000  # the whole page, not one screen
    assert len(image.resize((200, 400)).getcolors(maxcolors=200 * 400)) > 20  # text, tables and charts, not a blank page


def test_sample_filters_change_the_visible_rows(study_page, browser):
    out = study_page.parent
    page = open_page(browser, study_page)
    total = expected_samples(out)
    assert page.locator("#sample-count").inner_text() == f"{total} of {total} samples"
    assert page.locator("tr.sample").count() == min(total, 50)  # one page at a time

    page.select_option("#filter-model", "beta-post-trained0")
    page.select_option("#filter-method", "soft-prompt-chat")
    assert page.locator("tr.sample").count() == expected_samples(out, model="beta-post-trained0", method="soft-prompt-chat") == 25
    page.select_option("#filter-outcome", "correct")
    correct = expected_samples(out, model="beta-post-trained0", method="soft-prompt-chat", outcome="correct")
    assert page.locator("tr.sample").count() == correct
    assert page.locator("#sample-count").inner_text() == f"{correct} of {total} samples"
    assert all(t == "correct" for t in page.locator("tr.sample td:nth-child(3)").all_text_contents())

    page.select_option("#filter-outcome", "")
    page.select_option("#filter-model", "")
    page.select_option("#filter-method", "")
    page.click("#page-next")
    assert page.locator("#page-label").inner_text().startswith("page 2 of")
    assert page.errors == []


def screenshot_shows_content(page: Path, anchor: str, folder: Path) -> bool:
    """A plain headless `chromium --screenshot` of the page at `#anchor` holds more than the
    page's background: a section's headings, tables and charts."""
    import subprocess

    from PIL import Image

    shot = folder / f"{anchor}.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1280,900",
                    f"{page.as_uri()}#{anchor}"], capture_output=True, timeout=120, check=True)
    image = Image.open(shot).convert("RGB")
    body = image.crop((0, 120, image.width, image.height))  # below the page's header
    return len(body.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20


def test_a_screenshot_of_each_sections_anchor_shows_that_section(study_page, browser, tmp_path):
    page = open_page(browser, study_page)
    sections = [s.get_attribute("id") for s in page.locator("main > section").all()]
    assert {"summary", "findings", "run", "overview", "ranking", "samples"} <= set(sections)
    for anchor in sections:
        assert screenshot_shows_content(study_page, anchor, tmp_path), anchor
    # a link shows its section alone, at the top; the page without one shows them all
    page.goto(f"{study_page.as_uri()}#ranking")
    assert [s.get_attribute("id") for s in page.locator("main > section").all() if s.is_visible()] == ["ranking"]
    page.goto(f"{study_page.as_uri()}#")
    assert all(s.is_visible() for s in page.locator("main > section").all())


def test_a_conflict_is_its_own_outcome_as_in_the_diagnostics_table():
    def sample(status, format_ok=False, correct=False):
        return SimpleNamespace(task_correct=correct, lenient_status=status, format_ok=format_ok)

    assert [outcome(sample(s)) for s in ("conflict", "ambiguous", "no_answer")] == ["conflict", "ambiguous", "format failure"]
    assert outcome(sample("answer", format_ok=True)) == "wrong" and outcome(sample("answer", True, True)) == "correct"


def test_a_series_study_shows_its_checkpoints_section(tmp_path, tokenizer_dirs, browser):
    """Two runs of three checkpoints each (tiny llamas, other random weights at each): the page
    shows decision accuracy per budget and method, the earliest decisions, the curves and noise."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import TUNING, tiny_config, write_user_task

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])
    tokenizer.chat_template = None
    for r, run in enumerate(("run-a", "run-b")):
        for step in (100, 200, 300):
            torch.manual_seed(1000 * r + step)
            AutoModelForCausalLM.from_config(tiny_config("llama", len(tokenizer), tokenizer)).save_pretrained(tmp_path / run / f"checkpoint-{step}")
            tokenizer.save_pretrained(tmp_path / run / f"checkpoint-{step}")
    series = [{"name": run, "checkpoints": str(tmp_path / run), "tokens_per_step": 1e6} for run in ("run-a", "run-b")]
    study = {"series": series, "tasks": [str(write_user_task(tmp_path, STUDY_ROWS))], "methods": ["zero-shot", "soft-prompt"], "limit": 8,
             "tuning": TUNING}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    result = CliRunner().invoke(app, ["study", str(tmp_path / "study.yaml"), "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    analysis = json.loads((tmp_path / "out" / "analysis.json").read_text())["tasks"]["capitals"]

    page = open_page(browser, tmp_path / "out" / "index.html")
    assert page.errors == []
    section = page.locator("section#series")
    assert section.count() == 1 and page.locator("nav a[href='#series']").count() == 1
    rows = section.locator("table.decisions tr")
    assert rows.count() == 1 + 3 + 2  # header, three budgets, the earliest decision by the estimate and by the interval
    assert rows.nth(1).locator("td").first.text_content() == "100M tokens"
    shown = rows.nth(3).locator("td").all_text_contents()[1:]  # the last budget, per method
    last = [analysis["decisions"][m][2]["decision_accuracy"] for m in ("zero-shot", "soft-prompt")]
    assert shown == [f"{e['value']:.2f} [{e['ci_low']:.2f}, {e['ci_high']:.2f}]" if e["value"] is not None else "n/a" for e in last]
    assert rows.nth(4).locator("td").first.text_content() == "decides from"
    assert rows.last.locator("td").first.text_content() == "shown from (interval)"
    for method in ("zero-shot", "soft-prompt"):  # the first budget from which every lower bound clears the threshold
        clears = [b["decision_accuracy"]["ci_low"] is not None and b["decision_accuracy"]["ci_low"] >= 0.8 for b in analysis["decisions"][method]]
        first = next((k for k in range(len(clears)) if all(clears[k:])), None)
        assert analysis["earliest_shown"][method] == (None if first is None else analysis["decisions"][method][first]["budget"])
    assert section.locator("svg").count() == 1
    assert screenshot_shows_content(tmp_path / "out" / "index.html", "series", tmp_path)  # the checkpoints, not a blank stretch
    assert section.locator("ul.why li").all_text_contents() == analysis["notes"]  # why a figure is n/a, as analysis.json says
    for written in ("analysis.json", "analysis.md", "analysis_capitals.png"):  # the study names the analysis's files
        assert f"wrote {tmp_path / 'out' / written}" in result.output
    assert section.locator("table").nth(1).locator("tr").count() == 1 + 2 * 2  # per method and recipe: noise, outliers

