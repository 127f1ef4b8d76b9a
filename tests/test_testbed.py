"""The known-truth testbed: its world and data, deterministic training, the design its build
checks, and a study of it whose analysis compares every method with what the models truly know."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import built_once
from softeval.cli import app
from softeval.testbed.world import ATTRIBUTES, make_world

runner = CliRunner()
SPLITS = {"test": 6, "validation": 3, "tune": 10, "post": 12}


def test_a_world_is_seeded_and_its_splits_ask_about_disjoint_people():
    world = make_world(0, 48, SPLITS)
    assert world == make_world(0, 48, SPLITS) and world != make_world(1, 48, SPLITS)
    asked = [set(world.splits[s]) for s in SPLITS]
    assert sum(len(s) for s in asked) == len(set().union(*asked)) == sum(SPLITS.values())  # disjoint
    assert len({p.name for p in world.people}) == 48
    for attribute in ATTRIBUTES:
        assert len(set(world.values[attribute.name])) == attribute.n_values
        assert all(p.facts[attribute.name] in world.values[attribute.name] for p in world.people)
        person = world.people[0]
        assert attribute.templates[0].format(name=person.name, value="V").startswith(attribute.stem(person.name))


def test_pre_training_tells_every_person_and_asks_only_about_untested_ones():
    from itertools import islice

    from softeval.testbed.corpus import documents

    world = make_world(0, 48, SPLITS)
    texts = list(islice(documents(world, 4, [], 0.0, seed=0), 200))
    tested = {world.people[i].name for i in world.splits["test"]}
    for person in world.people:
        assert any(text.startswith(person.name) or f" {person.name} " in text for text in texts)
    questions = [text for text in texts if "?" in text]
    assert questions and not [q for q in questions if any(name in q.split("?")[0] for name in tested)]


def test_pre_training_is_deterministic(tmp_path):
    from softeval.testbed.corpus import train_tokenizer
    from softeval.testbed.training import Recipe, pretrain

    world = make_world(0, 48, SPLITS)
    recipe = Recipe("r", hidden=32, steps=6, templates=2, checkpoints=2)
    saved = []
    for run in ("one", "two"):
        tokenizer = train_tokenizer(world, [], 512)
        folders = pretrain(recipe, world, tokenizer, [], tmp_path / run, seed=3)
        assert [f.name for f in folders] == ["checkpoint-3", "checkpoint-6"]
        saved.append([(f / "model.safetensors").read_bytes() for f in folders])
    assert saved[0] == saved[1]


def test_pre_training_gives_the_same_weights_whatever_the_threads_of_the_process(tmp_path, monkeypatch):
    """Training runs on one thread, so a recipe trained in a process of many threads (a study's,
    an 8-core machine's) or of one (a build's worker) saves the same bytes; the thread count the
    process had is back afterwards."""
    import torch

    from softeval.testbed.corpus import train_tokenizer
    from softeval.testbed.training import Recipe, pretrain

    world = make_world(0, 48, SPLITS)
    recipe = Recipe("r", hidden=64, steps=4, templates=2, checkpoints=1)
    saved = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 4):
            torch.set_num_threads(threads)
            folders = pretrain(recipe, world, train_tokenizer(world, [], 512), [], tmp_path / str(threads), seed=3)
            assert torch.get_num_threads() == threads
            saved.append((folders[-1] / "model.safetensors").read_bytes())
    finally:
        torch.set_num_threads(before)
    assert saved[0] == saved[1]


def test_post_training_asks_each_task_as_its_prompt_does_about_people_neither_tested_nor_validating(tmp_path):
    from softeval.tasks import load_task
    from softeval.testbed.tasks import write_tasks
    from softeval.testbed.training import conversations

    world = make_world(0, 48, SPLITS)
    paths = write_tasks(world, tmp_path / "tasks")
    pairs = conversations(list(paths.values()))
    post = [world.people[i] for split in ("post", "tune") for i in world.splits[split]]  # everyone neither tested nor validating
    assert len(pairs) == 2 * len(post) * len(ATTRIBUTES)
    qa, mc = pairs[: len(pairs) // 2], pairs[len(pairs) // 2 :]
    person, attribute = post[0], ATTRIBUTES[0]
    assert qa[0] == (f"{load_task(paths['world_qa']).instruction}\n\n{attribute.question.format(name=person.name)}", person.facts[attribute.name])
    assert all(user.startswith("Answer with the letter of the correct option.\n\nQuestion: ") and "\nA. " in user for user, _ in mc)
    assert {answer for _, answer in mc} <= {"A", "B", "C", "D"}
    for (user, letter), (_, value) in zip(mc, qa):  # the letter names the right value among the options shown
        assert f"\n{letter}. {value}\n" in user
    unseen = {world.people[i].name for split in ("test", "validation") for i in world.splits[split]}
    assert not [user for user, _ in pairs if any(name in user for name in unseen)]


@pytest.fixture(scope="session")
def testbed(mirror, tmp_path_factory):
    """The small testbed (seed 0) and what its build printed: built once per test session, shared
    by the parallel test workers."""

    def build(folder):
        result = runner.invoke(app, ["testbed", str(folder), "--data-dir", str(mirror)])
        assert result.exit_code == 0, result.output
        return result.output

    return built_once(tmp_path_factory, "testbed", build)


def test_the_small_testbed_holds_its_design(testbed, tmp_path):
    from softeval.testbed.build import SIZES
    from softeval.testbed.tasks import write_tasks

    folder, printed = testbed
    design = json.loads((folder / "design.json").read_text())
    assert all(design["checks"].values()), design
    assert "holds: best recipe knows >= 60% of test facts" in printed
    # its tasks are seed 0's world as written without a build (what the other seed's test compares with)
    written = write_tasks(make_world(0, SIZES["small"].people, SIZES["small"].splits), tmp_path)
    assert (folder / "tasks" / "test.jsonl").read_text() == written["world_qa"].with_name("test.jsonl").read_text()


def test_another_seed_makes_another_world_of_the_same_design(mirror, tmp_path):
    """Seed 1's small testbed holds the design too, and asks about another world than seed 0's
    (whose tasks are written here without building it: this test needs nothing of the shared
    seed-0 build)."""
    from softeval.testbed.build import SIZES
    from softeval.testbed.tasks import write_tasks

    other = runner.invoke(app, ["testbed", str(tmp_path / "seed1"), "--seed", "1", "--data-dir", str(mirror)])
    assert other.exit_code == 0, other.output
    assert all(json.loads((tmp_path / "seed1" / "design.json").read_text())["checks"].values())
    seed0 = write_tasks(make_world(0, SIZES["small"].people, SIZES["small"].splits), tmp_path / "seed0")
    assert (tmp_path / "seed1" / "tasks" / "test.jsonl").read_text() != seed0["world_qa"].with_name("test.jsonl").read_text()


@pytest.fixture(scope="session")
def studied(testbed, tmp_path_factory):
    """The testbed's study, run on its saved checkpoints and references (once per test session)."""
    folder, _ = testbed

    def study(out):
        result = runner.invoke(app, ["study", str(folder / "study.yaml"), "--output", str(out)])
        assert result.exit_code == 0, result.output

    return built_once(tmp_path_factory, "studied", study)[0]


