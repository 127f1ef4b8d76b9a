"""Bad input: each mistake is one `error:` line (exit 2) naming the problem and the fix, found
before any model loads, and nothing is left behind."""

from __future__ import annotations

import json
import os
import resource
import signal

import pytest

from conftest import ROWS, write_user_task
from softeval import cli
from softeval._io import write_json_atomic
from softeval.errors import SoftevalError

ALIAS = "smollm2-135m-instruct"  # a valid --model that the checks below never get to load


@pytest.fixture
def no_model_loading(monkeypatch):
    """Loading a model fails the test: every check here must come first."""

    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("softeval.models.load_model", load_model)
    monkeypatch.setattr("softeval.study.runner.load_model", load_model)


def user_sees(monkeypatch, capsys, *args, code: int = 2) -> str:
    """What `softeval ARGS` prints on stderr, checked to be one line; the exit code is checked too."""
    monkeypatch.setattr("sys.argv", ["softeval", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == code, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def eval_args(task, out, *extra):
    return ["eval", "--model", ALIAS, "--task", task, "--output", out, *extra]


def assert_nothing_written(out):
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


# --- data files -------------------------------------------------------------------------------------


@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path):
    """The hub's endpoint where nothing listens (the discard port), and empty local caches."""
    from huggingface_hub import constants

    from softeval.models import hub_unreachable

    monkeypatch.delenv("SOFTEVAL_DATA_DIR", raising=False)
    for proxy in ("http", "https", "all", "no"):
        monkeypatch.delenv(f"{proxy}_proxy", raising=False)
        monkeypatch.delenv(f"{proxy.upper()}_PROXY", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "empty-cache")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    hub_unreachable.cache_clear()
    yield
    hub_unreachable.cache_clear()


def test_an_unreachable_hub_is_one_line_without_retries(tmp_path, monkeypatch, capsys, no_model_loading, unreachable_hub):
    line = user_sees(monkeypatch, capsys, "eval", "--model", ALIAS, "--task", "arc_easy", "--output", tmp_path / "out")
    assert line.startswith("error: task arc_easy: cannot load allenai/ai2_arc (test) from the Hugging Face hub (127.0.0.1:9 is not reachable: ")
    assert line.endswith("is not reachable: Connection refused, and the datasets cache does not hold it); pass --data-dir with a local mirror or set $SOFTEVAL_DATA_DIR")
    assert_nothing_written(tmp_path / "out")


def test_a_hub_model_without_the_hub_is_one_line_without_retries(tmp_path, unreachable_hub):
    from softeval.models import load_model

    with pytest.raises(SoftevalError) as error:
        load_model("softeval-tests/no-such-model")
    assert str(error.value) == (
        "cannot load model 'softeval-tests/no-such-model' from the hub (127.0.0.1:9 is not reachable: Connection refused), "
        "and the Hugging Face cache does not hold it; give a local folder, a .gguf file or an alias"
    )


def test_jsonl_that_is_not_utf8(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS)
    data = tmp_path / "test.jsonl"
    data.write_bytes(data.read_bytes() + '{"q": "caf\u00e9", "a": "x", "b": "y", "gold": 0}\n'.encode("latin-1"))
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"{data}:3: not UTF-8 text (byte 0xe9); re-encode the file as UTF-8" in line
    assert_nothing_written(tmp_path / "out")


def test_csv_that_is_not_utf8(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS, fmt="csv")
    data = tmp_path / "test.csv"
    data.write_bytes(data.read_bytes().replace(b"Rome", "R\u00f6me".encode("latin-1"), 1))
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"{data}:2: not UTF-8 text" in line and "re-encode the file as UTF-8" in line


def test_task_spec_that_is_not_utf8(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS)
    task.write_bytes(b"# written in latin-1: caf\xe9\n" + task.read_bytes())
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"{task}:1: not UTF-8 text (byte 0xe9); re-encode the file as UTF-8" in line


def test_option_labels_and_texts_of_different_lengths(tmp_path, monkeypatch, capsys, no_model_loading):
    rows = [{**r, "labels": ["A", "B"]} for r in ROWS]
    rows[1]["labels"] = ["A", "B", "C"]
    fields = {"question": "q", "choices": "[a, b]", "labels": "labels", "answer": "gold"}
    task = write_user_task(tmp_path, rows, fields=fields)
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"{tmp_path / 'test.jsonl'}:2: 3 option labels but 2 option texts; fix the row or drop it" in line


def test_empty_split_names_the_file(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, [])
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"split 'test' has no rows ({tmp_path / 'test.jsonl'} is empty)" in line


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("Question: {{ questoin }}\nAnswer:", "'questoin' is undefined"),
        ("{{ question.__class__ }}\nAnswer:", "access to attribute '__class__' of 'str' object is unsafe"),
    ],
)
def test_template_checked_against_the_first_row(tmp_path, monkeypatch, capsys, no_model_loading, template, reason):
    task = write_user_task(tmp_path, ROWS, template=template)
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"task spec {task}: template cannot be rendered for {tmp_path / 'test.jsonl'}:1: {reason}" in line
    assert line.endswith("fix the template or the row")


