"""Tasks of lm-evaluation-harness as softeval tasks (`--task lm-eval:NAME`): built through lm-eval's
own registry, read offline from mirror-layout data, scored as lm-eval scores them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from softeval.cli import app
from softeval.errors import SoftevalError

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'softeval[lm-eval]')")

# rows in each dataset's own schema, for the datasets the shared mirror lacks
SYNTHETIC = {
    "Rowan/hellaswag/default": lambda i: {"ind": i, "activity_label": "Cooking", "ctx_a": f"A cook cracks {i + 2} eggs into a bowl.",
                                          "ctx_b": "then she", "ctx": "", "endings": ["whisks them.", "sings [title] loudly.", "sleeps.", "runs off."],
                                          "source_id": "x", "split": "val", "split_type": "indomain", "label": "0"},
    "baber/piqa/default": lambda i: {"goal": f"Keep {i + 2} apples fresh", "sol1": "Store them in a cool place.", "sol2": "Leave them in the sun.",
                                     "label": 0},
    "allenai/winogrande/winogrande_xl": lambda i: {"sentence": f"The cup did not fit in the box because the _ was {i + 2} cm too big.",
                                                    "option1": "cup", "option2": "box", "answer": "1"},
    "allenai/openbookqa/main": lambda i: {"id": str(i), "question_stem": f"Which of these conducts heat best ({i})?",
                                          "choices": {"text": ["metal", "wood", "air", "wool"], "label": ["A", "B", "C", "D"]}, "answerKey": "A"},
    "allenai/sciq/default": lambda i: {"question": f"What do plants take in ({i})?", "distractor1": f"oxygen {i}", "distractor2": f"helium {i}",
                                       "distractor3": f"neon {i}", "correct_answer": f"carbon dioxide {i}", "support": "Plants take in carbon dioxide."},
    "EleutherAI/hendrycks_math/algebra": lambda i: {"problem": f"What is ${i} + 2$?", "level": "Level 1", "type": "Algebra",
                                                    "solution": f"Adding, ${i} + 2 = \\boxed{{{i + 2}}}$."},
    "lighteval/siqa/default": lambda i: {"context": f"Alex gave Sam {i + 2} books.", "question": "How would Sam feel?",
                                         "answerA": "grateful", "answerB": "angry", "answerC": "bored", "label": "1"},
    "aps/super_glue/boolq": lambda i: {"question": f"is water wet {i}", "passage": "Water is a liquid.", "idx": i, "label": 1},
    "cais/mmlu/astronomy": lambda i: {"question": f"How many planets orbit the Sun ({i})?", "subject": "astronomy",
                                      "choices": ["7", "8", "9", "10"], "answer": 1},
}
SPLITS = ("train", "validation", "test", "dev")
# the tasks of lm-eval's registry that must run offline, with the mirror folder each reads
REGISTRY_TASKS = {
    "arc_easy": "allenai/ai2_arc/ARC-Easy", "arc_challenge": "allenai/ai2_arc/ARC-Challenge", "hellaswag": "Rowan/hellaswag/default",
    "piqa": "baber/piqa/default", "winogrande": "allenai/winogrande/winogrande_xl", "openbookqa": "allenai/openbookqa/main",
    "sciq": "allenai/sciq/default", "social_iqa": "lighteval/siqa/default", "mmlu_astronomy": "cais/mmlu/astronomy",
    "boolq": "aps/super_glue/boolq", "commonsense_qa": "tau/commonsense_qa/default", "gsm8k": "openai/gsm8k/main",
    # generation tasks of each known answer format (NQ-open's mirror folder is its one config, nq_open)
    "triviaqa": "mandarjoshi/trivia_qa/rc.nocontext", "nq_open": "google-research-datasets/nq_open/nq_open",
    "hendrycks_math_algebra": "EleutherAI/hendrycks_math/algebra",
}


@pytest.fixture(scope="module")
def lm_eval_mirror(tmp_path_factory, mirror) -> Path:
    """A mirror-layout folder: the first rows of the shared mirror's splits, and synthetic rows in
    their own schema for the datasets it lacks."""
    root = tmp_path_factory.mktemp("lm-eval-mirror")
    for folder in REGISTRY_TASKS.values():
        (root / folder).mkdir(parents=True)
        for split in SPLITS:
            if folder in SYNTHETIC:
                lines = [json.dumps(SYNTHETIC[folder](i + 100 * SPLITS.index(split))) for i in range(6)]  # other rows in each split
            elif (mirror / folder / f"{split}.jsonl").is_file():
                lines = (mirror / folder / f"{split}.jsonl").read_text().split("\n")[:24]
            else:
                continue
            (root / folder / f"{split}.jsonl").write_text("\n".join(line for line in lines if line.strip()) + "\n")
    return root


@pytest.mark.parametrize("name", sorted(REGISTRY_TASKS))
def test_a_registry_task_reads_its_mirror_rows_as_lm_eval_makes_them(name, lm_eval_mirror):
    from softeval.scoring import score_sample
    from softeval.tasks import load_examples, load_task
    from softeval.tasks.prompts import question_text, target_text

    spec = load_task(f"lm-eval:{name}")
    assert spec.lm_eval.task == name and spec.name == f"lm-eval-{name}"
    for split in {spec.dataset.eval_split, spec.dataset.tune_split}:
        examples = load_examples(spec, split, lm_eval_mirror)
        assert examples
    for example in examples:
        prompt = question_text(spec, example)
        if spec.is_multiple_choice:  # every option is shown above the answer cue
            assert all(choice in prompt for choice in (example.choices or [])) and prompt.rstrip().endswith(":")
        # the tuning target, read by the task's own answer format, is right: a prompt tuned towards it learns the format
        judged = score_sample(spec.format, example, target_text(spec, example).strip(), None)
        assert judged.format_ok and judged.task_correct, (example.source, target_text(spec, example))
    if name == "sciq":  # lm-eval's answer is always the last option: shown in an order of their own, it is not
        assert len({e.answer for e in examples}) > 1 and all(e.choices[e.answer_index].startswith("carbon dioxide") for e in examples)


@pytest.mark.parametrize(
    ("name", "metric"),
    [
        ("arc_easy", "acc_norm"),  # options after lm-eval's prompt, per character
        ("hellaswag", "acc_norm"),  # rows made into documents by lm-eval's own process_docs
        ("mmlu_astronomy", "acc"),  # lm-eval's description before its prompt; its options are letters
        ("winogrande", "acc"),  # partial scoring: each option a context, one continuation
    ],
)
def test_knowledge_equals_lm_evals_own_metric_on_the_same_rows(name, metric, tmp_path, lm_eval_mirror, tiny_model_dirs):
    """The same tiny model, the same rows: softeval's zero-shot knowledge of `lm-eval:NAME` is
    lm-eval's own acc_norm (or acc, where that is all lm-eval reports), row by row."""
    from lm_eval.tasks import TaskManager

    from softeval.tasks import load_task

    model = tiny_model_dirs["llama"]
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "--model", str(model), "--task", f"lm-eval:{name}", "--method", "zero-shot",
                                      "--data-dir", str(lm_eval_mirror), "--output", str(out)])
    assert result.exit_code == 0, result.output
    cell = out / model.name / f"lm-eval-{name}" / "zero-shot"
    ours = [json.loads(line) for line in (cell / "samples.jsonl").read_text().splitlines()]
    knowledge = json.loads((cell / "results.json").read_text())["metrics"]["knowledge"]["value"]

    # lm-eval runs its own registered task on the file softeval evaluated
    split = load_task(f"lm-eval:{name}").dataset.eval_split
    data = lm_eval_mirror / REGISTRY_TASKS[name] / f"{split}.jsonl"
    registered = TaskManager().task_index[name].yaml_path
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "rows.yaml").write_text(
        f"include: {registered}\ntask: {name}_rows\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\ntraining_split: null\nvalidation_split: null\ntest_split: test\nfewshot_split: null\n"
    )
    theirs = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model},dtype=float32", tasks=[f"{name}_rows"],
                                     task_manager=TaskManager(include_path=str(tmp_path / "tasks")), batch_size=4, device="cpu", log_samples=True)
    per_row = {s["doc_id"]: s[metric] for s in theirs["samples"][f"{name}_rows"]}
    assert len(ours) == len(per_row) and len(ours) >= 6
    assert [bool(s["knowledge_correct"]) for s in sorted(ours, key=lambda s: s["index"])] == [bool(per_row[i]) for i in range(len(per_row))]
    assert knowledge == pytest.approx(theirs["results"][f"{name}_rows"][f"{metric},none"], abs=1e-6)  # results.json keeps 6 decimals