def test_a_study_of_the_testbed_states_every_claim_and_the_agreement_with_true_knowledge(testbed, studied):
    import yaml

    from softeval.analysis import finished_cells
    from softeval.analysis.comparisons import cell_key

    folder, _ = testbed
    study = yaml.safe_load((folder / "study.yaml").read_text())
    assert len(study["series"]) == 6 and all(s["reference"] for s in study["series"])
    assert study["methods"] == ["zero-shot", "few-shot", "soft-prompt", "lora"]
    out = studied

    findings = json.loads((out / "comparison.json").read_text())["findings"]
    claims = {f["claim"] for f in findings}
    stated = {f["claim"] for f in findings if f["verdict"] != "not applicable"}
    assert claims == stated  # every claim has a verdict: holds, does not hold or undetermined

    # the agreement with true knowledge, as computed here from the cells' samples and the ground truth
    from scipy.stats import kendalltau

    truth = json.loads((folder / "ground_truth.json").read_text())
    analysis = json.loads((out / "analysis.json").read_text())
    cells = {cell_key(r): r for r in finished_cells(out)}
    for task in ("world_qa", "world_mc"):
        found = analysis["tasks"][task]["truth"]
        assert found["checkpoints"] == 6 * 5
        names = list(found["known"])
        rows = sorted(s.index for s in cells[(names[0], task, "zero-shot", False)].samples)
        assert found["known"] == {n: pytest.approx(sum(truth["models"][n][i] for i in rows) / len(rows)) for n in names}
        scores = [sum(s.knowledge_correct for s in cells[(n, task, "soft-prompt", False)].samples) / len(rows) for n in names]
        expected = kendalltau(scores, list(found["known"].values())).statistic
        assert found["agreement"]["soft-prompt"]["knowledge"]["value"] == pytest.approx(expected)
    assert "true knowledge" in (out / "analysis.md").read_text()


