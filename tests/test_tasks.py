"""Built-in task specs against the real benchmark mirror, and user task specs with local files."""

from __future__ import annotations

import json

import pytest
from conftest import ROWS, write_user_task

from softeval import SoftevalError, builtin_tasks, load_examples, load_task
from softeval.prompts import question_text, target_text, tuning_target

EXPECTED = {"arc_easy", "arc_challenge", "mmlu", "commonsense_qa", "boolq", "gsm8k", "triviaqa", "nq_open"}


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


def test_unknown_task_lists_known_ones():
    with pytest.raises(SoftevalError, match="unknown task 'arc_eazy'.*arc_easy"):
        load_task("arc_eazy")


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