def test_a_study_of_lm_eval_tasks_runs_offline_end_to_end(tmp_path, lm_eval_mirror, tokenizer_dirs):
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import TUNING, tiny_config

    # lm-eval keeps 256 tokens free for a generated answer: a tiny llama of a longer context
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])
    config = tiny_config("llama", len(tokenizer), tokenizer)
    config.max_position_embeddings = 1024
    model = tmp_path / "tiny-long"
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    tokenizer.save_pretrained(model)
    study = {"models": [str(model)], "tasks": ["lm-eval:arc_easy", "lm-eval:gsm8k", "lm-eval:winogrande"],
             "methods": ["zero-shot", "few-shot", "soft-prompt"], "k": 2, "limit": 6, "tuning": TUNING}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", str(tmp_path / "study.yaml"), "--data-dir", str(lm_eval_mirror), "--output", str(out)])
    assert result.exit_code == 0, result.output
    for task in ("lm-eval-arc_easy", "lm-eval-gsm8k", "lm-eval-winogrande"):
        for method in ("zero-shot", "few-shot", "soft-prompt"):
            saved = json.loads((out / "tiny-long" / task / method / "results.json").read_text())
            assert saved["config"]["task"] == task and saved["n_examples"] == 6
    samples = [json.loads(line) for line in (out / "tiny-long" / "lm-eval-winogrande" / "zero-shot" / "samples.jsonl").read_text().splitlines()]
    assert all(s["gold"] in ("A", "B") for s in samples)  # partial scoring: two options, each a context
    # exported for lm-eval's tools under lm-eval's own metric names: acc_norm where lm-eval reports it
    result = CliRunner().invoke(app, ["export", str(out), "--format", "lm-eval"])
    assert result.exit_code == 0, result.output
    saved = json.loads(next((out / "export" / "lm-eval").glob("*__zero-shot/results_*.json")).read_text())
    exported = saved["results"]
    assert "knowledge,acc_norm" in exported["lm-eval-arc_easy"] and "knowledge,acc" in exported["lm-eval-winogrande"]
    # the prompt shown is lm-eval's own, as its configuration writes it, not softeval's fields of what lm-eval computed
    assert saved["configs"]["lm-eval-arc_easy"]["doc_to_text"] == "Question: {{question}}\nAnswer:"
    assert saved["configs"]["lm-eval-gsm8k"]["doc_to_text"] == "Question: {{question}}\nAnswer:"
    assert saved["configs"]["lm-eval-winogrande"]["doc_to_text"].startswith("!function ")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("lm-eval:no_such_task", r"^unknown lm-eval task 'no_such_task'"),
        ("lm-eval:mmlu", r"^lm-eval 'mmlu' names several tasks \(a group\); give them one by one \(such as mmlu_[a-z_]+, mmlu_[a-z_]+, mmlu_[a-z_]+\); "
                         r"or use softeval's built-in --task mmlu$"),
        ("lm-eval:ai2_arc", r"^lm-eval 'ai2_arc' names several tasks \(a tag\); give them one by one \(such as arc_challenge, arc_easy\)$"),
        ("lm-eval:arc", r"^unknown lm-eval task 'arc'; did you mean arc_"),
        ("lm-eval:squadv2", r"^lm-eval defines task 'squadv2' with code of its own \(a task class or a custom dataset\), which softeval cannot use$"),
        ("lm-eval:wikitext", r"^lm-eval task 'wikitext' is a loglikelihood_rolling task; softeval evaluates multiple-choice and generation tasks$"),
        ("lm-eval:arc_easy:number", r"^lm-eval task 'arc_easy' is multiple choice: answer it as multiple_choice or option_text, not 'number'$"),
        ("lm-eval:wmt16-de-en", r"^lm-eval task 'wmt16-de-en' generates text and lm-eval scores it by bleu, which counts no answer right or wrong; "
                                r"name an answer format to read it by: lm-eval:wmt16-de-en:FORMAT, FORMAT one of number, short_answer, math$"),
        ("lm-eval:wmt16-de-en:lm_eval", r"^lm-eval task 'wmt16-de-en' is scored by bleu, not right or wrong: the lm_eval format reads tasks scored by "),
    ],
)
def test_a_task_softeval_cannot_use_is_told_in_one_line(name, message):
    from softeval.tasks import load_task

    with pytest.raises(SoftevalError, match=message) as caught:
        load_task(name)
    assert "\n" not in str(caught.value)