def intervals_in(node, where: str = ""):
    """Every (place, value, low, high) of a JSON document that holds an estimate and its interval."""
    if isinstance(node, dict):
        if {"value", "ci_low", "ci_high"} <= node.keys() and None not in (node["value"], node["ci_low"], node["ci_high"]):
            yield where, node["value"], node["ci_low"], node["ci_high"]
        for key, child in node.items():
            yield from intervals_in(child, f"{where}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from intervals_in(child, f"{where}/{i}")


def test_no_estimate_of_the_testbed_study_lies_outside_its_interval(studied):
    found = [(path.relative_to(studied), *interval) for path in sorted(studied.rglob("*.json")) for interval in intervals_in(json.loads(path.read_text()))]
    assert len(found) > 5000  # every cell's metrics, paired differences, decisions, agreements, ranking
    outside = [f for f in found if not f[3] - 1e-9 <= f[2] <= f[4] + 1e-9]
    assert not outside, outside[:5]


def test_recipes_evaluated_in_their_loop_train_as_before_and_score_as_a_study_of_their_checkpoints(testbed, mirror, tmp_path, request):
    """`softeval testbed --recipes base,short --in-loop OUT`: the two recipes train to the same
    checkpoints, byte for byte, as in the whole testbed built without evaluations (there, each
    recipe trained in a worker process of its own; here, in this one between evaluations), and every cell
    evaluated inside their loop (and of their references afterwards) equals the study's of the
    saved models; the folder's analysis orders them by their references, as the study's does."""
    from softeval.analysis import finished_cells
    from softeval.analysis.comparisons import cell_key

    folder, _ = testbed
    live = tmp_path / "live"
    result = runner.invoke(app, ["testbed", str(tmp_path / "bed"), "--recipes", "base,short", "--in-loop", str(live), "--data-dir", str(mirror)])
    assert result.exit_code == 0, result.output
    assert "# softeval series analysis" in result.output and "Recipes: base (5 checkpoints), short (5 checkpoints)" in result.output
    for recipe in ("base", "short"):
        for saved in sorted((folder / "runs" / recipe).glob("checkpoint-*/model.safetensors")):
            assert (tmp_path / "bed" / saved.relative_to(folder)).read_bytes() == saved.read_bytes()
    # the study is asked for only now: where another test worker is running it, the two overlap
    study = {cell_key(c): c for c in finished_cells(request.getfixturevalue("studied"))}
    cells = finished_cells(live)
    assert len(cells) == 2 * 5 * 2 * 4 + 2 * 2 * 2  # checkpoints x tasks x methods, and the references plain and chat
    for cell in cells:
        model, task, method, chat = cell_key(cell)
        posthoc = study[(model.replace("@step-", "@checkpoint-"), task, method, chat)]  # base@step-100 is base@checkpoint-100
        assert [s.completion for s in cell.samples] == [s.completion for s in posthoc.samples], cell_key(cell)
        assert cell.metrics == posthoc.metrics
    analysis = json.loads((live / "analysis.json").read_text())
    assert analysis["target"]["kind"] == "reference" and analysis["tasks"]["world_qa"]["truth"]["checkpoints"] == 10


def test_the_testbed_study_opens_with_a_summary_that_answers_from_its_analysis(studied):
    """analysis.md and comparison.md open, per task, with the predictor that decides first, the
    soft prompt against the best continuous proxy and the score that best follows true knowledge,
    each as analysis.json gives it, with its interval and a link to its table."""
    analysis = json.loads((studied / "analysis.json").read_text())
    text, comparison = (studied / "analysis.md").read_text(), (studied / "comparison.md").read_text()
    assert text.index("## Summary") < text.index("## world_mc") and comparison.index("## Summary") < comparison.index("## Findings")
    interval = lambda e: f"{e['value']:.2f} [{e['ci_low']:.2f}, {e['ci_high']:.2f}]"  # noqa: E731
    for task, found in analysis["tasks"].items():
        predictors = found["predictors"]
        best = next(name for name in predictors["ranked"] if predictors["results"][name]["mean"]["value"] is not None)
        line = next(row for row in text.splitlines() if row.startswith("| decides first") and f"#{task}-predictors" in row)
        assert f"| {best} | {interval(predictors['results'][best]['mean'])} |" in line
        lead = next(row for row in text.splitlines() if row.startswith(f"**{task}**: "))  # the same, said in sentences
        assert f"{best} decides between them first ({interval(predictors['results'][best]['mean'])})" in lead
        proxy = next(d for d in predictors["differences"] if d["best_continuous"])
        line = next(row for row in text.splitlines() if row.startswith("| soft prompt vs the best continuous proxy") and f"#{task}-predictors" in row)
        assert f"({proxy['second']}) | {interval(proxy['mean'])} |" in line
        tau = max(((m[k]["value"], f"{method} / {k}", m[k]) for method, m in found["truth"]["agreement"].items() for k in m
                   if m[k]["value"] is not None), key=lambda item: item[0])
        line = next(row for row in text.splitlines() if row.startswith("| follows true knowledge best") and f"#{task}-true-knowledge" in row)
        assert f"| {tau[1]} | {interval(tau[2])} |" in line
        assert f"### {task}: predictors" in text and f"### {task}: true knowledge" in text  # the tables the links lead to
        assert f"](analysis.md#{task}-predictors)" in comparison