def test_field_that_uses_an_undefined_variable(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS, fields={"question": "question_text", "choices": "[a, b]", "answer": "gold"})
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert "test.jsonl:1: cannot compute field 'question' (question_text)" in line and "fix the task spec's fields" in line


def test_error_text_is_printed_literally(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS, fields={"question": "q", "choices": "[a, b][c]", "answer": "gold"})
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert "cannot compute field 'choices' ([a, b][c])" in line  # brackets are text, not terminal markup


def test_field_refused_by_the_sandbox(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS, fields={"question": "q.__class__.__name__", "choices": "[a, b]", "answer": "gold"})
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert "test.jsonl:1: cannot compute field 'question' (q.__class__.__name__)" in line


@pytest.fixture
def arc_mirror(tmp_path):
    """A mirror folder holding ARC-Easy's splits, to be filled by the test."""
    folder = tmp_path / "mirror" / "allenai" / "ai2_arc" / "ARC-Easy"
    folder.mkdir(parents=True)
    row = {"id": "1", "question": "Which is a gas?", "answerKey": "B",
           "choices": {"text": ["rock", "steam", "ice"], "label": ["A", "B", "C"]}}
    for split in ("train", "validation", "test"):
        (folder / f"{split}.jsonl").write_text(json.dumps(row) + "\n")
    return folder


def test_builtin_task_row_with_more_labels_than_options(tmp_path, monkeypatch, capsys, no_model_loading, arc_mirror):
    row = json.loads((arc_mirror / "test.jsonl").read_text())
    row["choices"]["label"].append("D")  # four labels, three option texts
    (arc_mirror / "test.jsonl").write_text((arc_mirror / "test.jsonl").read_text() + json.dumps(row) + "\n")
    line = user_sees(monkeypatch, capsys, *eval_args("arc_easy", tmp_path / "out", "--data-dir", tmp_path / "mirror"))
    assert f"{arc_mirror / 'test.jsonl'}:2: 4 option labels but 3 option texts; fix the row or drop it" in line


def test_empty_split_in_a_mirror_names_the_file(tmp_path, monkeypatch, capsys, no_model_loading, arc_mirror):
    (arc_mirror / "test.jsonl").write_text("\n")
    line = user_sees(monkeypatch, capsys, *eval_args("arc_easy", tmp_path / "out", "--data-dir", tmp_path / "mirror"))
    assert f"task arc_easy: split 'test' has no rows ({arc_mirror / 'test.jsonl'} is empty)" in line


def test_tuning_split_too_small_to_hold_out_validation(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS)
    line = user_sees(monkeypatch, capsys, "tune", "--model", ALIAS, "--task", task, "--output", tmp_path / "out")
    assert "task capitals's tuning split 'train' has 2 rows; tuning holds out a fifth for validation and needs at least 5" in line


def test_model_path_that_does_not_exist(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS)
    line = user_sees(monkeypatch, capsys, "eval", "--model", "./models/smol", "--task", task, "--output", tmp_path / "out")
    assert "model folder not found: models/smol; check the path" in line