def test_a_task_module_that_loads_a_metric_asks_no_hub_that_cannot_be_reached(monkeypatch, tmp_path):
    """humaneval's module loads the code_eval metric from the hub as it is imported. Where the hub
    cannot be reached, `evaluate` makes no request (it would retry for seconds per metric): the
    module fails at once, and the task is refused in one line."""
    import evaluate.config
    import evaluate.utils.file_utils as evaluate_files

    from softeval.tasks import load_task
    from softeval.tasks import lm_eval as softeval_lm_eval

    requests = []

    def request(method, url, **kwargs):
        requests.append(url)
        raise evaluate_files.requests.exceptions.ConnectionError(f"{url}: no network in this test")

    monkeypatch.setattr(evaluate_files.requests, "request", request)
    monkeypatch.setattr(evaluate.config, "HF_MODULES_CACHE", tmp_path)  # no copy of the metric cached by an earlier run
    monkeypatch.setattr(softeval_lm_eval, "hub_unreachable", lambda: "huggingface.co:443 is not reachable (this test)")
    softeval_lm_eval._config.cache_clear()  # read again, not from another test's load
    with pytest.raises(SoftevalError, match=r"^lm-eval task 'humaneval': its configuration cannot be loaded \(") as caught:
        load_task("lm-eval:humaneval")
    assert "\n" not in str(caught.value) and requests == []


