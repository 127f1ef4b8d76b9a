"""Built-in task specs against the real benchmark mirror, and user task specs with local files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ROWS, write_user_task
from softeval import SoftevalError, builtin_tasks, load_examples, load_task
from softeval.tasks import tuning_target
from softeval.tasks.prompts import question_text, target_text

EXPECTED = {"arc_easy", "arc_challenge", "arc_easy_text", "arc_challenge_text", "mmlu", "commonsense_qa", "boolq",
            "gsm8k", "triviaqa", "nq_open"}


def test_all_builtin_tasks_are_declared():
    assert EXPECTED <= set(builtin_tasks())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_task_parses_every_row_of_the_mirror(name, mirror):
    spec = load_task(name)
    ds = spec.dataset
    for split in {ds.eval_split, ds.tune_split, ds.fewshot_split, ds.validation_split} - {None}:
        examples = load_examples(spec, split, mirror)
        assert len(examples) > 100
    example = examples[0]
    prompt, target = question_text(spec, example), target_text(spec, example)
    assert example.question in prompt
    assert prompt.rstrip().endswith("Answer:")
    assert tuning_target(spec, example) == target + spec.stop[0]
    # the tuning target is the gold answer in the strict format: both parsers read it as correct
    assert spec.format.is_correct(spec.format.strict(target, example).answer, example)
    assert spec.format.is_correct(spec.format.lenient(target, example).answer, example)


@pytest.mark.parametrize("name", ["arc_easy", "arc_challenge", "mmlu", "commonsense_qa", "boolq"])
def test_multiple_choice_prompts_list_every_option(name, mirror):
    spec = load_task(name)
    example = load_examples(spec, spec.dataset.eval_split, mirror, limit=1)[0]
    prompt = question_text(spec, example)
    assert all(f"{letter}. " in prompt for letter in example.letters)
    assert target_text(spec, example) == f" {example.answer}" and example.answer in example.letters


def test_gsm8k_target_is_the_worked_solution(mirror):
    spec = load_task("gsm8k")
    example = load_examples(spec, "train", mirror, limit=1)[0]
    target = target_text(spec, example)
    assert target.rstrip().endswith(f"#### {example.answer}") and "<<" not in target
    assert float(example.answer.replace(",", "")) == float(example.answer)


def test_arc_numeric_labels_are_relettered(tmp_path):
    # some hub rows of ARC label their options 1-4; the mirror already re-letters them
    row = {"id": "x", "question": "Q?", "choices": {"text": ["a", "b", "c", "d"], "label": ["1", "2", "3", "4"]}, "answerKey": "3"}
    folder = tmp_path / "allenai/ai2_arc/ARC-Easy"
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_text(json.dumps(row) + "\n")
    (example,) = load_examples(load_task("arc_easy"), "test", tmp_path)
    assert (example.answer, example.answer_index, example.letters) == ("C", 2, ["A", "B", "C", "D"])


def test_limit_takes_a_fixed_seeded_subset(mirror):
    spec = load_task("boolq")
    a = load_examples(spec, "validation", mirror, limit=30, seed=1)
    b = load_examples(spec, "validation", mirror, limit=30, seed=1)
    c = load_examples(spec, "validation", mirror, limit=30, seed=2)
    assert [e.index for e in a] == [e.index for e in b] != [e.index for e in c]
    assert [e.index for e in a] == sorted(e.index for e in a)


def test_an_unreachable_hub_reads_the_datasets_cache_at_once(mirror, monkeypatch):
    """datasets itself reads its cache when the hub is down, after ~30 s of retries: offline mode
    makes it read the cache at once. (datasets is replaced here by a cache of one split.)"""
    import datasets
    from huggingface_hub import constants

    rows = [json.loads(line) for line in (mirror / "allenai/ai2_arc/ARC-Easy/test.jsonl").read_text().splitlines()[:3]]

    def cached_load(path, config, split):
        if not (datasets.config.HF_HUB_OFFLINE and constants.HF_HUB_OFFLINE):
            raise ConnectionError("retried the hub")
        return rows

    monkeypatch.delenv("SOFTEVAL_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", cached_load)
    monkeypatch.setattr("softeval.tasks.data.hub_unreachable", lambda: "huggingface.co:443 is not reachable: no route")
    flags = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    examples = load_examples(load_task("arc_easy"), "test", data_dir=None)
    assert [e.source for e in examples] == [f"hub:allenai/ai2_arc/ARC-Easy/test[{i}]" for i in range(3)]
    assert (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE) == flags  # offline for that load only
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("not cached")))
    for memory in ("_ROWS", "_EXAMPLES"):  # a split is read once per process: forget the one just read
        monkeypatch.setattr(f"softeval.tasks.data.{memory}", {})
    with pytest.raises(SoftevalError, match=r"\(huggingface.co:443 is not reachable: no route, and the datasets cache does not hold it\)"):
        load_examples(load_task("arc_easy"), "test", data_dir=None)


def test_unknown_task_lists_known_ones(tmp_path):
    with pytest.raises(SoftevalError, match="unknown task 'arc_eazy'.*arc_easy"):
        load_task("arc_eazy")
    with pytest.raises(SoftevalError, match=r"task spec not found: .*nope\.yaml; check the path, or give a built-in task name \(softeval tasks lists them\)"):
        load_task(tmp_path / "nope.yaml")


# --- user tasks --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_user_task_reads_local_files(tmp_path, fmt):
    spec = load_task(write_user_task(tmp_path, ROWS, fmt))
    examples = load_examples(spec, "test")
    assert [e.answer for e in examples] == ["A", "B"]
    assert examples[1].choices == ["Paris", "Rome"]


def test_malformed_row_names_file_and_line(tmp_path):
    spec = load_task(write_user_task(tmp_path, [ROWS[0], '{"q": "broken",']))
    with pytest.raises(SoftevalError, match=r"test\.jsonl:2: malformed JSON"):
        load_examples(spec, "test")


def test_missing_field_names_the_row(tmp_path):
    spec = load_task(write_user_task(tmp_path, [ROWS[0], {"q": "no options", "gold": 0}]))
    with pytest.raises(SoftevalError, match=r"test\.jsonl:2: cannot compute field 'choices'"):
        load_examples(spec, "test")


def test_answer_out_of_range(tmp_path):
    spec = load_task(write_user_task(tmp_path, [{**ROWS[0], "gold": 3}]))
    with pytest.raises(SoftevalError, match=r"test\.jsonl:1: answer index 3 is out of range for 2 options"):
        load_examples(spec, "test")


@pytest.mark.parametrize(("answer", "kind"), [("q", "'Capital of France?' is a str"), ("gold / 2", "0.0 is a float")])
def test_answer_that_is_not_an_index(tmp_path, answer, kind):
    task = write_user_task(tmp_path, [ROWS[0]])
    task.write_text(task.read_text().replace("answer: gold", f"answer: {answer}"))
    with pytest.raises(SoftevalError, match=re.escape(f"test.jsonl:1: answer index {kind}, not an integer; the spec's answer field must give")):
        load_examples(load_task(task), "test")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("stop:", "stopp:", "unknown key 'stopp' (did you mean 'stop'?)"),
        ("eval_split:", "eval_splt:", "unknown key 'dataset.eval_splt' (did you mean 'eval_split'?)"),
        ("stop:", "colour: 1\nstop:", "unknown key 'colour'; remove it"),
        ("  eval_split: test\n", "", "dataset.eval_split: required, but not given; add it"),
        ("answer_format: multiple_choice", "answer_format: bogus", "unknown answer_format 'bogus'; choose one of: multiple_choice"),
        ("stop:", "stop: [", "is not valid YAML ("),
    ],
)
def test_spec_mistakes_name_the_key_and_the_fix(tmp_path, old, new, expected):
    task = write_user_task(tmp_path, ROWS)
    task.write_text(task.read_text().replace(old, new, 1))
    with pytest.raises(SoftevalError, match=re.escape(expected)):
        load_task(task)


def test_a_yaml_syntax_error_names_its_line(tmp_path):
    task = write_user_task(tmp_path, ROWS)
    lines = task.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("stop:"))
    lines[at] = "stop: [unclosed"
    task.write_text("\n".join(lines) + "\n")
    with pytest.raises(SoftevalError) as error:
        load_task(task)
    assert re.search(rf"{re.escape(str(task))}:\d+:\d+ is not valid YAML \(.+\); fix its syntax", str(error.value)), error.value


def test_empty_split(tmp_path):
    spec = load_task(write_user_task(tmp_path, []))
    with pytest.raises(SoftevalError, match=r"split 'test' has no rows \(.*test\.jsonl is empty\)"):
        load_examples(spec, "test")


def test_missing_mirror_file_says_what_layout_is_expected(tmp_path):
    with pytest.raises(SoftevalError, match="not found; check --data-dir"):
        load_examples(load_task("gsm8k"), "test", tmp_path)


def test_spec_missing_a_required_field_is_rejected(tmp_path):
    path = write_user_task(tmp_path, ROWS, fields={"question": "q", "answer": "gold"})
    with pytest.raises(SoftevalError, match="needs fields: choices"):
        load_task(path)


# --- include, filter, options from columns, spec-time checks -----------------------------------------


def test_include_overrides_field_by_field():
    easy, challenge, text = load_task("arc_easy"), load_task("arc_challenge"), load_task("arc_challenge_text")
    assert challenge.dataset.config == text.dataset.config == "ARC-Challenge"
    assert challenge.dataset.model_copy(update={"config": "ARC-Easy"}) == easy.dataset
    assert (challenge.fields, challenge.template, challenge.target) == (easy.fields, easy.template, easy.target)
    assert text.answer_format == "option_text" and text.target == " {{ answer_text }}" and text.fields == easy.fields


def test_include_of_a_user_spec_keeps_its_data_files(tmp_path):
    (tmp_path / "base").mkdir()
    base = write_user_task(tmp_path / "base", ROWS)
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"include: base/{base.name}\nname: capitals_cued\ntemplate: 'Q: {{{{ question }}}}\\n{{{{ options }}}}\\nA:'\n")
    spec = load_task(variant)
    assert spec.name == "capitals_cued" and spec.template.startswith("Q: ")
    examples = load_examples(spec, "test")  # data_files stay relative to the base spec's file
    assert [e.question for e in examples] == [r["q"] for r in ROWS]


def test_include_by_a_relative_path_through_two_levels(tmp_path, monkeypatch):
    (tmp_path / "specs" / "base").mkdir(parents=True)
    base = write_user_task(tmp_path / "specs" / "base", ROWS)
    (tmp_path / "specs" / "middle.yaml").write_text(f"include: base/{base.name}\nname: middle\nmax_new_tokens: 6\n")
    (tmp_path / "specs" / "top.yaml").write_text("include: middle.yaml\nname: top\nfields: {labels: null}\n")
    monkeypatch.chdir(tmp_path)
    spec = load_task("specs/top.yaml")
    assert (spec.name, spec.max_new_tokens) == ("top", 6)
    assert [e.question for e in load_examples(spec, "test")] == [r["q"] for r in ROWS]


def test_an_included_key_set_to_null_is_dropped(tmp_path):
    base = write_user_task(tmp_path, ROWS, fields={"question": "q", "choices": "[a, b]", "answer": "gold", "labels": "['A', 'B']"})
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"include: {base.name}\nname: plain\nfields: {{labels: null}}\n")
    assert "labels" not in load_task(variant).fields


def test_include_needs_a_name_of_its_own(tmp_path):
    (tmp_path / "variant.yaml").write_text("include: arc_easy\ndataset: {config: ARC-Challenge}\n")
    with pytest.raises(SoftevalError, match="a spec that includes another needs its own name"):
        load_task(tmp_path / "variant.yaml")


def test_include_with_choices_from_must_drop_the_inherited_options(tmp_path):
    base = write_user_task(tmp_path, ROWS)
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"include: {base.name}\nname: swapped\nchoices_from: {{correct: b, distractors: [a]}}\n")
    with pytest.raises(SoftevalError, match="choices_from builds choices and answer; drop fields answer, choices"):
        load_task(variant)
    variant.write_text(variant.read_text() + "fields: {choices: null, answer: null}\n")
    examples = load_examples(load_task(variant), "test")
    assert all(e.choices[e.answer_index] == r["b"] for e, r in zip(examples, ROWS))


def test_include_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("include: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\nname: b\n")
    with pytest.raises(SoftevalError, match="includes itself in the end; break the cycle"):
        load_task(tmp_path / "a.yaml")


def test_filter_skips_rows_and_counts_them(tmp_path):
    rows = [*ROWS, {**ROWS[0], "q": ""}, {**ROWS[1], "q": "Capital of Spain?", "b": ""}]
    spec = load_task(write_user_task(tmp_path, rows, filter="q and a and b"))
    examples = load_examples(spec, "test")
    assert [e.index for e in examples] == [0, 1]  # indices stay the rows' positions in the split
    from softeval.tasks import data_identity

    identity = data_identity(spec, "test", None)
    assert (identity["rows"], identity["filtered_out"]) == (4, 2)
    unfiltered = data_identity(load_task(write_user_task(tmp_path, rows)), "test", None)
    assert (unfiltered["rows"], unfiltered["filtered_out"]) == (4, 0)
    none_left = load_task(write_user_task(tmp_path, ROWS, filter="false"))
    with pytest.raises(SoftevalError, match=r"the filter \(false\) keeps none of the 2 rows of split 'test'"):
        load_examples(none_left, "test")


def test_choices_from_columns_places_the_answer_by_a_seeded_shuffle(tmp_path):
    rows = [{"q": f"Question {i}?", "right": f"yes {i}", "w1": f"no {i}", "w2": f"never {i}", "w3": f"maybe {i}"} for i in range(40)]
    choices_from = {"correct": "right", "distractors": ["w1", "w2", "w3"]}
    spec = load_task(write_user_task(tmp_path, rows, fields={"question": "q"}, choices_from=choices_from))
    examples = load_examples(spec, "test")
    assert all(e.choices[e.answer_index] == f"yes {e.index}" for e in examples)
    assert all(sorted(e.choices) == sorted(rows[e.index][k] for k in ("right", "w1", "w2", "w3")) for e in examples)
    positions = [e.answer_index for e in examples]
    assert set(positions) == {0, 1, 2, 3}  # the correct answer is not always in one place
    assert positions == [e.answer_index for e in load_examples(spec, "test")]  # the same on every run
    # the order depends on the option texts only: pinned, so it stays the same across versions
    assert examples[0].choices == ["maybe 0", "no 0", "yes 0", "never 0"]
    extra = load_task(write_user_task(tmp_path, [{**r, "unused": 1} for r in rows], fields={"question": "q"}, choices_from=choices_from))
    assert [e.choices for e in load_examples(extra, "test")] == [e.choices for e in examples]


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ({"q": "Q?", "right": "yes", "w1": "", "w2": "x"}, r"choices_from: choices_from.distractors\[0\] \(w1\) is missing or empty; skip such rows with a filter"),
        ({"q": "Q?", "right": "yes", "w1": "no"}, r"choices_from: choices_from.distractors\[1\] \(w2\) is missing or empty"),
        ({"q": "Q?", "right": "yes", "w1": "yes", "w2": "x"}, r"choices_from: two options have the same text \(yes, yes, x\)"),
    ],
)
def test_choices_from_names_the_column_that_cannot_be_an_option(tmp_path, row, error):
    choices_from = {"correct": "right", "distractors": ["w1", "w2"]}
    spec = load_task(write_user_task(tmp_path, [row], fields={"question": "q"}, choices_from=choices_from))
    with pytest.raises(SoftevalError, match=r"test\.jsonl:1: " + error):
        load_examples(spec, "test")


def test_choices_from_reads_numbers_as_text(tmp_path):
    rows = [{"q": "2 + 2?", "right": 4, "w1": 5, "w2": 22}]
    spec = load_task(write_user_task(tmp_path, rows, fields={"question": "q"}, choices_from={"correct": "right", "distractors": ["w1", "w2"]}))
    (example,) = load_examples(spec, "test")
    assert sorted(example.choices) == ["22", "4", "5"] and example.choices[example.answer_index] == "4"


def test_text_column_used_as_a_number_says_to_add_int(tmp_path):
    spec = load_task(write_user_task(tmp_path, [{**r, "gold": str(r["gold"] + 1)} for r in ROWS],
                                     fields={"question": "q", "choices": "[a, b]", "answer": "gold - 1"}))
    with pytest.raises(SoftevalError, match=r"cannot compute field 'answer' \(gold - 1\): .*add `\| int`"):
        load_examples(spec, "test")


def test_empty_template_is_found_before_work(tmp_path):
    from softeval.study.preflight import check_task

    spec = load_task(write_user_task(tmp_path, ROWS, cloze_template="{{ '' }}"))
    with pytest.raises(SoftevalError, match=r"cloze_template renders to nothing for .*test\.jsonl:1; give the cloze_template some text"):
        check_task(spec, ["test"], None)


def test_string_label_used_as_an_index_says_to_add_int(tmp_path):
    spec = load_task(write_user_task(tmp_path, [{**r, "gold": str(r["gold"])} for r in ROWS]))
    with pytest.raises(SoftevalError, match=r"test\.jsonl:1: answer index '0' is text, not a number; add `\| int`"):
        load_examples(spec, "test")


def test_multiple_choice_needs_a_cloze_template(tmp_path):
    with pytest.raises(SoftevalError, match="answer_format multiple_choice needs a cloze_template"):
        load_task(write_user_task(tmp_path, ROWS, cloze_template=None))


def test_text_task_targets_the_option_text(mirror):
    spec = load_task("arc_easy_text")
    example = load_examples(spec, "test", mirror, limit=1)[0]
    prompt = question_text(spec, example)
    listed = "Options:\n" + "\n".join(f"- {choice}" for choice in example.choices) + "\nAnswer:"
    assert prompt.endswith(listed) and "A. " not in prompt
    assert target_text(spec, example) == " " + example.choices[example.answer_index]


def test_spec_identity_ignores_settings_left_at_their_default(tmp_path):
    from softeval.tasks import TaskSpec

    class WithANewSetting(TaskSpec):  # a later softeval with one more optional setting
        new_setting: int = 0

    plain = load_task(write_user_task(tmp_path, ROWS))
    later = WithANewSetting(**plain.model_dump(exclude_defaults=True))
    edited = load_task(write_user_task(tmp_path, ROWS, template="Q: {{ question }}\n{{ options }}\nA:"))
    assert plain.sha256() == later.sha256() != edited.sha256()


@pytest.mark.parametrize("name", ["capitals", "science_quiz"])
def test_the_example_tasks_load_and_every_split_validates(name):
    """The docs' own examples work as written: the spec loads, every split it names is read and
    each row validates, and there are rows enough to tune and to give five demonstrations."""
    from softeval.study import check_before_work

    examples = Path(__file__).resolve().parents[1] / "examples"
    spec = load_task(examples / f"{name}.yaml")
    check_before_work([], [spec], ["zero-shot", "few-shot", "soft-prompt"], k=5, tuning=True, outputs=[], data_dir=None)
    rows = load_examples(spec, spec.dataset.eval_split)
    assert rows and all(e.answer for e in rows)
    if spec.answer_format == "short_answer":
        assert any(len(e.aliases) > 1 for e in rows)  # the aliases list is read