# --- options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--limit", "0"], "Invalid value for '--limit': Input should be greater than or equal to 1"),
        (["--limit", "-3"], "Invalid value for '--limit'"),
        (["--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["--method", "few-shot", "--k", "0"], "Invalid value for '--k'"),
        # an evaluated example is never its own demonstration: a shared split of 6 rows gives 5
        (["--method", "few-shot", "--k", "6"], "--k 6 is more demonstrations than task capitals's few-shot split 'test' can give (6 rows, shared with evaluation); use --k 5 or fewer"),
        (["--method", "soft-prompt"], "--method soft-prompt needs a tuned prompt (--prompt PATH); to tune one and evaluate it, use softeval run or softeval study"),
        (["--seed", "-1"], "Invalid value for '--seed'"),
        (["--prompt", "tuned"], "--prompt is evaluated by the soft-prompt method only; add --method soft-prompt"),
    ],
)
def test_eval_options(tmp_path, monkeypatch, capsys, no_model_loading, args, expected):
    task = write_user_task(tmp_path, ROWS * 3)
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out", *args))
    assert expected in line
    assert_nothing_written(tmp_path / "out")


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        ("tune", ["--steps", "0"], "Invalid value for '--steps'"),
        ("tune", ["--tune-batch-size", "0"], "Invalid value for '--tune-batch-size'"),
        ("tune", ["--lr", "0"], "--lr: input should be greater than 0"),
        ("tune", ["--lr", "inf"], "--lr: input should be a finite number"),
        ("run", ["--lr", "nan"], "--lr: input should be a finite number"),
        ("run", ["--lora-lr", "inf"], "--lora-lr: input should be a finite number"),
        ("tune", ["--seed", "-1"], "Invalid value for '--seed'"),
        ("run", ["--seed", "-1"], "Invalid value for '--seed'"),
        ("run", ["--steps", "-1"], "Invalid value for '--steps'"),
        ("run", ["--limit", "0"], "Invalid value for '--limit'"),
        ("run", ["--k", "100"], "--k 100 is more demonstrations"),
        ("tune", ["--init-text", "capitals"], "--init-text is read by --init text only; add --init text"),
    ],
)
def test_tune_and_run_options(tmp_path, monkeypatch, capsys, no_model_loading, command, args, expected):
    task = write_user_task(tmp_path, ROWS * 3)
    line = user_sees(monkeypatch, capsys, command, "--model", ALIAS, "--task", task, "--output", tmp_path / "out", *args)
    assert expected in line
    if expected.startswith("Invalid value"):
        assert line.endswith(f"(see 'softeval {command} --help')")


# --- the output folder ------------------------------------------------------------------------------


def test_a_model_cache_that_is_a_file(tmp_path, monkeypatch, capsys):
    """Found when the alias is first prepared (a model load), so the cell fails and nothing is kept."""
    task = write_user_task(tmp_path, ROWS)
    (tmp_path / "afile").write_text("notes")
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out", "--cache-dir", tmp_path / "afile"))
    assert f"the model cache {tmp_path / 'afile'} cannot be a folder: {tmp_path / 'afile'} is a file; give --cache-dir" in line
    assert_nothing_written(tmp_path / "out")


def test_ranking_a_folder_that_does_not_exist(tmp_path, monkeypatch, capsys):
    line = user_sees(monkeypatch, capsys, "rank", tmp_path / "nowhere")
    assert line == f"error: no results folder at {tmp_path / 'nowhere'}; give the --output folder of softeval study or run"


def test_output_that_is_a_file(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS)
    (tmp_path / "out").write_text("notes")
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"--output {tmp_path / 'out'} is a file, not a folder; give a folder path" in line
    below = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out" / "run1"))
    assert f"--output {tmp_path / 'out' / 'run1'} cannot be made: {tmp_path / 'out'} is a file, not a folder; give a folder path" in below


def test_a_file_where_a_cell_folder_goes_is_found_before_work(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS * 5)  # rows enough to tune on
    unit = tmp_path / "out" / ALIAS / "capitals"
    unit.parent.mkdir(parents=True)
    unit.write_text("notes")  # where the cells of this model and task go
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert line == f"error: {unit} is a file where softeval keeps results; move it away or choose another --output"
    unit.unlink()
    (unit / "zero-shot").parent.mkdir()
    (unit / "prompt").write_text("notes")  # where a tuned prompt goes
    line = user_sees(monkeypatch, capsys, "run", "--model", ALIAS, "--task", task, "--method", "soft-prompt", "--output", tmp_path / "out")
    assert line == f"error: {unit / 'prompt'} is a file where softeval keeps results; move it away or choose another --output"