def test_offline_mode_leaves_evaluate_as_it_found_it(monkeypatch):
    """Inside `offline()`, evaluate is offline; after, as before: also where it is first imported
    inside (it reads its setting once, at import), which a fresh interpreter shows."""
    import os
    import subprocess
    import sys

    import evaluate.config

    from softeval.models import offline

    monkeypatch.delenv("HF_EVALUATE_OFFLINE", raising=False)
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", False)
    with offline():
        assert evaluate.config.HF_EVALUATE_OFFLINE and os.environ["HF_EVALUATE_OFFLINE"] == "1"
    assert evaluate.config.HF_EVALUATE_OFFLINE is False and "HF_EVALUATE_OFFLINE" not in os.environ
    fresh = ("import os, sys\nfrom softeval.models import offline\nassert 'evaluate' not in sys.modules\n"
             "with offline():\n    import evaluate.config\n    assert evaluate.config.HF_EVALUATE_OFFLINE\n"
             "print(evaluate.config.HF_EVALUATE_OFFLINE, os.environ.get('HF_EVALUATE_OFFLINE'))")
    after = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, timeout=120)
    assert after.returncode == 0 and after.stdout.strip() == "False None", after.stderr[-1000:]


def test_a_task_module_that_ends_the_process_is_told_in_one_line(monkeypatch, capsys, tmp_path, tiny_model_dirs):
    """lm-eval's slr_bench module calls sys.exit when it is imported without SWI-Prolog (or fails
    to import `evaluate`): softeval goes on to its own one-line error, naming the task and the
    module's message."""
    import shutil

    from test_bad_input import user_sees

    if shutil.which("swipl"):
        pytest.skip("SWI-Prolog is installed: slr_bench's module imports")
    err = user_sees(monkeypatch, capsys, "eval", "--model", tiny_model_dirs["llama"], "--task", "lm-eval:slr_bench_basic", "--output", tmp_path / "out")
    assert err.startswith("error: lm-eval task 'slr_bench_basic': its configuration cannot be loaded (")
    assert "SWI-Prolog" in err or "ImportError" in err or "ModuleNotFoundError" in err
    assert "\n" not in err.strip() and not (tmp_path / "out").exists()


def test_the_user_sees_one_line_for_a_group(monkeypatch, capsys, tmp_path, tiny_model_dirs):
    from test_bad_input import user_sees

    err = user_sees(monkeypatch, capsys, "eval", "--model", tiny_model_dirs["llama"], "--task", "lm-eval:mmlu", "--output", tmp_path / "out")
    assert err.startswith("error: lm-eval 'mmlu' names several tasks (a group); give them one by one (such as mmlu_")
    assert not (tmp_path / "out").exists()


# --- lm-eval's own reading of a generated answer (the lm_eval format) -----------------------------

DATE_ROWS = [{"input": f"Today is 12/{10 + i}/2020. What is the date tomorrow in MM/DD/YYYY?\nOptions:\n(A) 12/{11 + i}/2020\n(B) 01/01/1999",
              "target": "(A)"} for i in range(6)]
DROP_ROWS = [{"section_id": f"s{i}", "query_id": f"q{i}", "passage": f"The team scored {i + 3} goals in the first half and 2 in the second.",
              "question": "How many goals were scored in the first half?",
              "answer": {"number": str(i + 3), "date": {"day": "", "month": "", "year": ""}, "spans": []},
              "validated_answers": {"number": [str(i + 3)], "date": [{"day": "", "month": "", "year": ""}], "spans": [[]]}} for i in range(6)]