def test_a_data_folder_that_is_a_file(tmp_path, monkeypatch, capsys, no_model_loading):
    (tmp_path / "mirror").write_text("notes")
    line = user_sees(monkeypatch, capsys, *eval_args("arc_easy", tmp_path / "out", "--data-dir", tmp_path / "mirror"))
    assert line == f"error: the data folder {tmp_path / 'mirror'} (--data-dir or $SOFTEVAL_DATA_DIR) is a file; give the benchmark mirror's root folder"


@pytest.mark.parametrize(
    "data, line, problem",
    [
        ('q,a,b,gold\n"Capital of Italy?,Rome,Paris,0\nCapital of Spain?,Madrid,Lisbon,0\n', 2, "unexpected end of data (a quote left open?); fix the quoting of the row"),
        ("q,a,b,gold\nCapital of Italy?,Rome,Paris,0\nCapital of Spain, today?,Madrid,Lisbon,0\n", 3,
         "5 fields where the header has 4; quote a field that holds a comma, or fix the row"),
    ],
)
def test_a_malformed_csv_row_names_its_line(tmp_path, monkeypatch, capsys, no_model_loading, data, line, problem):
    task = write_user_task(tmp_path, ROWS, fmt="csv")
    (tmp_path / "test.csv").write_text(data)
    said = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert said == f"error: {tmp_path / 'test.csv'}:{line}: {problem}"
    assert_nothing_written(tmp_path / "out")


def test_rows_of_a_csv_are_named_by_the_line_they_start_on(tmp_path):
    from softeval.tasks import load_task
    from softeval.tasks.data import load_rows

    task = write_user_task(tmp_path, ROWS, fmt="csv")
    (tmp_path / "test.csv").write_text('q,a,b,gold\n"Capital\nof Italy?",Rome,Paris,0\n\nCapital of Spain?,Madrid,Lisbon,0\n')
    rows = load_rows(load_task(task), "test")
    assert [(row["q"], where.rsplit("/", 1)[1]) for row, where in rows] == [("Capital\nof Italy?", "test.csv:2"), ("Capital of Spain?", "test.csv:5")]


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs a Linux /sys, where no one may create files")
def test_output_folder_that_is_not_writable(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS)
    for out in ("/sys/softeval-results", "/sys"):  # to be made in a folder no one may write, or that folder
        line = user_sees(monkeypatch, capsys, *eval_args(task, out))
        assert f"cannot write in /sys for --output {out}: " in line and line.endswith("; choose a writable --output")
    assert not os.path.exists("/sys/softeval-results")


@pytest.fixture
def small_file_size_limit():
    """Writes beyond 256 KiB fail as on a full disk (EFBIG instead of the process being killed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, hard))
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, previous)


def test_disk_that_fills_up_is_found_before_work(tmp_path, monkeypatch, capsys, no_model_loading, small_file_size_limit):
    task = write_user_task(tmp_path, ROWS)
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out"))
    assert f"cannot write in {tmp_path} for --output {tmp_path / 'out'}: File too large; free disk space or choose another --output" in line
    assert_nothing_written(tmp_path / "out")


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, small_file_size_limit):
    target = tmp_path / "results.json"
    write_json_atomic(target, {"complete": True})
    with pytest.raises(SoftevalError, match="cannot write .*results.json: File too large; free disk space or choose another output folder"):
        write_json_atomic(target, {"big": "x" * (512 << 10)})
    assert json.loads(target.read_text()) == {"complete": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


# --- checkpoints and unexpected errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("made_for", "extra", "expected"),
    [
        ("trivia", [], "was tuned for task 'trivia', not 'capitals'; tune one for this task"),
        ("capitals", ["--model", "gemma-3-270m"], "was tuned for one model; evaluate it with one --model"),
        ("capitals", ["--task", "second"], "was tuned for one task; evaluate it with one --task"),
    ],
)
def test_a_given_prompt_is_checked_before_the_model_loads(tmp_path, monkeypatch, capsys, no_model_loading, made_for, extra, expected):
    import torch

    from softeval.tasks import load_task
    from softeval.tuning import save_soft_prompt

    task = write_user_task(tmp_path, ROWS * 3)
    (tmp_path / "second").mkdir()
    extra = [str(write_user_task(tmp_path / "second", ROWS * 3, name="second")) if a == "second" else a for a in extra]
    path = tmp_path / "soft_prompt.safetensors"
    save_soft_prompt(path, torch.zeros(10, 4), {"task": {"name": made_for, "spec_sha256": load_task(task).sha256()}, "chat": False})
    line = user_sees(monkeypatch, capsys, *eval_args(task, tmp_path / "out", *extra, "--method", "soft-prompt", "--prompt", path))
    assert expected in line
    assert_nothing_written(tmp_path / "out")


def test_a_prompt_of_another_model_is_one_line_naming_that_model(tmp_path, monkeypatch, capsys, caplog, tiny_model_dirs):
    import torch

    from softeval.tasks import load_task
    from softeval.tuning import save_soft_prompt

    task = write_user_task(tmp_path, ROWS * 3)
    path = tmp_path / "soft_prompt.safetensors"
    made_for = {"spec": "smollm2-135m-instruct", "model_type": "llama", "hidden_size": 576}
    save_soft_prompt(path, torch.zeros(10, 576), {"model": made_for, "task": {"name": "capitals", "spec_sha256": load_task(task).sha256()}, "chat": False})
    args = ["eval", "--model", tiny_model_dirs["llama"], "--task", task, "--output", tmp_path / "out", "--method", "soft-prompt", "--prompt", path]
    line = user_sees(monkeypatch, capsys, *args)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # one cell: its failure is told once, by the error line
    assert "soft_prompt.safetensors was tuned for model 'smollm2-135m-instruct'" in line and line.endswith("tune one for this model")
    assert not list((tmp_path / "out").rglob("results.json"))


def test_checkpoint_written_with_other_settings(tmp_path, monkeypatch, capsys, no_model_loading):
    import torch
    from safetensors.torch import save_file

    from softeval.tuning import TuneConfig

    task = write_user_task(tmp_path, ROWS * 10)
    (tmp_path / "tuned").mkdir()
    checkpoint = tmp_path / "tuned" / "checkpoint.safetensors"
    save_file({"soft_prompt": torch.zeros(10, 4)}, str(checkpoint), metadata={"config": TuneConfig(steps=99).model_dump_json()})
    line = user_sees(monkeypatch, capsys, "tune", "--model", ALIAS, "--task", task, "--output", tmp_path / "tuned", "--resume")
    assert f"checkpoint {checkpoint} was written with other settings (steps); resume with the same flags" in line


def test_export_folder_checked_before_tuning(tmp_path, monkeypatch, capsys, no_model_loading):
    task = write_user_task(tmp_path, ROWS * 10)
    (tmp_path / "adapter").write_text("a file")
    line = user_sees(monkeypatch, capsys, "tune", "--model", ALIAS, "--task", task, "--output", tmp_path / "tuned",
                     "--export-peft", tmp_path / "adapter")
    assert f"--export-peft {tmp_path / 'adapter'} is a file, not a folder" in line


@pytest.mark.parametrize("content", [b"\x08\x00\x00\x00\x00\x00\x00\x00{\"soft", b"", "foreign"])
def test_truncated_or_foreign_checkpoint(tmp_path, monkeypatch, capsys, no_model_loading, content):
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "tuned"
    out.mkdir()
    checkpoint = out / "checkpoint.safetensors"
    if content == "foreign":  # a valid safetensors file that softeval did not write
        import torch
        from safetensors.torch import save_file

        save_file({"weight": torch.zeros(2)}, str(checkpoint))
    else:
        checkpoint.write_bytes(content)
    line = user_sees(monkeypatch, capsys, "tune", "--model", ALIAS, "--task", task, "--output", out, "--resume")
    assert f"checkpoint {checkpoint} is truncated or not a softeval tuning checkpoint" in line
    assert line.endswith("delete it to tune from step 0")


def test_unexpected_error_is_one_line_with_a_log(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("SOFTEVAL_DEBUG", raising=False)
    monkeypatch.setattr(cli.settings, "debug", False)  # restored after the --debug run below

    def broken(name):
        raise RuntimeError("something internal broke\nsecond line")

    monkeypatch.setattr("softeval.cli.load_task", broken)
    line = user_sees(monkeypatch, capsys, "tune", "--model", ALIAS, "--task", "arc_easy", "--output", tmp_path / "o", code=1)
    assert line.startswith("error: unexpected RuntimeError: something internal broke; the traceback is in ")
    assert line.endswith("(softeval --debug COMMAND ... prints it)")
    log = line.split("the traceback is in ")[1].split(" (softeval --debug")[0]
    assert log.startswith(str(tmp_path / "state"))
    text = open(log).read()
    assert "Traceback (most recent call last)" in text and "second line" in text and "softeval tune" in text
    monkeypatch.setattr("sys.argv", ["softeval", "--debug", "tune", "--model", ALIAS, "--task", "arc_easy", "--output", str(tmp_path / "o")])
    with pytest.raises(RuntimeError, match="something internal broke"):
        cli.main()


def test_a_later_row_that_cannot_be_rendered_names_its_line(tmp_path, tiny_llama):
    from softeval import evaluate, load_task

    rows = [{**ROWS[0], "hint": "Europe"}, ROWS[1]]  # the second row lacks the field the template uses
    task = write_user_task(tmp_path, rows, template="Question: {{ question }} ({{ hint }})\n{{ options }}\nAnswer:")
    with pytest.raises(SoftevalError, match=r"template cannot be rendered for .*test.jsonl:2: 'hint' is undefined; fix"):
        evaluate(tiny_llama, load_task(task), "zero-shot", progress=False)


def test_checkpoint_of_another_task_is_not_resumed(tmp_path, monkeypatch, capsys, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    args = ["tune", "--model", tiny_model_dirs["llama"], "--task", task, "--steps", 2, "--eval-every", 1,
            "--val-size", 2, "--length", 2, "--output", tmp_path / "tuned", "--resume"]
    monkeypatch.setattr("sys.argv", ["softeval", *map(str, args)])
    with pytest.raises(SystemExit) as finished:
        cli.main()
    assert finished.value.code == 0
    capsys.readouterr()
    task.write_text(task.read_text().replace("Answer:", "The answer:"))  # now another task spec
    with pytest.raises(SystemExit) as refused:
        cli.main()
    assert refused.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
    assert last.startswith("error: checkpoint ")
    assert last.endswith("was written for another model or task (or an edited task spec); delete it to tune from step 0, or choose another --output")


def test_tuning_again_into_a_folder_with_a_checkpoint_says_how_to_resume(tmp_path, monkeypatch, capsys, caplog, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    args = ["tune", "--model", tiny_model_dirs["llama"], "--task", task, "--steps", 1, "--eval-every", 1,
            "--val-size", 2, "--length", 2, "--output", tmp_path / "tuned"]
    monkeypatch.setattr("sys.argv", ["softeval", *map(str, args)])
    for _ in range(2):
        with pytest.raises(SystemExit) as finished:
            cli.main()
        assert finished.value.code == 0
    said = [r.getMessage() for r in caplog.records if "earlier run's checkpoint" in r.getMessage()]
    assert said == [f"tuning from step 0 into {tmp_path / 'tuned'}, which holds an earlier run's checkpoint (replaced as this run goes); "
                    "to continue that run instead, stop and add --resume"]  # the second run only


@pytest.mark.parametrize(
    "command, expected",
    [
        ("eval", "error: interrupted; finished cells and tuning checkpoints are kept: rerun the same command to do the rest"),
        ("tune", "error: interrupted; the last checkpoint is kept: rerun the same command with --resume to continue from it"),
    ],
)
def test_an_interrupted_command_says_how_to_go_on(tmp_path, monkeypatch, capsys, no_model_loading, command, expected):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the command works

    monkeypatch.setattr("softeval.study.preflight.check_task", interrupted)
    task = write_user_task(tmp_path, ROWS * 10)
    assert user_sees(monkeypatch, capsys, command, "--model", ALIAS, "--task", task, "--output", tmp_path / "out", code=130) == expected


# --- near names and checkpoint names --------------------------------------------------------------


def test_a_near_task_name_is_suggested(tmp_path, monkeypatch, capsys, no_model_loading):
    err = user_sees(monkeypatch, capsys, *eval_args("arc-easy", tmp_path / "out"))
    assert err == "error: unknown task 'arc-easy'; did you mean 'arc_easy'? (softeval tasks lists them)"
    assert_nothing_written(tmp_path / "out")


def test_a_near_series_key_is_suggested(tmp_path, monkeypatch, capsys, no_model_loading):
    import yaml

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"series": [{"name": "a", "model": "org/a", "revisions": ["step1"], "tokens_per_stp": 2}], "tasks": ["arc_easy"]}))
    err = user_sees(monkeypatch, capsys, "study", study, "--output", tmp_path / "out")
    assert err == f"error: study file {study}: unknown key 'series.0.tokens_per_stp' (did you mean 'tokens_per_step'?); fix the study file"


def test_revisions_of_a_local_run_folder_point_to_checkpoints(tmp_path, monkeypatch, capsys, no_model_loading):
    import yaml

    (tmp_path / "run" / "checkpoint-10").mkdir(parents=True)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"series": [{"name": "a", "model": str(tmp_path / "run"), "revisions": ["checkpoint-10"]}], "tasks": ["arc_easy"]}))
    err = user_sees(monkeypatch, capsys, "study", study, "--output", tmp_path / "out")
    assert err.endswith(f"series 'a': {tmp_path / 'run'} is a local training run's folder, and revisions are a hub model's branches or tags; "
                        f"give its checkpoints instead (checkpoints: {tmp_path / 'run'}); fix the study file")


def test_a_checkpoint_name_that_is_not_in_its_run_folder_lists_those_that_are(tmp_path, monkeypatch, capsys, no_model_loading):
    for step in (10, 30):
        (tmp_path / "run" / f"checkpoint-{step}").mkdir(parents=True)
        (tmp_path / "run" / f"checkpoint-{step}" / "config.json").write_text("{}")
    err = user_sees(monkeypatch, capsys, "eval", "--model", tmp_path / "run@checkpoint-20", "--task", "arc_easy", "--output", tmp_path / "out")
    assert err == (f"error: model '{tmp_path / 'run@checkpoint-20'}': no checkpoint folder {tmp_path / 'run' / 'checkpoint-20'}; "
                   "it holds checkpoint-10, checkpoint-30")


def test_a_missing_ground_truth_file_is_one_line(tmp_path, monkeypatch, capsys, no_model_loading):
    import yaml

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"models": ["org/a"], "tasks": ["arc_easy"], "ground_truth": str(tmp_path / "truth.json")}))
    err = user_sees(monkeypatch, capsys, "study", study, "--output", tmp_path / "out")
    assert err == (f"error: study file {study}: ground_truth: ground truth file not found: {tmp_path / 'truth.json'}; "
                   "give the ground_truth.json that softeval testbed wrote; fix the study file")
    assert_nothing_written(tmp_path / "out")


def test_an_unknown_testbed_size_is_one_line(tmp_path, monkeypatch, capsys, no_model_loading):
    err = user_sees(monkeypatch, capsys, "testbed", tmp_path / "bed", "--size", "huge")
    assert err == "error: --size: unknown size 'huge'; choose one of: small, full"
    assert not (tmp_path / "bed").exists()


def test_a_testbed_without_the_mirror_says_which_recipe_needs_it(tmp_path, monkeypatch, capsys, no_model_loading):
    monkeypatch.delenv("SOFTEVAL_DATA_DIR", raising=False)
    err = user_sees(monkeypatch, capsys, "testbed", tmp_path / "bed")
    assert err == "error: the 'filler' recipe mixes in prose from the benchmark mirror; give --data-dir (the mirror's folder)"
    assert not (tmp_path / "bed").exists()