# per task: the mirror folder, its rows, lm-eval's metric key (metric, strict filter), and completions of every kind
PARITY = {
    "gsm8k_cot": ("openai/gsm8k/main", None, ("exact_match", "strict-match"),
                  lambda gold: [f"So 3 + 4 = 7. The answer is {gold}.", f"The answer is ${gold}.", f"The answer is {gold}", "The answer is 123456.",
                                f"the answer is {gold}.", f"#### {gold}", "", f"The answer is {gold},000."]),
    "bbh_cot_fewshot_date_understanding": ("SaylorTwift/bbh/date_understanding", DATE_ROWS, ("exact_match", "get-answer"),
                                           lambda gold: [f"Tomorrow comes next. So the answer is {gold}.", f"So the answer is {gold}", "So the answer is (B).",
                                                         f"The answer is {gold}.", f"so the answer is {gold.lower()}.", gold, ""]),
    "drop": ("EleutherAI/drop/default", DROP_ROWS, ("em", "none"),
             lambda gold: [gold, f" {gold}", f"{gold} goals", "two", f"The answer is {gold}", ""]),
}


@pytest.fixture(scope="module")
def parity_mirror(tmp_path_factory, mirror) -> Path:
    root = tmp_path_factory.mktemp("lm-eval-parity")
    for folder, rows, _, _ in PARITY.values():
        (root / folder).mkdir(parents=True)
        for split in ("train", "validation", "test"):
            lines = [json.dumps(r) for r in rows] if rows else (mirror / folder / f"{split}.jsonl").read_text().splitlines()[:8] \
                if (mirror / folder / f"{split}.jsonl").is_file() else []
            if lines:
                (root / folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("name", sorted(PARITY))
def test_lm_eval_format_scores_each_completion_as_lm_evals_own_strict_metric(name, parity_mirror):
    """The same completions, row by row: softeval's task accuracy and format-following under the
    lm_eval format (chosen without being named) equal lm-eval's strict metric, computed here by
    lm-eval's own task object: its filter ensembles on its Instances, then its process_results."""
    from lm_eval.api.instance import Instance

    from softeval.scoring import score_sample
    from softeval.tasks import load_examples, load_task
    from softeval.formats.lm_eval import READINGS
    from softeval.tasks.prompts import target_text

    _, _, (metric, strict), completions = PARITY[name]
    spec = load_task(f"lm-eval:{name}")
    assert spec.answer_format == "lm_eval" and spec.name == f"lm-eval-{name}"
    examples = load_examples(spec, spec.dataset.eval_split, parity_mirror)
    task = READINGS[name].task  # lm-eval's own task object, as softeval read the rows with it
    compared = 0
    for example in examples:
        doc = {k: v for k, v in example.row.items() if not k.startswith("lm_eval_")}
        # the tuning target is read back as right by lm-eval's own strict filter: a prompt tuned on it learns the format
        for completion in [*completions(example.answer), target_text(spec, example).strip()]:
            instance = Instance(request_type="generate_until", doc=doc, arguments=("", {}), idx=0)
            instance.resps = [completion]
            for ensemble in task._filters:
                ensemble.apply([instance])
            extracted = instance.filtered_resps[strict]
            theirs = task.process_results(doc, [extracted])[metric]
            ours = score_sample(spec.format, example, completion, None)
            assert ours.task_correct == (theirs == 1.0), (name, completion, extracted, ours.strict_answer)
            assert ours.format_ok == (extracted.strip() not in ("[invalid]", "")), (name, completion, extracted)  # an empty answer is none
            compared += 1
        assert score_sample(spec.format, example, target_text(spec, example).strip(), None).task_correct
    assert compared >= 6 * 5
    # every kind of completion occurs: right, wrong and unreadable
    judged = [score_sample(spec.format, e, c, None) for e in examples for c in completions(e.answer)]
    assert any(j.task_correct for j in judged) and any(j.format_ok and not j.task_correct for j in judged) and any(not j.format_ok for j in judged)


def test_a_chain_of_thought_task_runs_without_a_named_format(tmp_path, parity_mirror, tokenizer_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import tiny_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])
    config = tiny_config("llama", len(tokenizer), tokenizer)
    config.max_position_embeddings = 1024  # lm-eval keeps 256 tokens free for the reasoning
    model = tmp_path / "tiny-long"
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    tokenizer.save_pretrained(model)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "--model", str(model), "--task", "lm-eval:gsm8k_cot", "--method", "zero-shot", "--limit", "3",
                                      "--data-dir", str(parity_mirror), "--output", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "tiny-long" / "lm-eval-gsm8k_cot" / "zero-shot" / "results.json").read_text())
    assert saved["n_examples"] == 3 and saved["metrics"]["task_accuracy"]["value"] is not None
